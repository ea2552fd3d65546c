"""Short-lived text tracks: the same text seen in consecutive frames is one track.

A detection joins the open track of its stream whose last box overlaps it most, when the
overlap is large, or when it overlaps at all and reads alike. A track's reading is a
confidence-weighted vote over its frames, or the cloud's answer once it came, unless the
vote is surer than the answer; it keeps its few best crops (sharpest x largest) for the
cloud; it ends when unseen for `max_gap` frames. Ended tracks are kept
(bounded) so that a late verdict still lands on its track. A crop's rank is the edge's
confidence on it x its sharpness x its area: glare and blur lower the first two.
"""

from __future__ import annotations

import difflib
import itertools
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import cv2
import numpy as np

from edgefleet.edge.pixels import bgr_crop, frame_hw, gray
from edgefleet.edge.settings import TrackSettings
from edgefleet.shared.messages import CaseId, Detection, StreamId, TrackId
from edgefleet.shared.models.ocr import vote

Box = tuple[float, float, float, float]


def iou(a: Box, b: Box) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def similarity(a: str, b: str) -> float:
    """0..1 how alike two readings are, ignoring case and spacing."""
    x, y = "".join(a.split()).casefold(), "".join(b.split()).casefold()
    if not x or not y:
        return 0.0
    return difflib.SequenceMatcher(None, x, y).ratio()


def sharpness(image: np.ndarray) -> float:
    """Variance of the Laplacian: how much fine detail a crop keeps (blur lowers it)."""
    gray = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY) if image.ndim == 3 else image
    return float(cv2.Laplacian(gray, cv2.CV_32F).var())


@dataclass(eq=False)
class Crop:
    """A crop of one sighting, ranked by confidence x sharpness x area."""

    image: np.ndarray
    frame_index: int
    box: tuple[int, int, int, int]
    rank: float


@dataclass
class Track:
    """One text seen across frames."""

    track_id: TrackId
    stream_id: StreamId
    first_frame: int
    last_frame: int
    box: Box
    reads: list[tuple[str, float]] = field(default_factory=list)
    crops: list[Crop] = field(default_factory=list)
    escalated: bool = False
    case_id: CaseId | None = None
    cloud: Detection | None = None
    ended: bool = False

    @property
    def frames(self) -> int:
        return len(self.reads)

    def reading(self) -> tuple[str, float]:
        """The edge's vote over this track's frames: (text, vote share x confidence)."""
        return vote(self.reads)

    def outcome(self) -> tuple[str, float, bool]:
        """What the device reports, (text, score, whether it is the cloud's answer): the
        cloud's answer once it came, unless the edge's vote over the track's frames is surer
        than it (a blurred crop the cloud reads `PO 008 HN` at 0.33 does not overturn twenty
        frames agreeing on `PD 008 HN` at 0.9); else the edge's vote."""
        text, score = self.reading()
        if self.cloud is not None and self.cloud.score >= score:
            return self.cloud.text or "", self.cloud.score, True
        return text, score, False

    def result(self) -> tuple[str, float]:
        """What the device reports (`outcome`): (text, score)."""
        text, score, _ = self.outcome()
        return text, score

    def agreement(self) -> float:
        """Share of this track's reads that agree with its winning reading."""
        text, _ = self.reading()
        key = "".join(text.split()).casefold()
        same = sum(1 for t, _ in self.reads if "".join(t.split()).casefold() == key)
        return same / len(self.reads) if self.reads else 0.0


@dataclass(frozen=True)
class TrackReport:
    """What the device reports for one live track: its result and who gave it."""

    track_id: TrackId
    text: str
    score: float
    box: Box
    source: str  # "cloud" where its answer stands (`Track.outcome`), else "edge" (the vote)
    edge_text: str  # the edge's own vote over the track's frames, whatever the cloud said


def report(track: Track) -> TrackReport:
    text, score, answered = track.outcome()
    source = "cloud" if answered else "edge"
    return TrackReport(track.track_id, text, score, track.box, source, track.reading()[0])


