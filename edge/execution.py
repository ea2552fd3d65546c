"""The edge's own executor tuning: the cores split between inference workers, no spinning.

Kept apart from the model seam so that the settings can lay these defaults beneath what
the file and the environment give (`EdgeSettings.layered_defaults`).
"""

from __future__ import annotations

import os

from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings


def usable_cores() -> int:
    """The cores this process may run on: a container limited to a cpuset (docker
    --cpuset-cpus) sees the host's count in os.cpu_count(), and N threads per worker there
    would fight over the few cores it has."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 2


def edge_execution(workers: int) -> ExecutionSettings:
    """The edge's executor defaults: `workers` runs side by side, the cores split between,
    and ONNX Runtime's idle threads not spinning.

    A spinning session burns CPU per frame that decode, the post stage and the machine's
    other work need, and runs slower for it. Without spinning, one worker spreading each
    frame over every core (the default, `infer_workers: 1`) has the lower p95; two
    single-threaded workers overlap OCR's single-threaded parts and have more throughput on
    otherwise idle cores: `infer_workers: 2` trades p95 for it (`edgefleet bench edge`
    measures both; docs/decisions.md). The batcher still queues requests (several streams
    share the model) but sends a batch as soon as one waits.
    """
    cores = usable_cores()
    return ExecutionSettings(
        intra_op_threads=max(1, cores // workers),
        spinning=False,  # decode, post and the other workers share these cores
        batching=BatcherSettings(workers=workers, preferred_batch_size=1, max_delay_ms=2.0),
    )
