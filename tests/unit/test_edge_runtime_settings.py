"""The agent's settings choose who applies a deployment's image."""

from __future__ import annotations

from pathlib import Path

from edgefleet.edge.host_runtime import HostRuntime, runtime_from_settings
from edgefleet.edge.settings import EdgeSettings
from edgefleet.edge.updater import NullRuntime
from edgefleet.shared.config import load_settings


def test_the_agent_settings_choose_the_runtime(tmp_path: Path) -> None:
    # given: an edge.yaml that hands image changes to the host updater
    config = tmp_path / "edge.yaml"
    config.write_text(
        "device_id: cam-01\ndevice_key: k\n"
        f"runtime: {{kind: host, updater_dir: {tmp_path / 'updater'}}}\n"
    )
    settings = load_settings(EdgeSettings, config)
    runtime = runtime_from_settings(settings.runtime, settings.state_dir)
    # then: the host updater's folder is the one named; by default no image is applied
    assert isinstance(runtime, HostRuntime) and runtime.folder == tmp_path / "updater"
    default = load_settings(EdgeSettings, None, device_id="cam-01", device_key="k")
    assert isinstance(runtime_from_settings(default.runtime, tmp_path), NullRuntime)
