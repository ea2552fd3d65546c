"""The cloud's model files for device downloads: `root/{name}/{version}/{file}` + manifest.

A deployment names models as NAME@VER; the store turns that into a `ModelRef` (URL of
`GET /v1/models/{name}/{version}` and the file's SHA-256). Each device's URL carries a
capability, `?device=<id>&sig=<hex HMAC(device key, "name/version")>`, so a device can
download without any other credential, and a revoked device (its key gone) cannot.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from edgefleet.shared.errors import InvalidInput, ModelNotFound
from edgefleet.shared.hashing import sha256_file
from edgefleet.shared.messages import MODEL_PART_PATTERN, ModelRef, Sha256

_PART_RE = re.compile(MODEL_PART_PATTERN)


@dataclass(frozen=True)
class StoredModel:
    name: str
    version: str
    path: Path
    sha256: Sha256
    size: int


def _check(kind: str, value: str) -> str:
    if not _PART_RE.match(value or ""):
        raise InvalidInput(f"bad model {kind} {value!r}", hint="use letters, digits, . _ -")
    return value


def not_found(name: str, version: str) -> ModelNotFound:
    """The one answer to a model that is not there, or not the asker's to download."""
    return ModelNotFound(f"model {name}@{version} is not in the model store")


def capability(key: bytes, name: str, version: str) -> str:
    return hmac.new(key, f"{name}/{version}".encode(), hashlib.sha256).hexdigest()


class ModelStore:
    """Model files the cloud serves to devices, addressed by name and version."""

    def __init__(self, root: Path, base_url: str = "http://127.0.0.1:8000"):
        self.root = Path(root)
        self.base_url = base_url.rstrip("/")
        self.root.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, version: str, source: Path) -> StoredModel:
        """Copy `source` in as NAME@VERSION (atomic); InvalidInput if that version exists."""
        _check("name", name)
        _check("version", version)
        source = Path(source)
        if not source.is_file():
            raise InvalidInput(f"model file {source} does not exist")
        target_dir = self.root / name / version
        if (target_dir / "manifest.json").exists():
            raise InvalidInput(f"model {name}@{version} exists; versions are immutable")
        tmp_dir = self.root / name / f".{version}.tmp"
        shutil.rmtree(tmp_dir, ignore_errors=True)
        tmp_dir.mkdir(parents=True)
        shutil.copyfile(source, tmp_dir / source.name)
        digest = sha256_file(tmp_dir / source.name)
        manifest = {"file": source.name, "sha256": digest, "size": source.stat().st_size}
        (tmp_dir / "manifest.json").write_text(json.dumps(manifest))
        os.replace(tmp_dir, target_dir)
        return self.get(name, version)

    def get(self, name: str, version: str) -> StoredModel:
        _check("name", name)
        _check("version", version)
        try:
            manifest = json.loads((self.root / name / version / "manifest.json").read_text())
        except (OSError, ValueError):
            raise not_found(name, version) from None
        path = self.root / name / version / manifest["file"]
        return StoredModel(name, version, path, manifest["sha256"], manifest["size"])

    def list(self) -> list[StoredModel]:
        out = []
        for manifest in sorted(self.root.glob("*/*/manifest.json")):
            out.append(self.get(manifest.parent.parent.name, manifest.parent.name))
        return out

    def url(self, name: str, version: str) -> str:
        return f"{self.base_url}/v1/models/{name}/{version}"

    def ref(self, name: str, version: str) -> ModelRef:
        """The ModelRef a deployment carries for NAME@VERSION."""
        stored = self.get(name, version)
        return ModelRef(
            name=name, version=version, url=self.url(name, version), sha256=stored.sha256
        )

    def owns(self, url: str) -> bool:
        return url.startswith(f"{self.base_url}/v1/models/")

    def for_device(self, ref: ModelRef, device_id: str, key: bytes) -> ModelRef:
        """`ref` with the device's download capability in its URL (if the URL is ours)."""
        if not self.owns(ref.url) or "?" in ref.url:
            return ref
        query = urlencode({"device": device_id, "sig": capability(key, ref.name, ref.version)})
        return ref.model_copy(update={"url": f"{ref.url}?{query}"})
