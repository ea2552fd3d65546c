"""A replica's identity: the same across its restarts, never shared with a running sibling.

The identity is the MQTT client id of the replica's persistent session in the share
group. A random id per start leaves the old session behind after a crash, and the broker
keeps handing that orphan its share of the traffic until the session expires. So each
replica takes an id file under `data_dir/replicas/` and holds an exclusive lock on it while
it runs: a restart (even after `kill -9`, which releases the lock) takes the same free id
back and resumes its session; replicas sharing a data folder each lock a different one.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import secrets
from pathlib import Path

from edgefleet.shared.errors import ConfigError

log = logging.getLogger(__name__)

_ID = re.compile(r"^cloud-[0-9a-f]{8}$")


class ReplicaIdentity:
    """An id and the lock that makes it ours; `release` (or process exit) frees it."""

    def __init__(self, name: str, fd: int | None = None):
        self.name = name
        self._fd = fd

    @classmethod
    def fixed(cls, name: str) -> ReplicaIdentity:
        """An id from the settings (e.g. a StatefulSet pod name): no file, no lock."""
        return cls(name)

    @classmethod
    def claim(cls, data_dir: Path) -> ReplicaIdentity:
        folder = Path(data_dir) / "replicas"
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        for path in sorted(folder.glob("cloud-*.id")):
            if _ID.match(path.stem) and (fd := _try_lock(path)) is not None:
                log.info("replica identity resumed", extra={"replica": path.stem})
                return cls(path.stem, fd)
        while True:
            name = f"cloud-{secrets.token_hex(4)}"
            try:
                fd = os.open(folder / f"{name}.id", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                continue
            if not _lock(fd):  # another process won the race for this very name
                os.close(fd)
                continue
            log.info("replica identity created", extra={"replica": name})
            return cls(name, fd)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        raise ConfigError(f"cannot lock a replica id file: {exc}") from None
    return True


def _try_lock(path: Path) -> int | None:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    if _lock(fd):
        return fd
    os.close(fd)
    return None
