"""Native TensorRT backend: build engines from ONNX (FP16/INT8), cache them, run them.

What needs no GPU (cache keys, profile planning, calibration batching) lives in
`tensorrt_plan`; TensorRT and CUDA are imported inside the functions here, so this
module imports on any host and TensorRT loads only when this backend is chosen.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgefleet.shared.errors import ConfigError, EdgefleetError
from edgefleet.shared.executor.base import Capabilities, InferenceFailed, ModelBlob, TensorSpec
from edgefleet.shared.executor.engine_cache import cached_build, invalidate, write_atomic
from edgefleet.shared.executor.metrics import INFER_SECONDS, MODEL_LOAD_SECONDS
from edgefleet.shared.executor.plugin import Backend, BackendTraits
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.executor.tensorrt_plan import (
    EngineKey,
    calibration_batches,
    calibration_digest,
    image_files,
    letterbox_loader,
    plan_profile,
)

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, int, int], None]


class EngineBuildError(EdgefleetError):
    code = "engine_build_failed"
    http_status = 500
    hint = "check the ONNX opset against this TensorRT version; the log has TensorRT's errors"


def tensorrt_available() -> bool:
    return importlib.util.find_spec("tensorrt") is not None


# --- CUDA plumbing (cuda-python), used only where TensorRT runs ------------------------------


def _cudart():
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError:
            raise EdgefleetError(
                "the TensorRT backend needs cuda-python for device memory",
                hint="pip install cuda-python (JetPack: the matching cuda-python wheel)",
            ) from None
    return cudart


def _check(result):
    err, *rest = result
    if int(err) != 0:
        raise EdgefleetError(f"CUDA call failed with error {int(err)}")
    return rest[0] if len(rest) == 1 else rest


def gpu_identity(gpu_index: int = 0) -> tuple[str, str]:
    """(GPU name, compute capability 'M.m'): NVML on dGPUs, the CUDA runtime on Jetson."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
            name = pynvml.nvmlDeviceGetName(handle)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        finally:
            pynvml.nvmlShutdown()
        return (name.decode() if isinstance(name, bytes) else str(name)), f"{major}.{minor}"
    except Exception:  # NVML is absent on Jetson: ask CUDA itself
        props = _check(_cudart().cudaGetDeviceProperties(gpu_index))
        name = props.name.decode(errors="replace").rstrip("\x00")
        return name, f"{props.major}.{props.minor}"


# --- building -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildResult:
    path: Path
    key: EngineKey
    cached: bool
    build_s: float
    data: bytes = field(repr=False, default=b"")


def _network_inputs(network) -> list[TensorSpec]:
    specs = []
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = tuple(int(d) if int(d) >= 0 else None for d in tensor.shape)
        specs.append(TensorSpec(tensor.name, shape))
    return specs


