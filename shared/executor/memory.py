"""The memory budget: a model's memory reserved before it loads, new work refused above a
watermark.

Three ways to read memory, one per kind of device:
- dGPU: NVML (device memory is separate from host RAM);
- Jetson: /proc/meminfo, because GPU and CPU share the same RAM (unified memory), so a
  GPU allocation is host memory too and NVML is absent or partial there;
- CPU only: host RAM, with this process's RSS reported alongside.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from edgefleet.shared.errors import MemoryBudgetExceeded
from edgefleet.shared.executor.metrics import MEMORY_REFUSED, MEMORY_RESERVED
from edgefleet.shared.executor.settings import MemorySettings

log = logging.getLogger(__name__)

MiB = 1 << 20


@dataclass(frozen=True)
class MemorySnapshot:
    """Bytes of the budgeted device at one moment."""

    device: str
    total: int
    used: int
    process_rss: int = 0
    gpu_used: int = 0  # GPU allocations (NVML on dGPU; NvMap on Jetson, inside `used`)

    @property
    def available(self) -> int:
        return max(0, self.total - self.used)


class MemoryProbe(Protocol):
    """Reads the memory of one device."""

    device: str

    def snapshot(self) -> MemorySnapshot: ...


class HostProbe:
    """CPU-only hosts: host RAM (used = total - available) and this process's RSS."""

    device = "cpu"

    def snapshot(self) -> MemorySnapshot:
        import psutil

        vm = psutil.virtual_memory()
        rss = psutil.Process().memory_info().rss
        return MemorySnapshot(self.device, int(vm.total), int(vm.total - vm.available), int(rss))


def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes per key (values are in kB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return out


class JetsonProbe:
    """Jetson unified memory: GPU allocations come out of the same RAM as the CPU's.

    `used` is MemTotal - MemAvailable, which already includes CUDA allocations (they come
    out of the same pages); `gpu_used` is the NvMap share of it (what tegrastats shows as
    GPU memory) where the kernel reports NvMapMemUsed.
    """

    device = "jetson"

    def __init__(self, meminfo: Path = Path("/proc/meminfo")) -> None:
        self.meminfo = meminfo

    def snapshot(self) -> MemorySnapshot:
        info = parse_meminfo(self.meminfo.read_text())
        total = info.get("MemTotal", 0)
        available = info.get("MemAvailable", info.get("MemFree", 0))
        return MemorySnapshot(
            self.device, total, total - available, gpu_used=info.get("NvMapMemUsed", 0)
        )


class NvmlProbe:
    """Discrete GPU: device memory as NVML reports it."""

    def __init__(self, index: int = 0) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.device = f"cuda:{index}"

    def snapshot(self) -> MemorySnapshot:
        info = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return MemorySnapshot(self.device, int(info.total), int(info.used), gpu_used=int(info.used))


def is_jetson() -> bool:
    return Path("/etc/nv_tegra_release").exists()


def detect_probe(gpu: bool, gpu_index: int = 0) -> MemoryProbe:
    """The probe for where models will run: Jetson, a dGPU via NVML, or host RAM."""
    if is_jetson():
        return JetsonProbe()
    if gpu:
        return NvmlProbe(gpu_index)
    return HostProbe()


@dataclass(frozen=True)
class Footprint:
    """Estimated bytes a model needs: weights + activations per batch item + workspace."""

    weights: int
    activations_per_item: int
    workspace: int = 0

    def need(self, max_batch: int) -> int:
        return self.weights + self.activations_per_item * max(1, max_batch) + self.workspace


class MemoryBudget:
    """Admits models whose estimated need fits under the watermark; refuses new work above it.

    Reservations cover memory a load will take but which does not show in the device's
    `used` yet; a reservation is released once the model is loaded (its memory is then
    visible in `used`) or when the load fails.
    """

    def __init__(
        self,
        probe: MemoryProbe,
        settings: MemorySettings | None = None,
        *,
        cache_s: float = 0.1,
    ) -> None:
        self.probe = probe
        self.settings = settings or MemorySettings()
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._reserved: dict[str, int] = {}
        self._cached: tuple[float, MemorySnapshot] | None = None

    def _recent(self) -> MemorySnapshot:
        """A snapshot at most `cache_s` old: the per-request checks stay cheap (reading
        memory is a query to the device or the OS), a reservation always reads afresh."""
        now = time.monotonic()
        cached = self._cached
        if cached is not None and now - cached[0] < self.cache_s:
            return cached[1]
        snap = self.probe.snapshot()
        self._cached = (now, snap)
        return snap

    @property
    def device(self) -> str:
        return self.probe.device

    def _used(self, snap: MemorySnapshot) -> int:
        """Bytes counted against the budget: with a `limit_mb` cap on a host, this
        process's RSS (the cap is this process's share); otherwise the device's use."""
        if self.settings.limit_mb is not None and snap.process_rss:
            return snap.process_rss
        return snap.used

    def capacity(self, snap: MemorySnapshot) -> int:
        """Bytes usable under the watermark (and the configured limit)."""
        total = snap.total
        if self.settings.limit_mb is not None:
            total = min(total, self.settings.limit_mb * MiB)
        return int(total * self.settings.watermark)

    def headroom(self) -> int:
        """Bytes still free to reserve now, reservations included."""
        snap = self._recent()
        with self._lock:
            reserved = sum(self._reserved.values())
        used = self._used(snap)
        return self.capacity(snap) - used - reserved

    def reserve(self, name: str, need: int) -> None:
        """Reserve `need` bytes for `name` or raise MemoryBudgetExceeded (nothing loaded)."""
        snap = self.probe.snapshot()
        used = self._used(snap)
        with self._lock:
            reserved = sum(self._reserved.values())
            free = self.capacity(snap) - used - reserved
            if need > free:
                MEMORY_REFUSED.labels("load").inc()
                raise MemoryBudgetExceeded(
                    f"model {name} needs ~{need / MiB:.0f} MiB on {snap.device}, "
                    f"{max(0, free) / MiB:.0f} MiB left under the "
                    f"{self.settings.watermark:.0%} watermark",
                    retry_after_s=30.0,
                )
            self._reserved[name] = self._reserved.get(name, 0) + need
            MEMORY_RESERVED.labels(snap.device).set(sum(self._reserved.values()))
        log.info("memory reserved", extra={"model": name, "need_mib": need // MiB})

    def release(self, name: str) -> None:
        with self._lock:
            self._reserved.pop(name, None)
            MEMORY_RESERVED.labels(self.device).set(sum(self._reserved.values()))

    def check_watermark(self) -> None:
        """Refuse new work while memory in use is above the watermark: a retryable
        MemoryBudgetExceeded (an Overloaded; HTTP 503 + Retry-After, since the server, not
        the caller, is short of memory) instead of an out-of-memory crash later."""
        snap = self._recent()
        used = self._used(snap)
        if used > self.capacity(snap):
            MEMORY_REFUSED.labels("watermark").inc()
            raise MemoryBudgetExceeded(
                f"memory on {snap.device} is above the {self.settings.watermark:.0%} watermark",
                code="memory_watermark",
                hint="retry after Retry-After; if it persists, load fewer models or lower "
                "max_batch_size",
                retry_after_s=2.0,
            )

    def max_batch(self, activations_per_item: int, ceiling: int) -> int:
        """The largest batch (1..ceiling) whose activations fit in the headroom now."""
        if activations_per_item <= 0:
            return ceiling
        fits = self.headroom() // activations_per_item
        return int(max(1, min(ceiling, fits)))
