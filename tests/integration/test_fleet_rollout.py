"""A rollout across 5 device processes through a real Mosquitto with the generated ACLs.

The devices are `tests.support.fleet_device` processes (the real updater, ONNX Runtime
warm-ups, the process runtime, the real MQTT wire contract); the cloud side is the fleet
app served by uvicorn plus an MQTT client logged in as the `cloud` service account.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cloud_link import CloudLink
from tests.support.fleet import FleetServer, fleet_broker, tiny_onnx
from tests.support.waiting import eventually

DEVICES = [f"cam-{i:02d}" for i in range(5)]
REPO = Path(__file__).resolve().parents[2]


class DeviceProcesses:
    """The five device processes; each can be killed and started again with its own state."""

    def __init__(self, tmp_path: Path, port: int, enrollments: dict):
        self.tmp_path = tmp_path
        self.port = port
        self.enrollments = enrollments
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, device: str, runtime: str = "process") -> None:
        enrollment = self.enrollments[device]
        with open(self.tmp_path / f"{device}.log", "ab") as log:
            self.procs[device] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.fleet_device",
                    "--device",
                    device,
                    "--key",
                    enrollment.device_key.hex(),
                    "--port",
                    str(self.port),
                    # `=`: a generated password may begin with "-"
                    f"--password={enrollment.broker_password}",
                    "--state",
                    str(self.tmp_path / "devices" / device),
                    f"--runtime={runtime}",
                ],
                cwd=REPO,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def kill(self, device: str) -> None:
        """Gone without a goodbye (power cut): the broker publishes its `offline` will."""
        proc = self.procs.pop(device)
        proc.kill()
        proc.wait(timeout=15)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
def rig(tmp_path: Path):
    server = FleetServer(tmp_path / "cloud", publish=lambda w, r: link.publish(w, r))
    server.start()
    enrollments = {d: server.registry.enroll(d, group="line") for d in DEVICES}
    cloud_password = server.registry.accounts.ensure_service("cloud")
    broker = fleet_broker(server.registry, tmp_path / "broker")
    link = CloudLink(server, broker.port, cloud_password).start()
    devices = DeviceProcesses(tmp_path, broker.port, enrollments)
    for device in DEVICES:
        devices.start(device)
    yield server, link, devices, tmp_path
    devices.stop()
    link.stop()
    broker.kill()
    server.stop()


@pytest.fixture
def fleet(rig):
    server, link, _, tmp_path = rig
    return server, link, tmp_path


def device_state(tmp_path: Path, device: str) -> dict:
    try:
        return json.loads((tmp_path / "devices" / device / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def logs(tmp_path: Path) -> str:
    return "\n".join((tmp_path / f"{d}.log").read_text()[-2000:] for d in DEVICES)


def rollout(server: FleetServer, version: str, sha256: str | None = None) -> str:
    model = {"name": "det", "version": version}
    if sha256:
        model.update(url=server.store.url("det", version), sha256=sha256)
    dep = server.rollouts.create(
        {
            "group": "line",
            "image": "ghcr.io/acme/edge@sha256:" + version * 64,
            "models": [model],
            "canary_percent": 20,
            "soak_s": 0,
            "auto_rollback": True,
        }
    )
    assert len(dep.canaries) == 1
    return dep.id


@pytest.mark.slow
def test_good_rollout_reaches_all_bad_ones_stop_at_the_canary(fleet) -> None:
    server, link, tmp_path = fleet
    server.store.add("det", "1", tiny_onnx(tmp_path / "m1" / "det.onnx", scale=1.0))
    server.store.add("det", "2", tiny_onnx(tmp_path / "m2" / "det.onnx", scale=2.0))
    broken = tmp_path / "m3" / "det.onnx"
    broken.parent.mkdir()
    broken.write_bytes(b"\x08\x07garbage that is no onnx graph" * 64)
    server.store.add("det", "3", broken)
    # given all five devices online
    eventually(
        lambda: sum(d.online for d in server.registry.list_devices("line")) == 5,
        timeout_s=90,
        detail=lambda: logs(tmp_path),
    )

    # when a good model is rolled out with one canary, it reaches all five
    good = rollout(server, "1")
    eventually(
        lambda: server.rollouts.get(good).status == "completed", 90, detail=lambda: logs(tmp_path)
    )
    for device in DEVICES:
        assert server.registry.reported(device).deployment_id == good
        assert device_state(tmp_path, device)["deployment_id"] == good

    # when a model whose sha256 does not match the served file is rolled out
    bad_hash = rollout(server, "2", sha256="f" * 64)
    view = server.rollouts.get(bad_hash)
    canary = view.canaries[0]
    # then it stops at the canary, which gets the good deployment back
    eventually(lambda: server.rollouts.get(bad_hash).status == "rolled_back", 90)
    assert "does not match" in server.rollouts.get(bad_hash).error
    eventually(
        lambda: (
            server.registry.reported(canary).deployment_id == good
            and server.registry.reported(canary).status == "healthy"
        ),
        60,
        detail=lambda: logs(tmp_path),
    )

    # when a model that fails its warm-up is rolled out
    bad_warmup = rollout(server, "3")
    canary3 = server.rollouts.get(bad_warmup).canaries[0]
    eventually(lambda: server.rollouts.get(bad_warmup).status == "rolled_back", 90)
    assert "warm-up" in server.rollouts.get(bad_warmup).error
    eventually(lambda: server.registry.reported(canary3).deployment_id == good, 60)

    # and the other devices never left the good version: never sent the bad ones at all
    for bad, can in ((bad_hash, canary), (bad_warmup, canary3)):
        sent_to = {topic.split("/")[2] for topic, dep in link.published if dep == bad}
        assert sent_to == {can}
        targets = {t.device_id: t.state for t in server.rollouts.get(bad).targets}
        assert targets[can] == "rolled_back"
        assert all(state == "pending" for d, state in targets.items() if d != can)
    for device in DEVICES:
        assert device_state(tmp_path, device)["deployment_id"] == good
        assert server.registry.desired(device).deployment_id == good


def test_a_device_offline_during_the_rollout_gets_it_when_it_returns(rig) -> None:
    server, link, devices, tmp_path = rig
    server.store.add("det", "1", tiny_onnx(tmp_path / "m1" / "det.onnx", scale=1.0))
    eventually(
        lambda: sum(d.online for d in server.registry.list_devices("line")) == 5,
        timeout_s=90,
        detail=lambda: logs(tmp_path),
    )
    # given cam-04 drops off the network (its will marks it offline)
    devices.kill("cam-04")
    eventually(lambda: not server.registry.get_device("cam-04").online, timeout_s=60)

    # when a rollout runs while it is away
    dep = rollout(server, "1")
    assert server.rollouts.get(dep).canaries != ["cam-04"]  # online devices go first
    # then the four online devices apply it; the rollout waits for the fifth
    eventually(
        lambda: all(
            server.registry.reported(d) is not None
            and server.registry.reported(d).deployment_id == dep
            and server.registry.reported(d).status == "healthy"
            for d in DEVICES[:4]
        ),
        90,
        detail=lambda: logs(tmp_path),
    )
    view = server.rollouts.get(dep)
    assert view.status == "rolling"
    assert {t.device_id: t.state for t in view.targets}["cam-04"] == "sent"
    assert device_state(tmp_path, "cam-04").get("deployment_id") != dep

    # when it comes back, the retained desired state is waiting for it: nobody re-sends
    published = len(link.published)
    devices.start("cam-04")
    eventually(
        lambda: server.rollouts.get(dep).status == "completed", 90, detail=lambda: logs(tmp_path)
    )
    assert device_state(tmp_path, "cam-04")["deployment_id"] == dep
    assert server.registry.reported("cam-04").deployment_id == dep
    assert len(link.published) == published


def test_a_canary_without_a_container_runtime_does_not_pass_an_image(rig) -> None:
    server, link, devices, tmp_path = rig
    server.store.add("det", "1", tiny_onnx(tmp_path / "m1" / "det.onnx", scale=1.0))
    # given the first canary (cam-00) is an agent on the host: runtime.kind none
    devices.kill("cam-00")
    eventually(lambda: not server.registry.get_device("cam-00").online, timeout_s=60)
    devices.start("cam-00", runtime="none")
    eventually(
        lambda: sum(d.online for d in server.registry.list_devices("line")) == 5,
        timeout_s=90,
        detail=lambda: logs(tmp_path),
    )
    # when a deployment naming a new image is rolled out
    dep = rollout(server, "1")
    assert server.rollouts.get(dep).canaries == ["cam-00"]
    # then the canary says the image was not applied, and the rollout stops there
    eventually(
        lambda: server.rollouts.get(dep).status == "rolled_back", 90, detail=lambda: logs(tmp_path)
    )
    assert "image not applied" in (server.rollouts.get(dep).error or "")
    assert server.registry.reported("cam-00").status in ("not_applied", "rolled_back")
    sent_to = {topic.split("/")[2] for topic, d in link.published if d == dep}
    assert sent_to == {"cam-00"}
