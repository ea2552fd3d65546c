"""glibc's malloc arenas, capped for a service of many threads.

Each thread that allocates while another holds the main arena gets an arena of its own,
up to eight per core, and an arena keeps the pages of what was freed in it, so request
threads decoding images at once grow the process well past the images it holds.
`cap_arenas` limits them (mallopt M_ARENA_MAX), before the threads start;
MALLOC_ARENA_MAX in the environment, where set, is the operator's and wins.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

M_ARENA_MAX = -8  # glibc's malloc.h

log = logging.getLogger(__name__)


def cap_arenas(arenas: int = 2) -> bool:
    """Cap the process's malloc arenas at `arenas`; False where MALLOC_ARENA_MAX is set or
    the C library is not glibc (musl has no arenas to cap)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None or not mallopt(M_ARENA_MAX, arenas):
        log.info("malloc arenas not capped: this C library has no M_ARENA_MAX")
        return False
    return True
