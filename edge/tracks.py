"""Short-lived text tracks: the same text seen in consecutive frames is one track.

A detection joins the open track of its stream whose last box overlaps it most, when the
overlap is large, or when it overlaps at all and reads alike. A track's reading is a
confidence-weighted vote over the frames where its line shows whole (a line cut by the
frame's border reads as a part of itself: until it shows whole, its latest read), or the
cloud's answer once it came, unless the vote is surer than the answer; it keeps its few
best crops (whole before cut, then sharpest x largest) for the cloud; it ends when unseen
for `max_gap` frames, and is taken up again if it comes back soon, near where it was and
reading alike (`revive_frames`). Ended tracks are kept (bounded) so that a late verdict
still lands on its track. A crop's rank is the edge's confidence on it x its sharpness x
its area: glare and blur lower the first two. A reading with fewer characters than its
box holds (`fit`) is the less sure for it, so that such a track is asked about.

An answer is for the track as it was when its case was sent (`Asked`). It stands only
while it still fits what the track sees now: when the line has come whole since, grown
past the answer, or reads as something else, the answer is retired (`Tracker._review`) and
the track may be asked again, up to `max_cases`.
"""

from __future__ import annotations

import difflib
import itertools
import secrets
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import cv2
import numpy as np
from prometheus_client import Counter

from edgefleet.edge.planes import bgr_crop, frame_hw, gray
from edgefleet.edge.scene_cuts import SceneCuts
from edgefleet.edge.settings import TrackSettings
from edgefleet.shared.messages import CaseId, Detection, StreamId, TrackId
from edgefleet.shared.models.lines import vote

Box = tuple[float, float, float, float]

RETIRED = Counter(
    "ef_edge_answers_retired_total",
    "Cloud answers that no longer fit their track (the line came whole, grew or changed)",
    ["why"],
)


def iou(a: Box, b: Box) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def squash(text: str) -> str:
    """A reading as compared: no case, no spacing."""
    return "".join(text.split()).casefold()


def similarity(a: str, b: str) -> float:
    """0..1 how alike two readings are, ignoring case and spacing."""
    x, y = squash(a), squash(b)
    if not x or not y:
        return 0.0
    return difflib.SequenceMatcher(None, x, y).ratio()


def part_of(a: str, b: str) -> bool:
    """Whether the shorter reading is, but for a character in five, a piece of the longer
    one: what a half-hidden or half-read line gives."""
    x, y = sorted((squash(a), squash(b)), key=len)
    if not x:
        return True
    matcher = difflib.SequenceMatcher(None, x, y)
    return sum(m.size for m in matcher.get_matching_blocks()) >= 0.8 * len(x)


def fit(text: str, box: Box, char_width: float) -> float:
    """1 where a reading holds as many characters as its box can, less in proportion where
    the box is wider than `char_width` of its height per character: the reader lost
    characters, or read one wide glyph for several."""
    chars = len(squash(text))
    height = box[3] - box[1]
    if not chars or height <= 0:
        return 1.0
    per_char = (box[2] - box[0]) / height / chars
    return min(1.0, char_width / per_char) if per_char > 0 else 1.0


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
    whole: bool  # the line did not touch the frame's border

    @property
    def key(self) -> tuple[bool, float]:
        """What a kept crop is worth: a whole line before any cut one, then its rank."""
        return self.whole, self.rank


@dataclass(frozen=True)
class Asked:
    """The track as its latest case showed it: what its answer is an answer to."""

    text: str  # the edge's reading then
    whole: bool  # every crop sent showed the whole line
    height: float  # the line's height then, in frame pixels


