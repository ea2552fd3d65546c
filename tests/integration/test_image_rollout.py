"""A fleet rollout of container images, end to end: fleet API → signed retained desired
state over a real Mosquitto → device process (`runtime.kind: host`) → host updater →
real Docker engine and registry → the agent's report → the rollout's state machine.

On a device the agent is its container, so here each device process is restarted as the
image its container runs whenever the updater swaps it (what the container swap does).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import docker
from edgefleet.bench.mosquitto import free_port
from edgefleet.edge.agent_container import AgentContainer
from edgefleet.edge.image_update import ImageUpdater, Probe, SignedRequest
from edgefleet.shared.messages import DesiredState
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import encode
from tests.support.cloud_link import CloudLink
from tests.support.docker_engine import build_agent, import_base, push
from tests.support.fleet import FleetServer, fleet_broker
from tests.support.waiting import eventually

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
DEVICES = ["cam-00", "cam-01"]
VARIANTS = {"1": "good", "2": "good", "crash": "crash"}


class Device:
    """One device: its updater, its agent container, and the agent process of that image."""

    def __init__(self, device, enrollment, client, tmp_path: Path, broker_port: int):
        self.device, self.enrollment, self.client = device, enrollment, client
        self.folder, self.broker_port = tmp_path / device, broker_port
        self.folder.mkdir()
        port = free_port()
        compose = self.folder / "compose.yaml"
        compose.write_text(
            "name: efrollout\nservices:\n  edge:\n    image: x\n    restart: unless-stopped\n"
            f'    network_mode: host\n    environment: {{EF_PORT: "{port}"}}\n'
            "    stop_grace_period: 1s\n"
        )
        base = f"http://127.0.0.1:{port}"
        self.name = f"ef-rollout-{device}"
        self.updater = ImageUpdater(
            client,
            AgentContainer(compose),
            self.folder / "updater",
            device,
            enrollment.device_key,
            name=self.name,
            probe=Probe(ready_url=f"{base}/readyz", metrics_url=f"{base}/metrics"),
            deadline_s=8.0,
            min_free_bytes=1 << 20,
            poll_s=0.2,
        )
        self.image: str | None = None
        self.proc: subprocess.Popen | None = None

    def install(self, image: str) -> None:
        desired = DesiredState(device_id=self.device, deployment_id="dep-install", image=image)
        wire = encode(desired, self.enrollment.device_key, Topics().desired(self.device))
        assert self.updater.apply(SignedRequest.of(wire)).outcome == "running"

    def follow(self) -> None:
        """The updater's loop, and the agent process restarted as its container's image."""
        self.updater.handle_request()
        try:
            container = self.client.containers.get(self.name)
        except docker.errors.NotFound:
            return
        image = container.labels.get("io.edgefleet.image")
        if container.status == "running" and image != self.image:
            self.stop()
            self.start(image)

    def start(self, image: str) -> None:
        self.image = image
        log = open(self.folder / "agent.log", "ab")  # noqa: SIM115  # the process keeps it
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "tests.support.fleet_device", "--device", self.device),
                *("--key", self.enrollment.device_key.hex(), "--port", str(self.broker_port)),
                f"--password={self.enrollment.broker_password}",
                *("--state", str(self.folder / "state"), "--runtime=host"),
                *("--updater-dir", str(self.folder / "updater")),
            ],
            cwd=REPO,
            env={**os.environ, "EDGEFLEET_IMAGE": image},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            self.proc = None

    def remove(self) -> None:
        self.stop()
        for suffix in ("", "-previous"):
            with contextlib.suppress(docker.errors.NotFound):
                self.client.containers.get(self.name + suffix).remove(force=True)


@pytest.fixture
def fleet(tmp_path: Path, docker_client, image_registry):
    import_base(docker_client)
    repository = f"{image_registry.domain}/acme/fleet-agent"
    for tag, mode in VARIANTS.items():
        build_agent(docker_client, f"{repository}:{tag}", mode, version=tag)
        push(docker_client, repository, tag)
        docker_client.images.remove(f"{repository}:{tag}", force=True)
    server = FleetServer(tmp_path / "cloud", publish=lambda w, r: link.publish(w, r)).start()
    enrollments = {d: server.registry.enroll(d, group="line") for d in DEVICES}
    cloud_password = server.registry.accounts.ensure_service("cloud")  # before the broker files
    broker = fleet_broker(server.registry, tmp_path / "broker")
    link = CloudLink(server, broker.port, cloud_password).start()
    devices = {d: Device(d, enrollments[d], docker_client, tmp_path, broker.port) for d in DEVICES}
    stop = threading.Event()

    errors: list[BaseException] = []

    def loop() -> None:
        while not stop.wait(0.2):
            for device in devices.values():
                try:
                    device.follow()
                except Exception as exc:  # surfaced by the test's waits
                    errors.append(exc)
                    raise

    worker = threading.Thread(target=loop, daemon=True)
    try:
        from edgefleet.shared.image_ref import resolve_digest

        first = resolve_digest(f"{repository}:1")
        for device in devices.values():
            device.install(first)
        worker.start()
        yield server, link, devices, repository, errors
    finally:
        stop.set()
        worker.join(timeout=30)
        for device in devices.values():
            device.remove()
        link.stop()
        broker.kill()
        server.stop()


def logs(devices: dict[str, Device], errors: list[BaseException] | None = None) -> str:
    return repr(errors or []) + "\n".join(
        (d.folder / "agent.log").read_text()[-1500:]
        for d in devices.values()
        if (d.folder / "agent.log").exists()
    )


def test_a_good_image_reaches_the_fleet_and_a_crashing_one_stops_at_the_canary(fleet) -> None:
    server, link, devices, repository, errors = fleet
    eventually(
        lambda: sum(d.online for d in server.registry.list_devices("line")) == 2,
        60,
        detail=lambda: logs(devices, errors),
    )
    # when version 2 is rolled out by tag, one canary first
    good = server.rollouts.create(
        {"group": "line", "image": f"{repository}:2", "soak_s": 0, "canary_percent": 50}
    )
    pinned = good.image
    assert "@sha256:" in pinned and good.image_requested == f"{repository}:2"
    # then each device's updater runs it and each agent of version 2 reports it healthy
    eventually(
        lambda: server.rollouts.get(good.id).status == "completed",
        120,
        detail=lambda: logs(devices, errors),
    )
    for device in DEVICES:
        reported = server.registry.reported(device)
        assert reported.status == "healthy" and reported.running_image == pinned
        assert server.registry.list_devices("line")[DEVICES.index(device)].running_image == pinned

    # when an image that crash-loops is rolled out
    bad = server.rollouts.create(
        {"group": "line", "image": f"{repository}:crash", "soak_s": 0, "canary_percent": 50}
    )
    (canary,) = bad.canaries
    # then the canary's updater rolls it back, and the rollout is rolled back with the reason
    eventually(
        lambda: server.rollouts.get(bad.id).status == "rolled_back",
        120,
        detail=lambda: logs(devices, errors),
    )
    assert "crash loop" in (server.rollouts.get(bad.id).error or "")
    eventually(
        lambda: (
            server.registry.reported(canary).deployment_id == good.id
            and server.registry.reported(canary).status == "healthy"
        ),
        60,
        detail=lambda: logs(devices, errors),
    )
    assert devices[canary].image == pinned
    # and the other device was never sent the bad image
    sent_to = {topic.split("/")[2] for topic, dep in link.published if dep == bad.id}
    assert sent_to == {canary}
