"""A harness that drives the real orchestrator: the benchmarks and the tests use it.

`ServerThread` serves an app with uvicorn on a free port in a background thread;
`escalation_wire` lays out a signed EscalationCase exactly as an edge agent would.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence

import uvicorn
from fastapi import FastAPI

from edgefleet.bench.mosquitto import free_port
from edgefleet.shared.messages import (
    CloudVerdict,
    Detection,
    EscalationCase,
    EscalationReason,
    ImageContentType,
    ModelInfo,
)
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import WireMessage, encode


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1:<free port> until `stop`."""

    def __init__(self, app: FastAPI, port: int | None = None):
        self.port = port or free_port()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_config=None,
            access_log=False,
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError("uvicorn exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"uvicorn did not start within {timeout_s} s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def escalation_case(
    device_id: str,
    *,
    content_type: ImageContentType = "image/png",
    edge: Sequence[tuple[str, float]] = (("TEXT", 0.4),),
    reason: EscalationReason = "unsure",
    stream_id: str = "cam",
    frame_index: int = 0,
    **fields,
) -> EscalationCase:
    return EscalationCase(
        device_id=device_id,
        stream_id=stream_id,
        frame_index=frame_index,
        reason=reason,
        edge_result=[Detection(text=t, score=s) for t, s in edge],
        model=ModelInfo(name="ppocr", version="4"),
        content_type=content_type,
        **fields,
    )


def escalation_wire(
    case: EscalationCase, key: bytes, image: bytes, topics: Topics | None = None
) -> WireMessage:
    topics = topics or Topics()
    return encode(case, key, topics.escalations(case.device_id), image)


def publish_cases(client, device_id: str, key: bytes, count: int, image: bytes) -> list[str]:
    """Publish `count` signed escalations of one device (QoS 1, waited for); their case ids."""
    from edgefleet.shared.mqtt import publish

    cases = [escalation_case(device_id, frame_index=i, edge=[("X", 0.9)]) for i in range(count)]
    infos = [publish(client, escalation_wire(case, key, image), qos=1) for case in cases]
    for info in infos:
        info.wait_for_publish(60)
    return [case.case_id for case in cases]


def verdict_of(payload: bytes) -> CloudVerdict | None:
    """The verdict a device's results topic carried, or None for the cloud's retained lag
    status (`ef.cloud-status/1`), which shares that topic."""
    message = json.loads(payload)
    if message.get("schema") == "ef.cloud-status/1":
        return None
    return CloudVerdict.model_validate_json(payload)
