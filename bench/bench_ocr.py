"""Edge OCR against its peers, side by side in one run, on the same images and threads.

Run: `edgefleet bench ocr` (a few minutes on 2 cores; `--easy 4 --hard 12` for ~1 minute).

Contenders, each given the same JPEG bytes (decoding is part of every figure):
- edgefleet's edge model (`--model`, default `ppocr6-tiny`), ONNX Runtime with `--threads`;
- `faster-paddle` (Rust + ONNX Runtime, PP-OCRv6 tiny and small bundled), `threads` set
  to the same number; an optional bench dependency (`pip install 'edgefleet[bench]'`):
  skipped, and said so, where it is not installed;
- `rapidocr-onnxruntime` (PP-OCRv4 mobile, Python + ONNX Runtime), same threads.

Images (edgefleet/demo/scenes/stills.py, all from `--seed`): easy 1080p stills, hard 640x360
frames of two renderers: `hard`, OpenCV's Hershey fonts (small, faint, blurred, glare,
heavy JPEG; edgefleet/demo/scenes/clips.py), and `ttf`, TrueType fonts (the cascade's
scenarios: perspective, shake, low light, H.264, faded plates;
edgefleet/demo/scenes/scenarios.py). Per contender and set: ms per image (p50, p95; each
image read `--rounds` times, one image at a time, after a warm-up; the
contenders take turns image by image, so the host's load falls on all alike, with a pause
between two so that one's spinning threads do not slow the next) and
character accuracy / exact lines per true line (the best read overlapping it, case and
spaces ignored); the last column scores the same reads with O and 0 settled by their
word as edgefleet's reader settles them (`settle_kinds`; the rest of its rule needs the
recogniser's probabilities, which a peer does not give): what that alone is worth to each
peer. The last tables give the edge model's time and accuracy over the faster-paddle
model of the same size (tiny; the issue's bar is accuracy >= and p50 <= 0.8x) and over
faster-paddle small (the gap to the larger model).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
import typer

from edgefleet.demo.scenes.clips import Tally, frame_scores
from edgefleet.demo.scenes.stills import Scene, scenes
from edgefleet.shared.models.outputs.kinds import settle_kinds
from edgefleet.shared.models.registry import DEFAULT_MODEL

app = typer.Typer(add_completion=False)

Box = tuple[float, float, float, float]
Read = Callable[[bytes], list[tuple[str, Box | None]]]


@dataclass
class Result:
    name: str
    times: dict[str, list[float]] = field(default_factory=dict)
    tallies: dict[str, Tally] = field(default_factory=dict)
    settled: dict[str, Tally] = field(default_factory=dict)  # its reads with O/0 settled
    skipped: str = ""

    def p(self, level: str, q: float) -> float:
        values = self.times.get(level) or [float("nan")]
        return float(np.percentile(values, q)) * 1000


def edgefleet_reader(model_name: str, threads: int) -> tuple[Read, Callable[[], None]]:
    import cv2

    from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
    from edgefleet.shared.models import load_model

    settings = ExecutionSettings(
        backends=["onnxruntime-cpu"],
        intra_op_threads=threads,
        batching=BatcherSettings(enabled=False),
    )
    model = load_model(model_name, settings=settings)

    def read(jpeg: bytes) -> list[tuple[str, Box | None]]:
        bgr = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ValueError("JPEG decoding failed")
        lines = model.predict_many([bgr], fmt="bgr")[0]  # as a camera frame: no conversion
        return [(d.text or "", d.box) for d in lines]

    return read, model.close


def faster_paddle_reader(size: str, threads: int) -> tuple[Read, Callable[[], None]]:
    from faster_paddle import OcrEngine

    engine = OcrEngine(model_size=size, threads=threads)

    def read(jpeg: bytes) -> list[tuple[str, Box | None]]:
        bounds = engine.ocr(jpeg)["bounds"].values()
        return [(b["text"], (*b["topLeftCoord"], *b["bottomRightCoord"])) for b in bounds]

    return read, lambda: None


def rapidocr_reader(threads: int) -> tuple[Read, Callable[[], None]]:
    import cv2
    from rapidocr_onnxruntime import RapidOCR

    engine = RapidOCR(intra_op_num_threads=threads, inter_op_num_threads=1)

    def read(jpeg: bytes) -> list[tuple[str, Box | None]]:
        bgr = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        found, _ = engine(bgr)
        out: list[tuple[str, Box | None]] = []
        for quad, text, _score in found or []:
            q = np.asarray(quad, np.float32)
            out.append((text, (q[:, 0].min(), q[:, 1].min(), q[:, 0].max(), q[:, 1].max())))
        return out

    return read, lambda: None


Maker = Callable[[], tuple[Read, Callable[[], None]]]
PAUSE_S = 0.05  # between two contenders' reads: ONNX Runtime and rayon spin a while when idle


def measure(makers: dict[str, Maker], images: list[Scene], rounds: int) -> list[Result]:
    """Every contender reads every image, interleaved: image by image, each contender in
    turn (the order turning from image to image), so that a change in the host's load
    falls on all of them alike and the ratios hold on a shared machine."""
    results = {name: Result(name) for name in makers}
    readers: dict[str, Read] = {}
    closers: list[Callable[[], None]] = []
    try:
        for name, make in makers.items():
            try:
                readers[name], close = make()
            except ImportError as exc:
                why = f"not installed ({exc.name}): pip install 'edgefleet[bench]'"
                results[name].skipped = why
                continue
            closers.append(close)
            readers[name](images[0].jpeg)  # warm-up
        names = list(readers)
        for index, scene in enumerate(images):
            turn = index % len(names) if names else 0
            for name in names[turn:] + names[:turn]:
                time.sleep(PAUSE_S)  # the last contender's idle threads stop spinning
                best, reads = [], []
                for _ in range(rounds):
                    started = time.perf_counter()
                    reads = readers[name](scene.jpeg)
                    best.append(time.perf_counter() - started)
                result = results[name]
                result.times.setdefault(scene.level, []).append(min(best))
                tally = result.tallies.setdefault(scene.level, Tally())
                tally.add(frame_scores(reads, scene.truth))
                settled = [(settle_kinds(text), box) for text, box in reads]
                result.settled.setdefault(scene.level, Tally()).add(
                    frame_scores(settled, scene.truth)
                )
    finally:
        for close in closers:
            close()
    return list(results.values())


STAGES = ("det_pre", "det_infer", "db_boxes", "zoom", "crops", "rec_pre", "rec_infer", "ctc")


def stage_seconds(model: str) -> dict[str, float]:
    """Seconds spent so far in each OCR stage of `model` (ef_ocr_stage_seconds)."""
    from prometheus_client import REGISTRY

    return {
        stage: REGISTRY.get_sample_value(
            "ef_ocr_stage_seconds_sum", {"model": model, "stage": stage}
        )
        or 0.0
        for stage in STAGES
    }


def table(results: list[Result], levels: list[str]) -> None:
    typer.echo(
        f"{'contender':<28}{'set':<6}{'p50 ms':>8}{'p95 ms':>8}{'char acc':>10}{'exact':>8}"
        f"{'O/0 settled':>13}"
    )
    for r in results:
        if r.skipped:
            typer.echo(f"{r.name:<28}skipped: {r.skipped}")
            continue
        for level in levels:
            t = r.tallies[level]
            typer.echo(
                f"{r.name:<28}{level:<6}{r.p(level, 50):>8.1f}{r.p(level, 95):>8.1f}"
                f"{t.char_accuracy:>10.3f}{t.exact_share:>8.3f}"
                f"{r.settled[level].char_accuracy:>13.3f}"
            )


def verdict(ours: Result, peer: Result, levels: list[str]) -> None:
    if peer.skipped:
        typer.echo(f"\n{peer.name} not run: no verdict")
        return
    typer.echo(f"\n{ours.name} over {peer.name} (bar: time <= 0.80x, accuracy >= peer's)")
    for level in levels:
        ratio = ours.p(level, 50) / peer.p(level, 50)
        a, b = ours.tallies[level].char_accuracy, peer.tallies[level].char_accuracy
        ok = ratio <= 0.8 and a >= b
        fair = peer.settled[level].char_accuracy
        typer.echo(
            f"  {level:<5} p50 x{ratio:.2f}  char acc {a:.4f} vs {b:.4f}  "
            f"{'met' if ok else 'NOT met'}  (the peer with our O/0 rule: {fair:.4f})"
        )


def gap(ours: Result, peer: Result, levels: list[str]) -> None:
    """Time and accuracy against a larger peer: no bar, the distance."""
    if peer.skipped:
        typer.echo(f"\n{peer.name} not run: no gap")
        return
    typer.echo(f"\n{ours.name} against {peer.name} (the larger model: the gap)")
    for level in levels:
        ratio = ours.p(level, 50) / peer.p(level, 50)
        a, b = ours.tallies[level].char_accuracy, peer.tallies[level].char_accuracy
        typer.echo(f"  {level:<5} p50 x{ratio:.2f}  char acc {a:.4f} vs {b:.4f}  gap {a - b:+.4f}")


@app.command()
def main(
    model: Annotated[str, typer.Option(help="edgefleet's edge OCR model")] = DEFAULT_MODEL,
    easy: Annotated[int, typer.Option(help="easy 1080p stills")] = 12,
    hard: Annotated[int, typer.Option(help="hard 640x360 frames, Hershey fonts")] = 60,
    ttf: Annotated[int, typer.Option(help="hard 640x360 frames, TrueType fonts")] = 60,
    seed: Annotated[int, typer.Option(help="first seed of the scenes (tune on another)")] = 1000,
    threads: Annotated[int, typer.Option(help="threads every contender gets")] = 2,
    rounds: Annotated[int, typer.Option(help="reads per image; its fastest counts")] = 1,
    peers: Annotated[str, typer.Option(help="comma-separated peers")] = (
        "faster-paddle-tiny,faster-paddle-small,rapidocr"
    ),
) -> None:
    """Edge OCR vs faster-paddle (tiny, small) and rapidocr: ms/image and accuracy.

    A peer that is not installed is said and skipped (`pip install edgefleet[bench]`
    brings faster-paddle).

    Example: edgefleet bench ocr --easy 12 --hard 60 --ttf 60 --threads 2
    """
    images: list[Scene] = scenes(easy, hard, seed, ttf)
    levels = [lv for lv in ("easy", "hard", "ttf") if any(s.level == lv for s in images)]
    load = os.getloadavg()[0]
    typer.echo(
        f"{len(images)} images (seed {seed}), {threads} threads each, {rounds} round(s); "
        f"load average {load:.1f} on {os.cpu_count()} cores"
    )
    makers: dict[str, Maker] = {
        f"edgefleet {model}": lambda: edgefleet_reader(model, threads),
        "faster-paddle-tiny": lambda: faster_paddle_reader("tiny", threads),
        "faster-paddle-small": lambda: faster_paddle_reader("small", threads),
        "rapidocr": lambda: rapidocr_reader(threads),
    }
    chosen = [f"edgefleet {model}", *[p.strip() for p in peers.split(",") if p.strip()]]
    before = stage_seconds(model)
    results = measure({name: makers[name] for name in chosen}, images, rounds)
    spent = {k: v - before[k] for k, v in stage_seconds(model).items()}
    typer.echo("")
    table(results, levels)
    reads = (len(images) * rounds + 1) / 1000  # the warm-up read counts too
    typer.echo(
        f"\n{model}, where the time goes (ms per image, all images): "
        + ", ".join(f"{k} {v / reads:.1f}" for k, v in spent.items())
    )
    by_name = {r.name: r for r in results}
    if "faster-paddle-tiny" in by_name:
        verdict(results[0], by_name["faster-paddle-tiny"], levels)
    if "faster-paddle-small" in by_name:
        gap(results[0], by_name["faster-paddle-small"], levels)
    typer.echo(f"load average after the run {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    app()