@dataclass
class Track:
    """One text seen across frames."""

    track_id: TrackId
    stream_id: StreamId
    first_frame: int
    last_frame: int
    box: Box
    char_width: float  # TrackSettings.char_width: how wide a character of a reading may be
    reads: list[tuple[str, float]] = field(default_factory=list)
    whole_reads: list[tuple[str, float]] = field(default_factory=list)  # line not cut
    crops: list[Crop] = field(default_factory=list)
    escalated: bool = False  # a case is out and no new one is due
    considered: bool = False  # its score entered the budget's distribution
    cases: int = 0
    asked: Asked | None = None
    case_id: CaseId | None = None
    cloud: Detection | None = None
    ended: bool = False
    seen: int = 0  # frames it was seen on (reads keeps only the latest `max_reads`)
    strays: list[int] = field(default_factory=list)  # latest frames, in a row, read unlike

    @property
    def frames(self) -> int:
        return self.seen

    @property
    def height(self) -> float:
        return self.box[3] - self.box[1]

    def reading(self) -> tuple[str, float]:
        """The edge's vote over this track's frames where the line showed whole: (text,
        vote share x confidence x its `fit` to the box). While it has shown only cut, its
        latest read: the part in view changes from frame to frame, and an older part is a
        shorter one."""
        text, score = (
            vote(self.whole_reads) if self.whole_reads or not self.reads else (self.reads[-1])
        )
        return text, score * fit(text, self.box, self.char_width)

    def misfit(self, answer: Detection) -> str | None:
        """Why the cloud's `answer` no longer fits what the track sees now, or None. Asked
        on a cut line that shows whole now, an answer shorter than the whole reading is of
        the part; a reading grown two characters past the answer, or grown at all since the
        case and longer than the answer (a hidden part came into view), or one unlike what
        was asked, has outgrown it. (An edge vote surer than the answer wins in `outcome`.)"""
        if self.asked is None:
            return None
        text, _ = self.reading()
        mine, theirs = squash(text), squash(answer.text or "")
        if not self.asked.whole and self.whole_reads and len(theirs) < len(mine):
            return "was_cut"
        grown = len(mine) > len(squash(self.asked.text))
        if len(mine) - len(theirs) >= 2 or (grown and len(theirs) < len(mine)):
            return "grew"
        if self.whole_reads and similarity(text, self.asked.text) < 0.5:
            return "changed"
        return None

    def outcome(self) -> tuple[str, float, bool]:
        """What the device reports, (text, score, whether it is the cloud's answer): the
        cloud's answer once it came, unless the edge's vote over the track's frames is surer
        than it (a blurred crop the cloud reads `PO 008 HN` at 0.33 does not overturn twenty
        frames agreeing on `PD 008 HN` at 0.9); else the edge's vote. Each is weighed by its
        `fit` to the line's box: `电` read for a nine-character plate is sure of nothing."""
        text, score = self.reading()
        if self.cloud is not None:
            answer = self.cloud.text or ""
            sure = self.cloud.score * fit(answer, self.box, self.char_width)
            if sure >= score:
                return answer, sure, True
        return text, score, False

    def result(self) -> tuple[str, float]:
        """What the device reports (`outcome`): (text, score)."""
        text, score, _ = self.outcome()
        return text, score

    def keep_crop(
        self,
        image: np.ndarray,
        fmt: str,
        det: Detection,
        frame_index: int,
        whole: bool,
        settings: TrackSettings,
    ) -> None:
        """Rank this sighting's crop (YUV: on the Y plane); keep it among the track's best
        `max_crops`, converted to BGR only when kept."""
        assert det.box is not None  # the tracker skips detections without a box
        box, (h, w) = det.box, frame_hw(image, fmt)
        bw, bh = box[2] - box[0], box[3] - box[1]
        m = settings.crop_margin
        x1, y1 = int(max(0, box[0] - m * bh)), int(max(0, box[1] - m * bh))
        x2, y2 = int(min(w, np.ceil(box[2] + m * bh))), int(min(h, np.ceil(box[3] + m * bh)))
        if x2 - x1 < 2 or y2 - y1 < 2:
            return
        sharp = sharpness(gray(image, fmt)[y1:y2, x1:x2])
        rank = det.score * sharp * bw * bh  # sure, sharp, large
        worst = min(self.crops, key=lambda c: c.key, default=None)
        if len(self.crops) >= settings.max_crops:
            if worst is None or (whole, rank) <= worst.key:
                return
            self.crops.remove(worst)
        crop = bgr_crop(image, fmt, (x1, y1, x2, y2)).copy()
        self.crops.append(Crop(crop, frame_index, (x1, y1, x2, y2), rank, whole))

    def agreement(self) -> float:
        """Share of the reads `reading` votes over that agree with its winning reading."""
        text, _ = self.reading()
        reads = self.whole_reads or self.reads
        same = sum(1 for t, _ in reads if squash(t) == squash(text))
        return same / len(reads) if reads else 0.0


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
        self._lost: dict[str, deque[Track]] = {}  # ended unseen, lately: may come back
        self._by_id: dict[str, Track] = {}
        self._cuts = SceneCuts(settings.cut_level)
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
        h, w = frame_hw(image, fmt)
        with self._lock:
            if self._cuts.cut(stream_id, image, fmt):
                self._end_all(stream_id)
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
                if best is None and (revived := self._revive(stream_id, det, frame_index)):
                    tracks.append(revived)
                    best = len(tracks) - 1
                if best is None:
                    track = Track(
                        track_id=f"{stream_id[:40]}-{self._run}-{next(self._ids)}",
                        stream_id=stream_id,
                        first_frame=frame_index,
                        last_frame=frame_index,
                        box=det.box,
                        char_width=s.char_width,
                    )
                    tracks.append(track)
                    self._by_id[track.track_id] = track
                    best = len(tracks) - 1
                taken.add(best)
                track = tracks[best]
                whole = not self._cut(det.box, h, w)
                if not whole:
                    track.strays.clear()
                elif self._stray(track, det.text, frame_index):
                    track = tracks[best] = self._split(stream_id, track)
                track.box, track.last_frame = det.box, frame_index
                track.seen += 1
                for reads in (track.reads, track.whole_reads) if whole else (track.reads,):
                    reads.append((det.text, det.score))
                    del reads[: -s.max_reads]
                track.keep_crop(image, fmt, det, frame_index, whole, s)
                self._review(track)
                out.append(track)
            self._end_stale(stream_id, frame_index)
            return out

    def _stray(self, track: Track, text: str, frame_index: int) -> bool:
        """Count a whole read of `track` that reads unlike its vote and not as a part of
        it; whether this makes `change_frames` such reads in a row, alike each other: the
        line in the box is another one now (a plate replaced at a gate, a camera's cut, a
        video looping). Under the lock."""
        s = self.settings
        if not track.whole_reads:
            return False
        voted = track.reading()[0]
        if similarity(text, voted) >= s.min_similarity or part_of(text, voted):
            track.strays.clear()
            return False
        if track.strays and similarity(text, track.whole_reads[-1][0]) < s.min_similarity:
            track.strays.clear()  # unlike the run before it too: a new run starts here
        track.strays.append(frame_index)
        return len(track.strays) >= s.change_frames

    def _split(self, stream_id: StreamId, old: Track) -> Track:
        """End `old` as it read before its strays, and start a new track (a new id, so it is
        asked about anew) from the stray reads and crops. Under the lock."""
        since, n = old.strays[0], len(old.strays) - 1  # this frame's read is not in yet
        new = Track(
            track_id=f"{stream_id[:40]}-{self._run}-{next(self._ids)}",
            stream_id=stream_id,
            first_frame=since,
            last_frame=old.last_frame,
            box=old.box,
            char_width=old.char_width,
            reads=old.reads[len(old.reads) - n :],
            whole_reads=old.whole_reads[len(old.whole_reads) - n :],
            crops=[c for c in old.crops if c.frame_index >= since],
            seen=n,
        )
        del old.reads[len(old.reads) - n :], old.whole_reads[len(old.whole_reads) - n :]
        old.seen -= n
        old.strays.clear()
        old.crops = [c for c in old.crops if c.frame_index < since]
        self._by_id[new.track_id] = new
        self._retire(old)
        if self.settings.revive_frames:
            self._lost.setdefault(stream_id, deque(maxlen=64)).append(old)
        return new

    def _cut(self, box: Box, h: int, w: int) -> bool:
        """Whether a line with this box is cut by the frame's border."""
        m = self.settings.border_px
        return box[0] <= m or box[1] <= m or box[2] >= w - m or box[3] >= h - m

    def _review(self, track: Track) -> None:
        """Retire an answer the track has outgrown, and let a track that came whole, grew or
        lost its answer be asked again (up to `max_cases`). Under the lock."""
        s = self.settings
        if track.cloud is not None:
            why = track.misfit(track.cloud)
            if why is not None:
                RETIRED.labels(why).inc()
                track.cloud = None
                track.escalated = False
        asked = track.asked
        if not track.escalated or asked is None or track.cases >= s.max_cases:
            return
        came_whole = not asked.whole and len(track.whole_reads) >= s.ready_frames
        if came_whole or track.height >= asked.height * s.regrow:
            track.escalated = False

    def _end_stale(self, stream_id: StreamId, frame_index: int) -> None:
        tracks = self._open[stream_id]
        for track in [t for t in tracks if frame_index - t.last_frame > self.settings.max_gap]:
            tracks.remove(track)
            self._retire(track)
            if self.settings.revive_frames:
                self._lost.setdefault(stream_id, deque(maxlen=64)).append(track)

    def _revive(self, stream_id: StreamId, det: Detection, frame_index: int) -> Track | None:
        """A track that ended lately, near this line and reading alike, taken up again: a
        hard line the model missed for a while keeps its reads and its answer, and is not
        asked about again. Under the lock."""
        lost = self._lost.get(stream_id)
        s = self.settings
        while lost and frame_index - lost[0].last_frame > s.revive_frames:
            lost.popleft()
        if not lost or det.box is None:
            return None
        for track in reversed(lost):
            x1, y1, x2, y2 = track.box
            w, h = x2 - x1, y2 - y1
            if iou(det.box, (x1 - w, y1 - h, x2 + w, y2 + h)) <= 0:
                continue
            known = (track.result()[0], track.reading()[0])
            if max(similarity(det.text or "", t) for t in known) < s.min_similarity:
                continue
            lost.remove(track)
            self._ended.pop(track.track_id, None)
            self._by_id[track.track_id] = track
            track.ended = False
            return track
        return None

    def _end_all(self, stream_id: StreamId) -> list[Track]:
        """End every open track of the stream, none of them to be revived. Under the lock."""
        self._lost.pop(stream_id, None)
        tracks = self._open.pop(stream_id, [])
        for track in tracks:
            self._retire(track)
        return tracks

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
            self._cuts.forget(stream_id)
            return self._end_all(stream_id)

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
        unless the edge's vote is surer (`Track.outcome`) or the track has outgrown it
        (`Track.misfit`: retired at once); None if the track is unknown. It replaces a
        standing answer only if at least as sure: crops of a track answered by `PO 008 HN`
        at 0.3 after `PD 008 HN` at 0.8 add doubt, not a better reading."""
        with self._lock:
            track = self._by_id.get(track_id)
            if track is None:
                return None
            reads = [d for d in result if d.text]
            answer = (
                max(reads, key=lambda d: d.score)
                if reads
                else Detection(text="", score=0.0, box=track.box)
            )
            if track.cloud is None or answer.score >= track.cloud.score:
                track.cloud = answer
            self._review(track)
            return track
