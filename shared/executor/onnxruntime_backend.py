"""ONNX Runtime backend: CPU, CUDA and TensorRT execution providers."""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.shared.errors import ConfigError, EdgefleetError
from edgefleet.shared.executor.base import (
    Capabilities,
    InferenceFailed,
    ModelBlob,
    ModelLoadError,
    TensorSpec,
    runtime_message,
)
from edgefleet.shared.executor.engine_cache import key_lock, reset_folder
from edgefleet.shared.executor.metrics import INFER_SECONDS, MODEL_LOAD_SECONDS
from edgefleet.shared.executor.plugin import Backend, BackendTraits
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.executor.tensorrt_plan import (
    EngineKey,
    ProfileShape,
    calibration_digest,
    image_files,
    plan_profile,
)

log = logging.getLogger(__name__)

_PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "tensorrt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}
_NUMPY_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(uint8)": "uint8",
    "tensor(int8)": "int8",
    "tensor(bool)": "bool",
}


def _dims(shape: list) -> tuple[int | None, ...]:
    return tuple(d if isinstance(d, int) and d > 0 else None for d in shape)


class OnnxRuntimeExecutor:
    """One `InferenceSession`; `session.run` is thread-safe, so callers may share it."""

    def __init__(self, settings: ExecutionSettings, device: str = "cpu") -> None:
        if device not in _PROVIDERS:
            raise ValueError(f"unknown ONNX Runtime device {device!r}")
        self.settings = settings
        self.device = device
        self.name = f"onnxruntime-{device}"
        self._session: Any = None  # an onnxruntime.InferenceSession (ORT ships no types)
        self._model = "?"
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []

    def _session_options(self):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        s = self.settings
        if s.intra_op_threads:
            opts.intra_op_num_threads = s.intra_op_threads
        if s.inter_op_threads:
            opts.inter_op_num_threads = s.inter_op_threads
        if not s.spinning:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
            opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
        opts.graph_optimization_level = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }[s.graph_optimization]
        opts.enable_cpu_mem_arena = s.memory_arena
        opts.log_severity_level = 3
        return opts

    def trt_cache_dir(self, blob: ModelBlob) -> Path:
        """This model's own TensorRT-provider cache folder on this host."""
        import onnxruntime as ort

        gpu, cc = _gpu_identity(self.settings.gpu_index)
        key = ort_trt_key(blob, self.settings, f"ort{ort.__version__}-trt{_trt_version()}", gpu, cc)
        return self.settings.engine_cache_dir / "ort-trt" / key.stem(blob.name)

    def trt_profile(self, model: str, inputs: list[TensorSpec]) -> list[ProfileShape]:
        """The optimisation profile of the dynamic inputs (the bounds the cache key names),
        given to the TensorRT provider so that it builds one engine for the whole range at
        session creation, not one per new input size as they come. Empty (ORT's own lazy
        profile) where an input has a dynamic axis no profile plans."""
        ts, batching = self.settings.tensorrt, self.settings.batching
        try:
            planned = plan_profile(
                inputs,
                max_batch=batching.max_batch_size,
                opt_batch=batching.preferred_batch_size,
                min_hw=ts.min_hw,
                opt_hw=ts.opt_hw,
                max_hw=ts.max_hw,
            )
        except ConfigError as exc:
            log.info(
                "no TensorRT profile for this model: the provider sizes its engine lazily",
                extra={"model": model, "why": exc.message},
            )
            return []
        dynamic = {spec.name for spec in inputs if None in spec.shape}
        return [p for p in planned if p.name in dynamic]

    def provider_options(self, cache: Path | None, profile: list[ProfileShape]) -> list[dict]:
        s = self.settings
        out: list[dict] = []
        for provider in _PROVIDERS[self.device]:
            if provider == "TensorrtExecutionProvider" and cache is not None:
                options: dict[str, object] = {
                    "device_id": s.gpu_index,
                    "trt_fp16_enable": s.precision == "fp16",
                    "trt_engine_cache_enable": True,
                    "trt_engine_cache_path": str(cache),
                    "trt_timing_cache_enable": True,
                    "trt_max_workspace_size": s.memory.workspace_mb << 20,
                }
                if profile:
                    options.update(
                        {
                            "trt_profile_min_shapes": _shapes(profile, "min"),
                            "trt_profile_opt_shapes": _shapes(profile, "opt"),
                            "trt_profile_max_shapes": _shapes(profile, "max"),
                        }
                    )
                out.append(options)
            elif provider == "CUDAExecutionProvider":
                out.append({"device_id": s.gpu_index})
            else:
                out.append({})
        return out

    def load(self, blob: ModelBlob) -> None:
        import onnxruntime as ort

        if blob.format != "onnx":
            raise EdgefleetError(f"{self.name} runs ONNX models, not {blob.format}")
        started = time.perf_counter()
        providers = _PROVIDERS[self.device]
        missing = [p for p in providers if p not in ort.get_available_providers()]
        if missing:
            raise EdgefleetError(
                f"{self.name}: ONNX Runtime lacks {', '.join(missing)}",
                hint="install onnxruntime-gpu for CUDA/TensorRT providers",
            )
        if self.device == "tensorrt":
            cache = self.trt_cache_dir(blob)
            inputs = graph_inputs(blob)
            profile = self.trt_profile(blob.name, inputs)
            self._session = open_and_run_once(
                cache,
                lambda: self._open(blob, providers, cache, profile),
                first_feeds(inputs, profile),
            )
        else:
            self._session = self._open(blob, providers, None, [])
        check_providers(self.name, providers, self._session.get_providers())
        self._model = blob.name
        self._inputs = [
            TensorSpec(i.name, _dims(i.shape), _NUMPY_DTYPES.get(i.type, "float32"))
            for i in self._session.get_inputs()
        ]
        self._outputs = [
            TensorSpec(o.name, _dims(o.shape), _NUMPY_DTYPES.get(o.type, "float32"))
            for o in self._session.get_outputs()
        ]
        MODEL_LOAD_SECONDS.labels(blob.name, self.name).observe(time.perf_counter() - started)
        log.info(
            "model session ready",
            extra={"model": blob.name, "backend": self.name, "providers": providers},
        )

    def _open(
        self, blob: ModelBlob, providers: list[str], cache: Path | None, profile: list[ProfileShape]
    ) -> Any:
        import onnxruntime as ort

        try:
            session = ort.InferenceSession(
                blob.data,
                sess_options=self._session_options(),
                providers=providers,
                provider_options=self.provider_options(cache, profile),
            )
        except Exception as exc:  # ORT raises its own (non-typed) errors on bad graphs
            raise ModelLoadError(
                f"{self.name} cannot load {blob.name}: {runtime_message(exc)}"
            ) from None
        return session

    @property
    def metadata(self) -> dict[str, str]:
        """Custom metadata of the ONNX file (e.g. the PP-OCR character list)."""
        if self._session is None:
            return {}
        return dict(self._session.get_modelmeta().custom_metadata_map)

    def infer(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._session is None:
            raise EdgefleetError(f"{self.name}: infer() before load()")
        started = time.perf_counter()
        try:
            outputs = self._session.run(None, batch)
        except Exception as exc:  # ORT's own types (InvalidArgument, Fail, ValueError)
            raise InferenceFailed(f"{self._model}: {runtime_message(exc)}") from None
        INFER_SECONDS.labels(self._model, self.name).observe(time.perf_counter() - started)
        return outputs

    def close(self) -> None:
        self._session = None

    @property
    def capabilities(self) -> Capabilities:
        first = self._inputs[0].shape if self._inputs else ()
        return Capabilities(
            backend=self.name,
            device="cpu" if self.device == "cpu" else f"cuda:{self.settings.gpu_index}",
            dtypes=("float32", "float16") if self.device != "cpu" else ("float32",),
            dynamic_shapes=any(d is None for d in first),
            max_batch_size=first[0] if first and first[0] is not None else None,
            precision=self.settings.precision if self.device == "tensorrt" else "fp32",
            # what the session really started (check_providers refused a silent fallback)
            providers=tuple(self._session.get_providers())
            if self._session is not None
            else tuple(_PROVIDERS[self.device]),
        )

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self._outputs)


