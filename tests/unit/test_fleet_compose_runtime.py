"""ComposeRuntime writes the compose file and drives `docker compose`.

No Docker engine runs here, so `docker` is a hand-written stand-in script passed through
the public `docker=` argument; it records its arguments and fails on demand.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from edge.updater import ComposeRuntime, UpdateFailed


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
