"""The engine cache on disk: one builder per key across processes, atomic writes, and a
corrupt or half-written engine deleted and built again instead of a crash loop.

Each engine has a record beside it (`<engine>.json`: the key and the engine's sha256),
written after the engine: an engine whose record is missing or names other bytes was cut
short or damaged, so it is rebuilt. The lock file beside the engine (`<engine>.lock`,
`fcntl.flock`) lets replicas that share the folder wait for one build instead of racing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from edgefleet.shared.executor.metrics import ENGINE_CACHE, ENGINE_CACHE_CORRUPT

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedEngine:
    path: Path
    data: bytes
    cached: bool


def write_atomic(path: Path, data: bytes) -> None:
    """Write under a unique temporary name in the same folder, fsync, rename, fsync the
    folder: a reader sees the old file or the whole new one, never part of it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)  # as a plain write leaves it (mkstemp makes 0600): no secret
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


@contextlib.contextmanager
def key_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `lock_path` (created if absent) across processes."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def discard(path: Path, reason: str) -> None:
    """Delete a bad engine and its record, counted by reason and logged."""
    ENGINE_CACHE_CORRUPT.labels(reason).inc()
    log.warning(
        "engine cache entry is corrupt: deleted, it will be built again",
        extra={"engine": str(path), "reason": reason},
    )
    for stale in (path, _record_path(path)):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()


def _read_intact(path: Path) -> bytes | None:
    """The engine's bytes if it and its record agree; None (after deleting it) if not."""
    if not path.exists():
        return None
    try:
        record = json.loads(_record_path(path).read_text())
        expected = record["sha256"]
    except FileNotFoundError:
        discard(path, "no_record")
        return None
    except (ValueError, KeyError, TypeError):
        discard(path, "bad_record")
        return None
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != expected:
        discard(path, "digest")
        return None
    return data


def invalidate(path: Path, data: bytes, reason: str) -> None:
    """Delete the engine at `path` that a runtime refused (`data` is what it read), unless
    another process has already replaced it with other bytes."""
    with key_lock(_lock_path(path)):
        if path.exists() and hashlib.sha256(path.read_bytes()).digest() == (
            hashlib.sha256(data).digest()
        ):
            discard(path, reason)


def cached_build(path: Path, key: str, build: Callable[[], bytes]) -> CachedEngine:
    """The engine at `path`, built by `build()` if absent or corrupt; `key` (the key's
    canonical text) goes into its record. One process builds a key at a time: the others
    wait on the lock and then read what it wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with key_lock(_lock_path(path)):
        # a temporary file of this key while we hold its lock is a dead builder's
        for stale in path.parent.glob(f".{path.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        data = _read_intact(path)
        if data is not None:
            ENGINE_CACHE.labels("hit").inc()
            log.info("engine cache hit", extra={"engine": str(path)})
            return CachedEngine(path, data, True)
        data = build()
        write_atomic(path, data)
        record = {"key": json.loads(key), "sha256": hashlib.sha256(data).hexdigest()}
        write_atomic(_record_path(path), json.dumps(record, sort_keys=True).encode())
        ENGINE_CACHE.labels("built").inc()
        return CachedEngine(path, data, False)


def reset_folder(folder: Path, reason: str) -> bool:
    """Empty a runtime's own cache folder (ONNX Runtime's TensorRT engines) that failed to
    load, counted and logged; False when there was nothing in it to blame."""
    if not folder.is_dir() or not any(p for p in folder.iterdir() if p.name != ".lock"):
        return False
    ENGINE_CACHE_CORRUPT.labels(reason).inc()
    log.warning(
        "engine cache folder failed to load: emptied, it will be built again",
        extra={"engine": str(folder), "reason": reason},
    )
    for entry in folder.iterdir():
        if entry.name == ".lock":
            continue
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return True
