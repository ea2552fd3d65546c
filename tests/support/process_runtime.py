"""A container runtime stand-in for tests: the "image" runs as a local process."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from edgefleet.edge.updater import UpdateFailed


class ProcessRuntime:
    """Runs the "image" as a local process.

    `command` is started with `EF_IMAGE` and `EF_CONFIG` (JSON) in its environment; a
    change of image stops the old process and starts a new one, which must still be alive
    after `settle_s` to count as started.
    """

    def __init__(self, command: list[str], *, settle_s: float = 0.5, log_file: Path | None = None):
        self.command = command
        self.settle_s = settle_s
        self.log_file = log_file
        self._image: str | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def current_image(self) -> str | None:
        return self._image if self.running else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self.running and self._process else None

    def apply(self, image: str, config: dict[str, Any]) -> None:
        self.stop()
        env = {**os.environ, "EF_IMAGE": image, "EF_CONFIG": json.dumps(config)}
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._process = subprocess.Popen(self.command, env=env, stdout=out, stderr=out)
        except OSError as exc:
            raise UpdateFailed(f"cannot start {self.command[0]}: {exc}") from None
        finally:
            if not isinstance(out, int):  # the log file, not DEVNULL
                out.close()
        time.sleep(self.settle_s)
        if not self.running:
            code = self._process.returncode
            self._process = None
            raise UpdateFailed(f"image {image}: the process exited with {code} at start")
        self._image = image

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
