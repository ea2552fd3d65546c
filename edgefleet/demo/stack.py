"""The processes of `edgefleet demo`: broker, cloud, agents, and the bytes they uplink.

Each piece is started as its own process (own session, so Ctrl-C reaches only the demo,
which stops them in order) with its log in the work folder, configured the way a real
deployment is: a Mosquitto with per-device passwords and ACLs, a cloud.yaml, and the
enrollment bundle of each device with the demo's stream and paths on top.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from edgefleet.demo.video import GroundTruth
from edgefleet.shared.errors import ConfigError, EdgefleetError
from edgefleet.shared.topics import Channel, Topics

MOSQUITTO_MISSING = (
    "The demo needs the Mosquitto MQTT broker (the `mosquitto` binary), which is not installed.\n"
    "  Debian/Ubuntu:  sudo apt-get install mosquitto mosquitto-clients\n"
    "  Fedora/RHEL:    sudo dnf install mosquitto\n"
    "  macOS:          brew install mosquitto\n"
    "or run `make demo`, which installs it. Then run `edgefleet demo` again."
)
# Where distributions install the broker when sbin is not on PATH (a plain user's shell).
MOSQUITTO_LOCATIONS = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")
# Channels a device publishes on: what counts as uplink.
UPLINK_CHANNELS = (Channel.STATUS, Channel.TELEMETRY, Channel.ESCALATIONS, Channel.REPORTED)


@dataclass
class Child:
    """A process the demo started, stopped in the reverse order of starting."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    argv: list[str] = field(default_factory=list)  # what started it: a restart repeats it
    env: dict[str, str] = field(default_factory=dict)
    nice: int = 0

    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM: a graceful shutdown) without waiting."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float) -> int | None:
        """Stop it (a repeated SIGTERM is harmless), killing it after `timeout_s`."""
        if self.alive():
            self.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Device:
    device_id: str
    bundle: Path
    video: Path
    truth: GroundTruth | None
    results: Path
    health_port: int
    agent: Child | None = None


@dataclass
class Stack:
    workdir: Path
    console: Console
    children: list[Child] = field(default_factory=list)

    def start(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, nice: int = 0
    ) -> Child:
        """Start a child with its log in the work folder; `nice` > 0 lowers its priority."""
        child = self._spawn(name, argv, env or {}, nice)
        self.children.append(child)
        return child

    def restart(self, child: Child) -> Child:
        """Start a (dead) child again the same way, in its place in the stopping order."""
        again = self._spawn(child.name, child.argv, child.env, child.nice)
        index = next((i for i, c in enumerate(self.children) if c is child), None)
        if index is None:
            self.children.append(again)
        else:
            self.children[index] = again
        return again

    def _spawn(self, name: str, argv: list[str], env: dict[str, str], nice: int) -> Child:
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env},
                cwd=self.workdir,
                # Own session: Ctrl-C reaches only the demo, which then stops the children
                # in order (agents flush their outboxes while the broker is still up).
                start_new_session=True,
            )
        if nice:
            lower_priority(process.pid, nice)
        return Child(name, process, log, argv, env, nice)

    def stop_all(self) -> None:
        for child in reversed(self.children):
            child.stop(30.0)


# ----------------------------------------------------------------- helpers


def lower_priority(pid: int, nice: int) -> None:
    """Make a child yield the CPU: its nice value, and that of its autogroup.

    Each child runs in its own session, and where the kernel groups sessions for the
    scheduler (Linux autogroup, on by default on desktops and many servers) the cores are
    first shared between groups, whatever the nice values inside them: measured here with
    8 agents at nice 10, each still got as much CPU as the cloud. The group's own nice
    (/proc/PID/autogroup) is what weighs; raising it needs no privilege.
    """
    with contextlib.suppress(OSError):  # it may have exited already: its log says why
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    with contextlib.suppress(OSError):  # no autogroup here (disabled, or not Linux)
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def mosquitto_binary() -> str:
    """Path of the broker binary; ConfigError with install instructions when missing."""
    found = shutil.which("mosquitto") or next(
        (p for p in MOSQUITTO_LOCATIONS if Path(p).is_file()),
        None,
    )
    if found is None:
        raise ConfigError("mosquitto is not installed", hint=MOSQUITTO_MISSING)
    return found


class Interrupted(EdgefleetError):
    """Ctrl-C while the demo was still starting: nothing ran yet, so nothing to report."""

    def __init__(self, what: str):
        super().__init__(f"interrupted while waiting for {what}", code="demo_interrupted")


