"""A bundle from `edgefleet fleet enroll`, read by the agent running as the images' user
(uid 10001): given to it with `--owner`, the agent starts and comes online on a real
broker; left to root, it exits saying which file refuses it and why."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from edgefleet.cli import app
from edgefleet.shared.messages import DeviceStatus
from edgefleet.shared.mqtt import MqttSettings, connect, from_paho, make_client
from edgefleet.shared.topics import Channel, Topics
from edgefleet.shared.wire import Verifier
from tests.support.broker import MosquittoBroker
from tests.support.waiting import eventually

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as uid 10001")

UID = 10001
AS_CONTAINER_USER = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups"]


@pytest.fixture
def host() -> Iterator[Path]:
    """A folder uid 10001 can enter (pytest's own tmp folders are root's, mode 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="edgefleet-bundle-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder)


def _enroll(host: Path, device: str, *owner: str) -> Path:
    data = host / "fleet"
    data.mkdir(exist_ok=True)
    cfg = host / "fleet.yaml"
    cfg.write_text(f"data_dir: {data}\nca_dir: {data / 'ca'}\n")
    bundles = host / "bundles"
    store = ["-c", str(cfg), "--db", f"sqlite:///{data}/fleet.db", "--bundles", str(bundles)]
    result = CliRunner().invoke(
        app, ["fleet", "enroll", device, *store, *owner], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    bundles.chmod(0o755)  # the host folder holding the bundles, as a mount would
    return bundles / device


def _agent(host: Path, bundle: Path, broker: MosquittoBroker) -> subprocess.Popen[bytes]:
    """`edgefleet edge run` as uid 10001 on the bundle, with a state folder of its own
    (the image's volume) and the broker of this test."""
    home = host / "home"
    home.mkdir(exist_ok=True)
    os.chown(home, UID, UID)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "EDGEFLEET_EDGE_DEVICE_KEY_FILE": str(bundle / "secrets.yaml"),
        "EDGEFLEET_EDGE_STATE_DIR": str(home / "state"),
        "EDGEFLEET_EDGE_MQTT__HOST": broker.host,
        "EDGEFLEET_EDGE_MQTT__PORT": str(broker.port),
        "EDGEFLEET_EDGE_HEALTH__PORT": "0",
    }
    command = [sys.executable, "-m", "edgefleet", "edge", "run", "--no-json-logs"]
    return subprocess.Popen(
        [*AS_CONTAINER_USER, *command, "-c", str(bundle / "edge.yaml")],
        cwd=home,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(host / "agent.log").open("ab"),
    )


def test_a_bundle_root_owns_is_refused_with_the_owner_and_the_uid(host: Path, broker):
    bundle = _enroll(host, "cam-root")
    agent = _agent(host, bundle, broker)
    agent.wait(timeout=120)
    text = (host / "agent.log").read_text()
    assert agent.returncode == 2, text
    assert f"the folder {bundle} is owned by uid 0 (gid 0) with mode 0700" in text, text
    assert f"this process runs as uid {UID}" in text and "Traceback" not in text
    assert f"--owner {UID}:{UID}" in text  # the hint names the fix


def test_a_key_file_root_took_back_is_named_with_its_owner(host: Path, broker):
    bundle = _enroll(host, "cam-key", "--owner", f"{UID}:{UID}")
    secrets = bundle / "secrets.yaml"
    os.chown(secrets, 0, 0)  # e.g. copied over again without keeping its owner
    agent = _agent(host, bundle, broker)
    agent.wait(timeout=120)
    text = (host / "agent.log").read_text()
    assert agent.returncode == 2, text
    assert f"the file {secrets} is owned by uid 0 (gid 0) with mode 0600" in text, text
    assert "Traceback" not in text


def test_a_bundle_enrolled_with_owner_runs_as_the_container_user(host: Path, broker):
    bundle = _enroll(host, "cam-owned", "--owner", f"{UID}:{UID}")
    for path in (bundle, bundle / "edge.yaml", bundle / "secrets.yaml"):
        assert (path.stat().st_uid, path.stat().st_gid) == (UID, UID)
    key = bytes.fromhex(yaml.safe_load((bundle / "secrets.yaml").read_text())["device_key"])
    online = threading.Event()
    verifier = Verifier(key_for_device=lambda d: key if d == "cam-owned" else None)

    def on_message(client, userdata, message) -> None:
        status = verifier.verify(from_paho(message)).message
        if isinstance(status, DeviceStatus) and status.state == "online":
            online.set()

    settings = MqttSettings(host=broker.host, port=broker.port)
    watcher = make_client(settings, "test-bundle-owner")
    watcher.on_message = on_message
    watcher.on_connect = lambda client, *_: client.subscribe(
        Topics().for_device("cam-owned", Channel.STATUS), 1
    )
    connect(watcher, settings, clean_start=True)
    agent = _agent(host, bundle, broker)
    try:
        eventually(lambda: online.is_set() or agent.poll() is not None, 180, "cam-owned online")
        assert agent.poll() is None, (host / "agent.log").read_text()[-3000:]
    finally:
        agent.terminate()
        agent.wait(timeout=60)
        watcher.disconnect()
        watcher.loop_stop()
