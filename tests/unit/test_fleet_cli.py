"""`edgefleet fleet` commands against a real SQLite store and the real app over HTTP."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from pathlib import Path

import yaml
from cryptography import x509
from typer.testing import CliRunner

from edgefleet.cli import app
from tests.support.fleet import OPERATOR_KEY, FleetServer

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["fleet", *args], catch_exceptions=False)


def test_enroll_writes_a_private_bundle_and_broker_files(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/cloud.db"
    env = ["--db", db, "--bundles", str(tmp_path / "bundles")]
    # given a config naming the broker directory
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(f"data_dir: {tmp_path}\nbroker_host: broker.lan\nca_dir: {tmp_path / 'ca'}\n")
    result = run("enroll", "cam-01", "--group", "dock", "-c", str(cfg), *env)
    assert result.exit_code == 0, result.output
    bundle = tmp_path / "bundles" / "cam-01"
    for name in ("edge.yaml", "secrets.yaml"):
        assert stat.S_IMODE((bundle / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o700
    config = yaml.safe_load((bundle / "edge.yaml").read_text())
    secrets = yaml.safe_load((bundle / "secrets.yaml").read_text())
    assert config["device_id"] == "cam-01" and config["mqtt"]["host"] == "broker.lan"
    assert len(bytes.fromhex(secrets["device_key"])) == 32
    # the broker state has the device with a hash of exactly the bundle's password
    [client] = _broker_clients(tmp_path / "broker")
    assert client["username"] == "cam-01" and client["clientid"] == "ef-edge-cam-01"
    assert _hash_of(secrets["broker_password"], client) == client["password"]
    assert secrets["broker_password"] not in (tmp_path / "cloud.db").read_bytes().decode("latin-1")
    # enrolling again is refused with a clear error
    again = run("enroll", "cam-01", "-c", str(cfg), *env)
    assert again.exit_code == 2 and "already enrolled" in again.output
    # a bad id is refused
    bad = run("enroll", "Cam_01!", "-c", str(cfg), *env)
    assert bad.exit_code == 2 and "invalid device id" in bad.output
    # status reads the store
    table = run("status", "-c", str(cfg), "--db", db)
    assert table.exit_code == 0 and "cam-01" in table.output and "dock" in table.output
    # with a device certificate issued from the fleet CA
    assert run("ca-init", "--directory", str(tmp_path / "ca")).exit_code == 0
    issued = run("ca-issue", "cam-01", "--directory", str(tmp_path / "ca"), "--out", str(tmp_path))
    assert issued.exit_code == 0 and (tmp_path / "cam-01.crt").exists()
    # revoke removes it everywhere
    gone = run("revoke", "cam-01", "-c", str(cfg), *env)
    assert gone.exit_code == 0, gone.output
    crl = x509.load_pem_x509_crl((tmp_path / "ca" / "crl.pem").read_bytes())
    cert = x509.load_pem_x509_certificate((tmp_path / "cam-01.crt").read_bytes())
    assert crl.get_revoked_certificate_by_serial_number(cert.serial_number) is not None
    assert not bundle.exists()
    assert "cam-01" not in (tmp_path / "broker" / "dynamic-security.json").read_text()
    twice = run("revoke", "cam-01", "-c", str(cfg), *env)
    assert twice.exit_code == 2 and "not enrolled" in twice.output


def _broker_clients(folder: Path) -> list[dict]:
    return json.loads((folder / "dynamic-security.json").read_text())["clients"]


def _hash_of(password: str, client: dict) -> str:
    salt = base64.b64decode(client["salt"])
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, client["iterations"], 64)
    return base64.b64encode(digest).decode()


def test_broker_files_create_the_service_accounts_once(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/cloud.db"
    out = tmp_path / "auth"
    first = run("broker-files", "--db", db, "--out", str(out), "--emqx")
    assert first.exit_code == 0, first.output
    clients = {c["username"]: c for c in _broker_clients(out)}
    for account, secret in (("cloud", "cloud.secret"), ("ef-admin", "admin.secret")):
        password = (out / secret).read_text().strip()
        assert _hash_of(password, clients[account]) == clients[account]["password"]
        assert stat.S_IMODE((out / secret).stat().st_mode) == 0o600
    assert f"mosquitto-c{out / 'mosquitto.conf'}" in "".join(first.output.split())
    assert (out / "emqx-users.json").exists() and "{deny, all}." in (
        out / "emqx-acl.conf"
    ).read_text()
    (out / "cloud.secret").unlink()
    second = run("broker-files", "--db", db, "--out", str(out))
    assert second.exit_code == 0 and not (out / "cloud.secret").exists()
    # for a broker in another container: the folder shared with its group
    gid = os.getgid()
    shared = run("broker-files", "--db", db, "--out", str(out), "--readable-by-gid", str(gid))
    assert shared.exit_code == 0, shared.output
    for name in ("mosquitto.conf", "dynamic-security.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o660
        assert (out / name).stat().st_gid == gid


def test_deploy_and_status_through_the_api(tmp_path: Path, image_registry) -> None:
    digest = image_registry.push_manifest("acme/edge", "1.1")
    image_registry.push_manifest("acme/edge", "1.2")
    repo = f"{image_registry.domain}/acme/edge"
    server = FleetServer(tmp_path).start()
    try:
        for i in range(4):
            server.registry.enroll(f"cam-{i}", group="yard")
        api = ["--api", server.url, "--api-key", OPERATOR_KEY]
        ok = run(
            "deploy",
            "--group",
            "yard",
            "--image",
            f"{repo}:1.1",
            "--model",
            f"det@1=https://models.example/det.onnx#{'e' * 64}",
            "--canary",
            "25%",
            *api,
        )
        assert ok.exit_code == 0, ok.output
        assert "status: canary" in ok.output and len(server.sent) == 1
        # the tag was resolved once, to the digest the devices are sent
        assert f"image {repo}@{digest}" in ok.output.replace("\n", "")
        busy = run("deploy", "--group", "yard", "--image", f"{repo}:1.2", *api)
        assert busy.exit_code == 2 and "409" in busy.output and "active rollout" in busy.output
        bad = run("deploy", "--group", "yard", "--image", "edge", *api)
        assert bad.exit_code == 2 and "422" in bad.output
        unknown = run("deploy", "--group", "nowhere", "--image", "edge:1", *api)
        assert unknown.exit_code == 2 and "404" in unknown.output
        badhash = run(
            "deploy", "--group", "yard", "--image", "e:1", "--model", "d@1=https://x#zz", *api
        )
        assert badhash.exit_code == 2 and "sha256" in badhash.output
        table = run("status", *api)
        assert table.exit_code == 0 and "cam-3" in table.output and "4 devices" in table.output
        no_key = run("deploy", "--group", "yard", "--image", "edge:1", "--api", server.url)
        assert no_key.exit_code == 2 and "--api-key" in no_key.output
        # the operator rolls the active rollout back, once; the group is free again
        [active] = server.rollouts.list()
        back = run("rollback", active.id, *api)
        assert back.exit_code == 0 and "rolled_back" in back.output, back.output
        again = run("rollback", active.id, *api)
        assert again.exit_code == 2 and "409" in again.output
        assert server.rollouts.get(active.id).status == "rolled_back"
    finally:
        server.stop()


def test_deploy_flags_as_the_issue_writes_them(tmp_path: Path, image_registry) -> None:
    image_registry.push_manifest("acme/edge", "1.4.2")
    tag = f"{image_registry.domain}/acme/edge:1.4.2"
    server = FleetServer(tmp_path).start()
    try:
        for i in range(10):
            server.registry.enroll(f"cam-{i}", group="dock" if i < 5 else "yard")
        api = ["--api", server.url, "--api-key", OPERATOR_KEY]
        model = ["--model", f"det@3=https://models.example/det.onnx#{'e' * 64}"]
        # a percentage that is no number is refused before anything is sent
        bad = run("deploy", "--group", "dock", "--image", "acme/edge:1", "--canary", "ten", *api)
        assert bad.exit_code == 2 and "percentage" in bad.output
        zero = run("deploy", "--group", "dock", "--image", "acme/edge:1", "--canary", "0%", *api)
        assert zero.exit_code == 2 and "canary_percent" in zero.output
        assert server.sent == [] and server.rollouts.list() == []
        # when deployed with `--canary 10% --auto-rollback`
        ok = run(
            "deploy", "--group", "dock", "--image", tag, *model,
            "--canary", "10%", "--auto-rollback", *api,
        )  # fmt: skip
        assert ok.exit_code == 0, ok.output
        (dock,) = server.rollouts.list()
        assert dock.auto_rollback is True and len(dock.canaries) == 1
        assert dock.models[0].name == "det" and dock.models[0].version == "3"
        # and `--no-auto-rollback` turns it off
        off = run(
            "deploy", "--group", "yard", "--image", tag,
            "--canary", "40%", "--no-auto-rollback", *api,
        )  # fmt: skip
        assert off.exit_code == 0, off.output
        yard = next(d for d in server.rollouts.list() if d.group == "yard")
        assert yard.auto_rollback is False and len(yard.canaries) == 2
    finally:
        server.stop()


def test_status_table_is_coloured_by_health() -> None:
    import io

    from rich.console import Console

    from edgefleet.fleet.cli import status_table

    devices = [
        {"device_id": "cam-up", "group": "dock", "online": True, "deployment_id": "dep-1",
         "deployment_status": "healthy", "fps": 24.5, "gpu_temp": 88.0, "outbox_depth": 150,
         "last_seen": "2026-01-01T00:00:00Z"},
        {"device_id": "cam-down", "group": "dock", "online": False, "deployment_id": "dep-1",
         "deployment_status": "failed", "fps": None, "gpu_temp": None, "outbox_depth": None,
         "last_seen": None},
    ]  # fmt: skip
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="standard", width=200).print(
        status_table(devices)
    )
    text = out.getvalue()
    green, red, yellow = "\x1b[32m", "\x1b[31m", "\x1b[33m"
    assert f"{green}● online" in text and f"{red}○ offline" in text
    assert f"{green}dep-1 healthy" in text and f"{red}dep-1 failed" in text
    assert f"{red}88" in text  # hot
    assert f"{yellow}150" in text  # a growing outbox
    assert "never" in text and "2 devices" in text


def test_status_watch_refreshes_until_ctrl_c(tmp_path: Path) -> None:
    env = {**os.environ, "TTY_COMPATIBLE": "1", "FORCE_COLOR": "1", "COLUMNS": "160"}
    _watch_refreshes_until_ctrl_c(tmp_path, env)


def test_status_watch_prints_each_refresh_when_not_on_a_terminal(tmp_path: Path) -> None:
    quiet = ("TTY_COMPATIBLE", "FORCE_COLOR", "TTY_INTERACTIVE")
    env = {k: v for k, v in os.environ.items() if k not in quiet}
    _watch_refreshes_until_ctrl_c(tmp_path, {**env, "COLUMNS": "160"})


def _watch_refreshes_until_ctrl_c(tmp_path: Path, env: dict[str, str]) -> None:
    import signal
    import subprocess
    import sys
    import threading

    from edgefleet.fleet.registry import DeviceRegistry
    from edgefleet.shared.db import Database
    from tests.support.waiting import eventually

    db_url = f"sqlite:///{tmp_path}/cloud.db"
    db = Database.connect(db_url)
    registry = DeviceRegistry(db)
    registry.enroll("cam-01", group="dock")
    edgefleet = Path(sys.executable).parent / "edgefleet"
    proc = subprocess.Popen(
        [str(edgefleet), "fleet", "status", "--watch", "--interval", "0.2", "--db", db_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        # Ctrl-C as a terminal delivers it, whatever this run inherited (a background
        # job of a non-interactive shell starts with SIGINT ignored, and so would the CLI)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    output = bytearray()
    reader = threading.Thread(
        target=lambda: [
            output.extend(chunk) for chunk in iter(lambda: proc.stdout.read1(4096), b"")
        ],
        daemon=True,
    )
    reader.start()
    try:
        # given the watch shows the one device
        eventually(lambda: b"1 devices" in output, timeout_s=60, detail=lambda: output.decode())
        # when a second device is enrolled, the table refreshes by itself
        registry.enroll("cam-02", group="yard")
        eventually(lambda: b"2 devices" in output and b"cam-02" in output, timeout_s=60)
        # and Ctrl-C ends it cleanly
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, output.decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        db.close()


def test_enroll_refuses_an_owner_that_is_not_uid_gid_before_enrolling(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/cloud.db"
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(f"data_dir: {tmp_path}\nca_dir: {tmp_path / 'ca'}\n")
    env = ["-c", str(cfg), "--db", db, "--bundles", str(tmp_path / "bundles")]
    for bad in ("edgefleet", "10001:", "-1", "10001:10001:1", "4294967295"):
        refused = run("enroll", "cam-01", "--owner", bad, *env)
        assert refused.exit_code == 2 and "--owner" in refused.output, (bad, refused.output)
    # nothing was enrolled on the way: the same id enrolls now, the group defaulting to the uid
    owned = run("enroll", "cam-01", "--owner", str(os.geteuid()), *env)
    assert owned.exit_code == 0, owned.output
    bundle = tmp_path / "bundles" / "cam-01" / "secrets.yaml"
    assert (bundle.stat().st_uid, bundle.stat().st_gid) == (os.geteuid(), os.geteuid())


IMAGE = "registry.example/acme/edge@sha256:" + "ab" * 32  # pinned: nothing to resolve


def _devices_that_report(status: str):
    """A `publish` for FleetServer: every device sent a desired state reports `status`
    for it from its own thread, as a real agent's `reported` arrives over MQTT later."""
    import threading

    from edgefleet.shared.errors import EdgefleetError
    from edgefleet.shared.messages import DesiredState, ReportedState
    from tests.support.waiting import eventually

    holder: dict[str, FleetServer] = {}

    def sent(dep_id: str, device: str) -> bool:
        """The rollout has recorded that it sent `device` its state (a report that comes
        sooner finds no target to move, as for a device that never got the state)."""
        try:
            targets = holder["server"].rollouts.get(dep_id).targets
        except EdgefleetError:
            return False
        return any(t.device_id == device and t.state == "sent" for t in targets)

    def report(device: str, desired: DesiredState) -> None:
        eventually(lambda: sent(desired.deployment_id, device), 30, f"{device} sent its state")
        reported = ReportedState(
            device_id=device,
            deployment_id=desired.deployment_id,
            image=desired.image,
            running_image=desired.image,
            status=status,  # type: ignore[arg-type]
            error=None if status == "healthy" else "model failed its warm-up",
        )
        holder["server"].rollouts.on_reported(reported)

    def publish(wire, retain: bool) -> None:
        if wire.payload:
            desired = DesiredState.model_validate_json(wire.payload)
            device = wire.topic.split("/")[2]
            threading.Thread(target=report, args=(device, desired), daemon=True).start()

    return holder, publish


