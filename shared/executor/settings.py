"""Execution settings: backend preference, threads, precision, batching and memory budget.

These are plain pydantic models (not settings sources): each process nests them in its own
settings tree, so one YAML file configures the executor of the edge agent or the cloud.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from edgefleet.shared.config import Closed


class BatcherSettings(Closed):
    """Triton-style dynamic batching in front of a model."""

    enabled: bool = Field(
        True,
        description="queue requests and run them in batches (off: no queue, each call runs "
        "at once on its caller's thread, with no priority and no deadline that can free it)",
    )
    preferred_batch_size: int = Field(
        4, ge=1, le=256, description="a batch leaves as soon as this many requests wait"
    )
    max_batch_size: int = Field(8, ge=1, le=256, description="never put more in one batch")
    max_delay_ms: float = Field(
        5.0, ge=0, le=10_000, description="the oldest request waits at most this long"
    )
    max_queue: int = Field(
        64,
        ge=1,
        le=100_000,
        description="requests waiting beyond this are refused (overloaded), unless they "
        "outrank the lowest priority waiting, whose newest request is refused instead",
    )
    max_queue_per_tenant: int | None = Field(
        16,
        ge=1,
        le=100_000,
        description="requests one tenant (at the cloud, a device) may have waiting; its next "
        "is refused (overloaded), so one device's flood cannot fill the queue for the others; "
        "requests that name no tenant (the edge's own) are not bounded by it; none = no bound",
    )
    max_batch_per_tenant: int | None = Field(
        1,
        ge=1,
        le=256,
        description="requests of one tenant (at the cloud, a device) in one batch: a batch "
        "takes as long as its slowest image, so one device's heavy images must not fill the "
        "batch another device's case rides in; raise it where one device's cases should "
        "batch together (a GPU); requests that name no tenant are not bounded by it; "
        "none = no bound",
    )
    timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="deadline of a request that names none: past it, a request still queued "
        "is dropped and its caller gets a timeout",
    )
    workers: int = Field(1, ge=1, le=16, description="threads that run batches")
    eager: bool = Field(
        False,
        description=(
            "dispatch at once when a worker is idle instead of waiting max_delay_ms: batches "
            "then form only while the device is busy (lowest latency at low load)"
        ),
    )


class MemorySettings(Closed):
    """The memory budget of the device the models run on."""

    watermark: float = Field(
        0.85, gt=0, le=1.0, description="above this share of memory in use, new work is refused"
    )
    limit_mb: int | None = Field(
        None, ge=1, description="cap the budget below the device total (MiB); none = device total"
    )
    workspace_mb: int = Field(
        256, ge=0, description="scratch memory a GPU backend reserves per model (MiB)"
    )
    activation_factor: float = Field(
        12.0,
        gt=0,
        description=(
            "activations per batch item, as a multiple of one input tensor's bytes "
            "(PP-OCR on ONNX Runtime CPU measured ~8x: 400 MiB for a batch of 8)"
        ),
    )


class TensorRTSettings(Closed):
    """Engine building: optimisation profile for dynamic height/width, builder effort."""

    min_hw: tuple[int, int] = Field((32, 32), description="smallest H, W of dynamic inputs")
    opt_hw: tuple[int, int] = Field((640, 640), description="H, W TensorRT tunes kernels for")
    max_hw: tuple[int, int] = Field(
        (1024, 1600), description="largest H, W of dynamic inputs (OCR lines are wide)"
    )
    builder_optimization_level: int = Field(
        3, ge=0, le=5, description="TensorRT builder effort (higher builds slower, runs faster)"
    )
    calibration_images: int = Field(
        512, ge=1, description="at most this many images feed INT8 calibration"
    )


class ExecutionSettings(Closed):
    """How models are executed on this host."""

    backends: list[str] | None = Field(
        None,
        description="backend preference, best first; the first one that fits is chosen; "
        "none = every backend this build declares, in its shipped order (TensorRT first, "
        "torch on the CPU last)",
    )
    precision: Literal["fp32", "fp16", "int8"] = Field(
        "fp32", description="numeric precision; fp16/int8 need a GPU backend"
    )
    gpu_index: int = Field(0, ge=0, description="GPU index for CUDA/TensorRT backends")
    intra_op_threads: int = Field(
        0, ge=0, le=256, description="ONNX Runtime intra-op threads (0 = runtime default)"
    )
    inter_op_threads: int = Field(
        0, ge=0, le=256, description="ONNX Runtime inter-op threads (0 = runtime default)"
    )
    spinning: bool = Field(
        True,
        description="ONNX Runtime's idle threads spin for work (its default): lower latency "
        "on free cores, but on cores shared with decode or other sessions they burn the "
        "CPU the work needs (the edge turns it off)",
    )
    graph_optimization: Literal["disable", "basic", "extended", "all"] = Field(
        "all", description="ONNX Runtime graph optimisation level"
    )
    memory_arena: bool = Field(True, description="ONNX Runtime CPU memory arena on/off")
    warmup: bool = Field(True, description="run one inference in load() before declaring ready")
    engine_cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "edgefleet" / "engines",
        description="where TensorRT engines and timing caches are kept",
    )
    calibration_dir: Path | None = Field(
        None, description="folder of real images for INT8 calibration"
    )
    tensorrt: TensorRTSettings = Field(
        default_factory=TensorRTSettings, description="TensorRT engine building"
    )
    batching: BatcherSettings = Field(
        default_factory=BatcherSettings, description="dynamic batching"
    )
    memory: MemorySettings = Field(default_factory=MemorySettings, description="memory budget")


class TritonServing(Closed):
    """Where a model's forward pass runs when Triton Inference Server serves it (KServe v2).

    Pre- and post-processing stay in this process; only the tensors travel.
    """

    url: str = Field(
        min_length=1,
        max_length=256,
        description="the server's host:port (gRPC 8001, HTTP 8000 in NVIDIA's container)",
    )
    protocol: Literal["grpc", "http"] = Field("grpc", description="KServe v2 over gRPC or HTTP")
    model: str | None = Field(
        None,
        max_length=128,
        description="the model's name on the server; none = the manifest entry's name (a "
        "pipeline's components: each component's own name, as `cloud triton-repo` writes)",
    )
    version: str = Field(
        "", max_length=32, description="model version on the server; empty = its version policy"
    )
    connect_timeout_s: float = Field(
        2.0, gt=0, le=60, description="a server that does not answer this fast is down"
    )
    timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="bound of a call that carries no deadline of its own (a call from the "
        "model's scheduler carries its requests' deadline)",
    )
    verify_sha256: bool = Field(
        True,
        description="refuse a served model whose config's `edgefleet_sha256` parameter is not "
        "the manifest's sha256 (absent: logged, not refused)",
    )
