"""How the ingest cuts telemetry into transactions (`LightSink.collect`), without a broker."""

from __future__ import annotations

import threading

from tests.support.cloud import deliver_telemetry, idle_ingest
from tests.support.waiting import eventually


def _collect_in_thread(ingest) -> tuple[threading.Thread, list]:
    got: list = []
    thread = threading.Thread(target=lambda: got.append(ingest.light.collect()), daemon=True)
    thread.start()
    return thread, got


def test_a_batch_does_not_wait_for_more_once_the_broker_can_send_none() -> None:
    # given an ingest whose batches may wait an hour for more, and a window of 3 messages
    key = bytes(32)
    ingest = idle_ingest(key, receive_maximum=3, light_flush_s=3600.0)
    # when the broker has handed over its 3 (it may send more only after our acks)
    for seq in range(3):
        deliver_telemetry(ingest, key, seq, qos=1)
    thread, got = _collect_in_thread(ingest)
    thread.join(30)
    # then the batch is cut at once, with all 3
    assert not thread.is_alive(), "the batch waited for messages the broker cannot send"
    batch, stop = got[0]
    assert [item.mid for item in batch] == [0, 1, 2] and not stop


def test_a_batch_waits_for_more_while_the_window_has_room_and_stops_at_the_stop_mark() -> None:
    # given an ingest whose batches may wait an hour, with one message taken of 64
    key = bytes(32)
    ingest = idle_ingest(key, light_flush_s=3600.0)
    deliver_telemetry(ingest, key, 1, qos=1)
    thread, got = _collect_in_thread(ingest)
    eventually(lambda: ingest.light.waiting() == 0, timeout_s=10, what="the first taken")
    # when a second message arrives while the batch waits, then the stop marks
    deliver_telemetry(ingest, key, 2, qos=1)
    ingest.light.stop()  # (its workers never started: only the stop marks go in)
    thread.join(30)
    # then both are in the batch, and the worker is told to stop after storing it
    assert not thread.is_alive()
    batch, stop = got[0]
    assert [item.mid for item in batch] == [1, 2] and stop
