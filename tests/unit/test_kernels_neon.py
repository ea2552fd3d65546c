"""The C test driver (tests/native/driver.c), natively and as aarch64 NEON under qemu.

The driver checks every compiled path (NEON and portable C) against a naive golden model
of the same definitions and against each other; see its header for the tolerances.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "tests/native/driver.c",
    ROOT / "shared/kernels/src/preprocess.c",
    ROOT / "shared/kernels/src/preprocess_x86.c",
    ROOT / "shared/kernels/src/nms.c",
]
FLAGS = ["-O2", "-std=c99", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-ffp-contract=off"]
CROSS = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"


def build(compiler: str, out: Path) -> Path:
    cmd = [compiler, *FLAGS, "-I", str(ROOT / "shared/kernels/src"), *map(str, SOURCES)]
    subprocess.run([*cmd, "-lm", "-pthread", "-o", str(out)], check=True, timeout=120)
    return out


def run_driver(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "FAIL" not in proc.stdout
    return proc.stdout


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_portable_c_driver_natively(tmp_path):
    out = run_driver([str(build("gcc", tmp_path / "driver"))])
    assert out.rstrip().splitlines()[-1].startswith("OK ")


@pytest.mark.skipif(
    shutil.which(CROSS) is None or shutil.which(QEMU) is None,
    reason=f"needs {CROSS} and {QEMU} (Debian: gcc-aarch64-linux-gnu, qemu-user)",
)
def test_neon_driver_under_qemu(tmp_path):
    exe = build(CROSS, tmp_path / "driver-aarch64")
    out = run_driver([QEMU, "-L", "/usr/aarch64-linux-gnu", str(exe)])
    # The NEON paths were really compiled in, and every check passed.
    assert out.splitlines()[0] == "NEON compiled in: 1"
    assert out.rstrip().splitlines()[-1].startswith("OK ")