def build_or_load_engine(
    blob: ModelBlob,
    settings: ExecutionSettings,
    *,
    max_batch: int | None = None,
    opt_batch: int | None = None,
    spatial: tuple[int, int] | None = None,
    on_progress: ProgressFn | None = None,
) -> BuildResult:
    """The cached engine for this ONNX on this GPU, building it (and caching) if absent."""
    import tensorrt as trt

    if blob.format != "onnx":
        raise EngineBuildError(f"{blob.name}: engines are built from ONNX, not {blob.format}")
    trt_logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(trt_logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse(blob.data):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"{blob.name}: TensorRT cannot parse the ONNX: {errors}")
    ts = settings.tensorrt
    hw = spatial or ts.opt_hw
    profile_plan = plan_profile(
        _network_inputs(network),
        max_batch=max_batch or settings.batching.max_batch_size,
        opt_batch=opt_batch or settings.batching.preferred_batch_size,
        min_hw=(min(ts.min_hw[0], hw[0]), min(ts.min_hw[1], hw[1])),
        opt_hw=hw,
        max_hw=(max(ts.max_hw[0], hw[0]), max(ts.max_hw[1], hw[1])),
    )
    calibration: list[Path] = []
    if settings.precision == "int8":
        if settings.calibration_dir is None:
            raise ConfigError("INT8 needs `calibration_dir`: a folder of real images")
        calibration = image_files(settings.calibration_dir)[: ts.calibration_images]
    gpu_name, cc = gpu_identity(settings.gpu_index)
    key = EngineKey(
        blob.sha256,
        trt.__version__,
        gpu_name,
        cc,
        settings.precision,
        tuple(profile_plan),
        calibration_digest(calibration) if calibration else "",
    )
    cache_dir = settings.engine_cache_dir
    timing_path = cache_dir / key.timing_cache_name()

    def build() -> bytes:
        config = builder.create_builder_config()
        config.set_memory_pool_limit(
            trt.MemoryPoolType.WORKSPACE, settings.memory.workspace_mb << 20
        )
        config.builder_optimization_level = ts.builder_optimization_level
        profile = builder.create_optimization_profile()
        for p in profile_plan:
            profile.set_shape(p.name, p.min, p.opt, p.max)
        config.add_optimization_profile(profile)
        if settings.precision in {"fp16", "int8"}:
            config.set_flag(trt.BuilderFlag.FP16)
        if calibration:
            first = profile_plan[0]
            config.set_flag(trt.BuilderFlag.INT8)
            config.int8_calibrator = make_entropy_calibrator(
                calibration_batches(
                    calibration,
                    first.opt[0],
                    letterbox_loader((first.opt[2], first.opt[3]), blob.mean, blob.std, blob.bgr),
                    max_images=ts.calibration_images,
                ),
                batch_size=first.opt[0],
                cache_path=cache_dir / key.calibration_cache_name(blob.name),
            )
            config.set_calibration_profile(profile)
        timing = config.create_timing_cache(
            timing_path.read_bytes() if timing_path.exists() else b""
        )
        config.set_timing_cache(timing, ignore_mismatch=True)
        if on_progress is not None and hasattr(trt, "IProgressMonitor"):
            config.progress_monitor = _progress_monitor(trt, on_progress)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise EngineBuildError(f"{blob.name}: TensorRT failed to build the engine")
        write_atomic(timing_path, bytes(config.get_timing_cache().serialize()))
        return bytes(serialized)

    started = time.perf_counter()
    entry = cached_build(cache_dir / key.filename(blob.name), key.canonical(), build)
    build_s = 0.0 if entry.cached else time.perf_counter() - started
    if not entry.cached:
        log.info(
            "engine built",
            extra={"model": blob.name, "engine": str(entry.path), "seconds": build_s},
        )
    return BuildResult(entry.path, key, entry.cached, build_s, entry.data)


def _progress_monitor(trt, on_progress: ProgressFn):
    class Monitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.totals: dict[str, int] = {}

        def phase_start(self, phase_name, parent_phase, num_steps):
            self.totals[phase_name] = num_steps
            on_progress(phase_name, 0, num_steps)

        def step_complete(self, phase_name, step):
            on_progress(phase_name, step + 1, self.totals.get(phase_name, step + 1))
            return True

        def phase_finish(self, phase_name):
            total = self.totals.get(phase_name, 1)
            on_progress(phase_name, total, total)

    return Monitor()


def make_entropy_calibrator(batches: Iterator[np.ndarray], *, batch_size: int, cache_path: Path):
    """An IInt8EntropyCalibrator2 fed from `batches`, keeping its cache at `cache_path`."""
    import tensorrt as trt

    cudart = _cudart()

    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._batches = batches
            self._device: int | None = None  # the batch buffer's device pointer
            self._nbytes = 0

        def get_batch_size(self) -> int:
            return batch_size

        def get_batch(self, names):
            try:
                batch = next(self._batches)
            except StopIteration:
                return None
            if self._device is None or batch.nbytes > self._nbytes:
                if self._device is not None:
                    _check(cudart.cudaFree(self._device))
                self._device = _check(cudart.cudaMalloc(batch.nbytes))
                self._nbytes = batch.nbytes
            _check(
                cudart.cudaMemcpy(
                    self._device,
                    batch.ctypes.data,
                    batch.nbytes,
                    cudart.cudaMemcpyKind.cudaMemcpyHostToDevice,
                )
            )
            return [int(self._device)]

        def read_calibration_cache(self):
            return cache_path.read_bytes() if cache_path.exists() else None

        def write_calibration_cache(self, cache) -> None:
            write_atomic(cache_path, bytes(cache))

    return EntropyCalibrator()


# --- the executor -------------------------------------------------------------------------


