"""SHA-256 hex digests of bytes and files: one definition for every part that pins a model."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

_BLOCK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex digest of the file at `path`, in 1 MiB blocks so a large model never sits in memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def same_hex(given: str, expected: str) -> bool:
    """Constant-time check of a hex signature someone sent; any other text is a mismatch.

    `hmac.compare_digest` raises on non-ASCII str, which would turn a forged header into
    a crash instead of a refusal, so the comparison is made on bytes of ASCII text only.
    """
    return given.isascii() and hmac.compare_digest(given.lower().encode(), expected.encode())
