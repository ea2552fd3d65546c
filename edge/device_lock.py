"""One agent per device on a host: an exclusive lock beside the outbox, held for the
process's life (the kernel drops it when the process dies, even by `kill -9`).

Two agents on one bundle would share the outbox and take each other's broker session
over; the second is refused before it opens anything.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from edgefleet.shared.errors import DeviceTaken


class DeviceLock:
    """`<outbox>.lock`, locked with `flock`; holds the owner's pid for the message."""

    def __init__(self, outbox_path: Path, device_id: str):
        self.path = Path(f"{outbox_path}.lock")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self._fd)
            raise DeviceTaken(
                f"device id {device_id} is already connected: another agent on this host "
                f"(pid {owner}) runs it and holds {self.path}"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        os.close(self._fd)  # closing drops the flock
