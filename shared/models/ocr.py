"""The PP-OCR pipeline: DB text detection (with a zoomed second look for faint text), then
its lines read by `lines.LineReader` (angle classifier, CTC recognisers, the vote).

Which pipelines the edge and the cloud run was decided by measurement (BENCHMARKS.md, "OCR
ladder").
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

import cv2
import numpy as np
from prometheus_client import Counter

from edgefleet.shared import kernels
from edgefleet.shared.executor.memory import MemoryBudget
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.kernels.crops import crop_windows, sub_frame
from edgefleet.shared.messages import Detection
from edgefleet.shared.models.base import Capped, Model
from edgefleet.shared.models.frames import FrameIn
from edgefleet.shared.models.lines import LineReader, Read, Reader, load_charset, stage
from edgefleet.shared.models.outputs.dbnet import DBParams, db_boxes, order_quad
from edgefleet.shared.models.preprocess import (
    ceil_to,
    det_plan,
    kernel_batch,
    round_to,
    stack_canvases,
)
from edgefleet.shared.models.registry import ModelRegistry
from edgefleet.shared.models.session import Session, open_session
from edgefleet.shared.models.tasks import OcrOptions, OcrSpec

log = logging.getLogger(__name__)

LINES_UNREAD = Counter(
    "ef_ocr_lines_unread_total",
    "Text lines found but left unread by the pipeline's max_lines cap (dense images)",
    ["model"],
)
DET_PAD = 114  # the detector's canvas outside the image: mid-grey, no edges
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
        side = ceil_to(opts.det_max_side, 32)
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
            again = recogniser(opts.reread) if opts.reread else None
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
        self.det = det
        readers = [Reader.of(s, load_charset(s, registry)) for s in (rec, *voters)]
        rereader = Reader.of(again, load_charset(again, registry)) if again else None
        self.lines = LineReader(spec.name, opts, cls, readers, rereader)
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

    def pre_process(self, frames: list[FrameIn]) -> _DetBatch:
        with stage(self.spec.name, "det_pre"):
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
        with stage(self.spec.name, "det_infer"):
            for idx, tensor in prepared.groups:
                out = self.det.run(tensor)[0]
                for k, i in enumerate(idx):
                    maps[i] = out[k, 0]
        return maps

    def post_process(self, raw: list[np.ndarray], prepared: _DetBatch) -> list[list[Detection]]:
        frames, found, probs, unread = prepared.frames, [], [], []
        for i, plan in enumerate(prepared.plans):
            probs.append(raw[i][: plan.dst_h, : plan.dst_w])
            with stage(self.spec.name, "db_boxes"):
                quads, _ = db_boxes(probs[-1], self._db)
            biggest, left = capped(
                readable([plan.points_to_source(q) for q in quads], plan), self.opts.max_lines
            )
            found.append(biggest)
            unread.append(left)
        reads = self.lines.read(frames, found)
        if self.opts.det_zoom:
            with stage(self.spec.name, "zoom"):
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
            rezoomed = self.lines.read(frames, zoomed)
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
        cap = ceil_to(self.opts.det_max_side, 32)  # no canvas above the first pass's (memory, TRT)
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
