"""Models the cloud serves, and the fallback chain that always gives a case an answer.

Chain: primary model (level 0) → lighter model (1) → rule-based answer (2) → "busy" (3).
A level that times out or fails hands the case to the next; each level used is counted
and recorded on the verdict as `fallback_level`. Models are loaded through
`edgefleet.shared.models.load_model`: each has one scheduler (its dynamic batcher) where a
call's priority, queue bound and deadline live, Triton-style. A call waits on its own
request there, so even a model that hangs inside its runtime costs a case no more than
the route's timeout, and no pool or timeout of our own sits on top.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from prometheus_client import Counter, Histogram

from edgefleet.cloud.cache import Cached, CacheKey, VerdictCache
from edgefleet.cloud.router import BUSY, RULES, Route
from edgefleet.cloud.tiles import read_tiles
from edgefleet.shared.errors import EdgefleetError, InferenceTimeout, ModelNotFound
from edgefleet.shared.messages import Detection, EscalationCase, ModelInfo, Sha256
from edgefleet.shared.models.base import Capped

log = logging.getLogger(__name__)

FALLBACKS = Counter(
    "ef_cloud_fallback_level_total", "Cases answered at each fallback level", ["level"]
)
LEVEL_FAILURES = Counter(
    "ef_cloud_model_failures_total", "Model calls that failed or timed out", ["model", "reason"]
)
MODEL_LATENCY = Histogram(
    "ef_cloud_model_latency_seconds",
    "Model call time as the orchestrator sees it (queueing and batching included)",
    ["model"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)

LEVEL_NAMES = {0: "primary", 1: "lighter", 2: "rules", 3: "busy"}


class ModelUnavailable(EdgefleetError):
    """A served model whose last load failed, asked for again before its retry is due."""

    code = "model_unavailable"
    http_status = 503
    hint = "the model failed to load; /readyz says why, and it is tried again shortly"


class CloudModel(Protocol):
    """What the orchestrator uses of a `edgefleet.shared.models.Model`."""

    info: ModelInfo

    def predict(
        self,
        image_rgb: np.ndarray,
        *,
        priority: int = 0,
        timeout_s: float | None = None,
        tenant: str | None = None,
    ) -> list[Detection]:
        """Detections for one RGB image, queued by priority (tenants taking turns), failed
        past its deadline."""

    async def predict_async(
        self,
        image_rgb: np.ndarray,
        *,
        priority: int = 0,
        timeout_s: float | None = None,
        tenant: str | None = None,
    ) -> list[Detection]:
        """The same, awaited."""

    @property
    def memory_bytes(self) -> int:
        """Estimated memory the model holds."""

    def close(self) -> None:
        """Release the model."""


ModelLoader = Callable[[str], CloudModel]


@dataclass
class _Slot:
    lock: threading.Lock
    model: CloudModel | None = None
    error: str | None = None
    error_code: str | None = None
    failed_at: float = -1e9  # monotonic time of the last failed load
    loading: bool = False
    calls: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))

    def qps(self, window_s: float = 60.0) -> float:
        """Calls per second over the last `window_s` (for /readyz)."""
        cutoff = time.monotonic() - window_s
        return round(sum(1 for t in list(self.calls) if t >= cutoff) / window_s, 3)


class ModelPool:
    """The served models: loaded once (at start or first use), looked up by name."""

    def __init__(self, names: list[str], loader: ModelLoader, *, retry_s: float = 2.0):
        self._loader = loader
        # a model that failed to load (its Triton down) is tried again on a case at most
        # this often: in between, its cases go straight down the fallback chain
        self.retry_s = retry_s
        self._slots = {name: _Slot(threading.Lock()) for name in dict.fromkeys(names)}
        self.on_loaded: Callable[[str, ModelInfo], None] | None = None

    @property
    def names(self) -> list[str]:
        return list(self._slots)

    def get(self, name: str) -> CloudModel:
        slot = self._slots.get(name)
        if slot is None:
            raise ModelNotFound(
                f"model {name!r} is not served here; served: {', '.join(self._slots)}"
            )
        if slot.model is not None:
            return slot.model
        with slot.lock:
            if slot.model is None:
                if slot.error is not None and time.monotonic() - slot.failed_at < self.retry_s:
                    raise ModelUnavailable(
                        f"model {name} is not loaded: {slot.error}", code=slot.error_code
                    )
                slot.loading = True
                try:
                    slot.model = self._loader(name)
                    slot.error = slot.error_code = None
                except EdgefleetError as exc:
                    slot.error, slot.error_code = exc.message, exc.code
                    slot.failed_at = time.monotonic()
                    raise
                finally:
                    slot.loading = False
                log.info("model ready", extra={"model": name, "sha256": slot.model.info.sha256})
                if self.on_loaded is not None:
                    self.on_loaded(name, slot.model.info)
        return slot.model

    def loaded(self, name: str) -> CloudModel | None:
        slot = self._slots.get(name)
        return slot.model if slot else None

    def preload(self) -> threading.Thread:
        """Load every model in the background; /readyz reports progress and errors."""

        def run() -> None:
            for name in self._slots:
                try:
                    self.get(name)
                except EdgefleetError as exc:
                    log.error("model %s failed to load: %s", name, exc)

        thread = threading.Thread(target=run, name="model-preload", daemon=True)
        thread.start()
        return thread

    def status(self) -> list[dict[str, Any]]:
        out = []
        for name, slot in self._slots.items():
            model = slot.model
            out.append(
                {
                    "name": name,
                    "version": model.info.version if model else None,
                    "sha256": model.info.sha256 if model else None,
                    "backend": model.info.backend if model else None,
                    "warmed": model is not None,
                    "memory_bytes": model.memory_bytes if model else 0,
                    "loading": slot.loading,
                    "error": slot.error,
                    "error_code": slot.error_code,
                    "qps": slot.qps(),
                }
            )
        return out

    def call(
        self,
        name: str,
        image: np.ndarray,
        timeout_s: float,
        *,
        priority: int = 0,
        tenant: str | None = None,
    ) -> list[Detection]:
        """One prediction, waited for on this thread until its deadline (InferenceTimeout)."""
        model = self.get(name)
        self._slots[name].calls.append(time.monotonic())
        started = time.perf_counter()
        try:
            return model.predict(image, priority=priority, timeout_s=timeout_s, tenant=tenant)
        finally:
            MODEL_LATENCY.labels(name).observe(time.perf_counter() - started)

    async def call_async(
        self,
        name: str,
        image: np.ndarray,
        timeout_s: float,
        *,
        priority: int = 0,
        tenant: str | None = None,
    ) -> list[Detection]:
        """The same for the event loop: batched with concurrent requests, never blocking."""
        model = self.get(name) if self.loaded(name) else await asyncio.to_thread(self.get, name)
        self._slots[name].calls.append(time.monotonic())
        started = time.perf_counter()
        try:
            return await model.predict_async(
                image, priority=priority, timeout_s=timeout_s, tenant=tenant
            )
        finally:
            MODEL_LATENCY.labels(name).observe(time.perf_counter() - started)

    def close(self) -> None:
        for slot in self._slots.values():
            if slot.model is not None:
                slot.model.close()
                slot.model = None


@dataclass(frozen=True)
class Outcome:
    result: list[Detection]
    model: str  # name@version, `rules` or `busy`
    fallback_level: int
    cached: bool = False
    lines_unread: int = 0  # text lines the model found but its per-image cap left unread


def rule_based(case: EscalationCase, min_score: float) -> list[Detection]:
    """Level 2: keep what the edge was reasonably sure of (no model needed)."""
    return [d for d in case.edge_result if d.score >= min_score]


class Cascade:
    def __init__(
        self,
        pool: ModelPool,
        cache: VerdictCache,
        *,
        lighter: str | None,
        accept_edge_min_score: float,
    ):
        self.pool = pool
        self.cache = cache
        self.lighter = lighter
        self.accept_edge_min_score = accept_edge_min_score

    def levels(self, route: Route) -> list[tuple[int, str]]:
        """(fallback level, model) in the order they are tried."""
        if route.model == RULES:
            return [(2, RULES), (3, BUSY)]
        if route.model == BUSY:
            return [(3, BUSY)]
        chain = [(0, route.model)]
        if route.fallback:
            if self.lighter and self.lighter != route.model:
                chain.append((1, self.lighter))
            chain.append((2, RULES))
        chain.append((3, BUSY))
        return chain

    def run(
        self, route: Route, case: EscalationCase, image: np.ndarray | None, image_sha256: Sha256
    ) -> Outcome:
        deadline = time.monotonic() + route.timeout_s
        for level, name in self.levels(route):
            if name == BUSY:
                outcome = Outcome([], BUSY, 3)
            elif name == RULES:
                outcome = Outcome(rule_based(case, self.accept_edge_min_score), RULES, 2)
            else:
                if image is None:
                    continue
                remaining = deadline - time.monotonic()
                if level > 0:
                    # The lighter model gets its own budget: the primary used up the route's.
                    remaining = max(remaining, route.timeout_s / 2)
                if remaining <= 0:
                    LEVEL_FAILURES.labels(name, "no_time_left").inc()
                    continue
                maybe = self._model_level(level, name, route, case, image, image_sha256, remaining)
                if maybe is None:
                    continue
                outcome = maybe
            FALLBACKS.labels(LEVEL_NAMES[outcome.fallback_level]).inc()
            return outcome
        FALLBACKS.labels("busy").inc()
        return Outcome([], BUSY, 3)

    def _model_level(
        self,
        level: int,
        name: str,
        route: Route,
        case: EscalationCase,
        image: np.ndarray,
        image_sha256: Sha256,
        timeout_s: float,
    ) -> Outcome | None:
        loaded = self.pool.loaded(name)
        if loaded is not None:
            key = CacheKey(image_sha256, f"{name}@{loaded.info.version}", route.name)
            hit = self.cache.get(key)
            if hit is not None:
                return Outcome(
                    list(hit.result),
                    hit.model,
                    hit.fallback_level,
                    cached=True,
                    lines_unread=hit.lines_unread,
                )
        deadline = time.monotonic() + timeout_s
        try:
            if case.tiles:  # several crops of one track: read each, fuse
                result = read_tiles(
                    case,
                    image,
                    lambda tile: self.pool.call(
                        name,
                        tile,
                        max(0.001, deadline - time.monotonic()),
                        priority=route.priority,
                        tenant=case.device_id,
                    ),
                )
            else:
                result = self.pool.call(
                    name, image, timeout_s, priority=route.priority, tenant=case.device_id
                )
        except InferenceTimeout:
            LEVEL_FAILURES.labels(name, "timeout").inc()
            log.warning("model %s timed out; falling back", name, extra={"route": route.name})
            return None
        except EdgefleetError as exc:
            LEVEL_FAILURES.labels(name, exc.code).inc()
            log.warning("model %s failed (%s); falling back", name, exc.code)
            return None
        except Exception:  # a model crash must not lose the case: fall back and log it
            LEVEL_FAILURES.labels(name, "error").inc()
            log.exception("model %s raised; falling back", name)
            return None
        model = self.pool.get(name)
        label = f"{name}@{model.info.version}"
        unread = result.unread if isinstance(result, Capped) else 0
        self.cache.put(
            CacheKey(image_sha256, label, route.name),
            Cached(tuple(result), label, level, unread),
        )
        return Outcome(result, label, level, lines_unread=unread)
