"""The model template: pre_process -> forward -> post_process, behind a dynamic batcher."""

from __future__ import annotations

import abc
import logging
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.executor.batcher import BatcherClosed, DynamicBatcher
from edgefleet.shared.executor.memory import MemoryBudget
from edgefleet.shared.executor.metrics import PREDICT_SECONDS, PREDICTIONS
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.messages import Detection, ModelInfo
from edgefleet.shared.models.frames import FrameIn
from edgefleet.shared.models.session import Session
from edgefleet.shared.models.spec import ModelSpec

log = logging.getLogger(__name__)


class ModelClosed(EdgefleetError):
    """The model was closed (e.g. swapped for a new version); retry against its successor."""

    code = "model_closed"
    http_status = 503
    hint = "the model was unloaded or replaced; retry the request"


class Capped(list[Detection]):
    """One image's detections, and how many more it held that a cost bound (a model's cap
    on lines per image) left unread: the verdict says the answer is partial."""

    def __init__(self, detections: list[Detection], unread: int = 0) -> None:
        super().__init__(detections)
        self.unread = unread


class Model(abc.ABC):
    """A loaded, warmed-up model. `predict` is thread-safe and goes through the batcher.

    Subclasses implement the three template steps; `predict_many` chains them for a list
    of images (one batch), and the batcher feeds `predict_many` with concurrent requests.
    """

    def __init__(
        self,
        spec: ModelSpec,
        sessions: list[Session],
        settings: ExecutionSettings,
        budget: MemoryBudget,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.budget = budget
        self._sessions = sessions
        main = sessions[0]
        self.info = ModelInfo(
            name=spec.name,
            version=spec.version,
            sha256=main.sha256,
            backend=main.backend,
            precision=main.executor.capabilities.precision
            if main.executor.capabilities.precision in {"fp32", "fp16", "int8", "bf16"}
            else None,
        )
        self._recent: deque[tuple[int, int]] = deque(maxlen=3600)
        self._recent_lock = threading.Lock()
        self._closing = False  # no new requests
        self._closed = False  # queue drained, sessions freed
        self._batcher: DynamicBatcher[FrameIn, list[Detection]] | None = None
        if settings.batching.enabled:
            per_item = sum(s.footprint.activations_per_item for s in sessions)
            cap = settings.batching.max_batch_size
            self._batcher = DynamicBatcher(
                self.predict_frames,
                settings.batching,
                name=spec.name,
                max_batch=lambda: budget.max_batch(per_item, cap),
            )

    # --- the template -------------------------------------------------------------------

    @abc.abstractmethod
    def pre_process(self, frames: list[FrameIn]) -> Any:
        """Frames in their native format -> what `forward` needs (tensors and transforms)."""

    @abc.abstractmethod
    def forward(self, prepared: Any) -> Any:
        """Run the executor(s)."""

    @abc.abstractmethod
    def post_process(self, raw: Any, prepared: Any) -> list[list[Detection]]:
        """Raw outputs -> detections per image, in source pixels."""

    # --- the public API ----------------------------------------------------------------

    def predict_many(self, images: list[np.ndarray], fmt: str = "rgb") -> list[list[Detection]]:
        """One batch, run directly (no queue): detections per image, in input order.

        `fmt` is the images' pixel format (rgb, bgr, nv12, i420): frames go to the
        kernels as the camera delivered them.
        """
        return self.predict_frames([FrameIn.checked(image, fmt) for image in images])

    def predict_frames(self, checked: list[FrameIn]) -> list[list[Detection]]:
        """`predict_many` for frames already checked (what the batcher runs)."""
        if self._closed:
            raise ModelClosed(f"model {self.spec.name} is closed")
        if not checked:
            return []
        started = time.perf_counter()
        prepared = self.pre_process(checked)
        results = self.post_process(self.forward(prepared), prepared)
        PREDICT_SECONDS.labels(self.spec.name).observe(time.perf_counter() - started)
        PREDICTIONS.labels(self.spec.name).inc(len(checked))
        second = int(time.monotonic())
        with self._recent_lock:  # per-second buckets: exact at any rate, bounded memory
            if self._recent and self._recent[-1][0] == second:
                self._recent[-1] = (second, self._recent[-1][1] + len(checked))
            else:
                self._recent.append((second, len(checked)))
        return results

    def qps(self, window_s: float = 60.0) -> float:
        """Images per second over the last `window_s` (for readiness pages)."""
        since = time.monotonic() - window_s
        with self._recent_lock:
            count = sum(n for t, n in self._recent if t >= since)
        return count / window_s

    def predict(
        self,
        image: np.ndarray,
        *,
        fmt: str = "rgb",
        priority: int = 0,
        timeout_s: float | None = None,
        tenant: str | None = None,
    ) -> list[Detection]:
        """Detections for one image (uint8 RGB or BGR HxWx3, NV12/I420 (H*3/2)xW); batched
        with concurrent callers, the higher `priority` first, `tenant`s taking turns within
        a priority, answered or failed by the request's deadline.

        Raises InvalidInput, Overloaded (queue full or memory watermark: retry later) or
        InferenceTimeout. Without batching the image runs at once on the caller's thread.
        """
        frame, batcher = self._admit(image, fmt)
        if batcher is None:
            return self.predict_frames([frame])[0]
        try:
            return batcher(frame, priority=priority, timeout_s=timeout_s, tenant=tenant)
        except BatcherClosed:
            raise ModelClosed(f"model {self.spec.name} is closed") from None

    async def predict_async(
        self,
        image: np.ndarray,
        *,
        fmt: str = "rgb",
        priority: int = 0,
        timeout_s: float | None = None,
        tenant: str | None = None,
    ) -> list[Detection]:
        """`predict` for asyncio callers (the event loop is never blocked)."""
        frame, batcher = self._admit(image, fmt)
        if batcher is None:
            import asyncio

            return (await asyncio.to_thread(self.predict_frames, [frame]))[0]
        try:
            return await batcher.submit_async(
                frame, priority=priority, timeout_s=timeout_s, tenant=tenant
            )
        except BatcherClosed:
            raise ModelClosed(f"model {self.spec.name} is closed") from None

    def _admit(
        self, image: np.ndarray, fmt: str
    ) -> tuple[FrameIn, DynamicBatcher[FrameIn, list[Detection]] | None]:
        """Refuse a bad image, a closed model or a full memory budget; the checked frame
        and the batcher, if any."""
        frame = FrameIn.checked(image, fmt)
        if self._closing:
            raise ModelClosed(f"model {self.spec.name} is closed")
        self.budget.check_watermark()
        return frame, self._batcher

    @property
    def memory_bytes(self) -> int:
        """Estimated bytes: weights + activations at the max batch + workspace, all sessions."""
        batch = self.settings.batching.max_batch_size if self._batcher else 1
        return sum(s.footprint.need(batch) for s in self._sessions)

    @property
    def batcher(self) -> DynamicBatcher | None:
        return self._batcher

    @property
    def backends(self) -> dict[str, str]:
        """Component name -> backend, for readiness pages."""
        return {s.spec.name: s.backend for s in self._sessions}

    def start(self) -> Model:
        """Start the batcher's workers (`load_model` does, before it returns the model)."""
        if self._batcher is not None:
            self._batcher.start()
        return self

    def close(self) -> None:
        """Finish queued requests, then free the sessions; later calls raise ModelClosed."""
        self._closing = True
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None
        self._closed = True
        for session in self._sessions:
            session.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
