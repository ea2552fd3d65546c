"""A real image registry for the tests: Debian's `docker-registry` (distribution 2.8),
started on a free loopback port with a throwaway filesystem root.

`push_manifest` uploads a tiny image (a config blob and a manifest) with the registry HTTP
API itself, so a tag's digest can be resolved without a Docker engine.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from edgefleet.bench.mosquitto import free_port, wait_for_port

MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"


class Registry:
    def __init__(self, port: int):
        self.port = port
        self.domain = f"127.0.0.1:{port}"
        self.api = f"http://{self.domain}/v2"

    def push_blob(self, name: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        start = httpx.post(f"{self.api}/{name}/blobs/uploads/")
        start.raise_for_status()
        location = start.headers["location"]
        if location.startswith("/"):
            location = f"http://{self.domain}{location}"
        # the upload URL carries its own state in its query: add the digest to it
        done = httpx.put(httpx.URL(location).copy_merge_params({"digest": digest}), content=data)
        done.raise_for_status()
        return digest

    def push_manifest(self, name: str, tag: str, label: str = "") -> str:
        """Push a one-config image under `name:tag`; its manifest digest."""
        config = json.dumps({"architecture": "amd64", "os": "linux", "label": label}).encode()
        config_digest = self.push_blob(name, config)
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST_V2,
                "config": {
                    "mediaType": "application/vnd.docker.container.image.v1+json",
                    "size": len(config),
                    "digest": config_digest,
                },
                "layers": [],
            }
        ).encode()
        resp = httpx.put(
            f"{self.api}/{name}/manifests/{tag}",
            content=manifest,
            headers={"Content-Type": MANIFEST_V2},
        )
        resp.raise_for_status()
        return "sha256:" + hashlib.sha256(manifest).hexdigest()


@contextmanager
def registry_server() -> Iterator[Registry]:
    """A registry on 127.0.0.1 for as long as the context lasts."""
    binary = shutil.which("docker-registry") or shutil.which("registry")
    if binary is None:
        raise RuntimeError(
            "no `docker-registry` binary: apt-get install docker-registry (make test does)"
        )
    root = Path(tempfile.mkdtemp(prefix="ef-registry-"))
    port = free_port()
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n"
    )
    with open(root / "registry.log", "wb") as log:
        proc = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log)
    try:
        wait_for_port(port, timeout_s=30)
        yield Registry(port)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)
