"""Telemetry pieces: tegrastats parsing on recorded lines, latency windows, GPU probes."""

from __future__ import annotations

import pytest

from edgefleet.edge.telemetry import (
    NoGpu,
    TegrastatsProbe,
    WindowStats,
    gpu_probe,
    latency_of,
    parse_tegrastats,
)
from tests.support.waiting import eventually

# Lines in the format tegrastats prints on each board (JetPack 6 / L4T 36 prefixes a date).
ORIN_NANO = (
    "11-29-2026 19:40:01 RAM 2547/7620MB (lfb 10x4MB) SWAP 0/3810MB (cached 0MB) "
    "CPU [2%@729,1%@729,0%@729,0%@729,0%@729,0%@729] EMC_FREQ 0%@2133 GR3D_FREQ 37%@[305] "
    "NVENC off NVDEC off NVJPG off NVJPG1 off VIC off OFA off APE 200 cpu@47.5C soc2@46.781C "
    "soc0@47.468C gpu@47.375C tj@47.5C soc1@47.062C VDD_IN 4436mW/4436mW "
    "VDD_CPU_GPU_CV 483mW/483mW VDD_SOC 1330mW/1330mW"
)
ORIN_NX = (
    "RAM 3137/15388MB (lfb 2536x4MB) SWAP 0/7694MB (cached 0MB) "
    "CPU [1%@1984,0%@1984,0%@1984,0%@1984,off,off,off,off] EMC_FREQ 0%@3199 "
    "GR3D_FREQ 99%@[1019] NVDEC off NVJPG off NVJPG1 off VIC off OFA off NVDLA0 off "
    "NVDLA1 off PVA0_FREQ off APE 200 cpu@51.312C soc2@48.687C soc0@49.5C gpu@58.031C "
    "tj@58.031C soc1@48.593C VDD_IN 12364mW/9012mW VDD_CPU_GPU_CV 5154mW/3311mW "
    "VDD_SOC 2530mW/1930mW"
)
AGX_ORIN = (
    "RAM 4422/30536MB (lfb 6026x4MB) SWAP 0/15268MB (cached 0MB) "
    "CPU [0%@729,0%@729,0%@729,0%@729,0%@729,0%@729,0%@729,0%@729,0%@729,0%@729,0%@729,"
    "0%@729] EMC_FREQ 0%@2133 GR3D_FREQ 12%@[0,0] VIC_FREQ 729 APE 174 CV0@-256C "
    "CPU@46.5C Tboard@35C SOC2@42.75C Tdiode@37.75C SOC0@43.656C CV1@-256C GPU@-256C "
    "tj@46.5C SOC1@42.656C CV2@-256C VDD_GPU_SOC 2396mW/2396mW VDD_CPU_CV 399mW/399mW "
    "VIN_SYS_5V0 2719mW/2719mW NC 0mW/0mW VDDQ_VDD2_1V8AO 303mW/303mW NC 0mW/0mW"
)


def test_orin_nano_line() -> None:
    gpu = parse_tegrastats(ORIN_NANO)
    assert gpu is not None
    assert gpu.util_pct == 37.0
    assert (gpu.mem_used_mb, gpu.mem_total_mb) == (2547.0, 7620.0)
    assert gpu.temp_c == pytest.approx(47.375)
    assert gpu.power_w == pytest.approx(4.436)


def test_orin_nx_line() -> None:
    gpu = parse_tegrastats(ORIN_NX)
    assert gpu is not None
    assert gpu.util_pct == 99.0
    assert gpu.mem_total_mb == 15388.0
    assert gpu.temp_c == pytest.approx(58.031)
    assert gpu.power_w == pytest.approx(12.364)  # VDD_IN, the current reading, not the average


def test_agx_orin_line_sums_rails_and_skips_sensors_that_are_off() -> None:
    gpu = parse_tegrastats(AGX_ORIN)
    assert gpu is not None
    assert gpu.util_pct == 12.0
    assert gpu.mem_used_mb == 4422.0
    assert gpu.temp_c == pytest.approx(46.5)  # GPU@-256C is off: the junction temperature
    assert gpu.power_w == pytest.approx((2396 + 399 + 2719 + 303) / 1000)


def test_lines_that_are_not_tegrastats() -> None:
    assert parse_tegrastats("") is None
    assert parse_tegrastats("tegrastats: permission denied") is None


def test_latency_percentiles_and_windows() -> None:
    assert latency_of([]).p50 == 0
    lat = latency_of([float(v) for v in range(1, 101)])
    assert lat.p50 == pytest.approx(50.5) and lat.p99 == pytest.approx(99.01)
    stats = WindowStats()
    for v in (10.0, 20.0, 30.0):
        stats.record("s", v)
    frames, window = stats.take("s")
    assert frames == 3 and window.p50 == 20.0
    assert stats.take("s")[0] == 0  # the window was reset


def test_cpu_host_reports_no_gpu() -> None:
    assert NoGpu().sample() is None


@pytest.mark.gpu
def test_nvml_probe_reads_the_gpu() -> None:
    from edgefleet.edge.telemetry import NvmlProbe

    probe = gpu_probe()
    assert isinstance(probe, NvmlProbe)
    gpu = probe.sample()
    assert gpu is not None and gpu.mem_total_mb and gpu.mem_total_mb > 0
    probe.close()


def test_the_tegrastats_probe_runs_only_once_started_and_keeps_the_last_line(tmp_path) -> None:
    # given a stand-in for tegrastats that prints an Orin Nano line per interval
    script = tmp_path / "tegrastats"
    script.write_text(f'#!/bin/sh\nwhile true; do echo "{ORIN_NANO}"; sleep 0.05; done\n')
    script.chmod(0o755)
    probe = TegrastatsProbe(str(script), interval_ms=50)
    # then nothing runs until it is started
    assert probe.sample() is None
    probe.start().start()
    try:
        eventually(lambda: probe.sample() is not None, 30, "a tegrastats line read")
        assert probe.sample() == parse_tegrastats(ORIN_NANO)
    finally:
        probe.close()
