"""A local Mosquitto broker process: the demo, the benchmarks and the tests start one.

`mosquitto_binary()` finds the broker (also in sbin, which a plain user's PATH lacks);
`MosquittoBroker` runs one on a free port with its own config and persistence, and can be
stopped, killed and started again on the same port (outage tests, uplink benchmarks).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from edgefleet.shared.errors import ConfigError
from edgefleet.shared.ports import free_port

MOSQUITTO_MISSING = (
    "The Mosquitto MQTT broker (the `mosquitto` binary) is not installed.\n"
    "  Debian/Ubuntu:  sudo apt-get install mosquitto mosquitto-clients\n"
    "  Fedora/RHEL:    sudo dnf install mosquitto\n"
    "  macOS:          brew install mosquitto"
)
# Where distributions install the broker when sbin is not on PATH (a plain user's shell).
MOSQUITTO_LOCATIONS = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto")


def mosquitto_binary(hint: str = MOSQUITTO_MISSING) -> str:
    """Path of the broker binary; ConfigError with install instructions when missing."""
    found = shutil.which("mosquitto") or next(
        (p for p in MOSQUITTO_LOCATIONS if Path(p).is_file()),
        None,
    )
    if found is None:
        raise ConfigError("mosquitto is not installed", hint=hint)
    return found


def wait_for_port(port: int, timeout_s: float = 10.0, host: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s} s")


class MosquittoBroker:
    """One broker process; `stop`, `kill` and `start` again keep port and persistence."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        extra_config: str = "",
        *,
        generated: Path | None = None,
    ):
        """A broker with a local config written in `workdir`, or with `generated` (a
        complete mosquitto.conf from `fleet broker-files`, whose listener is `port`) as is."""
        self.binary = mosquitto_binary()
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.host = "127.0.0.1"
        self.generated = generated
        self.config_path = generated or self.workdir / "mosquitto.conf"
        self.log_path = self.workdir / "mosquitto.log"
        self.extra_config = extra_config
        self._process: subprocess.Popen[bytes] | None = None

    def write_config(self) -> None:
        persistence = self.workdir / "data"
        persistence.mkdir(exist_ok=True)
        base = "\n".join(
            [
                f"listener {self.port} 127.0.0.1",
                # As root, mosquitto drops to the `mosquitto` user, which cannot write the
                # test's private temp folder: persistence would silently not happen.
                "user root" if os.geteuid() == 0 and not self._sets_user() else "",
                "allow_anonymous true" if "password_file" not in self.extra_config else "",
                "persistence true",
                f"persistence_location {persistence}/",
                "autosave_interval 1",
                "max_queued_messages 100000",
                "max_inflight_messages 0",
                "message_size_limit 16777216",
                f"log_dest file {self.log_path}",
                "log_type error",
                "log_type warning",
                "log_type notice",
                "",
            ]
        )
        self.config_path.write_text(base + self.extra_config + "\n")

    def _sets_user(self) -> bool:
        return any(line.split()[:1] == ["user"] for line in self.extra_config.splitlines())

    def start(self) -> MosquittoBroker:
        if self.running:
            return self
        if self.generated is None:
            self.write_config()
        self._process = subprocess.Popen(
            [self.binary, "-c", str(self.config_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_for_port(self.port)
        except TimeoutError:
            self.kill()
            raise RuntimeError(f"mosquitto did not start: {self.log_tail()}") from None
        return self

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the broker is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self) -> None:
        """Graceful stop: mosquitto saves its persistence file."""
        if self._process is not None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None

    def kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-n:])
        except OSError:
            return ""
