"""Device telemetry: per-stream fps/drops/latency, escalations, outbox, CPU/RAM and GPU.

GPU figures come from NVML on a discrete GPU and from `tegrastats` on a Jetson (where
NVML is not available); on a CPU-only host the `gpu` field is absent. `TelemetryReporter`
assembles one `DeviceTelemetry` per period and stores it in the outbox like any message.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from edgefleet.edge.outbox import Outbox
from edgefleet.edge.slot import ModelSlot
from edgefleet.edge.sources.capture import Capture
from edgefleet.edge.uplink import Uplink
from edgefleet.edge.verdicts import VerdictBook
from edgefleet.shared.messages import (
    DeviceTelemetry,
    EscalationCounters,
    GpuTelemetry,
    Latency,
    StreamId,
    StreamTelemetry,
)
from edgefleet.shared.wire import serialise

log = logging.getLogger(__name__)


# --- per-stream window statistics ---------------------------------------------------------


@dataclass
class StreamWindow:
    """Frames done and their end-to-end latencies since the last telemetry message."""

    frames: int = 0
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))


class WindowStats:
    """Thread-safe per-stream counters, read and reset once per telemetry period."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: dict[str, StreamWindow] = {}
        self.escalated: dict[str, int] = {}

    def record(self, stream_id: StreamId, latency_ms: float) -> None:
        with self._lock:
            window = self._windows.setdefault(stream_id, StreamWindow())
            window.frames += 1
            window.latencies_ms.append(latency_ms)

    def take(self, stream_id: StreamId) -> tuple[int, Latency]:
        """Frames and latency percentiles of the window that ends now."""
        with self._lock:
            window = self._windows.pop(stream_id, StreamWindow())
        return window.frames, latency_of(list(window.latencies_ms))


def latency_of(values_ms: list[float]) -> Latency:
    if not values_ms:
        return Latency(p50=0.0, p95=0.0, p99=0.0)
    p50, p95, p99 = np.percentile(np.asarray(values_ms), [50, 95, 99])
    return Latency(p50=round(float(p50), 3), p95=round(float(p95), 3), p99=round(float(p99), 3))


# --- host ---------------------------------------------------------------------------------


def host_usage() -> tuple[float, float]:
    """(CPU % since the previous call, RAM used in MiB) of the whole device."""
    return float(psutil.cpu_percent(interval=None)), psutil.virtual_memory().used / 2**20


# --- tegrastats (Jetson) ------------------------------------------------------------------

_RAM = re.compile(r"\bRAM (\d+)/(\d+)MB")
_GR3D = re.compile(r"\bGR3D_FREQ (\d+)%")
_TEMP = re.compile(r"\b([A-Za-z0-9_]+)@(-?\d+(?:\.\d+)?)C\b")
_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)mW/(\d+)mW")


def parse_tegrastats(line: str) -> GpuTelemetry | None:
    """GPU figures of one tegrastats line (JetPack 5/6, Orin Nano/NX/AGX); None if not one.

    On Jetson the GPU shares the RAM, so memory is the RAM figure. Power is `VDD_IN` (the
    module input) where the board reports it, else the sum of the reported rails.
    Sensors that are off read -256 C and are ignored.
    """
    ram = _RAM.search(line)
    gr3d = _GR3D.search(line)
    if ram is None and gr3d is None:
        return None
    temps = {name.lower(): float(value) for name, value in _TEMP.findall(line)}
    temps = {name: value for name, value in temps.items() if value > -200}
    temp = temps.get("gpu", temps.get("tj"))
    rails = {name: int(now) for name, now, _avg in _RAIL.findall(line)}
    rails.pop("NC", None)
    if "VDD_IN" in rails:
        power_mw: float | None = rails["VDD_IN"]
    else:
        power_mw = sum(rails.values()) if rails else None
    return GpuTelemetry(
        util_pct=float(gr3d.group(1)) if gr3d else None,
        mem_used_mb=float(ram.group(1)) if ram else None,
        mem_total_mb=float(ram.group(2)) if ram else None,
        temp_c=temp,
        power_w=None if power_mw is None else round(power_mw / 1000.0, 3),
    )


