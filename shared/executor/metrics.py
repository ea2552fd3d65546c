"""Prometheus metrics of the execution layer, created once at import."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

MODEL_LOAD_SECONDS = Histogram(
    "ef_model_load_seconds",
    "Time to parse a model and build its session",
    ["model", "backend"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
MODEL_WARMUP_SECONDS = Histogram(
    "ef_model_warmup_seconds",
    "Time of the first (warm-up) inference inside load",
    ["model", "backend"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
INFER_SECONDS = Histogram(
    "ef_infer_seconds",
    "Forward-pass time per batch",
    ["model", "backend"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
BATCH_SIZE = Histogram(
    "ef_batch_size",
    "Requests per batch run by the dynamic batcher",
    ["batcher"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
)
QUEUE_DEPTH = Gauge(
    "ef_batcher_queue_depth", "Requests waiting, per model and priority", ["batcher", "priority"]
)
REJECTED = Counter(
    "ef_batcher_rejected_total",
    "Requests refused or failed by the batcher, by reason: overloaded (queue full), shed "
    "(gave way to a higher priority), expired (deadline passed before it reached the model), "
    "timeout (it ran past its deadline), cancelled (its caller went away while it waited), "
    "error",
    ["batcher", "reason"],
)
MEMORY_RESERVED = Gauge(
    "ef_memory_reserved_bytes", "Bytes admitted by the memory budget", ["device"]
)
MEMORY_REFUSED = Counter(
    "ef_memory_refused_total",
    "Loads or requests refused by the memory budget (reason: load, watermark)",
    ["reason"],
)
PREDICTIONS = Counter("ef_model_predictions_total", "Images run through a model", ["model"])
PREDICT_SECONDS = Histogram(
    "ef_model_predict_seconds",
    "Pre-process + forward + post-process time per batch of images",
    ["model"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
BACKEND_FALLBACKS = Counter(
    "ef_backend_fallbacks_total",
    "Backends passed over on the way down the preference order, by reason: unavailable "
    "(not installed, or its build lacks the provider), proof (the tiny model did not load "
    "or run on it), load (the model itself did not load on it)",
    ["backend", "reason"],
)
ENGINE_CACHE = Counter(
    "ef_engine_cache_total",
    "Engine cache look-ups by result: hit (an intact engine was read), built (it was absent "
    "or corrupt and was built)",
    ["result"],
)
ENGINE_CACHE_CORRUPT = Counter(
    "ef_engine_cache_corrupt_total",
    "Cached engines deleted to be built again, by reason: no_record or bad_record (a build "
    "cut short), digest (the bytes changed), deserialise (TensorRT refused it), ort_load "
    "(ONNX Runtime's TensorRT cache folder failed to load)",
    ["reason"],
)
TRITON_CALLS = Counter(
    "ef_triton_calls_total",
    "Forward passes sent to Triton Inference Server, per served model and outcome: ok, "
    "timeout (past the call's deadline), unavailable (the server or the model is down), "
    "error (the server answered with an error)",
    ["model", "outcome"],
)
TRITON_SECONDS = Histogram(
    "ef_triton_call_seconds",
    "Round trip of one forward pass on Triton as the orchestrator sees it (network, "
    "Triton's queue and batching, the model)",
    ["model"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
