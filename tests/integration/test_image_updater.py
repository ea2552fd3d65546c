"""The host updater against a real Docker engine and a real registry.

Agent-like images (busybox httpd serving /readyz and /metrics) are built on a base
imported here, pushed to the test registry and removed from the engine, so every update
pulls by digest for real.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

import docker
from edgefleet.bench.mosquitto import free_port
from edgefleet.edge.agent_container import AgentContainer
from edgefleet.edge.host_runtime import HostRuntime
from edgefleet.edge.image_update import ImageUpdater, Probe, SignedRequest
from edgefleet.edge.updater import DesiredStateApplier
from edgefleet.shared.image_ref import resolve_digest
from edgefleet.shared.messages import DesiredState
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import WireMessage, encode
from tests.support.docker_engine import build_agent, import_base, push
from tests.support.fleet import OnnxControl
from tests.support.waiting import eventually

pytestmark = [pytest.mark.docker, pytest.mark.slow]

DEVICE = "cam-01"
KEY = bytes(range(32))
VARIANTS = {"1": "good", "2": "good", "3": "good", "never": "never-ready", "crash": "crash"}


@pytest.fixture(scope="module")
def images(docker_client, image_registry) -> dict[str, str]:
    """Each variant's `repo@sha256:...` in the registry; none of them left in the engine."""
    import_base(docker_client)
    repository = f"{image_registry.domain}/acme/agent"
    pinned = {}
    for tag, mode in VARIANTS.items():
        build_agent(docker_client, f"{repository}:{tag}", mode, version=tag)
        push(docker_client, repository, tag)
        pinned[tag] = resolve_digest(f"{repository}:{tag}")
    for tag in VARIANTS:
        docker_client.images.remove(f"{repository}:{tag}", force=True)
    return pinned


@pytest.fixture
def rig(tmp_path: Path, docker_client):
    port = free_port()
    name = f"ef-test-agent-{secrets.token_hex(3)}"
    compose = tmp_path / "compose.yaml"
    compose.write_text(
        "name: eftest\n"
        "services:\n"
        "  edge:\n"
        "    image: set-by-the-updater\n"
        "    restart: unless-stopped\n"
        "    network_mode: host\n"
        "    read_only: true\n"
        '    user: "10001:10001"\n'
        "    cap_drop: [ALL]\n"
        "    security_opt: [no-new-privileges:true]\n"
        f'    environment: {{EF_PORT: "{port}"}}\n'
        "    volumes:\n"
        "      - state:/var/lib/edgefleet\n"
        "      - type: tmpfs\n"
        "        target: /tmp\n"
        "    stop_grace_period: 1s\n"
    )
    base = f"http://127.0.0.1:{port}"
    updater = ImageUpdater(
        docker_client,
        AgentContainer(compose),
        tmp_path / "updater",
        DEVICE,
        KEY,
        name=name,
        probe=Probe(ready_url=f"{base}/readyz", metrics_url=f"{base}/metrics"),
        deadline_s=8.0,
        min_free_bytes=1 << 20,
        poll_s=0.2,
    )
    updater.test_port, updater.test_compose = port, compose  # for a second updater process
    yield updater, base
    for suffix in ("", "-previous"):
        with contextlib.suppress(docker.errors.NotFound):  # not there: nothing to clean
            docker_client.containers.get(name + suffix).remove(force=True)


def signed(image: str, dep: str = "dep-1") -> tuple[DesiredState, WireMessage]:
    desired = DesiredState(device_id=DEVICE, deployment_id=dep, image=image)
    return desired, encode(desired, KEY, Topics().desired(DEVICE))


def request(image: str, dep: str = "dep-1") -> SignedRequest:
    return SignedRequest.of(signed(image, dep)[1])


def held(client) -> set[str]:
    return {d for img in client.images.list() for d in img.attrs.get("RepoDigests", [])}


def absent(client, image: str) -> None:
    """`image` not in the engine (an earlier test may have pulled it)."""
    if image in held(client):
        client.images.remove(image, force=True)


def served_version(base: str) -> str:
    """The version the agent on the port serves; "" while none listens (mid-swap)."""
    try:
        return httpx.get(f"{base}/version", timeout=3).text
    except httpx.TransportError:
        return ""


def test_update_and_the_rollbacks_of_a_bad_image(rig, images, docker_client) -> None:
    updater, base = rig
    # given version 1 installed by the updater
    first = updater.apply(request(images["1"]))
    assert first.outcome == "running" and first.running_image == images["1"], first.reason
    assert served_version(base) == "1"
    # when version 2 is deployed, it runs and version 1's container is gone
    second = updater.apply(request(images["2"], "dep-2"))
    assert second.outcome == "running" and served_version(base) == "2", second.reason
    names = [c.name for c in docker_client.containers.list(all=True)]
    assert updater.name in names and f"{updater.name}-previous" not in names
    # when a version that never becomes ready is deployed, version 2 comes back
    never = updater.apply(request(images["never"], "dep-3"))
    assert never.outcome == "rolled_back" and "not ready" in (never.reason or "")
    assert never.running_image == images["2"] and served_version(base) == "2"
    # when a version that crash-loops is deployed, version 2 comes back
    crash = updater.apply(request(images["crash"], "dep-4"))
    assert crash.outcome == "rolled_back" and "crash loop" in (crash.reason or "")
    assert crash.running_image == images["2"] and served_version(base) == "2"
    # when version 3 follows, images older than the previous one (version 1) are pruned
    third = updater.apply(request(images["3"], "dep-5"))
    assert third.outcome == "running" and served_version(base) == "3"
    kept = held(docker_client)
    assert images["3"] in kept and images["2"] in kept and images["1"] not in kept
    assert updater.files.journal() == {
        "current": images["3"],
        "previous": images["2"],
        "pending": None,
    }


