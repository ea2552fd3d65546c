from __future__ import annotations

import json
import logging
import sys

from edgefleet.shared.logs import (
    JsonFormatter,
    PlainFormatter,
    redact_url,
    trace_id_from_traceparent,
    trace_id_var,
)


def test_traceparent_is_honoured_and_garbage_ignored():
    header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert trace_id_from_traceparent(header) == "4bf92f3577b34da6a3ce929d0e0e4736"
    for bad in (None, "", "00-xyz-00f067aa0ba902b7-01", "00-" + "0" * 32 + "-00f067aa0ba902b7-01"):
        assert trace_id_from_traceparent(bad) is None


def test_credentials_never_reach_a_log_line():
    assert redact_url("rtsp://admin:s3cret@10.0.0.5:554/live") == "rtsp://***@10.0.0.5:554/live"
    record = logging.LogRecord("x", logging.INFO, "f", 1, "open %s", ("rtsp://u:p@h/s",), None)
    assert "u:p" not in JsonFormatter().format(record)


def test_json_lines_carry_the_trace_id_and_extras():
    token = trace_id_var.set("ab" * 16)
    try:
        record = logging.LogRecord("edge", logging.WARNING, "f", 1, "dropped", (), None)
        record.stream_id = "door"
        entry = json.loads(JsonFormatter().format(record))
    finally:
        trace_id_var.reset(token)
    assert entry["trace_id"] == "ab" * 16
    assert entry["stream_id"] == "door"
    assert entry["level"] == "warning" and entry["ts"].endswith("Z")


def test_credentials_in_extras_and_exceptions_are_redacted_too():
    # given a log call that passes the URL as an extra field and inside an exception
    try:
        raise OSError("cannot open rtsp://admin:s3cret@10.0.0.5/live")
    except OSError:
        record = logging.LogRecord(
            "edge", logging.ERROR, "f", 1, "source failed", (), sys.exc_info()
        )
    record.source = "rtsp://admin:s3cret@10.0.0.5/live"
    # when formatted / then the password appears nowhere in the line
    line = JsonFormatter().format(record)
    assert "s3cret" not in line
    entry = json.loads(line)
    assert entry["source"] == "rtsp://***@10.0.0.5/live" and "rtsp://***@" in entry["exc"]


def test_plain_lines_redact_credentials_too():
    record = logging.LogRecord("x", logging.INFO, "f", 1, "open %s", ("rtsp://u:p@h/s",), None)
    line = PlainFormatter().format(record)
    assert "u:p" not in line and "rtsp://***@h/s" in line
