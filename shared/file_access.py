"""Why a file cannot be read, in the words an operator acts on: which path refuses this
process, who owns it, and which uid the process runs as (a bundle copied by root is
unreadable to a container that runs as uid 10001)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def unreadable_reason(path: Path, exc: OSError) -> str:
    """A sentence for `exc`, raised when reading `path`; for a refused permission, the
    first folder or the file that refuses, its owner and mode, and this process's uid."""
    if not isinstance(exc, PermissionError):
        return exc.strerror or str(exc)
    blocker = _first_refusing(Path(os.path.abspath(path)))
    me = f"this process runs as uid {os.geteuid()} (gid {os.getegid()})"
    if blocker is None:
        return f"permission denied; {me}"
    st = blocker.stat()
    kind = "folder" if stat.S_ISDIR(st.st_mode) else "file"
    return (
        f"permission denied: the {kind} {blocker} is owned by uid {st.st_uid} (gid "
        f"{st.st_gid}) with mode {stat.S_IMODE(st.st_mode):04o}, and {me}"
    )


def _first_refusing(path: Path) -> Path | None:
    """The outermost folder this process cannot enter, or the file it cannot read."""
    for folder in reversed(path.parents):
        if not os.access(folder, os.X_OK):
            return folder
    return path if path.exists() and not os.access(path, os.R_OK) else None


def chown_hint(path: Path) -> str:
    """What to run on the host so this process can read `path` and its folder."""
    uid, gid = os.geteuid(), os.getegid()
    return (
        f"give the folder to uid {uid} on the host (`sudo chown -R {uid}:{gid}` on what is "
        f"mounted at {Path(path).parent}); a device bundle can be written that way with "
        f"`edgefleet fleet enroll DEVICE --owner {uid}:{gid}`"
    )
