"""Reading text lines: each line sampled from its frame by the kernels, turned upright
where the angle classifier is sure, and read by every recogniser of the pipeline (the
reader, then its `voters`), from every crop the options ask for (the quad, a slightly
padded one with `tta`, an `enhance`d one).

Every read of a line votes for its text with its confidence; the text with the heaviest
vote wins, scored by its vote over the number of reads (so a line the readers disagree on
is reported as less sure).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import cv2
import numpy as np
from prometheus_client import Histogram

from edgefleet.shared import kernels
from edgefleet.shared.models.frames import FrameIn
from edgefleet.shared.models.outputs.angle import angle_flips
from edgefleet.shared.models.outputs.ctc import ctc_greedy, ppocr_charset
from edgefleet.shared.models.outputs.kinds import Kinds
from edgefleet.shared.models.preprocess import ceil_to
from edgefleet.shared.models.registry import ModelRegistry
from edgefleet.shared.models.session import Session
from edgefleet.shared.models.spec import ModelSpec
from edgefleet.shared.models.tasks import OcrOptions

KEYS_FILE = Path(__file__).with_name("ppocr_keys_v4.txt")
OCR_STAGE = Histogram(
    "ef_ocr_stage_seconds",
    "Time per OCR stage and batch: det_pre, det_infer, db_boxes, zoom, crops, rec_pre, "
    "rec_infer, ctc",
    ["model", "stage"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
)


@contextmanager
def stage(model: str, name: str) -> Iterator[None]:
    """Time one stage of one batch of `model` into OCR_STAGE."""
    started = time.perf_counter()
    yield
    OCR_STAGE.labels(model, name).observe(time.perf_counter() - started)


# Lines are read half a pixel up and left of the detector's quads, where PP-OCR's
# warpPerspective crop read them (it puts corner tl on its first pixel's centre; the kernels
# put corners on pixel corners). Chosen on seed 5000's hard scenes (never the held-out 3000
# and 7000), where it read better, the easy ones unchanged.
READ_SHIFT = -0.5
# Recogniser input widths: rec_min_width, then each 1.5x the last (in steps of 32) up to
# rec_max_width; a line is padded to the first that holds it, so its read never depends on
# the lines batched with it. Chosen on seed 5000: level with padding to the widest line of
# a batch and with steps of 32, in fewer recogniser calls than steps of 32 (docs/decisions.md).
REC_WIDTH_GROWTH = 1.5

Read = tuple[str, float, float]  # text, vote score, surest read's confidence


@dataclass(frozen=True)
class LineView:
    """One read of a text line: a quad (tl, tr, br, bl) of a frame, sampled by the kernels
    straight from the frame's own pixels (an enhanced crop is a little frame of its own)."""

    frame: FrameIn
    quad: np.ndarray

    def flipped(self) -> LineView:
        """The same line read upside down (turned 180 degrees)."""
        return LineView(self.frame, np.ascontiguousarray(np.roll(self.quad, 2, axis=0)))


