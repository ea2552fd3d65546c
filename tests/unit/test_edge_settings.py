"""Edge settings and the CLI: defaults, bad config → one clear line, device keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgefleet.edge.settings import EdgeSettings
from edgefleet.shared.config import load_settings
from edgefleet.shared.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "edge.yaml"
    path.write_text(text)
    return path


def test_little_config_is_enough(tmp_path: Path) -> None:
    s = load_settings(
        EdgeSettings,
        _write(tmp_path, "device_id: cam-01\ndevice_key: k\nstreams:\n  - {id: s1, url: a.mp4}\n"),
    )
    assert s.model.name == "ppocr6-tiny" and s.mqtt.max_inflight >= 100
    assert s.outbox.synchronous == "full"
    assert s.streams[0].kind == "auto" and s.streams[0].realtime
    assert s.key_bytes() == b"k"


def test_every_field_is_described() -> None:
    def walk(model: type) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            annotation = field.annotation
            for candidate in (annotation, *getattr(annotation, "__args__", ())):
                if isinstance(candidate, type) and hasattr(candidate, "model_fields"):
                    missing += walk(candidate)
        return missing

    assert walk(EdgeSettings) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("device_id: cam-01\ndevice_key: k\nstreamz: []\n", "edge.yaml:3: streamz"),
        (
            "device_id: cam-01\ndevice_key: k\nstreams:\n  - id: s1\n    url: a.mp4\n    fps: 10\n",
            "edge.yaml:6: streams.0.fps",
        ),
        ("device_id: cam-01\ndevice_key: k\ntelemetry_interval_s: often\n", "telemetry_interval_s"),
        ("device_id: Not_Valid\ndevice_key: k\n", "device_id"),
        ("device_id: cam-01\n", "device_key"),
        (
            "device_id: cam-01\ndevice_key: k\npolicy: {unsure_low: 0.9, unsure_high: 0.1}\n",
            "unsure_low",
        ),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(EdgeSettings, _write(tmp_path, text))
    assert expected in str(err.value)


def test_key_from_an_enrollment_bundle(tmp_path: Path) -> None:
    key = bytes(range(32))
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(f"device_id: cam-01\ndevice_key: {key.hex()}\n")
    s = EdgeSettings(device_id="cam-01", device_key_file=bundle)
    assert s.key_bytes() == key
    plain = tmp_path / "key.txt"
    plain.write_text(key.hex() + "\n")
    assert EdgeSettings(device_id="cam-01", device_key_file=plain).key_bytes() == key
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}")
    with pytest.raises(ConfigError, match="no `device_key`"):
        EdgeSettings(device_id="cam-01", device_key_file=empty).key_bytes()
    with pytest.raises(ConfigError, match="cannot read"):
        EdgeSettings(device_id="cam-01", device_key_file=tmp_path / "gone").key_bytes()


def test_cli_reports_bad_config_in_one_clear_error_without_traceback(tmp_path: Path) -> None:
    # given a config with a wrong type and an unknown key
    config = _write(tmp_path, "device_id: cam-01\ndevice_key: k\nmqtt: {port: nope}\nstreamz: []\n")
    result = subprocess.run(
        [sys.executable, "-m", "edgefleet", "edge", "run", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    # then it exits at once with one line per bad key, each naming file, line and key
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "error: invalid settings:" and len(lines) == 3, result.stderr
    assert lines[1].strip().startswith(f"{config}:3: mqtt.port")
    assert lines[2].strip().startswith(f"{config}:4: streamz: Extra inputs are not permitted")


def test_the_example_config_is_valid() -> None:
    example = REPO / "edge" / "edge.example.yaml"
    s = load_settings(EdgeSettings, example)
    assert [st.id for st in s.streams] == ["gate", "dock", "yard"]
    assert s.policy.attach == "crop" and s.outbox.synchronous == "full"


def test_one_execution_variable_refines_the_edge_tuning_instead_of_replacing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edgefleet.edge.execution import edge_execution

    # given the image's engine cache variable, and a file that asks for two workers
    monkeypatch.setenv("EDGEFLEET_EDGE_MODEL__EXECUTION__ENGINE_CACHE_DIR", str(tmp_path / "e"))
    config = _write(
        tmp_path,
        "device_id: cam-01\ndevice_key: k\npipeline: {infer_workers: 2}\n"
        "model: {execution: {batching: {max_queue: 9}}}\n",
    )
    # when the settings are built
    execution = load_settings(EdgeSettings, config).model.execution
    # then the variable and the file's key are set, and the rest is the edge's own tuning
    assert execution is not None
    assert execution.engine_cache_dir == tmp_path / "e"
    assert execution.batching.max_queue == 9
    tuned = edge_execution(2)
    assert not execution.spinning
    assert execution.intra_op_threads == tuned.intra_op_threads
    assert execution.batching.workers == 2 and execution.batching.preferred_batch_size == 1
    # and the cloud and the fleet, which layer nothing, build as before
    from edgefleet.cloud.settings import CloudSettings

    assert CloudSettings().execution.spinning
