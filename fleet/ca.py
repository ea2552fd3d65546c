"""Optional mutual TLS: a small CA that issues device client certificates, and a CRL.

`DeviceCA(dir).init()` makes an EC P-256 CA; `issue_device(id)` a client certificate
whose CN is the device id (with `use_identity_as_username true` Mosquitto takes it as
the username, so the generated ACL applies unchanged); `issue_server(hosts)` the
broker's own certificate; `revoke(id)` adds the device's certificates to the CRL that
the listener config points at. Keys are written 0600.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edgefleet.fleet.acl import write_private
from edgefleet.fleet.devices import validate_device_id
from edgefleet.shared.errors import ConfigError, NotFound
from edgefleet.shared.messages import utcnow


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "edgefleet"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


class DeviceCA:
    """A file-backed CA: `ca.crt`, `ca.key`, `crl.pem` and `issued.json` in `directory`."""

    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.cert_path = self.dir / "ca.crt"
        self.key_path = self.dir / "ca.key"
        self.crl_path = self.dir / "crl.pem"
        self.issued_path = self.dir / "issued.json"

    @property
    def exists(self) -> bool:
        return self.cert_path.exists() and self.key_path.exists()

    def init(self, common_name: str = "edgefleet device CA", days: int = 3650) -> Path:
        if self.exists:
            raise ConfigError(f"a CA exists in {self.dir}; refusing to overwrite it")
        self.dir.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        now = utcnow()
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(_name(common_name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        write_private(self.key_path, _key_pem(key))
        self.cert_path.write_text(cert.public_bytes(serialization.Encoding.PEM).decode())
        self.issued_path.write_text("{}")
        self._write_crl([])
        return self.cert_path

    def _load(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        if not self.exists:
            raise ConfigError(f"no CA in {self.dir}", hint="run `edgefleet fleet ca init` first")
        cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        key = serialization.load_pem_private_key(self.key_path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return cert, key

    def _issued(self) -> dict[str, list[dict[str, Any]]]:
        return json.loads(self.issued_path.read_text()) if self.issued_path.exists() else {}

    def _issue(
        self,
        common_name: str,
        out_dir: Path,
        *,
        usage: x509.ObjectIdentifier,
        sans: list[x509.GeneralName],
        days: int,
    ) -> tuple[Path, Path, int]:
        ca_cert, ca_key = self._load()
        key = ec.generate_private_key(ec.SECP256R1())
        now = utcnow()
        serial = x509.random_serial_number()
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(serial)
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        out_dir.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = out_dir / f"{common_name}.crt", out_dir / f"{common_name}.key"
        cert_path.write_text(cert.public_bytes(serialization.Encoding.PEM).decode())
        write_private(key_path, _key_pem(key))
        return cert_path, key_path, serial

    def issue_device(self, device_id: str, out_dir: Path, days: int = 825) -> tuple[Path, Path]:
        """Client certificate + key for `device_id` (CN = device id, clientAuth)."""
        validate_device_id(device_id)
        cert, key, serial = self._issue(
            device_id, out_dir, usage=ExtendedKeyUsageOID.CLIENT_AUTH, sans=[], days=days
        )
        issued = self._issued()
        issued.setdefault(device_id, []).append({"serial": serial, "revoked": False})
        self.issued_path.write_text(json.dumps(issued, indent=2))
        return cert, key

    def issue_server(self, hosts: list[str], out_dir: Path, days: int = 825) -> tuple[Path, Path]:
        """The broker's certificate, valid for `hosts` (DNS names or IP addresses)."""
        import ipaddress

        sans: list[x509.GeneralName] = []
        for host in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                sans.append(x509.DNSName(host))
        cert, key, _ = self._issue(
            "broker", out_dir, usage=ExtendedKeyUsageOID.SERVER_AUTH, sans=sans, days=days
        )
        return cert, key

    def revoke(self, device_id: str) -> int:
        """Put every certificate of the device on the CRL; how many were added."""
        issued = self._issued()
        if device_id not in issued:
            raise NotFound(f"no certificate was issued to {device_id!r}")
        added = 0
        for entry in issued[device_id]:
            if not entry["revoked"]:
                entry["revoked"] = True
                added += 1
        self.issued_path.write_text(json.dumps(issued, indent=2))
        serials = [e["serial"] for entries in issued.values() for e in entries if e["revoked"]]
        self._write_crl(serials)
        return added

    def _write_crl(self, serials: list[int]) -> None:
        ca_cert, ca_key = self._load()
        now = utcnow()
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(ca_cert.subject)
            .last_update(now - dt.timedelta(minutes=5))
            .next_update(now + dt.timedelta(days=30))
        )
        for serial in serials:
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder()
                .serial_number(serial)
                .revocation_date(now - dt.timedelta(minutes=1))
                .build()
            )
        crl = builder.sign(ca_key, hashes.SHA256())
        self.crl_path.write_text(crl.public_bytes(serialization.Encoding.PEM).decode())


def mosquitto_tls_listener(
    port: int,
    ca: DeviceCA,
    server_cert: Path,
    server_key: Path,
    *,
    bind: str = "0.0.0.0",
    require_certificate: bool = True,
) -> str:
    """A mosquitto.conf listener block that requires device client certificates (put it in
    the broker folder's conf.d/); devices still log in with their username and password."""
    return "\n".join(
        [
            f"listener {port} {bind}",
            f"cafile {ca.cert_path}",
            f"certfile {server_cert}",
            f"keyfile {server_key}",
            f"crlfile {ca.crl_path}",
            f"require_certificate {'true' if require_certificate else 'false'}",
            # Not use_identity_as_username: Mosquitto then skips the auth plugin, and with
            # it the binding of client ids to accounts. A device shows its certificate *and*
            # its username/password from the bundle.
            "tls_version tlsv1.2",
            "",
        ]
    )
