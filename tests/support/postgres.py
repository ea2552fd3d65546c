"""A PostgreSQL server for the tests: the machine's own, or a disposable one started here.

The scale path must never be skipped in silence: where nothing answers on 127.0.0.1:5432,
`initdb` makes a throwaway cluster in a temporary folder (Debian's `postgresql` package
installs the binaries; `make test` installs it) and `postgres` serves it on a free port
until the test session ends. As root the cluster belongs to the `postgres` user, since
PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from edgefleet.bench.mosquitto import free_port
from tests.support.waiting import eventually

LOCAL = "postgresql://postgres@127.0.0.1:5432/test"


def _answers(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def _binary(name: str) -> str:
    installed = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    found = shutil.which(name) or (installed[-1] if installed else None)
    if found is None:
        raise RuntimeError(
            f"no PostgreSQL answers on 127.0.0.1:5432 and `{name}` is not installed: "
            "apt-get install postgresql (make test does)"
        )
    return found


def _as_owner(argv: list[str]) -> list[str]:
    """Run as `postgres` when we are root (PostgreSQL refuses root)."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextmanager
def postgres_server() -> Iterator[str]:
    """The URL of database `test` on a server that answers, for the whole session."""
    if _answers(LOCAL):
        yield LOCAL
        return
    initdb, postgres = _binary("initdb"), _binary("postgres")
    root = Path(tempfile.mkdtemp(prefix="ef-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    subprocess.run(
        _as_owner([initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]),
        check=True,
        capture_output=True,
    )
    port = free_port()
    server = subprocess.Popen(
        _as_owner(
            [
                *(postgres, "-D", str(data), "-p", str(port), "-k", str(sockets)),
                *("-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"),
            ]
        ),
        stdout=subprocess.DEVNULL,
        stderr=(root / "postgres.log").open("wb"),
    )
    admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:

        def answers() -> bool:
            if _answers(admin):
                return True
            if server.poll() is not None:
                raise RuntimeError(
                    f"the disposable PostgreSQL exited at start: {root}/postgres.log"
                )
            return False

        eventually(
            answers,
            60,
            "the disposable PostgreSQL to answer",
            detail=lambda: f"{root}/postgres.log",
            interval_s=0.2,
        )
        import psycopg

        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE DATABASE test")
        yield f"postgresql://postgres@127.0.0.1:{port}/test"
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(root, ignore_errors=True)
