"""What one case costs the cloud on its way in: image decodes, case parses and
serialisations, store look-ups, verdict serialisations; by REST and by MQTT, new and sent
again.

Run: `edgefleet bench case-calls`. A real Mosquitto, uvicorn serving create_app, SQLite on
disk and an instant stand-in model (the figures are call counts, not times). The calls are
counted by wrapping the functions that do the work (`decode_image`, the store's claim and
look-ups, pydantic's parse and dump of the case and the verdict, `json.loads/dumps`) for
the time one case takes, the simulated device's own thread left out.
"""

from __future__ import annotations

import collections
import json
import secrets
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(add_completion=False)

OP_KEY = "case-calls-operator-key-0123456789"
DEVICE = "cam-calls"

COLUMNS = {
    "image decode": "image decodes",
    "case parse": "case parses",
    "case serialise": "case serialisations",
    "store look-up": "store look-ups (claim / case_device / verdict)",
    "verdict serialise": "verdict serialisations",
    "json": "json.loads / json.dumps",
}


class Counts:
    """Counters switched on for one case at a time; the device's thread is not the cloud."""

    def __init__(self) -> None:
        self.on = threading.Event()
        self.calls: collections.Counter[str] = collections.Counter()

    def hit(self, label: str) -> None:
        if self.on.is_set() and not threading.current_thread().name.endswith(f"{DEVICE}-d"):
            self.calls[label] += 1

    def wrap(self, owner: Any, name: str, label: str, *, classmethod_: bool = False) -> None:
        original: Callable[..., Any] = getattr(owner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.hit(label)
            return original(*args, **kwargs)

        if classmethod_:
            setattr(owner, name, classmethod(lambda cls, *a, **k: counted(*a, **k)))
        else:
            setattr(owner, name, counted)


class InstantModel:
    """Answers at once: the counts are about the way in, not the model."""

    def __init__(self) -> None:
        from edgefleet.shared.messages import ModelInfo

        self.info = ModelInfo(name="ppocr", version="instant")

    def predict(
        self,
        image_rgb,
        *,
        priority: int = 0,
        timeout_s: float | None = None,
        tenant: str | None = None,
    ):
        return []

    async def predict_async(
        self, image_rgb, *, priority: int = 0, timeout_s=None, tenant: str | None = None
    ):
        return []

    @property
    def memory_bytes(self) -> int:
        return 0

    def close(self) -> None:
        pass


def _instrument(counts: Counts) -> None:
    from edgefleet.cloud import services as services_module
    from edgefleet.cloud.ledger import CaseLedger
    from edgefleet.cloud.lookup import CaseLookup
    from edgefleet.shared.messages import CloudVerdict, EscalationCase

    counts.wrap(services_module, "decode_image", "image decode")
    counts.wrap(CaseLedger, "claim", "store look-up:claim")
    for name in ("case_device", "verdict"):
        counts.wrap(CaseLookup, name, f"store look-up:{name}")
    counts.wrap(EscalationCase, "model_validate_json", "case parse", classmethod_=True)
    counts.wrap(EscalationCase, "model_validate", "case parse", classmethod_=True)
    counts.wrap(EscalationCase, "model_dump_json", "case serialise")
    counts.wrap(CloudVerdict, "model_dump_json", "verdict serialise")
    counts.wrap(json, "loads", "json:loads")
    counts.wrap(json, "dumps", "json:dumps")


def _cell(calls: collections.Counter[str], column: str) -> str:
    if column == "store look-up":
        parts = [calls[f"store look-up:{n}"] for n in ("claim", "case_device", "verdict")]
        return " / ".join(str(p) for p in parts)
    if column == "json":
        return f"{calls['json:loads']} / {calls['json:dumps']}"
    return str(calls[column])


@app.command()
def main() -> None:
    """Count the calls one case costs, four ways (REST/MQTT x new/sent again).

    Example: edgefleet bench case-calls
    """
    import httpx
    import numpy as np

    from edgefleet.bench.harness import ServerThread, escalation_case, escalation_wire, verdict_of
    from edgefleet.bench.mosquitto import MosquittoBroker
    from edgefleet.cloud.app import create_app
    from edgefleet.cloud.auth import key_digest
    from edgefleet.cloud.services import CloudServices
    from edgefleet.cloud.settings import CloudSettings
    from edgefleet.shared.imaging import encode_png
    from edgefleet.shared.mqtt import MqttSettings, make_client, publish
    from edgefleet.shared.topics import Topics

    counts = Counts()
    _instrument(counts)
    tmp = Path(tempfile.mkdtemp(prefix="ef-case-calls-"))
    broker = MosquittoBroker(tmp / "broker").start()
    mqtt = MqttSettings(host=broker.host, port=broker.port)
    sections: dict[str, Any] = dict(  # validated as the YAML file's sections are
        ingest={"share_group": f"calls-{secrets.token_hex(3)}"},
        api_keys=[{"name": "bench", "sha256": key_digest(OP_KEY)}],
        models={"primary": "ppocr", "lighter": "ppocr", "served": ["ppocr"]},
    )
    settings = CloudSettings(data_dir=tmp / "data", mqtt=mqtt, **sections)
    services = CloudServices.build(settings, loader=lambda name: InstantModel())
    assert services.fleet_registry is not None
    device = services.fleet_registry.enroll(DEVICE)
    verdicts: list[str] = []
    arrived = threading.Condition()

    def on_message(client, userdata, message) -> None:
        verdict = verdict_of(message.payload)
        if verdict is not None:
            with arrived:
                verdicts.append(verdict.case_id)
                arrived.notify_all()

    subscribed = threading.Event()
    client = make_client(mqtt, f"{DEVICE}-d")
    client.on_message = on_message
    client.on_subscribe = lambda *args: subscribed.set()
    client.on_connect = lambda c, *args: c.subscribe(Topics().results(DEVICE), qos=1)
    rows: list[tuple[str, str, collections.Counter[str]]] = []
    try:
        with ServerThread(create_app(settings, services=services)) as server:
            assert services.ingest is not None and services.ingest.wait_connected(30)
            client.connect(broker.host, broker.port)
            client.loop_start()
            assert subscribed.wait(30), "the device could not subscribe to its results"
            png = encode_png(np.full((32, 64, 3), 90, np.uint8))
            rest_case = escalation_case(DEVICE, frame_index=1)
            mqtt_case = escalation_case(DEVICE, frame_index=2)
            metadata = rest_case.model_dump_json()
            wire = escalation_wire(mqtt_case, device.device_key, png)

            def rest() -> str:
                response = httpx.post(
                    f"{server.url}/v1/escalations",
                    params={"wait": 30},
                    files={"image": ("c.png", png, "image/png")},
                    data={"metadata": metadata},
                    headers={"Authorization": f"Bearer {OP_KEY}"},
                    timeout=60,
                )
                return str(response.status_code)

            def by_mqtt() -> str:
                with arrived:
                    seen = verdicts.count(mqtt_case.case_id)
                    publish(client, wire, qos=1).wait_for_publish(30)
                    answered = arrived.wait_for(
                        lambda: verdicts.count(mqtt_case.case_id) > seen, timeout=60
                    )
                return "verdict" if answered else "no verdict"

            for label, step in [
                ("REST, new", rest),
                ("REST, sent again", rest),
                ("MQTT, new", by_mqtt),
                ("MQTT, sent again", by_mqtt),
            ]:
                counts.calls.clear()
                counts.on.set()
                outcome = step()
                counts.on.clear()
                rows.append((label, outcome, collections.Counter(counts.calls)))
    finally:
        client.loop_stop()
        client.disconnect()
        services.close()
        broker.stop()
    print("| case | answer | " + " | ".join(COLUMNS.values()) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in COLUMNS) + " |")
    for label, outcome, calls in rows:
        cells = " | ".join(_cell(calls, column) for column in COLUMNS)
        print(f"| {label} | {outcome} | {cells} |")


if __name__ == "__main__":
    app()
