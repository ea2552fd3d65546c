"""The PP-OCR pipeline: DB text detection -> (angle classifier) -> CTC recognition.

A pipeline names its detector, its recogniser and optionally an angle classifier, a
second read of each line from a slightly padded crop (`tta`) and more recognisers
(`voters`). Every read of a line votes for its text with its confidence; the text with
the heaviest vote wins, scored by its vote over the number of reads (so a line the
readers disagree on is reported as less sure). Which pipelines the edge and the cloud
run was decided by measurement (BENCHMARKS.md, "OCR ladder").
"""

from __future__ import annotations

import logging
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
from prometheus_client import Counter, Histogram

from edgefleet.shared import kernels
from edgefleet.shared.executor.memory import MemoryBudget
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.kernels.crops import crop_windows, sub_frame
from edgefleet.shared.messages import Detection
from edgefleet.shared.models.base import Capped, Model
from edgefleet.shared.models.decoders.angle import angle_flips
from edgefleet.shared.models.decoders.ctc import ctc_greedy, ppocr_charset
from edgefleet.shared.models.decoders.dbnet import DBParams, db_boxes, order_quad
from edgefleet.shared.models.decoders.kinds import Kinds
from edgefleet.shared.models.frames import FrameIn
from edgefleet.shared.models.preprocess import det_plan, kernel_batch, round_to, stack_canvases
from edgefleet.shared.models.registry import ModelRegistry
from edgefleet.shared.models.session import Session, open_session
from edgefleet.shared.models.spec import ModelSpec
from edgefleet.shared.models.tasks import OcrOptions, OcrSpec

log = logging.getLogger(__name__)

