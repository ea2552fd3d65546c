"""Fused pre-processing and NMS kernels against what users write, side by side.

Run: `.venv/bin/python -m edgefleet.bench.bench_kernels` (add `--rounds 5` on a busy machine).
1080p NV12 -> 640x640 float32 tensor: the fused kernel vs the OpenCV + numpy chain
(cvtColor, resize, copyMakeBorder, normalise, transpose), with the memory-bandwidth
bound (bytes the kernel must move / measured copy bandwidth). NMS on 1k and 10k random
boxes vs cv2.dnn.NMSBoxes (and torchvision.ops.nms when installed). Timings are the
median of `--repeat` calls, best round of `--rounds` (the machine is shared).
"""

from __future__ import annotations

import importlib.util

import cv2
import numpy as np
import typer

import edgefleet.shared.kernels as kernels
from edgefleet.bench.timing import timed
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.kernels import native, reference

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
app = typer.Typer(add_completion=False)


def chain(frame: np.ndarray, t: LetterboxTransform) -> np.ndarray:
    """The pre-processing users write with OpenCV and numpy."""
    rgb = cv2.cvtColor(frame, cv2.COLOR_YUV2RGB_NV12)
    resized = cv2.resize(rgb, (t.new_w, t.new_h), interpolation=cv2.INTER_LINEAR)
    bottom = t.dst_h - t.new_h - t.pad_top
    right = t.dst_w - t.new_w - t.pad_left
    canvas = cv2.copyMakeBorder(
        resized, t.pad_top, bottom, t.pad_left, right, cv2.BORDER_CONSTANT, value=(114, 114, 114)
    )
    x = (canvas.astype(np.float32) / 255.0 - np.float32(MEAN)) / np.float32(STD)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def chain_steps(frame: np.ndarray, t: LetterboxTransform, repeat: int, rounds: int) -> str:
    """Where the chain's time goes, step by step."""
    rgb = cv2.cvtColor(frame, cv2.COLOR_YUV2RGB_NV12)
    small = cv2.resize(rgb, (t.new_w, t.new_h), interpolation=cv2.INTER_LINEAR)
    bottom, right = t.dst_h - t.new_h - t.pad_top, t.dst_w - t.new_w - t.pad_left
    canvas = cv2.copyMakeBorder(small, t.pad_top, bottom, t.pad_left, right, cv2.BORDER_CONSTANT)
    x = (canvas.astype(np.float32) / 255.0 - np.float32(MEAN)) / np.float32(STD)
    steps = {
        "cvtColor": lambda: cv2.cvtColor(frame, cv2.COLOR_YUV2RGB_NV12),
        "resize": lambda: cv2.resize(rgb, (t.new_w, t.new_h), interpolation=cv2.INTER_LINEAR),
        "copyMakeBorder": lambda: cv2.copyMakeBorder(
            small, t.pad_top, bottom, t.pad_left, right, cv2.BORDER_CONSTANT
        ),
        "normalise": lambda: (
            (canvas.astype(np.float32) / 255.0 - np.float32(MEAN)) / np.float32(STD)
        ),
        "to NCHW": lambda: np.ascontiguousarray(x.transpose(2, 0, 1)[None]),
    }
    return ", ".join(f"{k} {timed(f, repeat, rounds) * 1e3:.3f} ms" for k, f in steps.items())


