"""Fused pre-processing and NMS kernels against what users write, side by side.

Run: `.venv/bin/python -m edgefleet.bench.bench_kernels` (add `--rounds 5` on a busy machine).
1080p NV12 -> 640x640 float32 tensor: the fused kernel vs the OpenCV + numpy chain
(cvtColor, resize, copyMakeBorder, normalise, transpose), with the memory-bandwidth
bound (bytes the kernel must move / measured copy bandwidth). OCR line crops: 16 text
lines of a 1080p frame (NV12 and BGR) into one recogniser batch, `quads_to_tensor` vs the
chain it replaced (region conversion, warpPerspective, resize, normalise). NMS on 1k and 10k random
boxes vs cv2.dnn.NMSBoxes (and torchvision.ops.nms when installed). Timings are the
median of `--repeat` calls, best round of `--rounds` (the machine is shared).
"""

from __future__ import annotations

import importlib.util
from functools import partial

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
    x = (canvas.astype(np.float32) / 255.0 - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def chain_steps(frame: np.ndarray, t: LetterboxTransform, repeat: int, rounds: int) -> str:
    """Where the chain's time goes, step by step."""
    rgb = cv2.cvtColor(frame, cv2.COLOR_YUV2RGB_NV12)
    small = cv2.resize(rgb, (t.new_w, t.new_h), interpolation=cv2.INTER_LINEAR)
    bottom, right = t.dst_h - t.new_h - t.pad_top, t.dst_w - t.new_w - t.pad_left
    canvas = cv2.copyMakeBorder(small, t.pad_top, bottom, t.pad_left, right, cv2.BORDER_CONSTANT)
    x = (canvas.astype(np.float32) / 255.0 - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    steps = {
        "cvtColor": lambda: cv2.cvtColor(frame, cv2.COLOR_YUV2RGB_NV12),
        "resize": lambda: cv2.resize(rgb, (t.new_w, t.new_h), interpolation=cv2.INTER_LINEAR),
        "copyMakeBorder": lambda: cv2.copyMakeBorder(
            small, t.pad_top, bottom, t.pad_left, right, cv2.BORDER_CONSTANT
        ),
        "normalise": lambda: (
            (canvas.astype(np.float32) / 255.0 - np.array(MEAN, np.float32))
            / np.array(STD, np.float32)
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
    diff = np.abs((fused - chain(frame, t)) * np.array(STD, np.float32)[None, :, None, None]).max()
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
            partial(
                native.frame_to_tensor,
                frame,
                "nv12",
                size,
                MEAN,
                STD,
                114,
                out=out,
                threads=threads,
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


def text_quads(n: int, hw: tuple[int, int], seed: int) -> np.ndarray:
    """n slightly rotated text-line quads (tl, tr, br, bl) inside an (h, w) frame."""
    rng = np.random.default_rng(seed)
    length, thick = rng.uniform(150, 900, n), rng.uniform(20, 90, n)
    angle = rng.uniform(-0.1, 0.1, n)
    u = np.stack([np.cos(angle), np.sin(angle)], 1) * length[:, None]
    v = np.stack([-np.sin(angle), np.cos(angle)], 1) * thick[:, None]
    tl = rng.uniform([50, 50], [hw[1] - 1000, hw[0] - 150], (n, 2))
    return np.stack([tl, tl + u, tl + u + v, tl + v], 1).astype(np.float32)


def lines_chain(frame: np.ndarray, fmt: str, quads: np.ndarray, out: np.ndarray) -> None:
    """What the OCR model did per line before the fused kernel: crop, resize, normalise."""
    from edgefleet.shared.imaging.normalise import normalise
    from edgefleet.shared.models.frames import FrameIn
    from edgefleet.shared.models.lines import frame_crop

    h, width = out.shape[2:]
    src = FrameIn(frame, fmt)  # type: ignore[arg-type]  # fmt is one of the four
    out[...] = 0.0
    for k, quad in enumerate(quads):
        crop, is_bgr = frame_crop(src, quad)
        rw = min(width, max(1, int(np.ceil(h * crop.shape[1] / crop.shape[0]))))
        resized = cv2.resize(crop, (rw, h))
        out[k, :, :, :rw] = normalise(resized, [0.5] * 3, [0.5] * 3, 1 / 255, not is_bgr)


def bench_lines(repeat: int, rounds: int) -> None:
    rng = np.random.default_rng(1)
    rgb = cv2.GaussianBlur(rng.integers(0, 256, (1080, 1920, 3), dtype=np.uint8), (0, 0), 2)
    frames = {
        "NV12": ("nv12", np.ascontiguousarray(cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420))),
        "BGR": ("bgr", np.ascontiguousarray(rgb[..., ::-1])),
    }
    frames["NV12"] = ("nv12", _i420_to_nv12(frames["NV12"][1], 1080, 1920))
    quads = text_quads(16, (1080, 1920), seed=2)
    sizes, _ = kernels.line_sizes(quads)
    widths = np.minimum(1600, np.ceil(48 * sizes[:, 0] / sizes[:, 1])).astype(np.int32)
    out = np.empty((len(quads), 3, 48, int(widths.max())), np.float32)
    slots = np.arange(len(quads), dtype=np.int32)
    half = (0.5, 0.5, 0.5)
    for label, (fmt, frame) in frames.items():
        old = out.copy()
        lines_chain(frame, fmt, quads, old)
        native.quads_to_tensor(frame, fmt, quads, widths, slots, out, half, half, 0.0, "bgr")
        diff = float(np.abs(out - old).mean()) * 0.5 * 255
        t_chain = timed(lambda: lines_chain(frame, fmt, quads, old), repeat, rounds)  # noqa: B023
        print(
            f"16 lines of 1080p {label} -> (16, 3, 48, {out.shape[3]}) f32  chain (crop, resize, "
            f"normalise) {t_chain * 1e3:7.3f} ms; mean |fused - chain| {diff:.2f} levels"
        )
        for threads in (1, 2):
            t = timed(
                partial(
                    native.quads_to_tensor,
                    frame,
                    fmt,
                    quads,
                    widths,
                    slots,
                    out,
                    half,
                    half,
                    0.0,
                    "bgr",
                    threads=threads,
                ),
                repeat,
                rounds,
            )
            print(
                f"16 lines of 1080p {label}  quads_to_tensor, {threads} thread(s) "
                f"{t * 1e3:7.3f} ms   {t_chain / t:5.1f}x faster"
            )


def _i420_to_nv12(i420: np.ndarray, h: int, w: int) -> np.ndarray:
    flat = i420.reshape(-1)
    u = flat[h * w : h * w * 5 // 4].reshape(h // 2, w // 2)
    v = flat[h * w * 5 // 4 :].reshape(h // 2, w // 2)
    return np.concatenate([i420[:h], np.stack([u, v], axis=-1).reshape(h // 2, w)])


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
    bench_lines(max(3, repeat // 5), rounds)
    bench_nms(repeat, rounds)


if __name__ == "__main__":
    app()
