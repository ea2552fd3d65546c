"""Folders and files that hold secrets or private data: 0700 folders, 0600 files.

The cloud's store holds device keys and every case; an edge outbox holds signed messages
and images. The process umask (often 022) would leave them readable by every local user.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) and make it 0700 unless it is shared with a group on
    purpose (group-writable, e.g. a broker folder): then its mode is left as it is."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o007 or (mode & 0o070 and not mode & 0o020):
        os.chmod(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """Create `path` empty with mode 0600 if it is missing; tighten it to 0600 if it is
    readable by others. SQLite gives its -wal and -shm files the database file's mode."""
    path = Path(path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        if path.is_file() and stat.S_IMODE(path.stat().st_mode) & 0o077:
            os.chmod(path, 0o600)
    return path
