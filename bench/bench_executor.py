"""Models and dynamic batching against the way users call a model, side by side.

Run: `.venv/bin/python -m edgefleet.bench.bench_executor --rounds 3` (16 images, interleaved
rounds).

For each default model (`ppocr`, `ppocr-heavy`) on each backend available here:
- latency of one image at a time (batch 1, no queue), p50/p95;
- N concurrent callers (1/2/4/8 threads) each calling `predict_many([image])` directly
  (batch 1, what a user writes) vs the same callers going through the dynamic batcher
  (`predict`, Triton-style max_delay batching) and through an eager batcher (dispatch
  when idle), with throughput (images/s) and the ratios to batch 1;
- the batcher's own cost per request, with a no-op model (direct vs eager vs max_delay);
- the rapidocr-onnxruntime pipeline (same ONNX files) as a peer, when importable.
Images: 960x540 scenes rendered here with two lines of text each.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from functools import partial

import cv2
import numpy as np
import typer

from edgefleet.shared.executor.backends import probe_backends
from edgefleet.shared.executor.batcher import DynamicBatcher
from edgefleet.shared.executor.proof import prove
from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
from edgefleet.shared.models import load_model
from edgefleet.shared.models.base import Model
from edgefleet.shared.models.frames import FrameIn
from edgefleet.shared.models.ocr import OcrModel

app = typer.Typer(add_completion=False)
CALLERS = (1, 2, 4, 8)


def scene_lines(i: int) -> list[str]:
    """The two lines of text drawn on scene `i` (its ground truth)."""
    return [f"GATE {i:02d} BAY {7 * i + 3}", f"SERIAL SN {5518 + 37 * i}-{i:04d}"]


def scenes(count: int, start: int = 0) -> list[np.ndarray]:
    """Scenes `start` .. `start + count - 1`: 960x540 RGB, the two lines of `scene_lines`."""
    rng = np.random.default_rng(start)
    out = []
    for i in range(start, start + count):
        img = np.full((540, 960, 3), int(rng.integers(200, 245)), np.uint8)
        first, second = scene_lines(i)
        cv2.putText(img, first, (60, 180), cv2.FONT_HERSHEY_DUPLEX, 1.6, (20, 20, 20), 3)
        cv2.putText(img, second, (60, 380), cv2.FONT_HERSHEY_SIMPLEX, 1.4, (40, 10, 10), 3)
        out.append(img)
    return out


def run_callers(call, images: list[np.ndarray], callers: int) -> tuple[float, list[float]]:
    """Images/s and per-request latencies with `callers` threads sharing the images."""
    latencies: list[float] = []
    lock = threading.Lock()
    work = list(images)

    def worker():
        while True:
            with lock:
                if not work:
                    return
                img = work.pop()
            t0 = time.perf_counter()
            call(img)
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)

    threads = [threading.Thread(target=worker) for _ in range(callers)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return len(images) / (time.perf_counter() - t0), latencies


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1000, q))


def forward_only(data: list[np.ndarray], rounds: int) -> None:
    """The executor alone: det forward of 4 images one by one vs one batch of 4."""
    settings = ExecutionSettings(batching=BatcherSettings(enabled=False))
    with load_model("ppocr", settings=settings) as model:
        assert isinstance(model, OcrModel)  # ppocr: its detector is model.det
        batch = model.pre_process([FrameIn.checked(d) for d in data[:4]]).tensor
        singles = [batch[i : i + 1] for i in range(4)]
        model.det.run(batch)
        one_by_one = min(_time(lambda: [model.det.run(x) for x in singles]) for _ in range(rounds))
        batched = min(_time(lambda: model.det.run(batch)) for _ in range(rounds))
    print()
    print("| executor (ppocr-det forward, 4 images 640x384) | ms | ratio |")
    print("|---|---|---|")
    print(f"| 4 x batch 1 | {one_by_one * 1000:.0f} | 1.00x |")
    print(f"| 1 x batch 4 | {batched * 1000:.0f} | {one_by_one / batched:.2f}x |")


def batcher_overhead(max_delay_ms: float, requests: int = 2000) -> None:
    """The batcher's own cost per request: a no-op model called directly vs through the
    batcher (eager, and with `max_delay_ms`), one caller at a time."""

    def noop(items: list[int]) -> list[int]:
        return items

    def per_request(call) -> float:
        t0 = time.perf_counter()
        for i in range(requests):
            call(i)
        return (time.perf_counter() - t0) / requests

    direct = per_request(lambda i: noop([i])[0])
    rows = [("direct call (no queue)", direct)]
    for label, eager in (
        ("batcher, eager", True),
        (f"batcher, max_delay_ms={max_delay_ms}", False),
    ):
        settings = BatcherSettings(max_delay_ms=max_delay_ms, eager=eager, max_queue=requests)
        with DynamicBatcher(noop, settings, name=f"bench-noop-{eager}") as batcher:
            rows.append((label, per_request(batcher)))
    print()
    print(f"| batcher overhead (no-op model, 1 caller, {requests} requests) | µs / request |")
    print("|---|---|")
    for label, seconds in rows:
        print(f"| {label} | {seconds * 1e6:.1f} |")


def _predict_alone(model: Model, image: np.ndarray) -> object:
    """One image through predict_many: no batching across callers."""
    return model.predict_many([image])


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


@app.command()
def main(
    images: int = typer.Option(16, help="rendered images per measurement"),
    rounds: int = typer.Option(1, help="repeat each measurement, keep the best"),
    max_delay_ms: float = typer.Option(5.0, help="batcher max delay"),
    workers: int = typer.Option(2, help="batcher worker threads (overlap Python and ORT)"),
) -> None:
    """Print model latency and throughput, batch 1 vs dynamic batching, with ratios.

    Each default model on each backend available here, with 1 to 8 concurrent callers.

    Example: edgefleet bench executor --rounds 3
    """
    data = scenes(images)
    settings = ExecutionSettings()
    verdicts = {
        name: why or prove(name, settings) for name, why in probe_backends().items()
    }  # what is installed and really runs here (a tiny model loaded and run)
    available = [name for name, why in verdicts.items() if why is None]
    unavailable = {n: w for n, w in verdicts.items() if w is not None}
    print(f"backends here: {', '.join(available)}")
    for name, why in unavailable.items():
        print(f"  not measured: {name} ({why})")
    print()
    print(
        "| model | backend | callers | batch 1 img/s | batcher img/s | ratio | "
        "eager img/s | ratio | batch 1 p50 ms | batcher p50 ms | eager p50 ms | mean batch |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    singles: dict[tuple[str, str], list[float]] = {}
    for backend in available:
        if backend.startswith("torch"):
            continue  # the default pack is ONNX
        for model_name in ("ppocr", "ppocr-heavy"):
            batching = BatcherSettings(
                preferred_batch_size=4,
                max_batch_size=8,
                max_delay_ms=max_delay_ms,
                max_queue=256,
                workers=workers,
            )
            delayed = load_model(
                model_name, settings=ExecutionSettings(backends=[backend], batching=batching)
            )
            eager = load_model(
                model_name,
                settings=ExecutionSettings(
                    backends=[backend], batching=batching.model_copy(update={"eager": True})
                ),
            )
            delayed.predict_many([data[0]])  # warm
            eager.predict_many([data[0]])
            for callers in CALLERS:
                best: dict[str, tuple[float, list[float]]] = {
                    "naive": (0.0, []),
                    "delay": (0.0, []),
                    "eager": (0.0, []),
                }
                assert delayed.batcher is not None  # loaded with batching on
                sizes_before = len(delayed.batcher.batch_sizes)
                calls: dict[str, Callable[[np.ndarray], object]] = {
                    "naive": partial(_predict_alone, delayed),
                    "delay": delayed.predict,
                    "eager": eager.predict,
                }
                for _ in range(rounds):  # interleaved, best of rounds (shared machine)
                    for key, call in calls.items():
                        best[key] = max(
                            best[key], run_callers(call, data, callers), key=lambda r: r[0]
                        )
                sizes = list(delayed.batcher.batch_sizes)[sizes_before:]
                if callers == 1:
                    singles[(model_name, backend)] = best["naive"][1]
                n, d, e = best["naive"], best["delay"], best["eager"]
                print(
                    f"| {model_name} | {backend} | {callers} | {n[0]:.2f} | {d[0]:.2f} | "
                    f"{d[0] / n[0]:.2f}x | {e[0]:.2f} | {e[0] / n[0]:.2f}x | "
                    f"{pct(n[1], 50):.0f} | {pct(d[1], 50):.0f} | {pct(e[1], 50):.0f} | "
                    f"{statistics.mean(sizes):.2f} |"
                )
            delayed.close()
            eager.close()
    forward_only(data, rounds)
    batcher_overhead(max_delay_ms)
    print()
    print("| pipeline | backend | p50 ms / image | p95 ms / image |")
    print("|---|---|---|---|")
    for (model_name, backend), lat in singles.items():
        print(f"| edgefleet {model_name} | {backend} | {pct(lat, 50):.0f} | {pct(lat, 95):.0f} |")
    try:
        from rapidocr_onnxruntime import RapidOCR
    except Exception as exc:  # the peer is optional: its extra deps may be absent
        print(f"| rapidocr-onnxruntime | - | not importable: {type(exc).__name__} | - |")
        return
    engine = RapidOCR()
    engine(cv2.cvtColor(data[0], cv2.COLOR_RGB2BGR))
    lat = []
    for img in data:
        t0 = time.perf_counter()
        engine(cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
        lat.append(time.perf_counter() - t0)
    print(
        f"| rapidocr-onnxruntime 1.4.4 (peer, cls on) | onnxruntime-cpu | "
        f"{pct(lat, 50):.0f} | {pct(lat, 95):.0f} |"
    )


if __name__ == "__main__":
    app()
