"""Escalation policy: which frames and text tracks become cases, and what image goes.

`escalate: tracks` (the default): text seen across frames is one track (edge/tracks.py);
a track is escalated once it has shown its line whole (not cut by the frame's border) on
`ready_frames` frames, or after `max_wait_frames` if it never does, as soon as its voted
confidence is under the budget's threshold and the budget has credit (edge/budget.py),
as one case carrying its best crops (whole ones first) tiled into one image. It is asked
again (up to `max_cases`) only once it has come whole, grown or lost its answer since
(`Tracker._review`). Its reason is `disagreement` when its own frames read it
differently, else `unsure`. Frames are
still escalated when the model failed, found nothing where something is expected, or
were picked by the drift sample (one rule per reason: edge/reasons/).
`escalate: frames`: every frame with a score inside the unsure band, as before.

Every candidate then passes de-duplication (a 64-bit dHash within a time window: a parked
car is sent once) and a per-stream token bucket (a flood of hard frames cannot saturate
the uplink): the hard ceiling under any budget.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np
from prometheus_client import Counter

from edgefleet.edge.budget import EscalationBudget
from edgefleet.edge.planes import bgr_crop, frame_hw, gray
from edgefleet.edge.reasons import FrameFacts, frame_reason
from edgefleet.edge.settings import PolicySettings
from edgefleet.edge.tracks import Asked, Track, Tracker
from edgefleet.shared.messages import Detection, EscalationReason, StreamId, Tile, TrackId

CANDIDATES = Counter("ef_edge_escalation_candidates_total", "Frames that qualified", ["reason"])
SUPPRESSED = Counter(
    "ef_edge_escalations_suppressed_total", "Candidates not sent", ["stream", "why"]
)


class TokenBucket:
    """`rate_per_s` tokens per second, at most `burst` saved up."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float]):
        self.rate, self.burst, self._clock = rate_per_s, float(burst), clock
        self.tokens = float(burst)
        self._last = clock()

    def take(self) -> bool:
        now = self._clock()
        self.tokens = min(self.burst, self.tokens + (now - self._last) * self.rate)
        self._last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def dhash(image: np.ndarray) -> int:
    """64-bit difference hash of a BGR/RGB image (robust to noise, JPEG and small shifts)."""
    gray = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if image.ndim == 3 else image
    small = cv2.resize(gray, (9, 8), interpolation=cv2.INTER_AREA).astype(np.int16)
    bits = (small[:, 1:] > small[:, :-1]).flatten()
    return int(np.packbits(bits).view(">u8")[0])


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


@dataclass(frozen=True)
class Escalation:
    """A decision to send: why, the image bytes and the crop they show (None = frame);
    for a track, its id, its crops as tiles of the image, its voted reading and score."""

    reason: EscalationReason
    jpeg: bytes
    crop: tuple[int, int, int, int] | None
    track_id: TrackId | None = None
    tiles: tuple[Tile, ...] = ()
    edge_result: tuple[Detection, ...] | None = None
    score: float | None = None


def tile_crops(
    crops: list[np.ndarray], max_side: int
) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """Stack crops into one image, top to bottom, left-aligned on mid-grey; each crop's
    (x, y, w, h) in it. Scaled down together when the strip would exceed `max_side`."""
    extent = max(max(c.shape[1] for c in crops), sum(c.shape[0] for c in crops))
    scale = min(1.0, max_side / extent)
    sized = [
        cv2.resize(c, (max(1, round(c.shape[1] * scale)), max(1, round(c.shape[0] * scale))))
        if scale < 1.0
        else c
        for c in crops
    ]
    width = max(c.shape[1] for c in sized)
    strip = np.full((sum(c.shape[0] for c in sized), width, 3), 128, np.uint8)
    rects, y = [], 0
    for c in sized:
        strip[y : y + c.shape[0], : c.shape[1]] = c
        rects.append((0, y, c.shape[1], c.shape[0]))
        y += c.shape[0]
    return strip, rects


