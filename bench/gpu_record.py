"""What a GPU-check step records and needs: its result file, its missing packages.

Shared by the step runner (`edgefleet.bench.gpu_steps`) and the measured paths
(`edgefleet.bench.gpu_paths`), which import it and not each other's module.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from edgefleet.bench.gpu_check import ROOT, STATUSES, Status

# The engine cache the tensorrt step fills (emptied first, so builds are measured) and the
# batching step reuses: outside $OUT, so engines are not copied back with the report.
CACHE_DIR = ROOT / "build" / "gpu-check-cache"


class MissingPackage(Exception):
    """A package a step needs is not importable: the step is skipped, naming it."""


class Recorder:
    """The outcome of one step, rewritten to its result file at every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.figures: dict[str, object] = {}
        self.goals: list[dict[str, object]] = []
        self.status: Status | None = None
        self.reason = ""
        self.flush()

    def figure(self, **values: object) -> None:
        self.figures.update(values)
        self.flush()

    def goal(self, name: str, target: str, met: bool | None) -> None:
        self.goals.append({"name": name, "target": target, "met": met})
        self.flush()

    def finish(self, status: Status, reason: str = "") -> None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        self.status, self.reason = status, reason
        self.flush()

    def flush(self) -> None:
        data: dict[str, object] = {"figures": self.figures, "goals": self.goals}
        if self.status is not None:
            data.update(status=self.status, reason=self.reason)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, default=str))
        tmp.replace(self.path)


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing
        return False


def need(*modules: str) -> None:
    """Raise MissingPackage naming every module of `modules` that is not importable."""
    missing = [m for m in modules if not installed(m)]
    if missing:
        raise MissingPackage(f"not installed here: {', '.join(missing)}")


def cuda_python_installed() -> bool:
    """cuda-python: `cuda.bindings` (12.6+) or the older `cuda.cudart`."""
    return installed("cuda.bindings") or installed("cuda.cudart")
