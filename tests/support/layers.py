"""Run import-linter on the parts under their import names (`edgefleet.shared`, ...).

The parts live in top-level folders mapped to `edgefleet.<part>` by setup.py's
`package_dir`; grimp (import-linter's graph builder) only walks a package's own folder, so
it would not find them. This lays the sources out as they are installed (a copy of the
Python files under one `edgefleet/` folder) and runs `lint-imports` there with the
repository's pyproject.toml.

    python -m tests.support.layers      (what `make lint` and tests/unit/test_layers.py run)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("shared", "edge", "cloud", "fleet", "bench")


def installed_layout(target: Path) -> Path:
    """Copy edgefleet/ and each part's Python files to target/edgefleet[/<part>]."""
    python_only = shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.h", "*.cu")
    package = target / "edgefleet"
    shutil.copytree(ROOT / "edgefleet", package, ignore=python_only)
    for part in PARTS:
        shutil.copytree(ROOT / part, package / part, ignore=python_only)
    return package


def lint_imports(*args: str) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).with_name("lint-imports")
    with tempfile.TemporaryDirectory(prefix="edgefleet-layers-") as tmp:
        installed_layout(Path(tmp))
        # cwd first on sys.path: the copy, not the editable install, is what grimp reads.
        return subprocess.run(
            [str(lint), str(ROOT / "pyproject.toml"), *args],
            cwd=tmp,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": tmp, "PYTHONSAFEPATH": ""},
            capture_output=True,
            text=True,
            timeout=300,
        )


def import_circles() -> subprocess.CompletedProcess[str]:
    """JSON on stdout: how many modules the installed layout has, and its import circles
    (every import, lazy ones included), as `tests.support.circles` finds them."""
    with tempfile.TemporaryDirectory(prefix="edgefleet-circles-") as tmp:
        installed_layout(Path(tmp))
        return subprocess.run(
            [sys.executable, str(ROOT / "tests" / "support" / "circles.py")],
            cwd=tmp,
            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": tmp, "PYTHONSAFEPATH": ""},
            capture_output=True,
            text=True,
            timeout=300,
        )


if __name__ == "__main__":
    result = lint_imports(*sys.argv[1:])
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    sys.exit(result.returncode)