def test_deploy_wait_exits_non_zero_unless_the_rollout_completed(tmp_path: Path) -> None:
    for status, code, end in (("failed", 1, "rolled_back"), ("healthy", 0, "completed")):
        # given a group whose devices report `status` for what they are sent
        holder, publish = _devices_that_report(status)
        server = holder["server"] = FleetServer(tmp_path / status, publish=publish).start()
        try:
            for i in range(3):
                server.registry.enroll(f"cam-{i}", group="dock")
            api = ["--api", server.url, "--api-key", OPERATOR_KEY]
            # when deployed with --wait
            result = run(
                "deploy", "--group", "dock", "--image", IMAGE, "--canary", "34%",
                "--soak", "0", "--wait", *api,
            )  # fmt: skip
            # then the exit status says whether it completed, in readable text
            assert result.exit_code == code, result.output
            assert f"status: {end}" in result.output
            # (the in-process server's own log records share the runner's stderr)
            printed = [ln for ln in result.output.splitlines() if not ln.startswith('{"ts"')]
            assert not any("{" in ln or "'" in ln for ln in printed), result.output
        finally:
            server.stop()


def test_deploy_wait_prints_progress_as_counts_of_states() -> None:
    from edgefleet.fleet.cli import _counts

    assert _counts({"healthy": 2, "applying": 1, "failed": 0}) == "2 healthy, 1 applying"
    assert _counts({}) == "no targets"


