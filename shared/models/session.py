"""Open one verified model file on the best backend that runs here, inside the memory
budget, warmed up; a backend that fails is passed over for the next (`executor.fallback`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from edgefleet.shared.executor.backends import backends, create_executor, preference, probe_backends
from edgefleet.shared.executor.base import Executor, InferenceFailed, ModelBlob, ModelLoadError
from edgefleet.shared.executor.fallback import BackendChoice, open_first, record
from edgefleet.shared.executor.memory import Footprint, MemoryBudget, detect_probe
from edgefleet.shared.executor.metrics import MODEL_WARMUP_SECONDS
from edgefleet.shared.executor.selection import explain, screen
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.messages import Sha256
from edgefleet.shared.models.registry import ModelRegistry
from edgefleet.shared.models.spec import ModelSpec

log = logging.getLogger(__name__)

_BUDGETS: dict[tuple, MemoryBudget] = {}


def default_budget(settings: ExecutionSettings, gpu: bool) -> MemoryBudget:
    """One budget per device and policy in this process, shared by every model on it."""
    key = (gpu, settings.gpu_index, settings.memory.model_dump_json())
    if key not in _BUDGETS:
        _BUDGETS[key] = MemoryBudget(detect_probe(gpu, settings.gpu_index), settings.memory)
    return _BUDGETS[key]


@dataclass
class Session:
    """A loaded executor, what it costs, and why it runs on this backend."""

    spec: ModelSpec
    executor: Executor
    backend: str
    sha256: Sha256
    footprint: Footprint
    budget: MemoryBudget
    choice: BackendChoice

    @property
    def input_name(self) -> str:
        return self.spec.input.name or self.executor.inputs[0].name

    def run(self, batch: np.ndarray) -> list[np.ndarray]:
        return self.executor.infer({self.input_name: batch})

    def close(self) -> None:
        self.executor.close()


@contextmanager
def warmup_guard(spec: ModelSpec, executor: Executor) -> Iterator[None]:
    """A warm-up the runtime refuses means the model does not fit its manifest entry: a
    load error (the model never becomes ready), and the half-loaded executor is freed."""
    try:
        yield
    except InferenceFailed as exc:
        executor.close()
        raise ModelLoadError(
            f"{spec.name} failed its warm-up inference: {exc.message}",
            hint="check the manifest's input spec (name, layout, height, width) against "
            "the model's input",
        ) from None


def open_session(
    spec: ModelSpec,
    registry: ModelRegistry,
    settings: ExecutionSettings,
    *,
    item_shape: tuple[int, ...],
    warmup_shape: tuple[int, ...] | None,
    max_batch: int,
    budget: MemoryBudget | None = None,
) -> Session:
    """Verify, then down the backend order: prove, admit memory, load, warm up (the first
    that does all four is chosen; each one passed over is logged with its reason)."""
    blob = registry.read_verified(spec)  # hash first: nothing parses an unverified file
    if spec.triton is not None:
        return _open_on_triton(spec, blob, settings, warmup_shape, budget)
    screened = screen(probe_backends(), preference(settings), spec, settings.precision)

    def open_on(backend: str) -> tuple[Executor, Footprint, MemoryBudget]:
        return _load(spec, blob, backend, settings, item_shape, warmup_shape, max_batch, budget)

    chosen, (executor, footprint, used), skipped = open_first(
        screened, settings, open_on, model=spec.name, fmt=spec.format
    )
    choice = BackendChoice(chosen, executor.capabilities.providers, tuple(skipped))
    record(spec.name, choice)
    log.info(explain(chosen, skipped), extra={"model": spec.name, **choice.as_json()})
    return Session(spec, executor, chosen, blob.sha256, footprint, used, choice)


def _load(
    spec: ModelSpec,
    blob: ModelBlob,
    backend: str,
    settings: ExecutionSettings,
    item_shape: tuple[int, ...],
    warmup_shape: tuple[int, ...] | None,
    max_batch: int,
    budget: MemoryBudget | None,
) -> tuple[Executor, Footprint, MemoryBudget]:
    """Admit the model's memory on `backend`'s device, load it there and warm it up."""
    gpu = backends()[backend].traits.gpu
    budget = budget or default_budget(settings, gpu)
    footprint = Footprint(
        weights=len(blob.data),
        activations_per_item=int(np.prod(item_shape) * 4 * settings.memory.activation_factor),
        workspace=(settings.memory.workspace_mb << 20) if gpu else 0,
    )
    budget.reserve(spec.name, footprint.need(max_batch))
    try:
        executor = create_executor(backend, settings)
        try:
            executor.load(blob)
        except BaseException:
            executor.close()  # a half-loaded GPU session frees its memory for the next one
            raise
        if settings.warmup and warmup_shape is not None:
            started = time.perf_counter()
            name = spec.input.name or executor.inputs[0].name
            with warmup_guard(spec, executor):
                executor.infer({name: np.zeros(warmup_shape, np.float32)})
            MODEL_WARMUP_SECONDS.labels(spec.name, backend).observe(time.perf_counter() - started)
    finally:
        # once loaded its memory shows in the device's `used`; the reservation only
        # covered the window in which it did not yet
        budget.release(spec.name)
    return executor, footprint, budget


def _open_on_triton(
    spec: ModelSpec,
    blob: ModelBlob,
    settings: ExecutionSettings,
    warmup_shape: tuple[int, ...] | None,
    budget: MemoryBudget | None,
) -> Session:
    """The manifest names a Triton server: the forward pass runs there (the model's memory
    is the server's, so none is admitted here); warmed up through it like a local one."""
    # not in the registry's preference order: the manifest chose it, nothing is probed
    from edgefleet.shared.executor.triton_backend import TritonExecutor

    serving = spec.triton
    assert serving is not None  # the caller checked
    executor = TritonExecutor(settings, serving)
    try:
        executor.load(blob)
        if settings.warmup and warmup_shape is not None:
            started = time.perf_counter()
            name = spec.input.name or executor.inputs[0].name
            with warmup_guard(spec, executor):
                executor.infer({name: np.zeros(warmup_shape, np.float32)})
            MODEL_WARMUP_SECONDS.labels(spec.name, "triton").observe(time.perf_counter() - started)
    except BaseException:
        executor.close()
        raise
    choice = BackendChoice("triton", executor.capabilities.providers, ())
    record(spec.name, choice)
    log.info(explain("triton", []), extra={"model": spec.name, "url": serving.url})
    used = budget or default_budget(settings, gpu=False)
    return Session(spec, executor, "triton", blob.sha256, Footprint(0, 0), used, choice)