class TegrastatsProbe:
    """Runs `tegrastats --interval` in the background and keeps its last line."""

    def __init__(self, binary: str, interval_ms: int = 1000):
        self.command = [binary, "--interval", str(interval_ms)]
        self._last: str | None = None
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> TegrastatsProbe:
        """Run tegrastats and read its lines on a daemon thread (once)."""
        if self._proc is None:
            self._proc = subprocess.Popen(
                self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
            reader = threading.Thread(
                target=self._read, args=(self._proc,), name="tegrastats", daemon=True
            )
            reader.start()
        return self

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self._last = line.strip()

    def sample(self) -> GpuTelemetry | None:
        return parse_tegrastats(self._last) if self._last else None

    def close(self) -> None:
        if self._proc is not None:
            self._proc.terminate()


class NvmlProbe:
    """GPU 0 through NVML (nvidia-ml-py) on a discrete GPU."""

    def __init__(self, index: int = 0):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def sample(self) -> GpuTelemetry | None:
        nv = self._nvml
        try:
            util = nv.nvmlDeviceGetUtilizationRates(self._handle)
            mem = nv.nvmlDeviceGetMemoryInfo(self._handle)
            temp = nv.nvmlDeviceGetTemperature(self._handle, nv.NVML_TEMPERATURE_GPU)
            try:
                power = nv.nvmlDeviceGetPowerUsage(self._handle) / 1000.0
            except nv.NVMLError:
                power = None
        except nv.NVMLError as exc:
            log.warning("NVML read failed: %s", exc)
            return None
        return GpuTelemetry(
            util_pct=float(util.gpu),
            mem_used_mb=mem.used / 2**20,
            mem_total_mb=mem.total / 2**20,
            temp_c=float(temp),
            power_w=power,
        )

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class NoGpu:
    """CPU-only host: no GPU figures (a null object instead of None checks)."""

    def sample(self) -> GpuTelemetry | None:
        return None

    def close(self) -> None:
        pass


GpuProbe = TegrastatsProbe | NvmlProbe | NoGpu


def gpu_probe() -> GpuProbe:
    """Tegrastats on a Jetson, NVML where a driver answers, else nothing."""
    tegrastats = shutil.which("tegrastats")
    if Path("/etc/nv_tegra_release").exists() and tegrastats:
        return TegrastatsProbe(tegrastats).start()
    try:
        return NvmlProbe()
    except Exception as exc:  # no library, no driver or no device: a CPU host
        log.info("no GPU telemetry: %s", exc)
        return NoGpu()


# --- the periodic message -------------------------------------------------------------


class TelemetryReporter:
    """Every `interval_s`: one `DeviceTelemetry` into the outbox. Its thread also checks
    the streams for stalls twice a second (the one periodic thread of the agent)."""

    def __init__(
        self,
        device_id: str,
        *,
        interval_s: float,
        qos: int,
        captures: list[Capture],
        stats: WindowStats,
        outbox: Outbox,
        uplink: Uplink,
        model: ModelSlot,
        verdicts: VerdictBook,
        gpu: GpuProbe,
    ):
        self.device_id = device_id
        self.interval_s = interval_s
        self.qos = qos
        self.captures = captures
        self.stats = stats
        self.outbox = outbox
        self.uplink = uplink
        self.model = model
        self.verdicts = verdicts
        self.gpu = gpu
        self.started_at = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)

    def start(self) -> TelemetryReporter:
        host_usage()  # prime psutil's CPU counter: the first window then has a figure
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        self.gpu.close()

    def uptime_s(self) -> float:
        return round(time.monotonic() - self.started_at, 3)

    def collect(self, window_s: float) -> DeviceTelemetry:
        """The telemetry of the window that ends now (its counters are reset)."""
        streams = []
        for capture in self.captures:
            frames, latency = self.stats.take(capture.stream_id)
            streams.append(
                StreamTelemetry(
                    stream_id=capture.stream_id,
                    state=capture.state,
                    fps=round(frames / window_s, 3),
                    frames_dropped=capture.dropped,
                    latency_ms=latency,
                    reconnects=capture.reconnects,
                )
            )
        cpu, ram = host_usage()
        return DeviceTelemetry(
            device_id=self.device_id,
            seq=self.outbox.next_seq(),
            uptime_s=self.uptime_s(),
            streams=streams,
            escalations=EscalationCounters(
                sent=self.uplink.sent.get("escalation", 0),
                pending=self.outbox.depth("escalation"),
                dropped=self.outbox.dropped.get("escalation", 0),
            ),
            outbox_depth=self.outbox.depth(),
            outbox_dropped=self.outbox.dropped_total,
            cpu_pct=cpu,
            ram_used_mb=round(ram, 1),
            gpu=self.gpu.sample(),
            model=self.model.info,
            agreement_rate=self.verdicts.agreement_rate,
        )

    def send(self, window_s: float) -> DeviceTelemetry:
        """Collect and store one message for the uplink."""
        message = self.collect(window_s)
        self.outbox.put(serialise(message), qos=self.qos)
        self.uplink.wake()
        return message

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(min(0.5, max(0.0, next_at - time.monotonic()))):
            for capture in self.captures:
                capture.check_stall()
            if time.monotonic() >= next_at:
                next_at += self.interval_s
                try:
                    self.send(self.interval_s)
                except Exception:  # telemetry must never stop the agent
                    log.exception("telemetry failed")
