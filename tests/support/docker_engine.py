"""A real Docker engine for the image update tests, and tiny agent-like images for it.

Where no engine answers on the usual socket, `dockerd` (Debian's docker.io) is started as
root with its own data root and socket in a temporary folder: vfs storage, no iptables,
no bridge (what a sandbox without overlayfs allows); containers use the host network.
The images are built FROM a base imported from busybox-static, so nothing is pulled from
the internet: each serves /readyz and /metrics (with one published telemetry message)
through busybox httpd on `$EF_PORT`, unless it is one that never gets ready or crashes.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
from tests.support.waiting import eventually

TELEMETRY = 'ef_edge_uplink_published_total{kind="telemetry"} 3.0\n'
BASE = "ef-test-base:1"


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"`{name}` is not installed: apt-get install docker.io (make test does)")
    return found


@contextmanager
def docker_engine() -> Iterator[docker.DockerClient]:
    """A client of an engine that runs: the machine's own, else one started here."""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
        # where a second process (tests.support.updater_process) finds the same engine
        client.test_base_url = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        yield client
        return
    except docker.errors.DockerException:
        pass
    dockerd = _binary("dockerd")
    root = Path(tempfile.mkdtemp(prefix="ef-dockerd-"))
    sock = root / "docker.sock"
    argv = [
        *(dockerd, "--storage-driver=vfs", "--iptables=false", "--bridge=none"),
        *("--data-root", str(root / "data"), "--exec-root", str(root / "exec")),
        *("--pidfile", str(root / "docker.pid"), "-H", f"unix://{sock}"),
    ]
    with open(root / "dockerd.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log)
    try:
        clients: list[docker.DockerClient] = []

        def answers() -> bool:  # polling the engine's own socket until it answers
            try:  # the client asks the engine's API version as it is made
                clients.append(docker.DockerClient(base_url=f"unix://{sock}", timeout=120))
            except docker.errors.DockerException:
                if proc.poll() is not None:
                    tail = (root / "dockerd.log").read_text()[-2000:]
                    raise RuntimeError(f"dockerd exited at start: {tail}") from None
                return False
            return True

        eventually(
            answers,
            60,
            "dockerd to answer on its socket",
            detail=lambda: (root / "dockerd.log").read_text()[-2000:],
            interval_s=0.2,
        )
        client = clients[0]
        client.test_base_url = f"unix://{sock}"
        yield client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        _unmount_under(root)  # dockerd leaves its netns bind mount behind
        shutil.rmtree(root, ignore_errors=True)


def _unmount_under(root: Path) -> None:
    with open("/proc/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(str(root))]
    for point in sorted(points, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def import_base(client: docker.DockerClient) -> str:
    """`ef-test-base:1`: busybox-static and its applet links, as one imported layer."""
    busybox = _binary("busybox")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        bin_dir = tarfile.TarInfo("bin")
        bin_dir.type, bin_dir.mode = tarfile.DIRTYPE, 0o755  # the agent runs as uid 10001
        tar.addfile(bin_dir)
        tar.add(busybox, arcname="bin/busybox")
        for applet in ("sh", "httpd", "sleep", "mkdir", "cat", "echo"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        for folder in ("tmp", "www", "var/lib/edgefleet"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
    client.api.import_image_from_data(buf.getvalue(), repository="ef-test-base", tag="1")
    return BASE


def build_agent(client: docker.DockerClient, tag: str, mode: str, version: str) -> Any:
    """An agent-like image: `good`, `never-ready` (no /readyz) or `crash` (exits 3)."""
    context = Path(tempfile.mkdtemp(prefix="ef-agent-image-"))
    try:
        www = context / "www"
        www.mkdir()
        (www / "version").write_text(version)
        if mode != "never-ready":
            (www / "readyz").write_text("ok\n")
            (www / "metrics").write_text(TELEMETRY)
        cmd = (
            '["sh", "-c", "echo crashing; exit 3"]'
            if mode == "crash"
            else '["sh", "-c", "exec httpd -f -p 127.0.0.1:$EF_PORT -h /www"]'
        )
        (context / "Dockerfile").write_text(
            f"FROM {BASE}\nENV PATH=/bin\nCOPY www /www\nCMD {cmd}\n"
        )
        image, _ = client.images.build(path=str(context), tag=tag, network_mode="host", rm=True)
        return image
    finally:
        shutil.rmtree(context, ignore_errors=True)


def push(client: docker.DockerClient, repository: str, tag: str) -> None:
    for line in client.images.push(repository, tag=tag, stream=True, decode=True):
        if "error" in line:
            raise RuntimeError(f"push of {repository}:{tag} failed: {line['error']}")