def test_status_without_a_store_says_where_it_looked_and_creates_none(
    tmp_path: Path, monkeypatch
) -> None:
    # given a folder with no store, and a config naming another data_dir with none either
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(f"data_dir: {tmp_path / 'elsewhere'}\n")
    for args in ((), ("-c", str(cfg))):
        # when `fleet status` is run
        result = runner.invoke(app, ["fleet", "status", *args])
        # then it fails, naming the file it looked for, and creates nothing
        assert result.exit_code == 2, result.output
        assert "no device store at" in result.output and "cloud.db" in result.output
    assert not (tmp_path / "edgefleet-data").exists()
    assert not (tmp_path / "elsewhere").exists()


def test_model_add_refuses_a_file_that_is_not_onnx(tmp_path: Path) -> None:
    from tests.support.fleet import tiny_onnx

    store = tmp_path / "models"
    model = tiny_onnx(tmp_path / "det.onnx")
    not_models = {
        "notes.onnx": b"weights go here\n",
        "photo.onnx": b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4,
        "empty.onnx": b"",
        "cut.onnx": model.read_bytes()[: model.stat().st_size // 2],
    }
    for name, data in not_models.items():
        # given a file that is not an ONNX model, named as one
        (tmp_path / name).write_bytes(data)
        # when it is added, then it is refused, saying so, and nothing is stored
        result = run("model-add", "det", name, str(tmp_path / name), "--store-dir", str(store))
        assert result.exit_code == 2, (name, result.output)
        assert "is not an ONNX model" in result.output, result.output
    assert not list(store.glob("*/*/manifest.json"))
    # a real ONNX file is taken
    ok = run("model-add", "det", "1", str(model), "--store-dir", str(store))
    assert ok.exit_code == 0, ok.output
