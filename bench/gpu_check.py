"""`make gpu-check`: every GPU path of edgefleet run and measured in one go, within 8 minutes.

Run: `python -m edgefleet.bench.gpu_check` (or `edgefleet bench gpu-check`); `--dry-run`
prints the plan, `--steps kernels,nvml` picks steps, `--out DIR` (default `$OUT`, else
build/gpu-check) receives `gpu_check.json` and `gpu_check.md`.

Each step is a subprocess (`python -m edgefleet.bench.gpu_steps NAME --result FILE`) with its
own cap: a step that hangs is killed with its whole process group at the cap, recorded as `timeout`
with whatever figures it had written, and the next step runs. The exit status is 0 when
every step ran, whatever the figures say; it is non-zero only when this script itself
fails. Without an NVIDIA GPU every step is `skipped` with the reason, and nothing is
installed.

This module uses the standard library only: on a bare GPU machine it must start before
(and whether or not) the package and its dependencies could be installed.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

Status = Literal["ok", "failed", "skipped", "timeout"]
STATUSES: tuple[Status, ...] = ("ok", "failed", "skipped", "timeout")
SCHEMA = "ef.gpu-check/1"
TOTAL_CAP_S = 480  # 8 minutes: the whole check runs twice in one 15-minute device window
ROOT = Path(__file__).resolve().parents[1]
NVML_LIBRARIES = ("libnvidia-ml.so.1", "libnvidia-ml.so")


@dataclass(frozen=True)
class Step:
    """One step: its name, what it proves, its cap and the command that runs it.

    The runner appends `--result FILE --cap SECONDS` to `argv`; the command writes its
    outcome there as JSON ({"status", "reason", "figures", "goals"}), as often as it likes:
    what is there at a timeout is kept.
    """

    name: str
    title: str
    cap_s: int
    argv: tuple[str, ...]


@dataclass
class Goal:
    """A target a figure is held against; `met` is None when the figure is missing."""

    name: str
    target: str
    met: bool | None


@dataclass
class StepResult:
    """What one step did: status, why (for anything but ok), its figures and goals."""

    name: str
    title: str
    status: Status
    cap_s: int
    seconds: float
    reason: str = ""
    figures: dict[str, object] = field(default_factory=dict)
    goals: list[Goal] = field(default_factory=list)


@dataclass(frozen=True)
class GpuInfo:
    """Whether an NVIDIA GPU answers here, and what was found (or why none)."""

    present: bool
    detail: str


def _step(name: str, cap_s: int, title: str) -> Step:
    """A step run as `python -m edgefleet.bench.gpu_steps NAME` by this interpreter."""
    return Step(name, title, cap_s, (sys.executable, "-m", "edgefleet.bench.gpu_steps", name))


# The plan: caps sum to TOTAL_CAP_S. `setup` installs only what is missing.
PLAN: tuple[Step, ...] = (
    _step("setup", 80, "install the GPU wheels that are missing (bounded pip)"),
    _step("markers", 45, "pytest -m 'gpu or trt' on the unit tests"),
    _step("kernels", 45, "CUDA vs C kernels: 1080p NV12 -> 640x640, NMS 1k/10k"),
    _step("defaults", 55, "the shipped defaults (ppocr6-tiny, ppocr6-cloud): backend, provider"),
    _step("onnxruntime", 45, "ONNX Runtime CUDA and TensorRT providers: ppocr accuracy"),
    _step("tensorrt", 115, "TensorRT det+rec FP16 and INT8 (gated), engine cache, accuracy"),
    _step("batching", 45, "dynamic batching vs batch 1 on the GPU (goal >= 3x)"),
    _step("nvml", 25, "NVML memory budget refuses above the watermark; telemetry fields"),
    _step("triton", 25, "ppocr6-cloud's forward passes on Triton: same texts as in process"),
)


def plan_total(plan: Sequence[Step]) -> int:
    return sum(step.cap_s for step in plan)


def select_steps(plan: Sequence[Step], names: str | None) -> list[Step]:
    """The steps named in a comma-separated list (plan order kept); all when None."""
    if not names:
        return list(plan)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {s.name for s in plan}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise ValueError(
            f"unknown step(s) {', '.join(unknown) or '(none given)'}; "
            f"steps are: {', '.join(s.name for s in plan)}"
        )
    return [s for s in plan if s.name in wanted]


def detect_gpu(libraries: Sequence[str] = NVML_LIBRARIES) -> GpuInfo:
    """Ask NVML (the driver's own library, through ctypes) how many GPUs it sees."""
    for lib in libraries:
        try:
            nvml = ctypes.CDLL(lib)
        except OSError:
            continue
        if nvml.nvmlInit_v2() != 0:
            return GpuInfo(False, f"NVML ({lib}) loaded but nvmlInit failed: no usable driver")
        count = ctypes.c_uint(0)
        try:
            rc = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        finally:
            nvml.nvmlShutdown()
        if rc != 0 or count.value == 0:
            return GpuInfo(False, f"NVML ({lib}) sees no GPU")
        return GpuInfo(True, f"NVML sees {count.value} GPU(s)")
    return GpuInfo(False, f"no NVIDIA driver (NVML library {' or '.join(libraries)} not found)")


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):  # it may have just exited by itself
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _read_outcome(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:].strip()


