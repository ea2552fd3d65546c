"""The device bundle `edgefleet fleet enroll` writes: what the edge container mounts.

`{bundles_dir}/{device}/edge.yaml` is the agent's config (`edgefleet edge run -c`), and
`secrets.yaml` holds the device key, broker password and REST token. The directory is
0700 and both files 0600: they are the device's identity, shown nowhere else. So the
container's user must own them: `--owner` gives them to it (the images run as 10001).
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from edgefleet.fleet.acl import write_private
from edgefleet.fleet.devices import Enrollment
from edgefleet.shared.errors import ConfigError

CONTAINER_OWNER = "10001:10001"  # the user the edge images run as


@dataclass(frozen=True)
class Owner:
    """Who the bundle's files belong to: the container's user, not whoever enrolls."""

    uid: int
    gid: int

    @classmethod
    def parse(cls, text: str) -> Owner:
        """`UID[:GID]`, numbers (a container's user has no name on the host); GID = UID
        when left out."""
        match = re.fullmatch(r"(\d{1,10})(?::(\d{1,10}))?", text.strip())
        if match is None:
            raise ConfigError(
                f"--owner {text!r} is not UID[:GID]",
                hint=f"give numbers, e.g. --owner {CONTAINER_OWNER} (the edge images' user)",
            )
        uid = int(match[1])
        gid = int(match[2]) if match[2] is not None else uid
        if max(uid, gid) >= 2**32 - 1:
            raise ConfigError(f"--owner {text!r}: uid and gid must be below {2**32 - 1}")
        return cls(uid, gid)

    def check_can_give(self) -> None:
        """Only root gives files away: refuse before anything is enrolled."""
        if os.geteuid() != 0 and (self.uid, self.gid) != (os.geteuid(), os.getegid()):
            raise ConfigError(
                f"--owner {self.uid}:{self.gid} needs root (this runs as uid {os.geteuid()})",
                hint="run enroll with sudo, or chown -R the bundle afterwards as root",
            )


def write_bundle(
    enrollment: Enrollment,
    bundles_dir: Path,
    *,
    broker_host: str,
    broker_port: int,
    public_url: str,
    mount: str | None = None,
    owner: Owner | None = None,
) -> Path:
    """The bundle's paths work in the edge container and on a host alike: the key file is
    named relative to edge.yaml (`edge run` reads it beside the file), and the state and
    outbox folders are left to the defaults (the image sets its own)."""
    device_dir = Path(bundles_dir) / enrollment.device_id
    device_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(device_dir, 0o700)
    if owner is not None:
        owner.check_can_give()
        os.chown(device_dir, owner.uid, owner.gid)
    secrets = {
        "device_id": enrollment.device_id,
        "group": enrollment.group,
        "device_key": enrollment.device_key.hex(),
        "broker_username": enrollment.device_id,
        "broker_password": enrollment.broker_password,
        "rest_token": enrollment.token,
        "api_url": public_url,
    }
    config = {
        "device_id": enrollment.device_id,
        "device_key_file": f"{mount}/secrets.yaml" if mount else "secrets.yaml",
        "mqtt": {
            "host": broker_host,
            "port": broker_port,
            "username": enrollment.device_id,
            "password": enrollment.broker_password,
        },
        "api_url": public_url,
    }
    header = "# Written by `edgefleet fleet enroll`. Add your `streams:`; keep this file private.\n"
    ids = {"uid": owner.uid, "gid": owner.gid} if owner is not None else {}
    write_private(device_dir / "secrets.yaml", yaml.safe_dump(secrets, sort_keys=False), **ids)
    write_private(device_dir / "edge.yaml", header + yaml.safe_dump(config, sort_keys=False), **ids)
    return device_dir


def remove_bundle(bundles_dir: Path, device_id: str) -> bool:
    device_dir = Path(bundles_dir) / device_id
    if not device_dir.is_dir():
        return False
    shutil.rmtree(device_dir)
    return True
