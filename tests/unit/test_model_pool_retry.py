"""A served model whose load failed (its Triton down) is not loaded again on every case:
within `retry_s` its cases get the stored reason at once (the cascade falls back), after it
the next case tries again, and /readyz-facing status keeps the error's code."""

from __future__ import annotations

import pytest

from edgefleet.cloud.cascade import ModelPool, ModelUnavailable
from edgefleet.shared.executor.triton_backend import TritonUnavailable
from edgefleet.shared.messages import ModelInfo


class FlakyLoader:
    """Fails while `down`, counting every attempt; a sentinel model once up."""

    def __init__(self) -> None:
        self.down = True
        self.attempts = 0

    def __call__(self, name: str):
        self.attempts += 1
        if self.down:
            raise TritonUnavailable(f"triton 127.0.0.1:1: {name}: connection refused")
        return _Model()


class _Model:
    info = ModelInfo(name="m", version="1", sha256="0" * 64, backend="triton")
    memory_bytes = 0


def test_a_failed_load_is_retried_after_its_backoff_not_on_every_case() -> None:
    loader = FlakyLoader()
    pool = ModelPool(["m"], loader, retry_s=3600)
    with pytest.raises(TritonUnavailable):
        pool.get("m")
    # within the backoff: the stored reason, typed with its code, and no new attempt
    with pytest.raises(ModelUnavailable) as refused:
        pool.get("m")
    assert refused.value.code == "triton_unavailable" and loader.attempts == 1
    assert pool.status()[0]["error_code"] == "triton_unavailable"
    # once the backoff is over, the next case loads it
    pool.retry_s = 0
    loader.down = False
    assert isinstance(pool.get("m"), _Model) and loader.attempts == 2
    assert pool.status()[0]["error"] is None
