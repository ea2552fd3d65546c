"""The wheel, installed into a fresh environment beside another distribution's `shared`.

edgefleet's parts install as `edgefleet.<part>`: a user's `shared` (or `edge`, `cloud`,
`fleet`, `bench`) package keeps working next to it, and `import shared` finds nothing of
ours. The editable install is the other mode: the whole suite runs under it (`make test`).
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("shared", "edge", "cloud", "fleet", "bench")
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "edgefleet", *PARTS)

pytestmark = pytest.mark.slow


def _run(*argv: str | Path, cwd: Path) -> str:
    result = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def _dummy_wheel(folder: Path) -> Path:
    """A minimal wheel of another project, `othershared`, whose top-level package is `shared`."""
    files = {
        "shared/__init__.py": b'WHO = "othershared"\n',
        "othershared-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: othershared\n"
        b"Version: 1.0\n",
        "othershared-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("othershared-1.0.dist-info/RECORD,,")
    path = folder / "othershared-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr("othershared-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel` of a clean copy of the sources (no build/ or in-place .so from this checkout)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=skip)
        else:
            shutil.copy2(ROOT / name, src / name)
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "--wheel-dir", tmp / "dist", ".", cwd=src)  # fmt: skip
    (built,) = (tmp / "dist").glob("edgefleet-*.whl")
    return built


def test_the_wheel_holds_only_edgefleet_and_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"edgefleet", next(t for t in tops if t.endswith(".dist-info"))}, tops
    for expected in (
        "edgefleet/shared/messages.py",
        "edgefleet/shared/models/manifest.yaml",
        "edgefleet/shared/models/ppocr_keys_v4.txt",
        "edgefleet/shared/kernels/src/module.c",
        "edgefleet/shared/kernels/src/ef_kernels.h",
        "edgefleet/shared/kernels/cuda/nms.cu",
        "edgefleet/fleet/dashboard/index.html",
        "edgefleet/fleet/dashboard/dashboard.js",
        "edgefleet/fleet/dashboard/dashboard.css",
        "edgefleet/cloud/cloud.example.yaml",
        "edgefleet/bench/bench_edge.py",
    ):
        assert expected in names, expected
    assert any(n.startswith("edgefleet/shared/kernels/_native.") for n in names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: Apache-2.0" in text
    assert 'Requires-Dist: fastapi>=0.110; extra == "cloud"' in text
    assert not [line for line in text.splitlines() if line.startswith("Requires-Dist: fastapi")
                and "extra ==" not in line]  # fmt: skip


def test_installed_beside_another_shared_package(wheel: Path, tmp_path: Path) -> None:
    # given a fresh environment with another project's top-level `shared` in it
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(python, "-m", "pip", "install", "-q", "--no-index", _dummy_wheel(tmp_path),
         cwd=tmp_path)  # fmt: skip
    # when edgefleet's wheel is installed next to it (its dependencies come from this
    # interpreter's environment, added after the fresh site-packages: no network needed)
    _run(python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel, cwd=tmp_path)
    fresh = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                      cwd=tmp_path).strip())  # fmt: skip
    (fresh / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # then both import, each from its own distribution, and `shared` is not ours
    check = f"""
import pathlib, sys, tempfile
import shared
assert shared.WHO == "othershared", shared.__file__
assert not hasattr(shared, "messages") and not hasattr(shared, "kernels")
import edgefleet.shared.messages, edgefleet.shared.kernels._native, edgefleet.cli
fresh = pathlib.Path({str(fresh)!r})
for module in (edgefleet.shared.messages, edgefleet.shared.kernels._native, edgefleet.cli):
    assert pathlib.Path(module.__file__).is_relative_to(fresh), module.__file__
import importlib.util
for name in {PARTS!r}:
    spec = importlib.util.find_spec(name)
    assert name == "shared" or spec is None, (name, spec)
# outside a checkout, the benchmarks start their broker without the test suite
from edgefleet.bench.bench_edge import _broker
assert _broker(pathlib.Path(tempfile.mkdtemp())).binary
assert "tests" not in sys.modules
print("ok")
"""
    assert _run(python, "-I", "-c", check, cwd=tmp_path).strip() == "ok"
    # and the console script runs from the installed package
    out = _run(venv / "bin" / "edgefleet", "bench", "--help", cwd=tmp_path)
    assert "kernels" in out