def wait_until(
    check: Callable[[], bool],
    timeout_s: float,
    what: str,
    children: list[Child],
    stop: threading.Event | None = None,
) -> None:
    """Poll `check` until true; fail early, with its log, if a child process died, or
    with Interrupted once `stop` is set (Ctrl-C during a start-up that can take minutes)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stop is not None and stop.is_set():
            raise Interrupted(what)
        for child in children:
            if not child.alive():
                raise EdgefleetError(
                    f"{child.name} exited with code {child.process.returncode} while waiting "
                    f"for {what}; its log ({child.log}) ends with:\n{child.tail()}",
                    code="demo_failed",
                )
        if check():
            return
        time.sleep(0.25)
    raise EdgefleetError(
        f"timed out after {timeout_s:.0f} s waiting for {what}", code="demo_failed"
    )


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def edgefleet_argv(*args: str) -> list[str]:
    """The `edgefleet` command of this interpreter (works without the venv on PATH)."""
    return [sys.executable, "-m", "edgefleet", *args]


def write_cloud_config(
    workdir: Path,
    http_port: int,
    broker_port: int,
    operator_key: str,
    service_password: str,
    *,
    name: str = "cloud",
    client_id: str | None = None,
    keepalive_s: int | None = None,
) -> Path:
    """`name`.yaml for one cloud replica; replicas share the data folder (one store),
    each with its own HTTP port and, when given, its own fixed MQTT client id."""
    from edgefleet.cloud.auth import key_digest

    config: dict[str, Any] = {
        "http": {"host": "127.0.0.1", "port": http_port},
        "mqtt": {
            "host": "127.0.0.1",
            "port": broker_port,
            "username": "cloud",
            "password": service_password,
        },
        "data_dir": str(workdir / "cloud"),
        "api_keys": [{"name": "demo", "sha256": key_digest(operator_key)}],
        # One thread per model run, one frame per run: on cores the agents hold, two threads
        # cost the heavy model more CPU per frame than one (they spin and wait for each
        # other), and batches of four (padded to the largest) more than one frame at a
        # time, their first answer also waiting for the last (docs/decisions.md).
        "execution": {
            "intra_op_threads": 1,
            "inter_op_threads": 1,
            "batching": {
                "preferred_batch_size": 1,
                "max_batch_size": 1,
                "max_delay_ms": 2.0,
                "workers": 1,
            },
        },
        "telemetry": {"bucket_s": 5},
        "log_level": "WARNING",
    }
    if client_id is not None:
        config["ingest"] = {"client_id": client_id}
    if keepalive_s is not None:
        config["mqtt"]["keepalive_s"] = keepalive_s
    path = workdir / f"{name}.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    path.chmod(0o600)
    return path


# Escalations per minute the demo's cloud is given, shared by the devices: under what the
# heavy model answers on 2 shared cores beside 2-3 agents; more would queue behind it and
# come back late (or `busy`), and the backlog would hold up the final report.
CLOUD_CASES_PER_MIN = 30.0


def agent_env(
    device: Device,
    workdir: Path,
    devices: int = 1,
    broker_port: int | None = None,
    keepalive_s: int | None = None,
    resend_unanswered_s: float | None = None,
) -> dict[str, str]:
    """The demo's settings for one agent, over its enrollment bundle (EDGEFLEET_EDGE_...);
    `broker_port` points it elsewhere than the bundle says (a relay, under --chaos)."""
    state = workdir / "devices" / device.device_id
    stream = {
        "id": "cam",
        "url": str(device.video),
        "kind": "file",
        "realtime": True,
        "loop": True,
        "expect_result": True,
    }
    chaos = {}
    if broker_port is not None:
        chaos["EDGEFLEET_EDGE_MQTT__PORT"] = str(broker_port)
    if keepalive_s is not None:
        chaos["EDGEFLEET_EDGE_MQTT__KEEPALIVE_S"] = str(keepalive_s)
    if resend_unanswered_s is not None:
        chaos["EDGEFLEET_EDGE_UPLINK__RESEND_UNANSWERED_S"] = f"{resend_unanswered_s:g}"
    return chaos | {
        "EDGEFLEET_EDGE_STREAMS": json.dumps([stream]),
        "EDGEFLEET_EDGE_OUTBOX__PATH": str(state / "outbox.db"),
        "EDGEFLEET_EDGE_STATE_DIR": str(state / "state"),
        "EDGEFLEET_EDGE_HEALTH__PORT": str(device.health_port),
        "EDGEFLEET_EDGE_TELEMETRY_INTERVAL_S": "2",
        "EDGEFLEET_EDGE_POLICY__SEED": "0",
        # PP-OCR is confidently wrong on the blurred lines (scores of 0.8-0.9): for these
        # scenes "unsure" reaches up to 0.95, so the hard lines are the ones escalated.
        "EDGEFLEET_EDGE_POLICY__UNSURE_HIGH": "0.95",
        # The cloud's budget split over the devices, in small bursts.
        "EDGEFLEET_EDGE_POLICY__RATE_PER_MIN": f"{CLOUD_CASES_PER_MIN / devices:g}",
        "EDGEFLEET_EDGE_POLICY__BURST": "2",
        # Several agents share the CPU here: one inference thread each.
        "EDGEFLEET_EDGE_MODEL__EXECUTION__INTRA_OP_THREADS": "1",
        "EDGEFLEET_EDGE_MODEL__EXECUTION__INTER_OP_THREADS": "1",
    }


class UplinkMeter:
    """Counts the bytes each device publishes (topic + payload + properties), as the broker
    receives them, by listening on the device channels with the cloud's account."""

    def __init__(self, port: int, username: str, password: str, topics: Topics = Topics()):
        import paho.mqtt.client as mqtt

        self.bytes: dict[str, int] = {}
        self.messages: dict[str, int] = {}
        self._lock = threading.Lock()
        self._topics = topics
        self._subscribed = threading.Event()
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"edgefleet-demo-meter-{secrets.token_hex(3)}",
            protocol=mqtt.MQTTv5,
        )
        self.client.username_pw_set(username, password)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def wait_subscribed(self, timeout_s: float) -> bool:
        """True once the broker confirmed the subscription: from then on nothing is missed."""
        return self._subscribed.wait(timeout_s)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        client.subscribe([(self._topics.all_devices(channel), 0) for channel in UPLINK_CHANNELS])

    def _on_message(self, client: Any, userdata: Any, message: Any) -> None:
        device, _ = self._topics.parse(message.topic)
        size = len(message.topic) + len(message.payload)
        props = getattr(message, "properties", None)
        for key, value in getattr(props, "UserProperty", None) or []:
            size += len(key) + len(value)
        size += len(getattr(props, "ContentType", "") or "")
        with self._lock:
            self.bytes[device] = self.bytes.get(device, 0) + size
            self.messages[device] = self.messages.get(device, 0) + 1

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@dataclass
class Enrolled:
    bundles: dict[str, Path]
    broker_config: Path  # `mosquitto -c` this: written whole by `fleet broker-files`
    cloud_password: str


