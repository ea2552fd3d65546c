from __future__ import annotations

import json
import logging
import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgefleet.shared.logs import (
    MAX_LOGGED_CHARS,
    JsonFormatter,
    PlainFormatter,
    clip,
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


_OLD_RULE = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="ab9Z+.-:/@ x\t", max_size=40))
def test_redaction_hides_what_the_plain_rule_hides(text: str) -> None:
    # the linear scan against the obvious (quadratic) regular expression it replaces
    assert redact_url(text) == _OLD_RULE.sub(r"\g<scheme>***@", text)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "attack", ["x" * 2_000_000, "a://" * 500_000, "a:" * 1_000_000, "a://b" + "c" * 2_000_000]
)
def test_redaction_reads_each_character_a_bounded_number_of_times(attack: str) -> None:
    # #32: the old rule took 3.4 s on 65,000 characters and grew with the square: these
    # 2,000,000 would take about an hour; the scan takes milliseconds
    assert "***" not in redact_url(attack)
    record = logging.LogRecord("x", logging.INFO, "f", 1, "GET %s", (attack,), None)
    record.path = attack
    entry = json.loads(JsonFormatter().format(record))
    assert len(entry["msg"]) < MAX_LOGGED_CHARS + 40  # clipped, saying how much was left off
    assert entry["msg"].endswith("more chars]") and len(entry["path"]) < MAX_LOGGED_CHARS + 40


def test_clip_keeps_short_text_and_says_what_it_cut() -> None:
    assert clip("short") == "short"
    assert clip("x" * 10, 4) == "xxxx…[6 more chars]"
