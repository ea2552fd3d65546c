"""Admission of a case: decoded once, checked against the store once (the claim), and kept
as it arrived, whichever way it came."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.shared.errors import Conflict, EdgefleetError, Overloaded
from edgefleet.shared.messages import CloudVerdict
from tests.support.cloud import PNG, rules_only_services


class CountingDecoder:
    """The processor's decoder, counted (it is handed to the processor at construction)."""

    def __init__(self, decode) -> None:
        self.decode = decode
        self.calls = 0

    def __call__(self, data: bytes):
        self.calls += 1
        return self.decode(data)


class HeldPublisher:
    """Holds the only worker on the first verdict until `open`."""

    def __init__(self) -> None:
        self.held = threading.Event()
        self._open = threading.Event()

    def __call__(self, verdict: CloudVerdict) -> None:
        self.held.set()
        assert self._open.wait(30)

    def open(self) -> None:
        self._open.set()


def test_a_rest_case_is_decoded_and_claimed_once_and_a_repeat_is_a_409_while_queued(
    tmp_path: Path,
) -> None:
    svc = rules_only_services(tmp_path)
    decoder = CountingDecoder(svc.processor.admission.decode)
    svc.processor.admission.decode = decoder
    gate = HeldPublisher()
    svc.processor.answers.publish = gate
    try:
        # given the only worker busy with a first case and a second case queued behind it
        first = svc.processor.accept(escalation_case("cam-a"), PNG, source="rest")
        assert gate.held.wait(30)
        case = escalation_case("cam-a", frame_index=1)
        queued = svc.processor.accept(case, PNG, source="rest")
        assert decoder.calls == 2 and svc.processor.depth == 1
        # when the same case_id comes again before it ran, then it is refused by the claim
        with pytest.raises(Conflict) as refused:
            svc.processor.accept(case, PNG, source="rest")
        assert refused.value.code == "duplicate_case" and svc.processor.depth == 1
        gate.open()
        assert first.result(timeout=60) is not None and queued.result(timeout=60) is not None
        # and each case ran once, the rules route needing no pixels beyond the check
        assert set(svc.store.ledger.attempts().values()) == {1}
        assert decoder.calls == 3
    finally:
        gate.open()
        svc.close()


def test_a_rest_case_whose_image_will_not_decode_is_refused_before_it_is_stored(
    tmp_path: Path,
) -> None:
    svc = rules_only_services(tmp_path, max_pending_per_device=2)
    try:
        # given images that claim to be PNG and are not
        bad = b"\x89PNG\r\n\x1a\n" + b"\0" * 64
        for i in range(5):
            case = escalation_case("cam-a", frame_index=i)
            # then each is a typed refusal and nothing is stored
            with pytest.raises(EdgefleetError) as refused:
                svc.processor.accept(case, bad, source="rest")
            assert 400 <= refused.value.http_status < 500
            assert not isinstance(refused.value, Overloaded)
            assert svc.store.lookup.case_device(case.case_id) is None
        # and the refusals did not use up the device's quota of waiting cases
        good = svc.processor.accept(escalation_case("cam-a", frame_index=9), PNG, source="rest")
        assert good.result(timeout=60) is not None
    finally:
        svc.close()


def test_an_mqtt_case_is_stored_as_it_arrived_not_serialised_again(tmp_path: Path) -> None:
    svc = rules_only_services(tmp_path)
    try:
        # given the ef-meta bytes a device signed (spacing of its own JSON encoder)
        case = escalation_case("cam-a", edge=[("EF-1", 0.7)])
        meta = case.model_dump_json(indent=1).encode()
        # when the case is processed
        future = svc.processor.submit(case, PNG, source="mqtt", flow_controlled=True, meta=meta)
        assert future.result(timeout=60) is not None
        # then those very bytes are the stored case, and they read back as the case
        row = svc.db.query_one("SELECT meta FROM ef_cases WHERE case_id = ?", (case.case_id,))
        assert row is not None and row["meta"] == meta.decode()
        assert svc.store.lookup.case(case.case_id)["edge_result"][0]["text"] == "EF-1"
    finally:
        svc.close()


def test_rest_metadata_is_parsed_once_and_kept_as_sent_when_complete() -> None:
    from edgefleet.cloud.api.deps import MalformedJson
    from edgefleet.cloud.api.escalations import read_case
    from edgefleet.shared.errors import InvalidInput

    request = {"trace_id": "f" * 32, "content_type": "image/png", "device_id": "cam-a"}
    sent = escalation_case("cam-a", edge=[("EF-2", 0.6)])
    # a complete case: parsed as it is, and its text is what the store keeps
    text = sent.model_dump_json()
    case, as_received = read_case(text, **request)
    assert case == sent and as_received == text.encode()
    # one without a trace id takes the request's, and is serialised when stored
    fields = sent.model_dump(mode="json", by_alias=True)
    del fields["trace_id"]
    case, as_received = read_case(json.dumps(fields), **request)
    assert case.trace_id == "f" * 32 and as_received is None
    # one that leaves its device and content type to the request gets them filled in
    del fields["device_id"], fields["content_type"]
    case, as_received = read_case(json.dumps(fields), **request)
    assert (case.device_id, case.content_type, as_received) == ("cam-a", "image/png", None)
    # bad metadata is the typed 400/422 it was
    with pytest.raises(MalformedJson):
        read_case("{not json", **request)
    with pytest.raises(InvalidInput, match="frame_index"):
        read_case(json.dumps({**fields, "frame_index": "one"}), **request)


def test_an_mqtt_case_under_another_devices_id_is_its_own_case(tmp_path: Path) -> None:
    svc = rules_only_services(tmp_path)
    sent: list[CloudVerdict] = []
    svc.processor.answers.publish = sent.append
    try:
        # given cam-a's case, answered over MQTT
        theirs = escalation_case("cam-a", edge=[("CAM-A", 0.9)], case_id="same-id-0001")
        first = svc.processor.submit(theirs, PNG, source="mqtt", flow_controlled=True)
        assert first.result(timeout=60).device_id == "cam-a"
        # when cam-b sends a case under the same id
        mine = escalation_case("cam-b", edge=[("CAM-B", 0.9)], case_id="same-id-0001")
        second = svc.processor.submit(mine, PNG, source="mqtt", flow_controlled=True)
        # then it is run as cam-b's own case: cam-b gets its verdict, not cam-a's re-sent
        verdict = second.result(timeout=60)
        assert verdict.device_id == "cam-b" and [d.text for d in verdict.result] == ["CAM-B"]
        assert [(v.device_id, v.result[0].text) for v in sent] == [
            ("cam-a", "CAM-A"),
            ("cam-b", "CAM-B"),
        ]
        # and a redelivery of cam-b's case is answered from cam-b's verdict
        again = svc.processor.submit(mine, PNG, source="mqtt", flow_controlled=True)
        assert again.result(timeout=60) == verdict
    finally:
        svc.close()
