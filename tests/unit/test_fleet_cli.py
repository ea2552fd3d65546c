"""`edgefleet fleet` commands against a real SQLite store and the real app over HTTP."""

from __future__ import annotations

import stat
from pathlib import Path

import yaml
from cryptography import x509
from typer.testing import CliRunner

from edgefleet.cli import app
from fleet.credentials import verify_mosquitto_hash
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
    # the broker file has the device with a hash of exactly the bundle's password
    line = (tmp_path / "broker" / "passwords").read_text().strip()
    user, encoded = line.split(":", 1)
    assert user == "cam-01" and verify_mosquitto_hash(secrets["broker_password"], encoded)
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
    assert "cam-01" not in (tmp_path / "broker" / "passwords").read_text()
    assert "cam-01" not in (tmp_path / "broker" / "acl").read_text()
    twice = run("revoke", "cam-01", "-c", str(cfg), *env)
    assert twice.exit_code == 2 and "not enrolled" in twice.output


def test_broker_files_create_the_cloud_account_once(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/cloud.db"
    out = tmp_path / "auth"
    first = run("broker-files", "--db", db, "--out", str(out), "--emqx")
    assert first.exit_code == 0, first.output
    password = (out / "cloud.secret").read_text().strip()
    user, encoded = (out / "passwords").read_text().strip().split(":", 1)
    assert user == "cloud" and verify_mosquitto_hash(password, encoded)
    assert (out / "emqx-users.json").exists() and "{deny, all}." in (
        out / "emqx-acl.conf"
    ).read_text()
    (out / "cloud.secret").unlink()
    second = run("broker-files", "--db", db, "--out", str(out))
    assert second.exit_code == 0 and not (out / "cloud.secret").exists()


def test_deploy_and_status_through_the_api(tmp_path: Path) -> None:
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
            "ghcr.io/acme/edge:1.1",
            "--model",
            f"det@1=https://models.example/det.onnx#{'e' * 64}",
            "--canary",
            "25%",
            *api,
        )
        assert ok.exit_code == 0, ok.output
        assert "status: canary" in ok.output and len(server.sent) == 1
        busy = run("deploy", "--group", "yard", "--image", "ghcr.io/acme/edge:1.2", *api)
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
    finally:
        server.stop()