KEYS_FILE = Path(__file__).with_name("ppocr_keys_v4.txt")
OCR_STAGE = Histogram(
    "ef_ocr_stage_seconds",
    "Time per OCR stage and batch: det_pre, det_infer, db_boxes, zoom, crops, rec_pre, "
    "rec_infer, ctc",
    ["model", "stage"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
)
LINES_UNREAD = Counter(
    "ef_ocr_lines_unread_total",
    "Text lines found but left unread by the pipeline's max_lines cap (dense images)",
    ["model"],
)
DET_PAD = 114  # the detector's canvas outside the image: mid-grey, no edges
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
ZOOM_MAX = 8  # regions zoomed per frame, largest first: a frame of noise costs 8 calls at most


@dataclass
class _DetBatch:
    frames: list[FrameIn]
    plans: list[LetterboxTransform]
    groups: list[tuple[list[int], np.ndarray]]  # the frames of one canvas size, their tensor

    @property
    def tensor(self) -> np.ndarray:
        """The batch's one tensor, where all its frames share a canvas size."""
        if len(self.groups) != 1:
            raise ValueError(f"{len(self.groups)} canvas sizes in this batch, not one")
        return self.groups[0][1]


def zoom_regions(prob: np.ndarray, plan: LetterboxTransform, thresh: float) -> np.ndarray:
    """Source-pixel boxes (N, 4) xyxy, largest first, around every place the text map stirs
    (above `thresh`, far below the binarisation threshold: a line the detector half sees),
    each grown by its own height plus 8 px (12 px along the line) so the zoomed pass sees
    the line whole with some ground around it; boxes that touch are merged."""
    h, w = plan.new_h, plan.new_w
    region = prob[plan.pad_top : plan.pad_top + h, plan.pad_left : plan.pad_left + w]
    _, _, stats, _ = cv2.connectedComponentsWithStats(
        (region > thresh).astype(np.uint8), connectivity=8
    )
    stats = stats[1:][stats[1:, cv2.CC_STAT_AREA] >= 3]
    if not len(stats):
        return np.zeros((0, 4), np.float32)
    x, y = stats[:, 0] + plan.pad_left, stats[:, 1] + plan.pad_top
    corners = np.stack([np.stack([x, y], 1), np.stack([x + stats[:, 2], y + stats[:, 3]], 1)], 1)
    src = plan.points_to_source(corners.astype(np.float32)).reshape(-1, 4)
    margin = (src[:, 3] - src[:, 1]) + 8
    grown = src + np.stack([-margin - 4, -margin, margin + 4, margin], 1)
    return merge_boxes(grown, (plan.src_h, plan.src_w))


def merge_boxes(boxes: np.ndarray, hw: tuple[int, int], cell: int = 4) -> np.ndarray:
    """Boxes (N, 4) xyxy (ends exclusive) inside an (h, w) image, those that touch replaced
    by the box around them all, largest first, on a grid of `cell` px: painted on a mask, so
    any number merge in linear time (a 1080p frame's mask is 480x270)."""
    h, w = -(-hw[0] // cell), -(-hw[1] // cell)
    mask = np.zeros((h, w), np.uint8)
    cells: np.ndarray = boxes.astype(np.float32) / cell
    limit = np.array([hw[1], hw[0], hw[1], hw[0]], np.float32)
    while True:
        lo = np.floor(cells[:, :2]).astype(np.int64)
        hi = np.ceil(cells[:, 2:]).astype(np.int64) - 1  # the last cell each box covers
        for (x0, y0), (x1, y1) in zip(lo.tolist(), hi.tolist(), strict=True):
            cv2.rectangle(mask, (x0, y0), (x1, y1), 1, thickness=-1)
        count, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
        merged = stats[1:, :4].astype(np.float32)
        merged[:, 2:] += merged[:, :2]
        if count - 1 == len(cells):  # nothing merged this round: no box touches another
            order = np.argsort(-stats[1:, cv2.CC_STAT_AREA], kind="stable")
            out = merged[order] * cell
            return np.minimum(out, limit)
        cells = merged


def readable(quads: list[np.ndarray], plan: LetterboxTransform) -> np.ndarray:
    """Source quads (N, 4, 2), ordered tl, tr, br, bl and kept inside the image, of the
    lines big enough to read."""
    kept = []
    for quad in quads:
        src = order_quad(quad)
        src[:, 0] = np.clip(src[:, 0], 0, plan.src_w - 1)
        src[:, 1] = np.clip(src[:, 1], 0, plan.src_h - 1)
        if np.linalg.norm(src[0] - src[1]) > 3 and np.linalg.norm(src[0] - src[3]) > 3:
            kept.append(src)
    out = np.array(kept, np.float32).reshape(-1, 4, 2)
    return out[kernels.line_sizes(out)[1]]


def capped(quads: np.ndarray, max_lines: int | None) -> tuple[np.ndarray, int]:
    """The `max_lines` largest of these line quads, in their order, and how many were left."""
    if max_lines is None or len(quads) <= max_lines:
        return quads, 0
    sizes, _ = kernels.line_sizes(quads)
    largest = np.sort(np.argsort(-(sizes[:, 0] * sizes[:, 1]), kind="stable")[:max_lines])
    return quads[largest], len(quads) - max_lines


Read = tuple[str, float, float]  # text, vote score, surest read's confidence


def surer(
    quads: np.ndarray, reads: list[Read], zoomed: np.ndarray, rezoomed: list[Read]
) -> tuple[np.ndarray, list[Read]]:
    """The first pass's lines and the zoomed pass's, one read per place: a zoomed line
    replaces the first-pass lines it overlaps when it is read more surely than each of
    them (a line the first pass split in two comes back whole), else it is dropped."""
    lo, hi = quads.min(axis=1), quads.max(axis=1)
    dropped: set[int] = set()
    added = []
    for quad, read in zip(zoomed, rezoomed, strict=True):
        over = np.flatnonzero(np.all((lo <= quad.max(axis=0)) & (quad.min(axis=0) <= hi), axis=1))
        if len(over) and read[1] <= max(reads[k][1] for k in over):
            continue
        dropped.update(over.tolist())
        added.append((quad, read))
    keep = [k for k in range(len(quads)) if k not in dropped]
    merged = [quads[k] for k in keep] + [quad for quad, _ in added]
    return (
        np.array(merged, np.float32).reshape(-1, 4, 2),
        [reads[k] for k in keep] + [read for _, read in added],
    )


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


class OcrModel(Model):
    """Text lines (text, score, box, polygon) of each image."""

    def __init__(
        self,
        spec: OcrSpec,
        registry: ModelRegistry,
        settings: ExecutionSettings,
        budget: MemoryBudget | None = None,
    ) -> None:
        opts: OcrOptions = spec.ocr
        self.opts = opts
        cap = settings.batching.max_batch_size
        side = ceil32(opts.det_max_side)
        sessions = []
        try:
            det = open_session(
                registry.component(opts.det, spec),
                registry,
                settings,
                item_shape=(3, side, side),
                warmup_shape=(1, 3, 96, 96),
                max_batch=cap,
                budget=budget,
            )
            sessions.append(det)

            def recogniser(name: str) -> Session:
                """A recogniser (the reader or a voter): same input shape, same budget."""
                session = open_session(
                    registry.component(name, spec),
                    registry,
                    settings,
                    item_shape=(8, 3, opts.rec_height, opts.rec_min_width * 2),
                    warmup_shape=(1, 3, opts.rec_height, opts.rec_min_width),
                    max_batch=cap,
                    budget=det.budget,
                )
                sessions.append(session)
                return session

            rec = recogniser(opts.rec)
            voters = [recogniser(name) for name in opts.voters]
            cls = None
            if opts.cls:
                cls_spec = registry.component(opts.cls, spec)
                ch, cw = cls_spec.input.height or 48, cls_spec.input.width or 192
                cls = open_session(
                    cls_spec,
                    registry,
                    settings,
                    item_shape=(8, 3, ch, cw),
                    warmup_shape=(1, 3, ch, cw),
                    max_batch=cap,
                    budget=det.budget,
                )
                sessions.append(cls)
        except BaseException:
            for s in sessions:
                s.close()
            raise
        self.det, self.rec, self.cls = det, rec, cls
        self.readers = [Reader.of(s, load_charset(s, registry)) for s in (rec, *voters)]
        ds = det.spec
        self._det_norm = (ds.mean, ds.std, ds.input.scale, ds.input.color == "BGR")
        self._det_fill = np.zeros(3, np.float32)  # normalised 0: mid-grey, no edges
        self._db = DBParams(
            thresh=opts.det_thresh,
            box_thresh=opts.box_thresh,
            unclip_ratio=opts.unclip_ratio,
            max_candidates=opts.max_candidates,
        )
        super().__init__(spec, sessions, settings, det.budget)

    # --- template ----------------------------------------------------------------------

    def pre_process(self, frames: list[FrameIn]) -> _DetBatch:
        with self._stage("det_pre"):
            return self._det_batch(frames)

    def _det_batch(self, frames: list[FrameIn]) -> _DetBatch:
        """Frames of one canvas size share a tensor; frames of another size get their own:
        padding a smaller canvas to the batch's would shift the detector's global pooling,
        and a frame's text would depend on the frames batched with it."""
        stretch = self.opts.det_fit == "stretch"
        plans = [det_plan(f.hw, self.opts.det_max_side, stretch=stretch) for f in frames]
        sizes: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, plan in enumerate(plans):
            sizes[(plan.dst_h, plan.dst_w)].append(i)
        groups = [
            (idx, self._det_tensor([frames[i] for i in idx], [plans[i] for i in idx]))
            for idx in sizes.values()
        ]
        return _DetBatch(frames, plans, groups)

    def _det_tensor(self, frames: list[FrameIn], plans: list[LetterboxTransform]) -> np.ndarray:
        mean, std, scale, bgr = self._det_norm
        if scale != 1 / 255:  # the kernels normalise x / 255 only
            rgb = [kernels.to_rgb(f.pixels, f.fmt) for f in frames]
            return stack_canvases(rgb, plans, self._det_fill, *self._det_norm)
        # mean/std are given in the model's channel order; the kernels take them per R, G, B
        mean, std = (mean[::-1], std[::-1]) if bgr else (mean, std)
        channels = "bgr" if bgr else "rgb"
        return kernel_batch(frames, plans, mean, std, DET_PAD, channels)

    def forward(self, prepared: _DetBatch) -> list[np.ndarray]:
        """Each frame's text map."""
        maps: list[np.ndarray] = [np.empty(0, np.float32)] * len(prepared.frames)
        with self._stage("det_infer"):
            for idx, tensor in prepared.groups:
                out = self.det.run(tensor)[0]
                for k, i in enumerate(idx):
                    maps[i] = out[k, 0]
        return maps

    def post_process(self, raw: list[np.ndarray], prepared: _DetBatch) -> list[list[Detection]]:
        frames, found, probs, unread = prepared.frames, [], [], []
        for i, plan in enumerate(prepared.plans):
            probs.append(raw[i][: plan.dst_h, : plan.dst_w])
            with self._stage("db_boxes"):
                quads, _ = db_boxes(probs[-1], self._db)
            biggest, left = capped(
                readable([plan.points_to_source(q) for q in quads], plan), self.opts.max_lines
            )
            found.append(biggest)
            unread.append(left)
        reads = self.read_lines(frames, found)
        if self.opts.det_zoom:
            with self._stage("zoom"):
                zoomed = []
                for i, (frame, plan, prob) in enumerate(
                    zip(frames, prepared.plans, probs, strict=True)
                ):
                    if unread[i]:  # dense already: the zoom looks for faint text, not more
                        zoomed.append(np.zeros((0, 4, 2), np.float32))
                        continue
                    more = self._zoom(frame, plan, prob, found[i], reads[i], self.opts.det_zoom)
                    more, unread[i] = capped(more, self.opts.max_lines)
                    zoomed.append(more)
            rezoomed = self.read_lines(frames, zoomed)
            for i in range(len(frames)):
                found[i], reads[i] = surer(found[i], reads[i], zoomed[i], rezoomed[i])
        results: list[list[Detection]] = []
        for quads, lines, left in zip(found, reads, unread, strict=True):
            kept = [
                _line(quad, text.strip(), score)
                for quad, (text, score, surest) in zip(quads, lines, strict=True)
                if text.strip() and surest >= self.opts.text_score
            ]
            kept.sort(key=_reading_order)
            if left:
                LINES_UNREAD.labels(self.spec.name).inc(left)
                log.info(
                    "text lines over max_lines left unread",
                    extra={
                        "model": self.spec.name,
                        "unread": left,
                        "max_lines": self.opts.max_lines,
                    },
                )
            results.append(Capped(kept, left))
        return results

    def read_lines(self, frames: list[FrameIn], quads: list[np.ndarray]) -> list[list[Read]]:
        """(text, vote score, surest read's confidence) of every quad of every frame: each
        line read by every recogniser, from every crop the options ask for."""
        views: list[LineView] = []
        owners: list[tuple[int, int]] = []
        started = time.perf_counter()
        for i, (frame, frame_quads) in enumerate(zip(frames, quads, strict=True)):
            for j, quad in enumerate(frame_quads):
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
        OCR_STAGE.labels(self.spec.name, "crops").observe(time.perf_counter() - started)
        if views and self.cls is not None:
            views = self.classify_angles(views)
        ballots: dict[tuple[int, int], list[tuple[str, float]]] = defaultdict(list)
        for reader in self.readers if views else []:
            for owner, read in zip(owners, self.recognise(views, reader), strict=True):
                ballots[owner].append(read)
        return [
            [(*vote(ballots[(i, j)]), max(r[1] for r in ballots[(i, j)])) for j in range(len(q))]
            for i, q in enumerate(quads)
        ]

    def _zoom(
        self,
        frame: FrameIn,
        plan: LetterboxTransform,
        prob: np.ndarray,
        quads: np.ndarray,
        reads: list[Read],
        zoom: float,
    ) -> np.ndarray:
        """Lines detected again `zoom` times finer than the first pass, in every
        `zoom_regions` region but those whose lines the first pass read surely (each at
        least `zoom_sure`). Each region is cut from the frame in its own format (no
        conversion) and detected alone: the detector's global pooling would mix regions
        packed on one canvas."""
        boxes = zoom_regions(prob, plan, self.opts.zoom_thresh)
        centres = quads.mean(axis=1)
        sure = np.array([score >= self.opts.zoom_sure for _, score, _ in reads], bool)
        scale = min(zoom * max(plan.scale_x, plan.scale_y), 4.0)
        cap = ceil32(self.opts.det_max_side)  # no canvas above the first pass's (memory, TRT)
        out: list[np.ndarray] = []
        zoomed = 0
        for win in crop_windows(boxes, frame.hw, frame.fmt) if len(boxes) else []:
            x0, y0, x1, y1 = win
            within = (
                (x0 <= centres[:, 0]) & (centres[:, 0] <= x1)
                & (y0 <= centres[:, 1]) & (centres[:, 1] <= y1)
            )  # fmt: skip
            if within.any() and sure[within].all():
                continue
            if zoomed == ZOOM_MAX:
                break
            zoomed += 1
            part = FrameIn(sub_frame(frame.pixels, frame.fmt, frame.hw, win), frame.fmt)
            h, w = part.hw
            fit = min(scale, cap / max(h, w))
            roi = LetterboxTransform.stretch((h, w), (round_to(h * fit, 32), round_to(w * fit, 32)))
            zmap = self.det.run(self._det_tensor([part], [roi]))[0][0, 0]
            found, _ = db_boxes(zmap[: roi.dst_h, : roi.dst_w], self._db)
            offset = np.array([x0, y0], np.float32)
            out += [roi.points_to_source(q) + offset for q in found]
        return readable(out, plan)

    # --- stages ------------------------------------------------------------------------

    @contextmanager
    def _stage(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        OCR_STAGE.labels(self.spec.name, stage).observe(time.perf_counter() - started)

    def classify_angles(self, views: list[LineView]) -> list[LineView]:
        """Flip lines the angle classifier is sure are upside down."""
        assert self.cls is not None  # called only when the pipeline has one
        spec = self.cls.spec
        h, w = spec.input.height or 48, spec.input.width or 192
        ratios = _ratios(views)
        out = list(views)
        step = self.opts.rec_batch
        for start in range(0, len(views), step):
            idx = np.arange(start, min(start + step, len(views)))
            batch = _line_batch(views, idx, ratios, (h, w), spec)
            probs = self.cls.run(batch)[0]
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
        OCR_STAGE.labels(self.spec.name, "rec_pre").observe(time.perf_counter() - started)
        with self._stage("rec_infer"):
            probs = reader.session.run(batch)[0]
        with self._stage("ctc"):
            if self.opts.word_kinds is None:
                return ctc_greedy(probs, reader.charset)
            return ctc_greedy(probs, reader.charset, reader.kinds, self.opts.word_kinds)


@cache
def width_ladder(lo: int, hi: int) -> tuple[int, ...]:
    """lo, then each REC_WIDTH_GROWTH times the last (in steps of 32), up to hi."""
    widths = [lo]
    while widths[-1] < hi:
        widths.append(min(hi, ceil32(widths[-1] * REC_WIDTH_GROWTH)))
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


def ceil32(value: float) -> int:
    return int(math.ceil(value / 32) * 32)


def _reading_order(line: Detection) -> tuple[int, float]:
    assert line.box is not None  # _line always sets it
    return round(line.box[1] / 12), line.box[0]


def _line(quad: np.ndarray, text: str, score: float) -> Detection:
    x1, y1 = float(quad[:, 0].min()), float(quad[:, 1].min())
    x2, y2 = float(quad[:, 0].max()), float(quad[:, 1].max())
    return Detection(
        text=text,
        score=float(min(1.0, max(0.0, score))),
        box=(round(x1, 1), round(y1, 1), round(x2, 1), round(y2, 1)),
        polygon=[(round(float(x), 1), round(float(y), 1)) for x, y in quad],
    )