class Tracker:
    """Thread-safe; tracks are kept per stream."""

    def __init__(self, settings: TrackSettings):
        self.settings = settings
        self._open: dict[str, list[Track]] = {}
        self._ended: OrderedDict[str, Track] = OrderedDict()
        self._by_id: dict[str, Track] = {}
        self._ids = itertools.count(1)
        # ids differ between runs: a verdict for a case sent before a restart can never
        # land on a new track that happens to reuse its number
        self._run = secrets.token_hex(3)
        self._lock = threading.Lock()

    def update(
        self,
        stream_id: StreamId,
        frame_index: int,
        image: np.ndarray,
        detections: list[Detection],
        fmt: str = "bgr",
    ) -> list[Track]:
        """Add one frame's text lines (`image` in pixel format `fmt`); the track of each
        detection, in the same order."""
        s = self.settings
        with self._lock:
            tracks = self._open.setdefault(stream_id, [])
            taken: set[int] = set()
            out: list[Track] = []
            for det in detections:
                if det.box is None or not det.text:
                    continue
                best, best_fit = None, 0.0
                for k, track in enumerate(tracks):
                    if k in taken:
                        continue
                    overlap = iou(det.box, track.box)
                    if overlap <= 0:
                        continue
                    alike = similarity(det.text, track.reading()[0])
                    if overlap < s.min_iou and alike < s.min_similarity:
                        continue
                    fit = overlap + alike
                    if fit > best_fit:
                        best, best_fit = k, fit
                if best is None:
                    track = Track(
                        track_id=f"{stream_id[:40]}-{self._run}-{next(self._ids)}",
                        stream_id=stream_id,
                        first_frame=frame_index,
                        last_frame=frame_index,
                        box=det.box,
                    )
                    tracks.append(track)
                    self._by_id[track.track_id] = track
                    best = len(tracks) - 1
                taken.add(best)
                track = tracks[best]
                track.box, track.last_frame = det.box, frame_index
                track.reads.append((det.text, det.score))
                del track.reads[: -s.max_reads]
                self._keep_crop(track, image, fmt, det.box, frame_index, det.score)
                out.append(track)
            self._end_stale(stream_id, frame_index)
            return out

    def _keep_crop(
        self, track: Track, image: np.ndarray, fmt: str, box: Box, frame_index: int, score: float
    ) -> None:
        """Rank the sighting's crop (YUV: on the Y plane); keep the best, converted to BGR
        only when kept."""
        h, w = frame_hw(image, fmt)
        bw, bh = box[2] - box[0], box[3] - box[1]
        m = self.settings.crop_margin
        x1, y1 = int(max(0, box[0] - m * bh)), int(max(0, box[1] - m * bh))
        x2, y2 = int(min(w, np.ceil(box[2] + m * bh))), int(min(h, np.ceil(box[3] + m * bh)))
        if x2 - x1 < 2 or y2 - y1 < 2:
            return
        rank = score * sharpness(gray(image, fmt)[y1:y2, x1:x2]) * bw * bh  # sure, sharp, large
        worst = min(track.crops, key=lambda c: c.rank, default=None)
        if len(track.crops) >= self.settings.max_crops:
            if worst is None or rank <= worst.rank:
                return
            track.crops.remove(worst)
        crop = bgr_crop(image, fmt, (x1, y1, x2, y2)).copy()
        track.crops.append(Crop(crop, frame_index, (x1, y1, x2, y2), rank))

    def _end_stale(self, stream_id: StreamId, frame_index: int) -> None:
        tracks = self._open[stream_id]
        for track in [t for t in tracks if frame_index - t.last_frame > self.settings.max_gap]:
            tracks.remove(track)
            self._retire(track)

    def _retire(self, track: Track) -> None:
        track.ended = True
        track.crops.clear()  # nothing will be sent any more: free the pixels
        self._ended[track.track_id] = track
        while len(self._ended) > self.settings.keep_ended:
            old, _ = self._ended.popitem(last=False)
            self._by_id.pop(old, None)

    def end_stream(self, stream_id: StreamId) -> list[Track]:
        """End every open track of a stream (it stopped); returns them."""
        with self._lock:
            tracks = self._open.pop(stream_id, [])
            for track in tracks:
                self._retire(track)
            return tracks

    def live(self, stream_id: StreamId) -> list[Track]:
        """The stream's open tracks: what the device reports for its latest frame, including
        text the model missed on that one frame but saw within `max_gap` frames."""
        with self._lock:
            return list(self._open.get(stream_id, []))

    def get(self, track_id: str) -> Track | None:
        """An open or recently ended track, or None."""
        with self._lock:
            return self._by_id.get(track_id)

    def apply_verdict(self, track_id: str, result: list[Detection]) -> Track | None:
        """The cloud's answer lands on the track (open or ended), and becomes its result
        unless the edge's vote is surer (`Track.outcome`); None if the track is unknown."""
        with self._lock:
            track = self._by_id.get(track_id)
            if track is None:
                return None
            reads = [d for d in result if d.text]
            track.cloud = (
                max(reads, key=lambda d: d.score)
                if reads
                else Detection(text="", score=0.0, box=track.box)
            )
            return track