def copy_bandwidth(nbytes: int, repeat: int, rounds: int) -> float:
    """Bytes per second of np.copyto (read + write counted) on an nbytes buffer."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    return 2 * nbytes / timed(lambda: np.copyto(dst, src), repeat, rounds)


def bench_preprocess(repeat: int, rounds: int) -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (1080 * 3 // 2, 1920), dtype=np.uint8)
    size = (640, 640)
    t = LetterboxTransform.plan((1080, 1920), size)
    out = np.empty((1, 3, *size), np.float32)
    fused = native.frame_to_tensor(frame, "nv12", size, MEAN, STD, 114, out=out)[0]
    diff = np.abs((fused - chain(frame, t)) * np.float32(STD)[None, :, None, None]).max()
    print(f"backend: {kernels.backend()}; max |fused - chain| on the [0,1] scale: {diff:.2e}")
    t_chain = timed(lambda: chain(frame, t), repeat, rounds)
    print(f"1080p NV12 -> 640x640 f32  OpenCV+numpy chain        {t_chain * 1e3:7.3f} ms")
    print("   its steps: " + chain_steps(frame, t, repeat, rounds))
    cv_threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        t_chain1 = timed(lambda: chain(frame, t), repeat, rounds)
    finally:
        cv2.setNumThreads(cv_threads)
    print(f"1080p NV12 -> 640x640 f32  same chain, OpenCV 1 thread {t_chain1 * 1e3:7.3f} ms")
    results = {}
    for threads in (1, 2):
        results[threads] = timed(
            lambda th=threads: native.frame_to_tensor(
                frame, "nv12", size, MEAN, STD, 114, out=out, threads=th
            ),
            repeat,
            rounds,
        )
        print(
            f"1080p NV12 -> 640x640 f32  fused, {threads} thread(s)          "
            f"{results[threads] * 1e3:7.3f} ms   {t_chain / results[threads]:5.1f}x faster"
            f" ({t_chain1 / results[threads]:.1f}x the 1-thread chain)"
        )
    out16 = np.empty((1, 3, *size), np.float16)
    t16 = timed(
        lambda: native.frame_to_tensor(frame, "nv12", size, MEAN, STD, 114, np.float16, out16),
        repeat,
        rounds,
    )
    print(f"1080p NV12 -> 640x640 f16  fused, default threads     {t16 * 1e3:7.3f} ms")
    moved = frame.nbytes + out.nbytes
    for label, nbytes in (("DRAM (256 MiB buffer)", 256 << 20), ("cache (8 MiB buffer)", 8 << 20)):
        bw = copy_bandwidth(nbytes, max(5, repeat // 10) if nbytes > 1 << 24 else repeat, rounds)
        bound = moved / bw
        best = min(results.values())
        print(
            f"bandwidth bound, {label}: {moved / 1e6:.1f} MB moved at {bw / 1e9:.1f} GB/s copy"
            f" = {bound * 1e3:.3f} ms; fused best is {best / bound:.2f}x the bound"
        )


def random_boxes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 1000, (n, 2))
    wh = rng.uniform(10, 100, (n, 2))
    boxes = np.concatenate([xy, xy + wh], 1).astype(np.float32)
    return boxes, rng.random(n).astype(np.float32)


def bench_nms(repeat: int, rounds: int) -> None:
    for n in (1000, 10000):
        bench_nms_at(n, max(3, repeat // (10 if n > 5000 else 1)), rounds)


def bench_nms_at(n: int, repeat: int, rounds: int) -> None:
    boxes, scores = random_boxes(n, seed=n)
    ours = native.nms(boxes, scores, 0.5, 0.0, None, n)
    want = reference.nms(boxes, scores, 0.5, 0.0, None, n)
    assert np.array_equal(ours, want), "native NMS disagrees with the reference"
    xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], 1).tolist()
    slist = scores.tolist()
    cv_keep = cv2.dnn.NMSBoxes(xywh, slist, 0.0, 0.5)
    t_cv = timed(lambda: cv2.dnn.NMSBoxes(xywh, slist, 0.0, 0.5), repeat, rounds)
    t_ours = timed(lambda: native.nms(boxes, scores, 0.5, 0.0, None, n), repeat, rounds)
    t_plain = timed(
        lambda: native.nms(boxes, scores, 0.5, 0.0, None, n, impl=native.IMPL_PORTABLE),
        repeat,
        rounds,
    )
    print(
        f"NMS {n:>5} boxes: cv2.dnn.NMSBoxes {t_cv * 1e3:8.3f} ms (kept {len(cv_keep)}), "
        f"ours {t_ours * 1e3:7.3f} ms (kept {len(ours)}): {t_cv / t_ours:6.1f}x faster "
        f"(without the grid: {t_plain * 1e3:.3f} ms, {t_cv / t_plain:.1f}x)"
    )
    if importlib.util.find_spec("torchvision") is None:
        print("torchvision not installed: its comparison is skipped")
        return
    import torch
    import torchvision

    tb, ts = torch.from_numpy(boxes), torch.from_numpy(scores)
    t_tv = timed(lambda: torchvision.ops.nms(tb, ts, 0.5), repeat, rounds)
    print(f"NMS {n:>5} boxes: torchvision.ops.nms {t_tv * 1e3:8.3f} ms: {t_tv / t_ours:6.1f}x ours")


@app.command()
def main(
    repeat: int = typer.Option(50, help="calls per round"),
    rounds: int = typer.Option(3, help="rounds; the best round's median is reported"),
) -> None:
    """Print the kernels' timings and ratios against the naive way.

    Fused NV12 pre-processing and NMS against the OpenCV + numpy chain.

    Example: edgefleet bench kernels --rounds 5
    """
    bench_preprocess(repeat, rounds)
    bench_nms(repeat, rounds)


if __name__ == "__main__":
    app()