def graph_inputs(blob: ModelBlob) -> list[TensorSpec]:
    """The model's inputs (names, shapes, types), read by a CPU session that optimises
    nothing: the TensorRT provider's profile must name them before its own session opens."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(blob.data, opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own (non-typed) errors on bad graphs
        raise ModelLoadError(
            f"cannot read the inputs of {blob.name}: {runtime_message(exc)}"
        ) from None
    return [
        TensorSpec(i.name, _dims(i.shape), _NUMPY_DTYPES.get(i.type, "float32"))
        for i in session.get_inputs()
    ]


def first_feeds(inputs: list[TensorSpec], profile: list[ProfileShape]) -> dict[str, np.ndarray]:
    """Zeros for every input, at the profile's opt shape (dynamic axes without one: 1)."""
    opt = {p.name: p.opt for p in profile}
    return {
        spec.name: np.zeros(opt.get(spec.name) or tuple(d or 1 for d in spec.shape), spec.dtype)
        for spec in inputs
    }


def open_and_run_once(cache: Path, open_session: Callable[[], Any], feeds: dict[str, np.ndarray]):
    """Open a TensorRT-provider session and run it once, both under the cache key's lock.

    ORT's TensorRT provider builds (or reads) its engine when the session opens if every
    dynamic input has a profile, and at the first run if not: both happen here, so
    replicas sharing the folder wait for one build instead of building the same engine
    side by side, and each reads it after. An engine ORT refuses (cut short, built by
    another TensorRT) empties the folder, counted, and is built once more.
    """
    with key_lock(cache / ".lock"):
        try:
            return _run_once(open_session(), feeds)
        except ModelLoadError:
            if not reset_folder(cache, "ort_load"):
                raise
            return _run_once(open_session(), feeds)