class EscalationPolicy:
    """Thread-safe; one instance for all streams (state is kept per stream)."""

    def __init__(self, settings: PolicySettings, *, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        self._rng = random.Random(settings.seed)
        self._buckets: dict[str, TokenBucket] = {}
        self._recent: dict[str, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()
        self.suppressed: dict[str, int] = {"rate": 0, "duplicate": 0}
        self.tracker = Tracker(settings.tracks)
        self.budget = EscalationBudget(settings.budget, clock=clock)

    def reason(
        self, detections: list[Detection], *, expect_result: bool, failed: bool
    ) -> EscalationReason | None:
        """Why this result is worth a second opinion (`edgefleet.edge.reasons`), or None."""
        return frame_reason(
            FrameFacts(detections, expect_result, failed, self.settings, self._draw)
        )

    def _draw(self) -> float:
        with self._lock:
            return self._rng.random()

    def passes(self, stream_id: StreamId, image: np.ndarray) -> bool:
        """De-duplicate and rate-limit one candidate; counts what it suppresses."""
        s = self.settings
        digest = dhash(image)
        now = self._clock()
        with self._lock:
            recent = self._recent.setdefault(stream_id, deque())
            while recent and now - recent[0][0] > s.dedup_window_s:
                recent.popleft()
            if any(hamming(digest, h) <= s.dedup_max_distance for _, h in recent):
                self._suppress(stream_id, "duplicate")
                return False
            bucket = self._buckets.get(stream_id)
            if bucket is None:
                bucket = TokenBucket(s.rate_per_min / 60.0, s.burst, self._clock)
                self._buckets[stream_id] = bucket
            if not bucket.take():
                self._suppress(stream_id, "rate")
                return False
            if s.dedup_window_s > 0:
                recent.append((now, digest))
            return True

    def _suppress(self, stream_id: StreamId, why: str) -> None:
        self.suppressed[why] += 1
        SUPPRESSED.labels(stream_id, why).inc()

    def decide_all(
        self,
        stream_id: StreamId,
        frame_index: int,
        image: np.ndarray,
        detections: list[Detection],
        *,
        expect_result: bool = False,
        failed: bool = False,
        fmt: str = "bgr",
    ) -> list[Escalation]:
        """Every case this frame (`image` in pixel format `fmt`: bgr, nv12, i420) gives: its
        own, and its tracks' (tracks mode)."""
        own = self.decide(
            stream_id, image, detections, expect_result=expect_result, failed=failed, fmt=fmt
        )
        out = [own] if own is not None else []
        if self.settings.escalate == "tracks":
            tracks = self.tracker.update(stream_id, frame_index, image, detections, fmt)
            out += self.escalations_for(stream_id, tracks)
        return out

    def escalations_for(self, stream_id: StreamId, tracks: list[Track]) -> list[Escalation]:
        """One frame's tracks (from `tracker.update`): the cases they give. The least sure
        is considered first: where credit is short, it goes to the track the cloud can help
        most, not to the one detected first."""
        self.budget.frame(stream_id)
        out = []
        unique = {t.track_id: t for t in tracks}.values()
        for track in sorted(unique, key=lambda t: t.reading()[1]):
            escalation = self.consider_track(stream_id, track)
            if escalation is not None:
                out.append(escalation)
        return out

    def consider_track(self, stream_id: StreamId, track: Track) -> Escalation | None:
        """Once the track can be answered (seen whole on `ready_frames` frames, or waited
        `max_wait_frames`), until it is sent: a case for the track, if the budget picks it
        and the rate limit and de-duplication let it through."""
        s = self.settings.tracks
        if track.escalated or track.frames < s.ready_frames:
            return None
        if len(track.whole_reads) < s.ready_frames and track.frames < s.max_wait_frames:
            return None  # cut by the frame's border: a case now would ask about a part
        text, score = track.reading()
        reason: EscalationReason = "disagreement" if track.agreement() < 0.6 else "unsure"
        first, track.considered = not track.considered, True
        if not self.budget.consider(stream_id, score, first=first):
            return None
        CANDIDATES.labels(reason).inc()
        whole = [c for c in track.crops if c.whole]
        crops = sorted(whole or track.crops, key=lambda c: -c.rank)
        strip, rects = tile_crops([c.image for c in crops], self.settings.max_image_side)
        if not self.passes(stream_id, strip):
            self.budget.refund(stream_id)
            return None
        track.escalated = True
        track.cases += 1
        track.asked = Asked(text, all(c.whole for c in crops), track.height)
        tiles = tuple(
            Tile(x=x, y=y, w=w, h=h, frame_index=c.frame_index, crop=c.box)
            for (x, y, w, h), c in zip(rects, crops, strict=True)
        )
        x1, y1, x2, y2 = (round(v, 1) for v in track.box)
        reading = Detection(text=text, score=min(1.0, max(0.0, score)), box=(x1, y1, x2, y2))
        return Escalation(
            reason, self.encode(strip, None), None, track.track_id, tiles, (reading,), score
        )

    def decide(
        self,
        stream_id: StreamId,
        image: np.ndarray,
        detections: list[Detection],
        *,
        expect_result: bool = False,
        failed: bool = False,
        fmt: str = "bgr",
    ) -> Escalation | None:
        """The frame's own escalation, or None (YUV: only what the JPEG shows is converted,
        and only for a case that passes)."""
        reason = self.reason(detections, expect_result=expect_result, failed=failed)
        if reason is None:
            return None
        CANDIDATES.labels(reason).inc()
        if not self.passes(stream_id, gray(image, fmt)):
            return None
        hw = frame_hw(image, fmt)
        crop = self.crop_box(hw, detections) if self.settings.attach == "crop" else None
        return Escalation(reason, self.encode(bgr_crop(image, fmt, crop), None), crop)

    def crop_box(
        self, hw: tuple[int, int], detections: list[Detection]
    ) -> tuple[int, int, int, int] | None:
        """The union of the result boxes plus a margin, clipped; None if there are none."""
        boxes = [d.box for d in detections if d.box is not None]
        if not boxes:
            return None
        h, w = hw
        arr = np.asarray(boxes, dtype=np.float64)
        x1, y1 = arr[:, 0].min(), arr[:, 1].min()
        x2, y2 = arr[:, 2].max(), arr[:, 3].max()
        mx = (x2 - x1) * self.settings.crop_margin
        my = (y2 - y1) * self.settings.crop_margin
        box = (
            int(max(0, x1 - mx)),
            int(max(0, y1 - my)),
            int(min(w, np.ceil(x2 + mx))),
            int(min(h, np.ceil(y2 + my))),
        )
        if box[2] - box[0] < 2 or box[3] - box[1] < 2:
            return None
        return box

    def encode(self, image: np.ndarray, crop: tuple[int, int, int, int] | None) -> bytes:
        """JPEG of the frame or crop, downscaled to max_image_side."""
        if crop is not None:
            image = image[crop[1] : crop[3], crop[0] : crop[2]]
        h, w = image.shape[:2]
        side = self.settings.max_image_side
        if max(h, w) > side:
            scale = side / max(h, w)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
        ok, buf = cv2.imencode(
            ".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, self.settings.jpeg_quality]
        )
        if not ok:
            raise ValueError("JPEG encoding failed")
        return buf.tobytes()