def crop_quad(image: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """Perspective-rectify the quad (tl, tr, br, bl) into an upright text-line image."""
    q = quad.astype(np.float32)
    w = max(1, round(max(np.linalg.norm(q[0] - q[1]), np.linalg.norm(q[3] - q[2]))))
    h = max(1, round(max(np.linalg.norm(q[0] - q[3]), np.linalg.norm(q[1] - q[2]))))
    dst = np.array([[0, 0], [w, 0], [w, h], [0, h]], dtype=np.float32)
    m = cv2.getPerspectiveTransform(q, dst)
    crop = cv2.warpPerspective(
        image, m, (w, h), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE
    )
    if h / w >= 1.5:  # a vertical line: read it as horizontal
        crop = np.ascontiguousarray(np.rot90(crop))
    return crop


def frame_crop(frame: FrameIn, quad: np.ndarray) -> tuple[np.ndarray, bool]:
    """`crop_quad` of a frame in any format, and whether the crop's pixels are B, G, R
    (for `enhance`, which works on pixels; reads go through `kernels.quads_to_tensor`).

    Packed frames are warped in place; of a YUV frame only the quad's bounding box (plus
    the cubic filter's reach) is converted, never the whole frame.
    """
    if frame.fmt in ("rgb", "bgr"):
        return crop_quad(frame.pixels, quad), frame.is_bgr
    lo, hi = quad.min(axis=0) - 3, quad.max(axis=0) + 3
    region, x0, y0 = frame.region(float(lo[0]), float(lo[1]), float(hi[0]), float(hi[1]))
    return crop_quad(region, quad - np.array([x0, y0], np.float32)), False


def pad_quad(quad: np.ndarray, ratio: float) -> np.ndarray:
    """Grow a quad outwards by `ratio` of its height on every side (for the second read)."""
    q = quad.astype(np.float32)
    along = q[1] - q[0]
    across = q[3] - q[0]
    height = float(np.linalg.norm(across)) or 1.0
    u = along / (float(np.linalg.norm(along)) or 1.0)
    v = across / height
    pad = ratio * height
    return np.array(
        [q[0] - pad * (u + v), q[1] + pad * (u - v), q[2] + pad * (u + v), q[3] - pad * (u - v)],
        dtype=np.float32,
    )


def load_charset(session: Session, registry: ModelRegistry) -> list[str]:
    """The recogniser's dictionary: the manifest's pinned file, else the ONNX metadata
    (`character`), else the PP-OCRv4 keys file."""
    pinned = registry.read_dictionary(session.spec)
    if pinned is not None:
        return ppocr_charset(pinned)
    meta = getattr(session.executor, "metadata", {}) or {}
    chars = meta.get("character")
    lines = chars.splitlines() if chars else KEYS_FILE.read_text(encoding="utf-8").splitlines()
    return ppocr_charset(lines)


@dataclass(frozen=True)
class Reader:
    """A recogniser, its dictionary, and which of the dictionary's classes are letters and
    which digits (for `word_kinds`)."""

    session: Session
    charset: list[str]
    kinds: Kinds

    @classmethod
    def of(cls, session: Session, charset: list[str]) -> Reader:
        return cls(session, charset, Kinds.of(charset))


class LineReader:
    """Reads the text of line quads: the pipeline's reading options, its angle classifier
    (if any) and its recognisers, the first of them the reader and the rest voters."""

    def __init__(
        self,
        name: str,
        opts: OcrOptions,
        angles: Session | None,
        readers: list[Reader],
        rereader: Reader | None = None,
    ) -> None:
        self.name = name  # the pipeline's, for OCR_STAGE
        self.opts = opts
        self.angles = angles
        self.readers = readers
        self.rereader = rereader  # reads again the lines the readers were unsure of

    def read(self, frames: list[FrameIn], quads: list[np.ndarray]) -> list[list[Read]]:
        """(text, vote score, surest read's confidence) of every quad of every frame: each
        line read by every recogniser, from every crop the options ask for, and the unsure
        ones read again by the rereader."""
        views: list[LineView] = []
        owners: list[tuple[int, int]] = []
        first: dict[tuple[int, int], int] = {}  # each line's view of its own quad
        started = time.perf_counter()
        for i, (frame, frame_quads) in enumerate(zip(frames, quads, strict=True)):
            for j, quad in enumerate(frame_quads):
                first[(i, j)] = len(views)
                read = quad + np.float32(READ_SHIFT)
                line = [LineView(frame, read)]
                if self.opts.tta:
                    padded = pad_quad(read, 0.12)
                    if kernels.line_sizes(padded[None])[1][0]:
                        line.append(LineView(frame, padded))
                if self.opts.enhance:
                    line.append(enhanced(line[-1]))
                views += line
                owners += [(i, j)] * len(line)
        OCR_STAGE.labels(self.name, "crops").observe(time.perf_counter() - started)
        if views and self.angles is not None:
            views = self.classify_angles(views)
        ballots: dict[tuple[int, int], list[tuple[str, float]]] = defaultdict(list)
        for reader in self.readers if views else []:
            for owner, read in zip(owners, self.recognise(views, reader), strict=True):
                ballots[owner].append(read)
        if self.rereader is not None and views:
            floor = self.opts.reread_below
            again = [k for o, k in first.items() if max(r[1] for r in ballots[o]) < floor]
            if again:
                reads = self.recognise([views[k] for k in again], self.rereader)
                for k, read in zip(again, reads, strict=True):
                    ballots[owners[k]].append(read)
        return [
            [(*vote(ballots[(i, j)]), max(r[1] for r in ballots[(i, j)])) for j in range(len(q))]
            for i, q in enumerate(quads)
        ]

    def classify_angles(self, views: list[LineView]) -> list[LineView]:
        """Flip lines the angle classifier is sure are upside down."""
        assert self.angles is not None  # called only when the pipeline has one
        spec = self.angles.spec
        h, w = spec.input.height or 48, spec.input.width or 192
        ratios = _ratios(views)
        out = list(views)
        step = self.opts.rec_batch
        for start in range(0, len(views), step):
            idx = np.arange(start, min(start + step, len(views)))
            batch = _line_batch(views, idx, ratios, (h, w), spec)
            probs = self.angles.run(batch)[0]
            flips = angle_flips(probs, spec.labels or ["0", "180"], self.opts.cls_threshold)
            for k, flip in zip(idx, flips, strict=True):
                if flip:
                    out[k] = views[k].flipped()
        return out

    def recognise(self, views: list[LineView], reader: Reader) -> list[tuple[str, float]]:
        """(text, confidence) per line; lines of the same padded width are batched together,
        each batch sampled from the frames by the kernels (one call per frame).

        A line's padded width depends on its own length only (`rec_widths`), never on its
        batch-mates': the recogniser mixes the whole width, so padding a line to a longer
        neighbour's width changes its read, and a line would read differently with the
        lines it happens to be batched with."""
        ratios = _ratios(views)
        widths = self.rec_widths(ratios)
        order = np.lexsort((ratios, widths))
        out: list[tuple[str, float]] = [("", 0.0)] * len(views)
        step = self.opts.rec_batch
        for width in np.unique(widths):
            same = order[widths[order] == width]
            for start in range(0, len(same), step):
                idx = same[start : start + step]
                reads = self._recognise_batch(views, idx, ratios, int(width), reader)
                for ci, read in zip(idx, reads, strict=True):
                    out[int(ci)] = read
        return out

    def rec_widths(self, ratios: np.ndarray) -> np.ndarray:
        """The recogniser's input width for lines of these length/thickness ratios: the
        first of the width ladder that holds the line at the recogniser's height."""
        ladder = np.array(width_ladder(self.opts.rec_min_width, self.opts.rec_max_width))
        at = np.searchsorted(ladder, self.opts.rec_height * ratios)
        return ladder[np.minimum(at, len(ladder) - 1)]

    def _recognise_batch(
        self,
        views: list[LineView],
        idx: np.ndarray,
        ratios: np.ndarray,
        width: int,
        reader: Reader,
    ) -> list[tuple[str, float]]:
        """(text, confidence) of views[idx], read in one batch of this width."""
        started = time.perf_counter()
        batch = _line_batch(views, idx, ratios, (self.opts.rec_height, width), reader.session.spec)
        OCR_STAGE.labels(self.name, "rec_pre").observe(time.perf_counter() - started)
        with stage(self.name, "rec_infer"):
            probs = reader.session.run(batch)[0]
        with stage(self.name, "ctc"):
            if self.opts.word_kinds is None:
                return ctc_greedy(probs, reader.charset)
            return ctc_greedy(probs, reader.charset, reader.kinds, self.opts.word_kinds)


@cache
def width_ladder(lo: int, hi: int) -> tuple[int, ...]:
    """lo, then each REC_WIDTH_GROWTH times the last (in steps of 32), up to hi."""
    widths = [lo]
    while widths[-1] < hi:
        widths.append(min(hi, ceil_to(widths[-1] * REC_WIDTH_GROWTH, 32)))
    return tuple(widths)


def _ratios(views: list[LineView]) -> np.ndarray:
    """Length over thickness of each line as the kernels read it."""
    sizes, _ = kernels.line_sizes(np.stack([v.quad for v in views]))
    return sizes[:, 0] / sizes[:, 1]


def _line_batch(
    views: list[LineView], idx: np.ndarray, ratios: np.ndarray, hw: tuple[int, int], spec: ModelSpec
) -> np.ndarray:
    """views[idx] as a (len(idx), 3, h, w) batch for `spec`: each line at its aspect ratio,
    left-aligned, normalised 0 to the right (as PP-OCR pads); one kernel call per frame."""
    h, w = hw
    batch = np.empty((len(idx), 3, h, w), np.float32)
    scale = spec.input.scale * 255  # the kernels normalise x / 255: fold the model's scale in
    bgr = spec.input.color == "BGR"
    # mean/std are given in the model's channel order; the kernels take them per R, G, B
    mean = [m / scale for m in (spec.mean[::-1] if bgr else spec.mean)]
    std = [s / scale for s in (spec.std[::-1] if bgr else spec.std)]
    by_frame: dict[int, list[int]] = defaultdict(list)
    for k, vi in enumerate(idx):
        by_frame[id(views[vi].frame)].append(k)
    for slots in by_frame.values():
        frame = views[idx[slots[0]]].frame
        quads = np.stack([views[idx[k]].quad for k in slots]).astype(np.float32)
        widths = [min(w, max(1, math.ceil(h * ratios[idx[k]]))) for k in slots]
        kernels.quads_to_tensor(
            frame.pixels,
            frame.fmt,
            quads,
            np.array(widths, np.int32),
            np.array(slots, np.int32),
            batch,
            mean,
            std,
            0.0,
            "bgr" if bgr else "rgb",
        )
    return batch


def enhanced(view: LineView) -> LineView:
    """The line cut out (`frame_crop`) and `enhance`d, as a view of the whole crop."""
    # the warp crop reads a quad where the kernels read it READ_SHIFT further: undo it
    crop, is_bgr = frame_crop(view.frame, view.quad - np.float32(READ_SHIFT))
    h, w = crop.shape[:2]
    outline = np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float32) - 0.5  # pixel centres
    return LineView(FrameIn(enhance(crop), "bgr" if is_bgr else "rgb"), outline)


def enhance(crop: np.ndarray) -> np.ndarray:
    """Faint, blurred text made readable: stretch the 2nd-98th percentile to the full range,
    then an unsharp mask."""
    lo, hi = np.percentile(crop, (2, 98))
    stretched = np.clip((crop.astype(np.float32) - lo) * (255.0 / max(hi - lo, 1.0)), 0, 255)
    blurred = cv2.GaussianBlur(stretched, (0, 0), 1.2)
    return np.clip(stretched * 1.8 - blurred * 0.8, 0, 255).astype(np.uint8)


def vote(reads: list[tuple[str, float]]) -> tuple[str, float]:
    """Confidence-weighted vote over reads of one line: texts equal up to case and spacing
    pool their confidence; the winner's surest spelling, scored vote / number of reads."""
    pools: dict[str, float] = defaultdict(float)
    spelling: dict[str, tuple[str, float]] = {}
    for text, score in reads:
        key = "".join(text.split()).casefold()
        if not key:
            continue
        pools[key] += score
        if key not in spelling or score > spelling[key][1]:
            spelling[key] = (text, score)
    if not pools:
        return "", 0.0
    key = max(pools, key=lambda k: pools[k])
    return spelling[key][0], pools[key] / len(reads)
