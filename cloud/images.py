"""Case images on disk beside the database, content-addressed by SHA-256: a case sent
twice stores its image once, and a crash never leaves half an image."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from edgefleet.shared.messages import ImageContentType, Sha256

_EXT = {"image/jpeg": "jpg", "image/png": "png"}


class ImageStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: Sha256, content_type: ImageContentType) -> Path:
        return self.root / sha256[:2] / f"{sha256}.{_EXT.get(content_type, 'bin')}"

    def put(self, sha256: Sha256, content_type: ImageContentType, data: bytes) -> Path:
        """Write once, atomically (tmp + rename): a crash never leaves half an image."""
        path = self.path(sha256, content_type)
        if path.exists():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path
