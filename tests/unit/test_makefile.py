"""`make demo` installs only what the demo needs; the test tools belong to `make test`.

Read from `make -n -B` (print every command, as on a machine where nothing is installed
yet, run none), so the check needs no root, no apt and no network.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_ONLY = ("chromium", "qemu-user", "gcc-aarch64-linux-gnu", "ffmpeg", "mosquitto-clients")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def _plan(target: str, tmp_path: Path) -> str:
    # as a top-level make even under `make test` (a nested make prints "Entering directory"
    # lines and inherits the outer one's flags)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _apt_packages(plan: str) -> set[str]:
    return {
        package
        for line in re.findall(r"apt-get install -y -qq --no-install-recommends ([^;]+);", plan)
        for package in line.split()
    }


def test_make_demo_installs_the_broker_and_the_build_tools_only(tmp_path: Path) -> None:
    plan = _plan("demo", tmp_path)
    packages = _apt_packages(plan)
    assert {"mosquitto", "gcc", "python3-dev", "python3-venv"} <= packages
    assert not packages & set(TEST_ONLY), packages & set(TEST_ONLY)
    # the package with what the demo runs (the edge with PyAV, the cloud), without the dev extras
    assert re.search(r"pip install -q -c constraints\.txt -e '\.\[edge,cloud\]'$", plan, re.M)
    assert "[dev]" not in plan
    assert plan.rstrip().endswith("edgefleet demo")


def test_make_test_adds_the_test_tools_and_the_dev_extras(tmp_path: Path) -> None:
    plan = _plan("test", tmp_path)
    assert set(TEST_ONLY) <= _apt_packages(plan)
    assert "pip install -q -c constraints.txt -e '.[dev]'" in plan
    assert "pytest" in plan.splitlines()[-1]


@pytest.mark.parametrize("target", ["demo", "test"])
def test_every_package_install_is_held_to_the_measured_versions(target: str, tmp_path: Path):
    # the figures of the README were measured with constraints.txt's versions: an install
    # that floats to a newer OpenCV draws other scenes and reads other text
    installs = [
        line
        for line in _plan(target, tmp_path).splitlines()
        if re.search(r"pip install .*-e '\.\[", line)
    ]
    assert installs and all("-c constraints.txt" in line for line in installs), installs
