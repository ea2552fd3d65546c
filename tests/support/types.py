"""Run mypy on the parts under their import names (`edgefleet.shared`, ...).

mypy cannot follow setup.py's `package_dir` mapping of the editable install, so, as for the
layer contracts (tests/support/layers.py), the sources are laid out as they are installed
and `mypy -p edgefleet` runs there with the repository's pyproject.toml (`[tool.mypy]`).

    python -m tests.support.types      (what `make lint` and tests/unit/test_types.py
                                        run; `make test` runs it once, in pytest)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.layers import ROOT, installed_layout


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    config = str(ROOT / "pyproject.toml")
    with tempfile.TemporaryDirectory(prefix="edgefleet-types-") as tmp:
        installed_layout(Path(tmp))
        # cwd first: the copy, not the editable install, is what mypy reads; a fresh cache
        # in the copy, so nothing is left in the work tree.
        cache = str(Path(tmp) / ".mypy_cache")
        command = ["-m", "mypy", "--config-file", config, "--cache-dir", cache, "-p", "edgefleet"]
        return subprocess.run(
            [sys.executable, *command, *args],
            cwd=tmp,
            env={"PATH": "/usr/bin:/bin", "MYPYPATH": tmp},
            capture_output=True,
            text=True,
            timeout=600,
        )


if __name__ == "__main__":
    result = mypy(*sys.argv[1:])
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    sys.exit(result.returncode)
