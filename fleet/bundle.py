"""The device bundle `edgefleet fleet enroll` writes: what the edge container mounts.

`{bundles_dir}/{device}/edge.yaml` is the agent's config (`edgefleet edge run -c`), and
`secrets.yaml` holds the device key, broker password and REST token. The directory is
0700 and both files 0600: they are the device's identity, shown nowhere else.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml

from edgefleet.fleet.acl import write_private
from edgefleet.fleet.devices import Enrollment


def write_bundle(
    enrollment: Enrollment,
    bundles_dir: Path,
    *,
    broker_host: str,
    broker_port: int,
    public_url: str,
    mount: str | None = None,
) -> Path:
    """The bundle's paths work in the edge container and on a host alike: the key file is
    named relative to edge.yaml (`edge run` reads it beside the file), and the state and
    outbox folders are left to the defaults (the image sets its own)."""
    device_dir = Path(bundles_dir) / enrollment.device_id
    device_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(device_dir, 0o700)
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
    write_private(device_dir / "secrets.yaml", yaml.safe_dump(secrets, sort_keys=False))
    write_private(device_dir / "edge.yaml", header + yaml.safe_dump(config, sort_keys=False))
    return device_dir


def remove_bundle(bundles_dir: Path, device_id: str) -> bool:
    device_dir = Path(bundles_dir) / device_id
    if not device_dir.is_dir():
        return False
    shutil.rmtree(device_dir)
    return True
