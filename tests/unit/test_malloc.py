"""The cloud caps glibc's malloc arenas before its threads start, unless the operator did."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = "from edgefleet.shared.malloc import cap_arenas; print(cap_arenas(2))"


def _probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
        check=True,
    )
    return done.stdout.strip()


def test_arenas_are_capped_on_glibc_and_left_to_the_operator_where_set() -> None:
    assert _probe() == "True"  # this machine's Python runs on glibc
    assert _probe(MALLOC_ARENA_MAX="4") == "False"
