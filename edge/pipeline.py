"""The real-time pipeline: capture → pre-process → infer → post/policy → uplink.

Stages are threads joined by bounded queues, so decode (capture threads), colour
conversion, inference and JPEG/outbox work overlap; OpenCV and ONNX Runtime release the
GIL. When inference falls behind, the queues fill, feeders block, and the capture threads
keep overwriting their one-frame slot: the pipeline always works on the newest frame.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import cv2
import numpy as np
from prometheus_client import Counter, Histogram

from edge.model import Predictor
from edge.policy import Escalation, EscalationPolicy
from edge.settings import PipelineSettings
from edge.sources.base import Frame
from edge.sources.capture import Capture
from edge.telemetry import WindowStats
from shared.errors import Overloaded
from shared.messages import Detection, ModelInfo

log = logging.getLogger(__name__)

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
STAGE = Histogram(
    "ef_edge_stage_seconds", "Time spent per pipeline stage", ["stage"], buckets=_BUCKETS
)
E2E = Histogram(
    "ef_edge_frame_latency_seconds", "Capture to result, per frame", ["stream"], buckets=_BUCKETS
)

OVERLOADED = Counter(
    "ef_edge_frames_shed_total", "Frames the executor refused (overloaded or memory watermark)"
)

_DONE = object()


@dataclass
class Work:
    """One frame on its way through the stages."""

    frame: Frame
    expect_result: bool
    rgb: np.ndarray | None = None
    detections: list[Detection] = field(default_factory=list)
    model: ModelInfo | None = None
    error: str | None = None


Sink = Callable[[Work, Escalation | None], None]


class Pipeline:
    """Owns the stage threads; `model` is asked for each frame so a swap takes effect live."""

    def __init__(
        self,
        captures: list[Capture],
        model: Callable[[], Predictor],
        policy: EscalationPolicy,
        sink: Sink,
        stats: WindowStats,
        settings: PipelineSettings,
    ):
        self.captures = captures
        self._model = model
        self.policy = policy
        self._sink = sink
        self.stats = stats
        self.settings = settings
        self._infer_q: queue.Queue = queue.Queue(settings.queue_size)
        self._post_q: queue.Queue = queue.Queue(settings.queue_size)
        self._stop_feed = threading.Event()
        self.processed = 0
        self.errors = 0
        self._feeders = [
            threading.Thread(target=self._feed, args=(c,), name=f"pre-{c.stream_id}")
            for c in captures
        ]
        self._workers = [
            threading.Thread(target=self._infer, name=f"infer-{i}")
            for i in range(settings.infer_workers)
        ]
        self._post = threading.Thread(target=self._post_loop, name="post")

    def start(self) -> Pipeline:
        for thread in (*self._workers, self._post, *self._feeders):
            thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Drain: feeders stop, queued frames finish, then workers and post exit (idempotent)."""
        if self._stop_feed.is_set():
            return
        self._stop_feed.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._feeders:
            thread.join(max(0.1, deadline - time.monotonic()))
        for _ in self._workers:
            self._infer_q.put(_DONE)
        for thread in self._workers:
            thread.join(max(0.1, deadline - time.monotonic()))
        self._post_q.put(_DONE)
        self._post.join(max(0.1, deadline - time.monotonic()))

    @property
    def idle(self) -> bool:
        return self._infer_q.empty() and self._post_q.empty()

    # --- stages ------------------------------------------------------------------------

    def _feed(self, capture: Capture) -> None:
        """Pre-process: take the newest frame, convert BGR → RGB, hand it to inference."""
        expect = capture.settings.expect_result
        while not self._stop_feed.is_set():
            frame = capture.get(timeout=0.2)
            if frame is None:
                if capture.finished and not capture.alive:
                    return
                continue
            start = time.perf_counter()
            work = Work(frame, expect)
            work.rgb = cv2.cvtColor(frame.image, cv2.COLOR_BGR2RGB)
            STAGE.labels("preprocess").observe(time.perf_counter() - start)
            self._put(self._infer_q, work)

    def _put(self, q: queue.Queue, item: object) -> None:
        while True:
            try:
                q.put(item, timeout=0.2)
                return
            except queue.Full:
                if self._stop_feed.is_set() and q is self._infer_q:
                    # shutting down with a full queue: the frame is dropped, not blocked on
                    return

    def _infer(self) -> None:
        while True:
            work = self._infer_q.get()
            if work is _DONE:
                return
            model = self._model()
            start = time.perf_counter()
            try:
                work.detections = model.predict(work.rgb)
            except Overloaded as exc:  # the executor sheds load: a dropped frame, not a case
                OVERLOADED.inc()
                log.debug("frame %s#%d shed: %s", work.frame.stream_id, work.frame.index, exc)
                continue
            except Exception as exc:  # one bad frame or model error must not stop the stream
                work.error = f"{type(exc).__name__}: {exc}"
                self.errors += 1
                log.warning(
                    "inference failed on %s#%d: %s",
                    work.frame.stream_id,
                    work.frame.index,
                    work.error,
                )
            STAGE.labels("infer").observe(time.perf_counter() - start)
            work.model = model.info
            work.rgb = None
            self._post_q.put(work)

    def _post_loop(self) -> None:
        while True:
            work = self._post_q.get()
            if work is _DONE:
                return
            try:
                self._post_one(work)
            except Exception:  # the uplink write failing must not stop the pipeline
                log.exception(
                    "post-processing failed on %s#%d", work.frame.stream_id, work.frame.index
                )

    def _post_one(self, work: Work) -> None:
        start = time.perf_counter()
        escalation = self.policy.decide(
            work.frame.stream_id,
            work.frame.image,
            work.detections,
            expect_result=work.expect_result,
            failed=work.error is not None,
        )
        mid = time.perf_counter()
        STAGE.labels("policy").observe(mid - start)
        self._sink(work, escalation)
        end = time.perf_counter()
        STAGE.labels("uplink").observe(end - mid)
        latency = time.monotonic() - work.frame.captured
        E2E.labels(work.frame.stream_id).observe(latency)
        self.stats.record(work.frame.stream_id, latency * 1000.0)
        self.processed += 1