def run_fleet(args: list[str], env: dict[str, str] | None = None) -> str:
    """One `edgefleet fleet ...` command; its output, or EdgefleetError with it."""
    result = subprocess.run(
        edgefleet_argv("fleet", *args),
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        stdin=subprocess.DEVNULL,
        timeout=300,
        start_new_session=True,  # Ctrl-C must not cut an enrollment off half-written
    )
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise EdgefleetError(
            f"`edgefleet fleet {' '.join(args)}` failed ({result.returncode}):\n{output}",
            code="demo_failed",
        )
    return output


def enroll_devices(
    root: Path,
    device_ids: list[str],
    broker_port: int,
    http_port: int,
    progress: Callable[[str], None] = lambda _: None,
) -> Enrolled:
    """The real fleet path: `fleet broker-files` (the broker's config and the cloud's
    account), then `fleet enroll` per device, each writing its bundle and regenerating the
    broker's state from the registry in the cloud's store."""
    fleet_yaml = root / "fleet.yaml"
    fleet_yaml.write_text(
        json.dumps(
            {
                "data_dir": str(root / "cloud"),
                "bundles_dir": str(root / "bundles"),
                "broker_dir": str(root / "broker-auth"),
                "broker_host": "127.0.0.1",
                "broker_port": broker_port,
                "broker_bind": "127.0.0.1",
                "public_url": f"http://127.0.0.1:{http_port}",
            },
            indent=1,
        )
    )
    progress("fleet broker-files")
    run_fleet(["broker-files", "-c", str(fleet_yaml)])
    secret = root / "broker-auth" / "cloud.secret"
    try:
        cloud_password = secret.read_text().strip()
    except OSError as exc:
        raise EdgefleetError(
            f"`fleet broker-files` wrote no cloud password ({secret}: {exc.strerror})",
            code="demo_failed",
        ) from None
    bundles = {}
    for done, device_id in enumerate(device_ids):
        progress(f"fleet enroll {device_id} ({done + 1} of {len(device_ids)})")
        bundle = root / "bundles" / device_id
        # Without a container the bundle is read where it lies, not at /etc/edgefleet.
        run_fleet(
            ["enroll", device_id, "--group", "demo", "-c", str(fleet_yaml)],
            env={"EDGEFLEET_FLEET_BUNDLE_MOUNT": str(bundle)},
        )
        bundles[device_id] = bundle
    return Enrolled(bundles, root / "broker-auth" / "mosquitto.conf", cloud_password)
