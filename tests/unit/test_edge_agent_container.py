"""The host updater starts the agent from the shipped compose file's `edge` service."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefleet.edge.agent_container import AgentContainer
from edgefleet.shared.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
IMAGE = "registry.example:5000/acme/edge@sha256:" + "a" * 64


def test_the_jetson_compose_service_is_the_updaters_container(tmp_path: Path) -> None:
    shipped = (REPO / "docker/jetson/compose.yaml").read_text()
    compose = tmp_path / "compose.yaml"  # the shipped file, its updater folder under tmp
    compose.write_text(shipped.replace("/var/lib/edgefleet/updater", str(tmp_path / "upd")))
    kwargs = AgentContainer(compose, env={"EDGEFLEET_BUNDLE": "/opt/b"}).create_kwargs(
        IMAGE, "edgefleet-edge"
    )
    # the hardening, runtime and ports of the compose service, unchanged
    assert (kwargs["user"], kwargs["read_only"], kwargs["cap_drop"]) == (
        "10001:10001",
        True,
        ["ALL"],
    )
    assert kwargs["runtime"] == "nvidia" and kwargs["ports"] == {"8081/tcp": ("127.0.0.1", 8081)}
    # the named volumes compose would use (project prefix), the bundle read-only
    mounts = {m["Target"]: m for m in kwargs["mounts"]}
    assert mounts["/var/lib/edgefleet/outbox"]["Source"] == "edgefleet-edge_outbox"
    assert mounts["/etc/edgefleet"] == {
        "Type": "bind",
        "Target": "/etc/edgefleet",
        "Source": "/opt/b",
        "ReadOnly": True,
    }
    assert (tmp_path / "upd").is_dir()
    # and the agent learns which image it is
    assert kwargs["environment"]["EDGEFLEET_IMAGE"] == IMAGE
    assert kwargs["labels"]["io.edgefleet.image"] == IMAGE


def test_the_x86_edge_compose_service_is_accepted_too(tmp_path: Path) -> None:
    shipped = (REPO / "docker/x86/compose.edge.yaml").read_text()
    compose = tmp_path / "compose.edge.yaml"
    compose.write_text(shipped.replace("/var/lib/edgefleet/updater", str(tmp_path / "upd")))
    kwargs = AgentContainer(compose, env={}).create_kwargs(IMAGE, "edgefleet-edge")
    assert kwargs["read_only"] and kwargs["cap_drop"] == ["ALL"]


def test_a_compose_key_the_updater_does_not_know_is_refused(tmp_path: Path) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text("services:\n  edge:\n    image: x\n    privileged: true\n")
    with pytest.raises(ConfigError, match="privileged"):
        AgentContainer(compose).create_kwargs(IMAGE, "edgefleet-edge")
