"""The real-time pipeline: capture → pre-process → infer → post/policy → uplink.

Stages are threads, so decode (one capture thread per stream), inference (N workers
sharing one model through its dynamic batcher; each frame goes to the model in its
source's pixel format, colour-converted inside the pre-processing kernel) and JPEG/outbox work
(the post thread, behind a bounded queue) overlap; OpenCV and ONNX Runtime release the
GIL. When inference falls behind, the capture threads keep overwriting their one-frame
slot: the pipeline always works on the newest frame and counts the ones it skipped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import Counter, Histogram

from edgefleet.edge.policy import Escalation, EscalationPolicy
from edgefleet.edge.settings import PipelineSettings
from edgefleet.edge.slot import ModelSlot
from edgefleet.edge.sources.base import Frame
from edgefleet.edge.sources.capture import Capture
from edgefleet.shared.errors import Overloaded
from edgefleet.shared.messages import Detection, ModelInfo, StreamId

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


class FrameStats(Protocol):
    """Where each frame's latency goes (the agent's telemetry windows): the real-time loop
    knows only this, not telemetry."""

    def record(self, stream_id: StreamId, latency_ms: float) -> None: ...


@dataclass
class Work:
    """One frame on its way through the stages."""

    frame: Frame
    expect_result: bool
    detections: list[Detection] = field(default_factory=list)
    model: ModelInfo | None = None
    error: str | None = None


Sink = Callable[[Work, list[Escalation]], None]


class Pipeline:
    """Owns the stage threads; each frame leases the slot's model, so a swap takes effect
    at the next frame and never closes a model under a frame still running on it.

    Inference workers pull: a worker that becomes free takes the newest frame of the next
    stream that has one, so no frame ages in a queue in front of the model. The post stage
    (policy, JPEG, outbox) has its own thread behind a bounded queue.
    """

    def __init__(
        self,
        captures: list[Capture],
        model: ModelSlot,
        policy: EscalationPolicy,
        sink: Sink,
        stats: FrameStats,
        settings: PipelineSettings,
    ):
        self.captures = captures
        self._model = model
        self.policy = policy
        self._sink = sink
        self.stats = stats
        self.settings = settings
        self._post_q: queue.Queue[Work | None] = queue.Queue(settings.queue_size)  # None: done
        self._stop_feed = threading.Event()
        self._ready = threading.Condition()
        self._turn = 0
        self._busy = 0  # frames a worker holds
        self._in_post = 0  # frames queued for or inside the post stage
        self.processed = 0
        self.errors = 0
        for capture in captures:
            capture.on_frame = self._frame_arrived
        self._workers = [
            threading.Thread(target=self._infer, name=f"infer-{i}")
            for i in range(settings.infer_workers)
        ]
        self._post = threading.Thread(target=self._post_loop, name="post")

    def start(self) -> Pipeline:
        for thread in (*self._workers, self._post):
            thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Drain: workers finish the frame in hand, then post empties its queue (idempotent)."""
        if self._stop_feed.is_set():
            return
        self._stop_feed.set()
        self._frame_arrived()
        deadline = time.monotonic() + timeout_s
        for thread in self._workers:
            if thread.is_alive():
                thread.join(max(0.1, deadline - time.monotonic()))
        if self._post.is_alive():
            self._post_q.put(None)
            self._post.join(max(0.1, deadline - time.monotonic()))

    @property
    def idle(self) -> bool:
        """No frame waits, is inferred or is being post-processed (the last escalation of
        an ended file is in the outbox once this is true)."""
        with self._ready:
            if self._busy or self._in_post:
                return False
        return not any(c.pending for c in self.captures)

    # --- stages ------------------------------------------------------------------------

    def _frame_arrived(self) -> None:
        with self._ready:
            self._ready.notify_all()

    def _next_frame(self) -> tuple[Frame, Capture] | None:
        """The newest frame of the next stream (round robin) that has one; None on stop."""
        while not self._stop_feed.is_set():
            with self._ready:
                count = len(self.captures)
                for offset in range(count):
                    capture = self.captures[(self._turn + offset) % count]
                    frame = capture.take()
                    if frame is not None:
                        self._turn = (self._turn + offset + 1) % count
                        self._busy += 1
                        return frame, capture
                self._ready.wait(0.2)
        return None

    def _infer(self) -> None:
        while True:
            taken = self._next_frame()
            if taken is None:
                return
            frame, capture = taken
            try:
                if not self._infer_one(Work(frame, capture.settings.expect_result)):
                    capture.count_shed()
            finally:
                with self._ready:
                    self._busy -= 1

    def _infer_one(self, work: Work) -> bool:
        """Pre-process and infer one frame, then queue it for post; False if it was shed."""
        start = time.perf_counter()
        try:
            with self._model.lease() as model:
                work.model = model.info
                work.detections = model.predict(work.frame.image, fmt=work.frame.fmt)
        except Overloaded as exc:  # the executor sheds load: a dropped frame, not a case
            OVERLOADED.inc()
            log.debug("frame %s#%d shed: %s", work.frame.stream_id, work.frame.index, exc)
            return False
        except Exception as exc:  # one bad frame or model error must not stop the stream
            work.error = f"{type(exc).__name__}: {exc}"
            self.errors += 1
            log.warning(
                "inference failed on %s#%d: %s", work.frame.stream_id, work.frame.index, work.error
            )
        STAGE.labels("infer").observe(time.perf_counter() - start)
        with self._ready:
            self._in_post += 1  # before the worker stops being busy: idle has no gap
        self._post_q.put(work)
        return True

    def _post_loop(self) -> None:
        while True:
            work = self._post_q.get()
            if work is None:
                return
            try:
                self._post_one(work)
            except Exception:  # the uplink write failing must not stop the pipeline
                log.exception(
                    "post-processing failed on %s#%d", work.frame.stream_id, work.frame.index
                )
            finally:
                with self._ready:
                    self._in_post -= 1

    def _post_one(self, work: Work) -> None:
        start = time.perf_counter()
        escalations = self.policy.decide_all(
            work.frame.stream_id,
            work.frame.index,
            work.frame.image,
            work.detections,
            expect_result=work.expect_result,
            failed=work.error is not None,
            fmt=work.frame.fmt,
        )
        mid = time.perf_counter()
        STAGE.labels("policy").observe(mid - start)
        self._sink(work, escalations)
        end = time.perf_counter()
        STAGE.labels("uplink").observe(end - mid)
        latency = time.monotonic() - work.frame.captured
        E2E.labels(work.frame.stream_id).observe(latency)
        self.stats.record(work.frame.stream_id, latency * 1000.0)
        self.processed += 1