def run_step(step: Step, workdir: Path) -> StepResult:
    """Run one step under its cap; a hang is killed (whole process group) as `timeout`."""
    workdir.mkdir(parents=True, exist_ok=True)
    result_path = workdir / f"{step.name}.result.json"
    log_path = workdir / f"{step.name}.log"
    result_path.unlink(missing_ok=True)
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*step.argv, "--result", str(result_path), "--cap", str(step.cap_s)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a timeout kills its children too
        )
        try:
            rc: int | None = proc.wait(timeout=step.cap_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = None
    seconds = round(time.monotonic() - started, 2)
    outcome = _read_outcome(result_path) or {}
    written = outcome.get("figures")
    figures: dict[str, object] = written if isinstance(written, dict) else {}
    goals = [
        Goal(str(g.get("name")), str(g.get("target")), g.get("met"))
        for g in outcome.get("goals") or []
        if isinstance(g, dict)
    ]
    if rc is None:
        status: Status = "timeout"
        reason = f"killed at its {step.cap_s} s cap; figures are those written before"
    elif outcome.get("status") in STATUSES:
        status = outcome["status"]
        reason = str(outcome.get("reason", ""))
    else:
        status = "failed"
        reason = f"exited with status {rc} without a result: {_tail(log_path)}"
    return StepResult(step.name, step.title, status, step.cap_s, seconds, reason, figures, goals)


def skipped(step: Step, reason: str) -> StepResult:
    return StepResult(step.name, step.title, "skipped", step.cap_s, 0.0, reason)


def run_plan(steps: Sequence[Step], workdir: Path, gpu: GpuInfo, echo=print) -> list[StepResult]:
    """Every step in order, each announced with its cap; all skipped without a GPU."""
    results = []
    for i, step in enumerate(steps, 1):
        if not gpu.present:
            results.append(skipped(step, f"no NVIDIA GPU here: {gpu.detail}"))
            continue
        echo(f"step {i}/{len(steps)} {step.name} (cap {step.cap_s} s): {step.title}", flush=True)
        result = run_step(step, workdir)
        echo(f"  -> {result.status} in {result.seconds:.1f} s" + _why(result), flush=True)
        results.append(result)
    return results


def _why(result: StepResult) -> str:
    return f": {result.reason[:300]}" if result.reason and result.status != "ok" else ""


REPORT_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "edgefleet GPU check report",
    "type": "object",
    "required": ["schema", "finished", "host", "gpu", "total_cap_s", "seconds", "steps"],
    "properties": {
        "schema": {"const": SCHEMA},
        "finished": {"type": "string", "pattern": "^\\d{4}-\\d\\d-\\d\\dT[0-9:]{8}Z$"},
        "host": {"type": "object"},
        "gpu": {
            "type": "object",
            "required": ["present", "detail"],
            "properties": {"present": {"type": "boolean"}, "detail": {"type": "string"}},
        },
        "total_cap_s": {"type": "integer", "minimum": 0},
        "seconds": {"type": "number", "minimum": 0},
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "title", "status", "cap_s", "seconds", "reason", "figures"],
                "properties": {
                    "name": {"type": "string"},
                    "status": {"enum": list(STATUSES)},
                    "cap_s": {"type": "integer", "minimum": 1},
                    "seconds": {"type": "number", "minimum": 0},
                    "reason": {"type": "string"},
                    "figures": {"type": "object"},
                    "goals": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name", "target", "met"],
                            "properties": {"met": {"type": ["boolean", "null"]}},
                        },
                    },
                },
            },
        },
    },
}


