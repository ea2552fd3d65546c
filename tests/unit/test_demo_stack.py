"""The demo's stack pieces against the real things: the fleet CLI, Mosquitto, the settings.

The end-to-end run (tests/e2e/test_demo.py) shows the whole works; these pin the parts a
typo would silently break: a misspelt EDGEFLEET_EDGE_ variable is ignored by
pydantic-settings, a cloud.yaml key the cloud does not know stops it at start, and the
broker must accept exactly the accounts `edgefleet fleet` created.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
import yaml
from rich.console import Console

from edgefleet.cloud.settings import CloudSettings
from edgefleet.demo.stack import (
    Device,
    Interrupted,
    Stack,
    UplinkMeter,
    agent_env,
    enroll_devices,
    mosquitto_binary,
    port_open,
    wait_until,
    write_cloud_config,
)
from edgefleet.shared.config import load_settings
from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.mqtt import device_client_id
from edgefleet.shared.ports import free_port
from tests.support.docker_files import EDGE, assert_env_sets_real_settings
from tests.support.waiting import eventually


def test_agent_environment_names_real_edge_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    device = Device("cam-01", tmp_path, tmp_path / "v.mp4", None, tmp_path / "r.jsonl", 8123)
    env = agent_env(device, tmp_path)
    # every variable lands in a real setting (streams is JSON: compared separately)
    streams = env.pop("EDGEFLEET_EDGE_STREAMS")
    assert assert_env_sets_real_settings([EDGE], env, monkeypatch) == len(env)
    monkeypatch.setenv("EDGEFLEET_EDGE_STREAMS", streams)
    settings = load_settings(EDGE.cls, None, **EDGE.required)
    assert [(s.id, s.url, s.loop) for s in settings.streams] == [("cam", str(device.video), True)]
    assert settings.outbox.path.parent == tmp_path / "devices" / "cam-01"


def test_chaos_agent_environment_names_real_edge_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # under --chaos an agent may reach the broker through a relay, with a short keepalive
    device = Device("cam-01", tmp_path, tmp_path / "v.mp4", None, tmp_path / "r.jsonl", 8123)
    env = agent_env(device, tmp_path, broker_port=24001, keepalive_s=5, resend_unanswered_s=30)
    env.pop("EDGEFLEET_EDGE_STREAMS")
    assert assert_env_sets_real_settings([EDGE], env, monkeypatch) == len(env)
    settings = load_settings(EDGE.cls, None, **EDGE.required)
    assert (settings.mqtt.port, settings.mqtt.keepalive_s) == (24001, 5)
    assert settings.uplink.resend_unanswered_s == 30


def test_a_second_cloud_replica_config_is_accepted_by_the_real_settings(tmp_path: Path) -> None:
    path = write_cloud_config(
        tmp_path,
        18081,
        11883,
        "efk_operator",
        "pw",
        name="cloud-b",
        client_id="demo-cloud-b",
        keepalive_s=5,
    )
    assert path.name == "cloud-b.yaml"
    settings = load_settings(CloudSettings, path)
    assert settings.ingest.client_id == "demo-cloud-b" and settings.mqtt.keepalive_s == 5
    assert settings.data_dir == tmp_path / "cloud"  # the same store as the first replica


def test_cloud_config_is_accepted_by_the_real_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write_cloud_config(tmp_path, 18080, 11883, "efk_operator", "pw")
    settings = load_settings(CloudSettings, path)
    assert (settings.http.port, settings.mqtt.port, settings.mqtt.password) == (18080, 11883, "pw")
    assert settings.data_dir == tmp_path / "cloud"
    assert path.stat().st_mode & 0o077 == 0  # it holds the broker password


def test_wait_until_reports_a_child_that_died_with_its_log(tmp_path: Path) -> None:
    stack = Stack(tmp_path, Console())
    child = stack.start("crasher", [sys.executable, "-c", "print('boom: bad config'); exit(3)"])
    child.process.wait(60)
    with pytest.raises(EdgefleetError, match=r"(?s)crasher exited with code 3.*boom: bad config"):
        wait_until(lambda: False, 60, "something", [child])


def test_wait_until_gives_up_on_ctrl_c(tmp_path: Path) -> None:
    # given a child that is alive and a check that is never true
    stack = Stack(tmp_path, Console())
    child = stack.start("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"])
    stop = threading.Event()
    stop.set()  # when Ctrl-C was pressed
    try:
        # then the wait ends at once, not after the timeout, as Interrupted
        with pytest.raises(Interrupted, match="interrupted while waiting for the cloud"):
            wait_until(lambda: False, 600, "the cloud", [child], stop)
    finally:
        stack.stop_all()
    assert not child.alive()


@pytest.mark.slow
def test_fleet_enrolled_devices_reach_the_demo_broker_and_are_metered(tmp_path: Path) -> None:
    try:
        binary = mosquitto_binary()
    except EdgefleetError:
        pytest.skip("mosquitto is not installed")
    # given two devices enrolled through the real `edgefleet fleet` commands
    port = free_port()
    enrolled = enroll_devices(tmp_path, ["cam-01", "cam-02"], port, free_port())
    bundle = yaml.safe_load((enrolled.bundles["cam-01"] / "edge.yaml").read_text())
    assert bundle["device_id"] == "cam-01" and bundle["mqtt"]["port"] == port
    assert bundle["device_key_file"] == str(enrolled.bundles["cam-01"] / "secrets.yaml")
    # and the demo's broker on the files `fleet` generated
    stack = Stack(tmp_path, Console())
    broker = stack.start("mosquitto", [binary, "-c", str(enrolled.broker_config)])
    try:
        wait_until(lambda: port_open(port), 30, "the broker", [broker])
        meter = UplinkMeter(port, "cloud", enrolled.cloud_password)
        try:
            assert meter.wait_subscribed(30), "the broker never confirmed the subscription"
            # when cam-01 publishes on its own telemetry topic with its bundle's password
            device = _connected(port, "cam-01", bundle["mqtt"]["password"])
            info = device.publish("ef/v1/cam-01/telemetry", b"x" * 100, qos=1)
            info.wait_for_publish(30)
            device.disconnect()
            device.loop_stop()
            # then the meter, subscribed with the cloud's account, counted its bytes
            eventually(
                lambda: meter.bytes.get("cam-01", 0) >= 100,
                30,
                "the meter to count cam-01's bytes",
                detail=lambda: (meter.bytes, meter.messages),
            )
            assert meter.bytes["cam-01"] >= 100 + len("ef/v1/cam-01/telemetry")
            assert meter.messages["cam-01"] >= 1
        finally:
            meter.close()
        # and a wrong password is refused
        with pytest.raises(ConnectionRefusedError):
            _connected(port, "cam-01", "not-the-password")
    finally:
        stack.stop_all()


def _connected(port: int, username: str, password: str) -> mqtt.Client:
    done = threading.Event()
    codes: list[int] = []

    def on_connect(client, userdata, flags, reason_code, properties):  # type: ignore[no-untyped-def]
        codes.append(reason_code.value)
        done.set()

    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=device_client_id(username),
        protocol=mqtt.MQTTv5,
    )
    client.username_pw_set(username, password)
    client.on_connect = on_connect
    client.connect("127.0.0.1", port)
    client.loop_start()
    assert done.wait(30), "no CONNACK"
    if codes[0] != 0:
        client.loop_stop()
        raise ConnectionRefusedError(codes[0])
    return client


def test_a_missing_mosquitto_says_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from edgefleet.cli import app
    from edgefleet.demo import stack as demo_stack

    # given a machine without the broker: nothing on PATH, nothing in sbin
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(demo_stack, "MOSQUITTO_LOCATIONS", (str(tmp_path / "sbin/mosquitto"),))
    with pytest.raises(EdgefleetError, match="mosquitto is not installed"):
        mosquitto_binary()
    # when the demo starts
    result = CliRunner().invoke(app, ["demo", "--workdir", str(tmp_path / "w")])
    # then it stops at once with the install commands, before starting or writing anything
    assert result.exit_code == 2, result.output
    assert "sudo apt-get install mosquitto" in result.output
    assert "brew install mosquitto" in result.output
    assert not (tmp_path / "w").exists()


@pytest.mark.timeout(120)
def test_ctrl_c_skips_waiting_for_the_clouds_late_answers(tmp_path: Path) -> None:
    import httpx

    from edgefleet.demo.cli import _collect_cases

    # given a device with an escalated case and a cloud that does not answer (nothing listens)
    results = tmp_path / "results.jsonl"
    results.write_text('{"kind": "escalated", "case_id": "c-1", "stream_id": "cam"}\n')
    device = Device("cam-01", tmp_path, tmp_path / "v.mp4", None, results, free_port())
    skip = threading.Event()
    skip.set()  # when Ctrl-C is pressed while the demo waits for the answers
    with httpx.Client(base_url=f"http://127.0.0.1:{free_port()}", timeout=1.0) as http:
        # then it reports with what it has instead of waiting out the (here 10-minute) limits
        cases = _collect_cases(http, [device], Console(), skip, timeout_s=600, quiet_s=600)
    assert cases == {}


@pytest.mark.parametrize(
    "args",
    [["--devices", "0"], ["--devices", "17"], ["--duration", "1"], ["--port", "70000"]],
)
def test_out_of_range_options_are_refused_before_anything_starts(
    tmp_path: Path, args: list[str]
) -> None:
    from typer.testing import CliRunner

    from edgefleet.cli import app

    result = CliRunner().invoke(app, ["demo", *args, "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 2, result.output
    assert "Invalid value" in result.output and args[0] in result.output
    assert not (tmp_path / "w").exists()


def test_a_child_started_nice_yields_in_its_own_session_group_too(tmp_path: Path) -> None:
    import psutil

    # given a child started the way the demo starts its agents (own session, nice 7)
    stack = Stack(tmp_path, Console())
    child = stack.start("agent", [sys.executable, "-c", "import time; time.sleep(600)"], nice=7)
    try:
        # then the process is niced, and so is its autogroup where the kernel has one
        # (a session's group is what the scheduler weighs first)
        assert psutil.Process(child.process.pid).nice() == 7
        group = Path(f"/proc/{child.process.pid}/autogroup")
        if group.exists():
            assert group.read_text().split()[-1] == "7"
    finally:
        stack.stop_all()


@pytest.mark.parametrize("devices", range(1, 17))
def test_the_agents_together_weigh_no_more_than_the_cloud(devices: int) -> None:
    from edgefleet.demo.steps import agent_niceness

    nice = agent_niceness(devices)
    # the scheduler's weight falls by about 1.25 per nice step (1024 at 0, 110 at 10)
    assert devices * 1.25**-nice <= 1.0
    assert nice == 0 or devices * 1.25 ** -(nice - 1) > 1.0  # and no more than needed
