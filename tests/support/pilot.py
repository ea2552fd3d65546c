"""A pilot's stack as an operator runs it: a real `edgefleet cloud serve` process and real
`edgefleet edge run` agents on looping videos, devices enrolled in the cloud's store.

Tests stop, kill and restart each part and read what the operator reads (`/v1/devices`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from edgefleet.cloud.auth import key_digest
from edgefleet.fleet.registry import DeviceRegistry, Enrollment
from edgefleet.shared.db import Database
from tests.support.broker import MosquittoBroker
from tests.support.edge import edge_settings, write_video
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
OP_KEY = "op-pilot-key-" + "p" * 20


def enroll(data_dir: Path, *device_ids: str) -> dict[str, Enrollment]:
    """Enroll devices in the cloud's store, as `edgefleet fleet enroll` does."""
    db = Database.connect(f"sqlite:///{data_dir / 'cloud.db'}")
    try:
        registry = DeviceRegistry(db)
        return {d: registry.enroll(d) for d in device_ids}
    finally:
        db.close()


@dataclass
class Cloud:
    """`edgefleet cloud serve` on a rules-only route (no model to load), in a process."""

    tmp: Path
    broker: MosquittoBroker
    options: dict[str, Any] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    url: str = ""

    @property
    def data_dir(self) -> Path:
        return self.tmp / "data"

    @property
    def log(self) -> Path:
        return self.tmp / "cloud.log"

    def config(self) -> Path:
        rules = self.tmp / "rules.yaml"
        rules.write_text("default: {model: rules, timeout_s: 30}\n")
        data: dict[str, Any] = {
            "http": {"port": 0},
            "mqtt": {"host": self.broker.host, "port": self.broker.port, "reconnect_max_s": 2},
            "data_dir": str(self.data_dir),
            "api_keys": [{"name": "ops", "sha256": key_digest(OP_KEY)}],
            "rules": {"file": str(rules)},
            "models": {"preload": False},
        }
        for key, value in self.options.items():
            data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
        path = self.tmp / "cloud.yaml"
        path.write_text(json.dumps(data))
        return path

    def start(self, timeout_s: float = 120) -> Cloud:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        offset = self.log.stat().st_size if self.log.exists() else 0
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edgefleet", "cloud", "serve", "-c", str(self.config())],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )
        process = self.process

        def ready() -> bool:
            assert process.poll() is None, f"the cloud exited:\n{self.tail()}"
            served = re.search(r"serving on 127\.0\.0\.1:(\d+)", self.log.read_text()[offset:])
            if not served:
                return False
            self.url = f"http://127.0.0.1:{served.group(1)}"
            try:
                return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        eventually(ready, timeout_s, "the cloud ready", detail=self.tail, interval_s=0.1)
        return self

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM, as systemd or docker stop send: the graceful path."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout_s)
        self.process = None
        return code

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def devices(self) -> dict[str, dict[str, Any]]:
        response = httpx.get(
            f"{self.url}/v1/devices", headers={"Authorization": f"Bearer {OP_KEY}"}, timeout=10
        )
        response.raise_for_status()
        return {d["device_id"]: d for d in response.json()["devices"]}

    def device(self, device_id: str) -> dict[str, Any]:
        response = httpx.get(
            f"{self.url}/v1/devices/{device_id}",
            headers={"Authorization": f"Bearer {OP_KEY}"},
            timeout=10,
        )
        response.raise_for_status()
        return dict(response.json())

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text()[-n:] if self.log.exists() else ""


@dataclass
class EdgeAgent:
    """`edgefleet edge run` for one enrolled device, on a looping video, in a process."""

    tmp: Path
    broker: MosquittoBroker
    enrollment: Enrollment
    options: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    process: subprocess.Popen[bytes] | None = None

    @property
    def folder(self) -> Path:
        return self.tmp / (self.name or self.enrollment.device_id)

    @property
    def log(self) -> Path:
        return self.folder / "agent.log"

    def config(self) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        video = self.folder / "loop.mp4"
        if not video.exists():
            write_video(video, [f"GATE {i:02d}" for i in range(20)], fps=10)
        data = edge_settings(
            self.folder,
            self.broker,
            "unused",
            device_id=self.enrollment.device_id,
            device_key=self.enrollment.device_key.hex(),
            streams=[{"id": "gate", "url": str(video), "loop": True, "realtime": True}],
            **self.options,
        )
        path = self.folder / "edge.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    def start(self) -> EdgeAgent:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edgefleet", "edge", "run", "-c", str(self.config())],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )
        return self

    def kill_9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text()[-n:] if self.log.exists() else ""


def wait_online(cloud: Cloud, device_id: str, timeout_s: float = 120) -> None:
    eventually(
        lambda: cloud.devices().get(device_id, {}).get("online") is True,
        timeout_s,
        f"{device_id} online",
        detail=cloud.tail,
    )
