"""The model slot: a swap never closes a model a call still holds, and closes it exactly once."""

from __future__ import annotations

import threading

import numpy as np

from edgefleet.edge.slot import ModelSlot
from edgefleet.shared.messages import Detection, ModelInfo, ModelRef

SHA = "ab" * 32


class GatedModel:
    """A hand-written Predictor whose `predict` waits until the test lets it finish."""

    def __init__(self, name: str):
        self._info = ModelInfo(name=name, version="1")
        self.entered = threading.Event()
        self.release = threading.Event()
        self.closed = 0
        self.closed_while_predicting = False
        self._predicting = 0

    @property
    def info(self) -> ModelInfo:
        return self._info

    def predict(self, rgb: np.ndarray) -> list[Detection]:
        self._predicting += 1
        self.entered.set()
        self.release.wait(30)
        self._predicting -= 1
        return [Detection(text=self._info.name, score=1.0)]

    def close(self) -> None:
        self.closed += 1
        self.closed_while_predicting |= self._predicting > 0


def _ref(name: str) -> ModelRef:
    return ModelRef(name=name, version="2", url="http://fleet/m.onnx", sha256=SHA)


def test_a_call_on_the_old_model_finishes_on_it_and_the_old_model_closes_once_after() -> None:
    # given a slot whose model is in the middle of a call
    old, new = GatedModel("old"), GatedModel("new")
    slot = ModelSlot(old)
    results: list[list[Detection]] = []

    def call() -> None:
        with slot.lease() as model:
            results.append(model.predict(np.zeros((2, 2, 3), np.uint8)))

    caller = threading.Thread(target=call)
    caller.start()
    assert old.entered.wait(30)
    # when a swap happens during that call
    slot.swap(new, _ref("new"))
    # then the old model is not closed while the call holds it, and new calls get the new one
    assert old.closed == 0
    with slot.lease() as model:
        assert model is new
    assert slot.ref == _ref("new") and slot.info.name == "new"
    # when the call ends, it answered from the old model, which is then closed exactly once
    old.release.set()
    caller.join(30)
    assert results == [[Detection(text="old", score=1.0)]]
    assert old.closed == 1 and not old.closed_while_predicting
    assert new.closed == 0


def test_a_swap_with_no_call_in_flight_closes_the_old_model_at_once() -> None:
    old, new = GatedModel("old"), GatedModel("new")
    slot = ModelSlot(old)
    slot.swap(new, _ref("new"))
    assert old.closed == 1 and new.closed == 0


def test_two_swaps_during_one_call_close_each_retired_model_once() -> None:
    # given a call in flight on the first model
    first, second, third = GatedModel("first"), GatedModel("second"), GatedModel("third")
    slot = ModelSlot(first)
    caller = threading.Thread(target=lambda: _call(slot))
    caller.start()
    assert first.entered.wait(30)
    # when two swaps follow each other before it ends
    slot.swap(second, _ref("second"))
    slot.swap(third, _ref("third"))
    # then the second (never leased) closes at once, the first only when the call ends
    assert (first.closed, second.closed, third.closed) == (0, 1, 0)
    first.release.set()
    caller.join(30)
    assert (first.closed, second.closed, third.closed) == (1, 1, 0)


def test_closing_the_slot_waits_for_the_last_call_and_is_idempotent() -> None:
    # given a call in flight
    model = GatedModel("only")
    slot = ModelSlot(model)
    caller = threading.Thread(target=lambda: _call(slot))
    caller.start()
    assert model.entered.wait(30)
    # when the agent closes the slot (twice), then the model closes after the call, once
    slot.close()
    slot.close()
    assert model.closed == 0
    model.release.set()
    caller.join(30)
    assert model.closed == 1
    assert not model.closed_while_predicting


def _call(slot: ModelSlot) -> None:
    with slot.lease() as model:
        model.predict(np.zeros((2, 2, 3), np.uint8))