class TensorRTExecutor:
    """Runs a TensorRT engine (built from ONNX and cached, or loaded as a verified .engine)."""

    def __init__(self, settings: ExecutionSettings) -> None:
        self.settings = settings
        self.name = "tensorrt"
        self._engine = None
        self._context = None
        self._stream = None
        self._model = "?"
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._buffers: dict[str, tuple[int, int]] = {}  # name -> (device ptr, bytes)
        self._lock = threading.Lock()

    def load(self, blob: ModelBlob) -> None:
        import tensorrt as trt

        started = time.perf_counter()
        if blob.format not in {"onnx", "tensorrt-engine"}:
            raise EdgefleetError(f"tensorrt runs ONNX or engine files, not {blob.format}")
        cudart = _cudart()
        _check(cudart.cudaSetDevice(self.settings.gpu_index))
        # the logger and runtime must outlive the engine: keep references
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        if blob.format == "onnx":
            built = build_or_load_engine(blob, self.settings)
            engine = self._runtime.deserialize_cuda_engine(built.data)
            if engine is None and built.cached:
                # intact on disk but refused by this runtime: build it again, once
                invalidate(built.path, built.data, "deserialise")
                built = build_or_load_engine(blob, self.settings)
                engine = self._runtime.deserialize_cuda_engine(built.data)
        else:
            engine = self._runtime.deserialize_cuda_engine(blob.data)
        if engine is None:
            raise EngineBuildError(
                f"{blob.name}: the engine does not deserialise on this TensorRT/GPU",
                hint="rebuild it here with `edgefleet model build-engine`",
            )
        self._engine = engine
        self._context = engine.create_execution_context()
        self._stream = _check(cudart.cudaStreamCreate())
        self._model = blob.name
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            shape = tuple(int(d) if int(d) >= 0 else None for d in engine.get_tensor_shape(name))
            dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(name))).name
            spec = TensorSpec(name, shape, dtype)
            if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                self._inputs.append(spec)
            else:
                self._outputs.append(spec)
        MODEL_LOAD_SECONDS.labels(blob.name, self.name).observe(time.perf_counter() - started)

    def _buffer(self, name: str, nbytes: int) -> int:
        cudart = _cudart()
        ptr, size = self._buffers.get(name, (0, 0))
        if nbytes > size:
            if ptr:
                _check(cudart.cudaFree(ptr))
            ptr = int(_check(cudart.cudaMalloc(nbytes)))
            self._buffers[name] = (ptr, nbytes)
        return ptr

    def infer(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        """One execution context and its buffers are shared: one inference at a time."""
        with self._lock:
            return self._infer(batch)

    def _infer(self, batch: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._context is None:
            raise EdgefleetError("tensorrt: infer() before load()")
        cudart = _cudart()
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        started = time.perf_counter()
        keep = []
        for spec in self._inputs:
            if spec.name not in batch:
                raise InferenceFailed(
                    f"{self._model}: input {spec.name!r} missing (got {', '.join(batch)})"
                )
            arr = np.ascontiguousarray(batch[spec.name], dtype=spec.dtype)
            keep.append(arr)
            if not self._context.set_input_shape(spec.name, arr.shape):
                raise InferenceFailed(
                    f"{self._model}: input {spec.name} shape {arr.shape} is outside the "
                    "engine's optimisation profile"
                )
            ptr = self._buffer(spec.name, arr.nbytes)
            self._context.set_tensor_address(spec.name, ptr)
            _check(cudart.cudaMemcpyAsync(ptr, arr.ctypes.data, arr.nbytes, h2d, self._stream))
        outputs = []
        for spec in self._outputs:
            shape = tuple(self._context.get_tensor_shape(spec.name))
            out = np.empty(shape, dtype=spec.dtype)
            ptr = self._buffer(spec.name, max(1, out.nbytes))
            self._context.set_tensor_address(spec.name, ptr)
            outputs.append((out, ptr))
        if not self._context.execute_async_v3(int(self._stream)):
            raise InferenceFailed(f"tensorrt: execution of {self._model} failed")
        for out, ptr in outputs:
            _check(cudart.cudaMemcpyAsync(out.ctypes.data, ptr, out.nbytes, d2h, self._stream))
        _check(cudart.cudaStreamSynchronize(self._stream))
        INFER_SECONDS.labels(self._model, self.name).observe(time.perf_counter() - started)
        return [out for out, _ in outputs]

    def close(self) -> None:
        if self._buffers or self._stream is not None:
            cudart = _cudart()
            for ptr, _ in self._buffers.values():
                cudart.cudaFree(ptr)
            if self._stream is not None:
                cudart.cudaStreamDestroy(self._stream)
        self._buffers.clear()
        self._stream = None
        self._context = None
        self._engine = None
        self._runtime = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            backend=self.name,
            device=f"cuda:{self.settings.gpu_index}",
            dtypes=("float32", "float16", "int8"),
            dynamic_shapes=True,
            max_batch_size=self.settings.batching.max_batch_size,
            precision=self.settings.precision,
        )

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self._inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self._outputs)


BACKENDS = (
    Backend(
        "tensorrt",
        BackendTraits(
            frozenset({"onnx", "tensorrt-engine"}), frozenset({"fp32", "fp16", "int8"}), gpu=True
        ),
        TensorRTExecutor,
        lambda: None if tensorrt_available() else "TensorRT (tensorrt) not installed",
        rank=0,
    ),
)