def build_report(results: Sequence[StepResult], gpu: GpuInfo, seconds: float) -> dict:
    return {
        "schema": SCHEMA,
        "finished": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": {"python": platform.python_version(), "machine": platform.machine()},
        "gpu": asdict(gpu),
        "total_cap_s": sum(r.cap_s for r in results),
        "seconds": round(seconds, 2),
        "steps": [asdict(r) for r in results],
    }


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "/").replace("\n", " ")


def report_table(report: dict) -> str:
    """The short Markdown table: one row per step, then each goal."""
    lines = [
        f"GPU check ({report['finished']}): {report['gpu']['detail']}",
        "",
        "| step | status | seconds / cap | key figures | reason |",
        "|---|---|---|---|---|",
    ]
    for s in report["steps"]:
        figures = ", ".join(f"{k}={_cell(v)}" for k, v in list(s["figures"].items())[:6])
        lines.append(
            f"| {s['name']} | {s['status']} | {s['seconds']:.0f} / {s['cap_s']} | "
            f"{figures or '-'} | {_cell(s['reason'])[:200] or '-'} |"
        )
    goals = [(s["name"], g) for s in report["steps"] for g in s["goals"]]
    if goals:
        lines += ["", "| step | goal | target | met |", "|---|---|---|---|"]
        for name, g in goals:
            met = {True: "yes", False: "NO", None: "not measured"}[g["met"]]
            lines.append(f"| {name} | {g['name']} | {_cell(g['target'])} | {met} |")
    return "\n".join(lines) + "\n"


def write_report(report: dict, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, table_path = out / "gpu_check.json", out / "gpu_check.md"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    table_path.write_text(report_table(report))
    return json_path, table_path


def parse_args(argv: Sequence[str] | None = None, prog: str = "gpu-check") -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run every GPU path of edgefleet, each step under a time cap, and "
        "write one JSON report and a table. Example: python -m edgefleet.bench.gpu_check --dry-run",
    )
    parser.add_argument("--steps", help="comma-separated steps to run (default: all)")
    parser.add_argument(
        "--out", type=Path, help="report folder (default: $OUT, else build/gpu-check)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan and caps, run nothing"
    )
    parser.add_argument(
        "--cap-scale",
        type=float,
        default=1.0,
        help="multiply every cap (a slower GPU); the total is printed",
    )
    return parser.parse_args(argv)


def scaled(steps: Sequence[Step], factor: float) -> list[Step]:
    if factor <= 0:
        raise ValueError(f"--cap-scale must be positive, got {factor}")
    return [Step(s.name, s.title, max(1, round(s.cap_s * factor)), s.argv) for s in steps]


def main(
    argv: Sequence[str] | None = None, plan: Sequence[Step] = PLAN, prog: str = "gpu-check"
) -> int:
    args = parse_args(argv, prog)
    try:
        steps = scaled(select_steps(plan, args.steps), args.cap_scale)
    except ValueError as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(os.environ.get("OUT") or ROOT / "build" / "gpu-check")
    print(f"gpu-check plan: {len(steps)} step(s), at most {plan_total(steps)} s in all")
    if args.dry_run:
        for i, step in enumerate(steps, 1):
            print(f"step {i}/{len(steps)} {step.name} (cap {step.cap_s} s): {step.title}")
        return 0
    gpu = detect_gpu()
    if not gpu.present:
        print(f"no NVIDIA GPU here: {gpu.detail}; every step is skipped")
    started = time.monotonic()
    results = run_plan(steps, out / "steps", gpu)
    report = build_report(results, gpu, time.monotonic() - started)
    json_path, table_path = write_report(report, out)
    print(report_table(report))
    print(f"report: {json_path} and {table_path}")
    return 0


def app(args: Sequence[str] | None = None, prog_name: str | None = None) -> None:
    """Entry for `edgefleet bench gpu-check` (bench/cli.py calls each bench's `app`)."""
    raise SystemExit(main(args, prog=prog_name or "gpu-check"))


if __name__ == "__main__":
    raise SystemExit(main())
