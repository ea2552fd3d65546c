"""`edgefleet schema` as a user runs it: the real console script in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from edgefleet.shared.messages import DeviceStatus


def edgefleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgefleet", *args], capture_output=True, text=True, timeout=60
    )


def test_schema_prints_every_message_keyed_by_id():
    result = edgefleet("schema")
    assert result.returncode == 0, result.stderr
    schemas = json.loads(result.stdout)
    assert "ef.escalation/1" in schemas and "ef.telemetry/1" in schemas


def test_check_accepts_a_valid_document_and_explains_a_bad_one(tmp_path: Path):
    good = tmp_path / "good.json"
    good.write_text(
        DeviceStatus(device_id="cam-01", state="online", agent_version="1").model_dump_json()
    )
    result = edgefleet("schema", "--check", str(good))
    assert result.returncode == 0 and "valid ef.status/1" in result.stdout

    bad = tmp_path / "bad.json"
    doc = json.loads(good.read_text())
    doc["state"] = "asleep"
    doc["ts"] = "2026-01-01T00:00:00"
    bad.write_text(json.dumps(doc))
    result = edgefleet("schema", "--check", str(bad))
    assert result.returncode == 1
    assert "state" in result.stderr and "ts" in result.stderr
    assert "Traceback" not in result.stderr


def test_check_names_unknown_schema_and_non_json(tmp_path: Path):
    unknown = tmp_path / "u.json"
    unknown.write_text('{"schema": "ef.nope/9"}')
    result = edgefleet("schema", "--check", str(unknown))
    assert result.returncode == 1 and "ef.nope/9" in result.stderr
    garbage = tmp_path / "g.json"
    garbage.write_text("not json")
    result = edgefleet("schema", "--check", str(garbage))
    assert result.returncode == 2 and "Traceback" not in result.stderr


def test_check_says_what_is_wrong_with_unreadable_or_non_object_input(tmp_path: Path):
    # given a missing file, broken JSON and JSON that is not an object
    missing = edgefleet("schema", "--check", str(tmp_path / "absent.json"))
    assert missing.returncode == 2 and "cannot read: No such file" in missing.stderr
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema": "ef.status/1",\n  "state": }')
    result = edgefleet("schema", "--check", str(broken))
    assert result.returncode == 2 and "not JSON" in result.stderr and "line 2" in result.stderr
    array = tmp_path / "array.json"
    array.write_text("[1, 2]")
    result = edgefleet("schema", "--check", str(array))
    # then each says what is wrong in the user's terms, never Python internals
    assert result.returncode == 2 and "is an array; a message is a JSON object" in result.stderr
    assert "attribute" not in result.stderr and "Traceback" not in result.stderr
