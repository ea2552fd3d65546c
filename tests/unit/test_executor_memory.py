"""MemoryBudget: admit or refuse before load, the watermark, batch caps, device probes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgefleet.shared.errors import MemoryBudgetExceeded, Overloaded
from edgefleet.shared.executor.memory import (
    Footprint,
    HostProbe,
    JetsonProbe,
    MemoryBudget,
    MemorySnapshot,
    parse_meminfo,
)
from edgefleet.shared.executor.settings import MemorySettings

GiB = 1 << 30
MiB = 1 << 20


class FixedProbe:
    """A device whose memory use the test sets (hand-written, public constructor)."""

    device = "fake:0"

    def __init__(self, total: int, used: int) -> None:
        self.total, self.used = total, used

    def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(self.device, self.total, self.used)


def test_footprint_counts_weights_activations_per_batch_and_workspace():
    fp = Footprint(weights=100 * MiB, activations_per_item=50 * MiB, workspace=256 * MiB)
    assert fp.need(1) == 406 * MiB
    assert fp.need(8) == (100 + 400 + 256) * MiB


def test_admits_under_the_watermark_and_refuses_above_it():
    # given 10 GiB with 5 GiB used and the default 85% watermark (8.5 GiB usable)
    probe = FixedProbe(10 * GiB, 5 * GiB)
    budget = MemoryBudget(probe, cache_s=0)
    budget.reserve("a", 2 * GiB)  # 7 GiB of 8.5
    # when a second model would pass the watermark, then it is refused, typed, retryable
    with pytest.raises(MemoryBudgetExceeded) as err:
        budget.reserve("b", 2 * GiB)
    assert err.value.http_status == 503 and err.value.retry_after_s > 0
    assert "model b needs ~2048 MiB" in err.value.message
    assert "85% watermark" in err.value.message
    # once "a" is loaded (its memory now counted in `used`), its reservation is released
    budget.release("a")
    probe.used = 7 * GiB
    budget.reserve("c", 1 * GiB)


def test_limit_caps_the_budget_below_the_device():
    budget = MemoryBudget(
        FixedProbe(100 * GiB, 0), MemorySettings(limit_mb=1024, watermark=0.5), cache_s=0
    )
    budget.reserve("small", 400 * MiB)
    with pytest.raises(MemoryBudgetExceeded):
        budget.reserve("big", 200 * MiB)


def test_watermark_refuses_new_work_with_a_retryable_error():
    probe = FixedProbe(10 * GiB, 8 * GiB)
    budget = MemoryBudget(probe, MemorySettings(watermark=0.85), cache_s=0)
    budget.check_watermark()  # 80% < 85%
    probe.used = 9 * GiB
    with pytest.raises(Overloaded) as err:
        budget.check_watermark()
    assert err.value.code == "memory_watermark"
    assert err.value.retry_after_s > 0
    # the server is short of memory, not the caller too fast: 503 with Retry-After
    assert err.value.http_status == 503


def test_batch_cap_follows_headroom():
    probe = FixedProbe(10 * GiB, 0)
    budget = MemoryBudget(probe, MemorySettings(watermark=0.5), cache_s=0)  # 5 GiB usable
    assert budget.max_batch(1 * GiB, ceiling=8) == 5
    probe.used = int(4.5 * GiB)
    assert budget.max_batch(1 * GiB, ceiling=8) == 1  # never below 1: the request runs alone
    assert budget.max_batch(0, ceiling=8) == 8


def test_meminfo_parsing_and_jetson_unified_memory(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(
        "MemTotal:       7999999 kB\nMemFree:         1000000 kB\n"
        "MemAvailable:    3000000 kB\nNvMapMemUsed:     400000 kB\nHugePages_Total:       0\n"
    )
    info = parse_meminfo(meminfo.read_text())
    assert info["MemTotal"] == 7999999 * 1024
    assert info["HugePages_Total"] == 0
    snap = JetsonProbe(meminfo).snapshot()
    assert snap.device == "jetson"
    assert snap.total == 7999999 * 1024
    assert snap.used == (7999999 - 3000000) * 1024
    assert snap.available == 3000000 * 1024
    assert snap.gpu_used == 400000 * 1024  # NvMap: the GPU's share of the same RAM


def test_host_probe_reads_this_machine():
    snap = HostProbe().snapshot()
    assert snap.total > snap.used > 0
    assert 0 < snap.process_rss < snap.total


@pytest.mark.gpu
def test_nvml_probe_reads_the_gpu():
    from edgefleet.shared.executor.memory import NvmlProbe

    snap = NvmlProbe(0).snapshot()
    assert snap.device == "cuda:0" and snap.total > 0 and 0 <= snap.used <= snap.total
    budget = MemoryBudget(NvmlProbe(0))
    with pytest.raises(MemoryBudgetExceeded):
        budget.reserve("huge", snap.total)


def test_load_model_is_refused_before_loading_when_it_does_not_fit():
    from edgefleet.shared.models import load_model

    # given a device with 100 MiB and nothing used: PP-OCR needs far more at batch 8
    budget = MemoryBudget(FixedProbe(100 * MiB, 0), cache_s=0)
    with pytest.raises(MemoryBudgetExceeded, match="model ppocr-det needs"):
        load_model("ppocr", budget=budget)
    # nothing stays reserved after a refusal
    budget.reserve("other", 80 * MiB)


def test_a_tight_budget_caps_the_batch_of_a_loaded_model():
    from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
    from edgefleet.shared.models import load_model

    probe = FixedProbe(64 * GiB, 0)
    budget = MemoryBudget(probe, cache_s=0)
    settings = ExecutionSettings(batching=BatcherSettings(max_batch_size=8, max_delay_ms=1))
    with load_model("ppocr", settings=settings, budget=budget) as model:
        assert model.batcher.max_batch_now() == 8
        # memory fills up to just under the watermark: batches shrink to what fits, not 0
        probe.used = int(64 * GiB * 0.85) - 1
        assert model.batcher.max_batch_now() == 1
        probe.used = int(64 * GiB * 0.9)
        with pytest.raises(Overloaded, match="watermark"):
            model.predict(np.zeros((32, 32, 3), np.uint8))


def test_request_checks_use_a_short_cache_a_reservation_reads_afresh():
    probe = FixedProbe(10 * GiB, 1 * GiB)
    budget = MemoryBudget(probe, cache_s=3600)
    budget.check_watermark()  # reads and caches 10% in use
    probe.used = 9 * GiB
    budget.check_watermark()  # still the cached reading: no probe call per request
    with pytest.raises(MemoryBudgetExceeded):
        budget.reserve("m", 1 * GiB)  # the reservation sees the real 90%