def _run_once(session: Any, feeds: dict[str, np.ndarray]) -> Any:
    try:
        session.run(None, feeds)
    except Exception as exc:  # ORT's own types: an engine it could not build or read
        raise ModelLoadError(f"the first run failed: {runtime_message(exc)}") from None
    return session


def _shapes(profile: list[ProfileShape], which: str) -> str:
    """A profile bound as the TensorRT provider reads it: `x:1x3x32x32,y:...`."""
    return ",".join(f"{p.name}:{'x'.join(str(d) for d in getattr(p, which))}" for p in profile)


def check_providers(backend: str, requested: list[str], got: list[str]) -> None:
    """ONNX Runtime falls back to the CPU, silently, when a GPU provider fails to start
    (a missing CUDA or TensorRT library): refuse that, so the backend chain moves on to an
    explicit choice and says why, instead of a "cuda" model quietly running on the CPU."""
    if requested and requested[0] not in got:
        raise ModelLoadError(
            f"{backend}: ONNX Runtime did not start {requested[0]} (it has {', '.join(got)})",
            hint="check the CUDA/TensorRT libraries ONNX Runtime's log names",
        )


def ort_trt_key(
    blob: ModelBlob, settings: ExecutionSettings, runtime: str, gpu_name: str, cc: str
) -> EngineKey:
    """What an ONNX Runtime TensorRT engine depends on. ORT names its cached engines after
    graph and node names, not weights: a fine-tuned model of the same architecture would
    load the old engine, so each key gets its own folder."""
    ts, batching = settings.tensorrt, settings.batching
    bounds = ProfileShape(
        "*",
        (1, *ts.min_hw),
        (batching.preferred_batch_size, *ts.opt_hw),
        (batching.max_batch_size, *ts.max_hw),
    )
    calibration = ""
    if settings.precision == "int8" and settings.calibration_dir is not None:
        files = image_files(settings.calibration_dir)[: ts.calibration_images]
        calibration = calibration_digest(files)
    return EngineKey(blob.sha256, runtime, gpu_name, cc, settings.precision, (bounds,), calibration)


def _trt_version() -> str:
    """The TensorRT libraries ONNX Runtime will load (the wheel that ships them)."""
    for dist in ("tensorrt", "tensorrt-cu12-libs", "tensorrt-libs", "tensorrt-cu11-libs"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(dist)
    try:  # JetPack's TensorRT comes from apt, with no distribution metadata
        import tensorrt

        return str(tensorrt.__version__)
    except Exception:  # absent, or present but unable to load: ORT would say why
        return "none"


def _gpu_identity(gpu_index: int) -> tuple[str, str]:
    from edgefleet.shared.executor.tensorrt_backend import gpu_identity

    try:
        return gpu_identity(gpu_index)
    except Exception:  # neither NVML nor cuda-python here: ORT still knows its own GPU
        return "unknown", "unknown"


def _providers() -> set[str]:
    try:
        import onnxruntime as ort
    except ImportError:
        return set()
    return set(ort.get_available_providers())


def _has(provider: str) -> Callable[[], str | None]:
    def probe() -> str | None:
        providers = _providers()
        if "CPUExecutionProvider" not in providers:
            return "onnxruntime not installed"
        return None if provider in providers else f"this onnxruntime build has no {provider}"

    return probe


def _on(device: str) -> Callable[[ExecutionSettings], OnnxRuntimeExecutor]:
    return lambda settings: OnnxRuntimeExecutor(settings, device=device)


BACKENDS = (
    # INT8 through ORT's TensorRT provider needs a calibration table made elsewhere; the
    # native backend calibrates itself, so INT8 is offered there only
    Backend(
        "onnxruntime-tensorrt",
        BackendTraits(frozenset({"onnx"}), frozenset({"fp32", "fp16"}), gpu=True),
        _on("tensorrt"),
        _has("TensorrtExecutionProvider"),
        rank=1,
    ),
    Backend(
        "onnxruntime-cuda",
        BackendTraits(frozenset({"onnx"}), frozenset({"fp32"}), gpu=True),
        _on("cuda"),
        _has("CUDAExecutionProvider"),
        rank=2,
    ),
    Backend(
        "onnxruntime-cpu",
        BackendTraits(frozenset({"onnx"}), frozenset({"fp32"}), gpu=False),
        _on("cpu"),
        _has("CPUExecutionProvider"),
        rank=3,
    ),
)
