"""ComposeRuntime writes the compose file and drives `docker compose`.

No Docker engine runs here, so `docker` is a hand-written stand-in script passed through
the public `docker=` argument; it records its arguments and fails on demand.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from edgefleet.edge.updater import ComposeRuntime, UpdateFailed


def fake_docker(tmp_path: Path, fail_on: str | None = None) -> tuple[Path, Path]:
    calls = tmp_path / "calls.txt"
    script = tmp_path / "docker"
    fail = (
        f'case "$*" in *" {fail_on}"*) echo "pull access denied" >&2; exit 1;; esac'
        if fail_on
        else ""
    )
    script.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n{fail}\nexit 0\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, calls


def test_image_change_writes_compose_then_pulls_and_ups(tmp_path: Path) -> None:
    docker, calls = fake_docker(tmp_path)
    runtime = ComposeRuntime(tmp_path / "compose.yaml", docker=str(docker), project="ef")
    assert runtime.current_image() is None
    runtime.apply("ghcr.io/acme/edge:1.4.2", {})
    doc = yaml.safe_load((tmp_path / "compose.yaml").read_text())
    assert doc["services"]["edge"]["image"] == "ghcr.io/acme/edge:1.4.2"
    assert doc["services"]["edge"]["runtime"] == "nvidia"
    assert runtime.current_image() == "ghcr.io/acme/edge:1.4.2"
    lines = calls.read_text().splitlines()
    compose = f"compose -f {tmp_path / 'compose.yaml'} -p ef"
    assert lines == [f"{compose} pull", f"{compose} up -d --remove-orphans"]


def test_failed_pull_restores_the_previous_compose_file(tmp_path: Path) -> None:
    good, _ = fake_docker(tmp_path)
    ComposeRuntime(tmp_path / "compose.yaml", docker=str(good)).apply("edge:1", {})
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad, _ = fake_docker(bad_dir, fail_on="pull")
    runtime = ComposeRuntime(tmp_path / "compose.yaml", docker=str(bad))
    with pytest.raises(UpdateFailed) as caught:
        runtime.apply("edge:2", {})
    assert "pull access denied" in str(caught.value)
    assert runtime.current_image() == "edge:1"


def test_missing_docker_is_a_clear_error(tmp_path: Path) -> None:
    runtime = ComposeRuntime(tmp_path / "compose.yaml", docker=str(tmp_path / "no-docker"))
    with pytest.raises(UpdateFailed) as caught:
        runtime.apply("edge:1", {})
    assert "could not run" in str(caught.value)


def test_the_agent_settings_choose_the_runtime(tmp_path: Path) -> None:
    from edgefleet.edge.settings import EdgeSettings
    from edgefleet.edge.updater import NullRuntime, runtime_from_settings
    from edgefleet.shared.config import load_settings

    # given: an edge.yaml that hands image changes to docker compose
    config = tmp_path / "edge.yaml"
    config.write_text(
        "device_id: cam-01\ndevice_key: k\n"
        f"runtime: {{kind: compose, compose_file: {tmp_path / 'c.yaml'}, project: site7}}\n"
    )
    settings = load_settings(EdgeSettings, config)
    runtime = runtime_from_settings(settings.runtime, settings.state_dir)
    # then: the agent's runtime is compose with those settings; by default it only records
    assert isinstance(runtime, ComposeRuntime)
    assert (runtime.compose_file, runtime.project) == (tmp_path / "c.yaml", "site7")
    default = load_settings(EdgeSettings, None, device_id="cam-01", device_key="k")
    assert isinstance(runtime_from_settings(default.runtime, tmp_path), NullRuntime)
    # and without a compose_file the compose file lives in the state folder (a volume)
    default.runtime.kind = "compose"
    in_state = runtime_from_settings(default.runtime, tmp_path)
    assert in_state.compose_file == tmp_path / "compose.yaml"
