"""The escalation budget: how unsure a track must be to go to the cloud, per stream.

The operator sets a budget (a share of frames and/or cases per minute). Credit accrues
with every frame (share) and every second (per minute), up to `burst`, and each case spends
one: the hard ceiling. Like a token bucket, a stream starts with its burst saved up: the
lines a camera shows when it comes up are asked about while they are on screen, not only
once credit for a case has accrued. Within it, the threshold is a quantile of the recent
track confidences, chosen so that the tracks below it fill the budget; score buckets
where the cloud has agreed every time lately are skipped (one in `explore_every` still
goes, so the bucket is re-checked), and while the cloud reports a wait longer than
`max_wait_s` the budget shrinks in proportion, so that verdicts arrive while they still
matter.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgefleet.edge.settings import BudgetSettings
from edgefleet.shared.messages import StreamId


def bucket_of(score: float, buckets: int) -> int:
    return min(buckets - 1, max(0, int(score * buckets)))


@dataclass
class _Stream:
    credit: float
    last_ts: float
    frames: deque[int]  # 1 per frame seen, in the window
    scores: deque[float]  # confidences of tracks that became ready, in the window


class EscalationBudget:
    """Thread-safe; one per agent, state per stream."""

    def __init__(self, settings: BudgetSettings, *, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self._clock = clock
        self._streams: dict[str, _Stream] = {}
        self._outcomes: list[deque[bool]] = [
            deque(maxlen=settings.agree_streak) for _ in range(settings.buckets)
        ]
        self._skipped = [0] * settings.buckets
        self._wait_s = 0.0
        self._lock = threading.Lock()
        self.spent = 0
        self.skipped = 0
        self.over = 0

    def _stream(self, stream_id: StreamId) -> _Stream:
        st = self._streams.get(stream_id)
        if st is None:
            s = self.settings
            saved = float(s.burst) if s.share > 0 or s.per_min > 0 else 0.0
            st = _Stream(saved, self._clock(), deque(maxlen=s.window_frames),
                         deque(maxlen=s.window_frames))
            self._streams[stream_id] = st
        return st

    def _pace(self) -> float:
        """1 while the cloud keeps up; less while it reports a longer wait than allowed."""
        limit = self.settings.max_wait_s
        return 1.0 if self._wait_s <= limit else limit / self._wait_s

    def frame(self, stream_id: StreamId) -> None:
        """One frame of this stream went through the edge: credit for `share` of a case."""
        s = self.settings
        with self._lock:
            st = self._stream(stream_id)
            now = self._clock()
            gain = s.share + (s.per_min / 60.0) * (now - st.last_ts)
            st.last_ts = now
            st.credit = min(float(s.burst), st.credit + gain * self._pace())
            st.frames.append(1)

    def threshold(self, stream_id: StreamId) -> float:
        """Tracks below this confidence are worth a case, given the recent load."""
        s = self.settings
        with self._lock:
            st = self._stream(stream_id)
            if not st.scores:
                return s.max_score
            rate = s.share + s.per_min / 60.0 / max(s.fps_hint, 1e-6)
            wanted = rate * len(st.frames) * self._pace()
            q = min(1.0, wanted / len(st.scores))
            return min(s.max_score, float(np.quantile(np.asarray(st.scores), q)))

    def consider(self, stream_id: StreamId, score: float, *, first: bool = True) -> bool:
        """A track with this confidence (`first`: the first time it is asked about, which
        enters its score in the recent distribution): spend a case on it?"""
        s = self.settings
        threshold = self.threshold(stream_id)
        with self._lock:
            st = self._stream(stream_id)
            if first:
                st.scores.append(score)
            if score > threshold:
                return False
            b = bucket_of(score, s.buckets)
            outcomes = self._outcomes[b]
            if len(outcomes) == outcomes.maxlen and all(outcomes):
                self._skipped[b] += 1
                if self._skipped[b] % s.explore_every:
                    self.skipped += 1
                    return False
            if st.credit < 1.0:
                self.over += 1
                return False
            st.credit -= 1.0
            self.spent += 1
            return True

    def refund(self, stream_id: StreamId) -> None:
        """A case the budget granted was not sent (the rate limit or de-duplication)."""
        with self._lock:
            st = self._stream(stream_id)
            st.credit = min(float(self.settings.burst), st.credit + 1.0)
            self.spent -= 1

    def verdict(self, score: float, agrees: bool) -> None:
        """The cloud answered a case of a track with this edge confidence."""
        with self._lock:
            self._outcomes[bucket_of(score, self.settings.buckets)].append(agrees)

    def cloud_wait(self, expected_wait_s: float) -> None:
        """The cloud's latest estimate of how long a new case waits for its verdict."""
        with self._lock:
            self._wait_s = max(0.0, expected_wait_s)

    def agreement(self) -> list[float | None]:
        """Recent edge/cloud agreement rate per score bucket (None: no verdict yet)."""
        with self._lock:
            return [sum(o) / len(o) if o else None for o in self._outcomes]