def test_a_tampered_or_unpinned_image_is_refused_before_a_pull(rig, images, docker_client):
    updater, _ = rig
    absent(docker_client, images["2"])
    # when the signed payload's digest is swapped for another image's
    signed = request(images["1"])
    wire = signed.wire()
    forged = wire.payload.replace(images["1"].encode(), images["2"].encode())
    tampered = SignedRequest.of(WireMessage(wire.topic, forged, wire.user_properties))
    status = updater.apply(tampered)
    # then it is refused, nothing was pulled and nothing runs
    assert status.outcome == "refused" and "refused" in (status.reason or "")
    assert images["2"] not in held(docker_client)
    assert status.running_image is None
    # an image named by tag only is refused too, even when signed
    tag = images["1"].split("@")[0] + ":1"
    unpinned = updater.apply(request(tag))
    assert unpinned.outcome == "refused" and "digest" in (unpinned.reason or "")


def test_no_disk_space_is_refused_before_pulling(rig, images, docker_client) -> None:
    updater, _ = rig
    absent(docker_client, images["1"])
    updater.images.min_free_bytes = 1 << 60  # more than any disk has
    status = updater.apply(request(images["1"]))
    assert status.outcome == "refused" and "MiB free" in (status.reason or "")
    assert images["1"] not in held(docker_client)


def test_the_agent_reports_what_the_host_updater_proved(rig, images, tmp_path: Path) -> None:
    updater, base = rig
    assert updater.apply(request(images["1"])).outcome == "running"
    stop = threading.Event()

    def serve() -> None:  # the updater's loop, as `edgefleet edge updater` runs it
        while not stop.wait(0.2):
            updater.handle_request()

    def agent(own: str, name: str):
        reports: list = []
        runtime = HostRuntime(updater.files.folder, own_image=own, answer_timeout_s=60, poll_s=0.1)
        applier = DesiredStateApplier(OnnxControl(reports.append), tmp_path / name, runtime)
        return applier, runtime, reports

    service = threading.Thread(target=serve, daemon=True)
    service.start()
    try:
        # when the agent of version 1 gets version 2's signed desired state, it hands it over
        old, old_runtime, old_reports = agent(images["1"], "old")
        desired, wire = signed(images["2"], "dep-2")
        handing = threading.Thread(target=old.handle, args=(desired, wire))
        handing.start()
        eventually(lambda: served_version(base) == "2", 60, "version 2 serving")
        # and is stopped (the updater stops its container): it said `applying`, nothing more
        old_runtime.stop_waiting()
        handing.join(timeout=30)
        assert not handing.is_alive() and [r.status for r in old_reports] == ["applying"]
        # then the agent of version 2 reports healthy once the updater has proved it
        new, _, reports = agent(images["2"], "new")
        new.handle(desired, signed=wire)
        assert reports[-1].status == "healthy" and reports[-1].running_image == images["2"]
        # when version 2's agent is sent the crash-looping image, it is rolled back under it
        bad, bad_wire = signed(images["crash"], "dep-3")
        new.handle(bad, signed=bad_wire)
        last = reports[-1]
        assert last.status == "failed" and "crash loop" in (last.error or "")
        assert last.running_image == images["2"] and served_version(base) == "2"
    finally:
        stop.set()
        service.join(timeout=30)


def test_an_updater_killed_mid_update_recovers_to_one_running_version(
    rig, images, docker_client, tmp_path: Path
) -> None:
    updater, base = rig
    assert updater.apply(request(images["1"])).outcome == "running"
    # given an updater process applying an image that never gets ready (a long deadline)
    ask = tmp_path / "request.json"
    ask.write_text(request(images["never"], "dep-2").model_dump_json())
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "tests.support.updater_process"),
            *("--engine", docker_client.test_base_url),
            *("--compose", str(updater.test_compose), "--folder", str(updater.files.folder)),
            *("--name", updater.name, "--device", DEVICE, "--key", KEY.hex()),
            *("--port", str(updater.test_port), "--request", str(ask)),
        ],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        # when it is killed once the new container runs and the old one is stopped
        eventually(
            lambda: (
                (updater.files.journal().get("pending") or {}).get("image") == images["never"]
                and any(
                    c.labels.get("io.edgefleet.image") == images["never"]
                    for c in docker_client.containers.list()
                )
            ),
            60,
            "the never-ready container running",
        )
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # then the next start recovers: one agent, the previous version, nothing pending
    updater.recover()
    agents = [
        c
        for c in docker_client.containers.list(all=True)
        if c.name in (updater.name, f"{updater.name}-previous")
    ]
    assert [(c.name, c.status) for c in agents] == [(updater.name, "running")]
    assert agents[0].labels["io.edgefleet.image"] == images["1"]
    eventually(lambda: served_version(base) == "1", 30, "version 1 serving again")
    assert updater.files.journal()["pending"] is None
    status = updater.files.status_file.read_text()
    assert "rolled_back" in status and "stopped during the update" in status
