"""The orchestrator end to end: real Mosquitto, uvicorn serving create_app, real PP-OCR
models, SQLite on disk, devices enrolled through the real fleet DeviceRegistry."""

from __future__ import annotations

import json
import queue
import secrets
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import cv2
import httpx
import numpy as np
import paho.mqtt.client as mqtt
import pytest
from typer.testing import CliRunner

from edgefleet.bench.harness import ServerThread, escalation_case, escalation_wire
from edgefleet.cloud.app import create_app
from edgefleet.cloud.auth import key_digest, sign_body
from edgefleet.cloud.services import CloudServices
from edgefleet.cloud.settings import CloudSettings
from edgefleet.shared.imaging import encode_jpeg, encode_png
from edgefleet.shared.messages import CloudVerdict
from edgefleet.shared.mqtt import MqttSettings, connect, from_paho, make_client, publish
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import Verifier, WireMessage
from tests.support.waiting import eventually

OP_KEY = "op-test-key-" + "x" * 20
TEXT = "EF-2048"

RULES_V1 = """
default: {model: ppocr6-cloud, timeout_s: 60}
rules:
  - name: cheap-stream
    when: {stream: "cheap*"}
    route: {model: rules}
"""


def text_image(text: str = TEXT) -> np.ndarray:
    img = np.full((96, 400, 3), 255, np.uint8)
    cv2.putText(img, text, (10, 65), cv2.FONT_HERSHEY_SIMPLEX, 1.8, (0, 0, 0), 4)
    return img


@dataclass
class Env:
    url: str
    services: CloudServices
    settings: CloudSettings
    device_key: bytes
    device_token: str
    other_token: str
    results: queue.Queue[CloudVerdict]
    device_client: mqtt.Client
    rules_path: Path
    config_path: Path

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.device_token}"}


def _wait_ready(url: str, timeout_s: float = 180.0) -> dict:
    body: dict = {}

    def ready() -> bool:
        response = httpx.get(f"{url}/readyz", timeout=10)
        body.clear()
        body.update(response.json())
        return response.status_code == 200

    eventually(ready, timeout_s, f"{url}/readyz to answer 200", detail=lambda: body, interval_s=0.2)
    return body


@pytest.fixture(scope="module")
def env(broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("cloud-api")
    rules = tmp / "rules.yaml"
    rules.write_text(RULES_V1)
    config = {
        "data_dir": str(tmp / "data"),
        "mqtt": {"host": broker.host, "port": broker.port},
        "ingest": {"share_group": f"api-{secrets.token_hex(3)}"},
        "api_keys": [{"name": "ops", "sha256": key_digest(OP_KEY)}],
        "rules": {"file": str(rules), "poll_s": 0.1},
        "http": {"max_upload_bytes": 1_000_000},
        "models": {"timeout_s": 60, "lighter": "ppocr", "served": ["ppocr6-cloud", "ppocr"]},
        "execution": {"batching": {"max_delay_ms": 2}},
    }
    config_path = tmp / "cloud.yaml"
    config_path.write_text(json.dumps(config))  # JSON is YAML
    settings = CloudSettings(**config)
    app = create_app(settings)
    services: CloudServices = app.state.services
    cam = services.fleet_registry.enroll("cam-01")
    other = services.fleet_registry.enroll("cam-02")
    results: queue.Queue[CloudVerdict] = queue.Queue()
    verifier = Verifier(key_for_device=lambda d: cam.device_key if d == "cam-01" else None)

    def on_message(client, userdata, message):
        results.put(verifier.verify(from_paho(message)).message)

    device = make_client(MqttSettings(host=broker.host, port=broker.port), "cam-01-test")
    device.on_message = on_message
    device.on_connect = lambda c, *a: c.subscribe(Topics().results("cam-01"), qos=1)
    connect(device, MqttSettings(host=broker.host, port=broker.port), clean_start=True)
    server = ServerThread(app).start()
    try:
        _wait_ready(server.url)
        yield Env(
            server.url,
            services,
            settings,
            cam.device_key,
            cam.token,
            other.token,
            results,
            device,
            rules,
            config_path,
        )
    finally:
        server.stop()
        device.loop_stop()
        device.disconnect()


def _next_verdict(env: Env, case_id: str, timeout_s: float = 90.0) -> CloudVerdict:
    found: list[CloudVerdict] = []

    def arrived() -> bool:
        while True:
            try:
                verdict = env.results.get_nowait()
            except queue.Empty:
                return False
            if isinstance(verdict, CloudVerdict) and verdict.case_id == case_id:
                found.append(verdict)  # (the topic also carries the cloud's lag status)
                return True

    eventually(arrived, timeout_s, f"a verdict for {case_id} on the results topic")
    return found[0]


def _post_case(env: Env, case, image: bytes, *, wait: float | None = 90, headers=None, token=None):
    meta = case.model_dump(mode="json", by_alias=True)
    params = {"wait": wait} if wait else {}
    return httpx.post(
        f"{env.url}/v1/escalations",
        params=params,
        files={"image": ("crop.png", image, case.content_type)},
        data={"metadata": json.dumps(meta)},
        headers={**env.auth(token), **(headers or {})},
        timeout=120,
    )


# --- the happy paths ------------------------------------------------------------------


def test_readyz_names_each_model_broker_and_store(env: Env) -> None:
    body = httpx.get(f"{env.url}/readyz", timeout=10).json()
    assert body["ready"] is True
    names = {m["name"]: m for m in body["models"]}
    assert set(names) == {"ppocr6-cloud", "ppocr"}
    for model in names.values():
        assert model["warmed"] and len(model["sha256"]) == 64
        assert model["backend"].startswith("onnxruntime") and model["memory_bytes"] > 0
        assert model["qps"] >= 0
    assert body["broker"] == {"required": True, "connected": True}
    assert body["store"] == {"dialect": "sqlite", "writable": True}
    assert httpx.get(f"{env.url}/healthz").json() == {"status": "ok"}


def test_rest_escalation_gives_verdict_and_results_message(env: Env) -> None:
    # given a case whose metadata carries no trace id, sent with a traceparent header
    trace = secrets.token_hex(16)
    case = escalation_case("cam-01", edge=[("EF-2O48", 0.41)])
    meta = case.model_dump(mode="json", by_alias=True)
    meta.pop("trace_id")
    response = httpx.post(
        f"{env.url}/v1/escalations",
        params={"wait": 90},
        files={"image": ("crop.png", encode_png(text_image()), "image/png")},
        data={"metadata": json.dumps(meta)},
        headers={**env.auth(), "traceparent": f"00-{trace}-{'1' * 16}-01"},
        timeout=120,
    )
    # then the heavy model read the text, and the trace id went through
    assert response.status_code == 200, response.text
    verdict = CloudVerdict.model_validate_json(response.text)
    assert [d.text for d in verdict.result] == [TEXT]
    assert verdict.fallback_level == 0 and verdict.model == "ppocr6-cloud@6.0"
    assert verdict.trace_id == trace and verdict.route == "default"
    # and the device got the same verdict, signed, on its results topic
    assert _next_verdict(env, case.case_id).result == verdict.result
    record = httpx.get(f"{env.url}/v1/escalations/{case.case_id}", headers=env.auth()).json()
    assert record["trace_id"] == trace and record["attempts"] == 1
    assert record["verdict"]["case_id"] == case.case_id
    # another device may not read it: for it there is no such case (ids are per device)
    denied = httpx.get(
        f"{env.url}/v1/escalations/{case.case_id}", headers=env.auth(env.other_token)
    )
    assert denied.status_code == 404 and denied.json()["error"]["code"] == "not_found"


def test_mqtt_escalation_twice_is_processed_once(env: Env) -> None:
    case = escalation_case("cam-01", content_type="image/jpeg")
    wire = escalation_wire(case, env.device_key, encode_jpeg(text_image(), quality=95))
    publish(env.device_client, wire, qos=1).wait_for_publish(10)
    first = _next_verdict(env, case.case_id)
    assert [d.text for d in first.result] == [TEXT]
    # when the very same message arrives again (a redelivery)
    publish(env.device_client, wire, qos=1).wait_for_publish(10)
    second = _next_verdict(env, case.case_id)
    # then it is answered again from the store, not run again
    assert second.result == first.result and second.latency_ms == first.latency_ms
    assert env.services.store.ledger.attempts()[case.case_id] == 1


def test_rules_file_edited_at_run_time_takes_effect(env: Env) -> None:
    png = encode_png(text_image())
    before = _post_case(env, escalation_case("cam-01", stream_id="hot"), png)
    assert before.json()["route"] == "default"
    env.rules_path.write_text(
        RULES_V1 + '  - name: hot-stream\n    when: {stream: "hot"}\n    route: {model: rules}\n'
    )
    answers: list[dict] = []

    def routed_hot() -> bool:
        answers[:] = [_post_case(env, escalation_case("cam-01", stream_id="hot"), png).json()]
        return answers[0]["route"] == "hot-stream"

    eventually(routed_hot, 60, "stream hot routed by the edited rules", detail=lambda: answers)
    assert answers[0]["route"] == "hot-stream"
    assert answers[0]["fallback_level"] == 2  # the rule-based level answered
    # a broken file is rejected and the rules in force stay
    env.rules_path.write_text("rules: [this is: not valid")

    def rejected() -> bool:
        if env.services.router.last_error is not None:
            return True
        _post_case(env, escalation_case("cam-01", stream_id="cheap-1"), png, wait=None)
        return False

    eventually(rejected, 60, "the broken rules file rejected", interval_s=0.1)
    assert env.services.router.last_error is not None
    again = _post_case(env, escalation_case("cam-01", stream_id="hot"), png)
    assert again.json()["route"] == "hot-stream"
    env.rules_path.write_text(RULES_V1)


def test_infer_endpoint_runs_the_named_model(env: Env) -> None:
    response = httpx.post(
        f"{env.url}/v1/infer/ppocr",
        content=encode_png(text_image()),
        headers={**env.auth(OP_KEY), "Content-Type": "image/png"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "ppocr@4.0" and [d["text"] for d in body["result"]] == [TEXT]
    # and /readyz counts the call in the model's qps
    models = {m["name"]: m for m in httpx.get(f"{env.url}/readyz", timeout=10).json()["models"]}
    assert models["ppocr"]["qps"] > 0


@pytest.mark.parametrize(("kind", "fmt"), [("webp", "WEBP"), ("bmp", "BMP"), ("tiff", "TIFF")])
def test_infer_takes_every_format_the_decoder_reads(env: Env, kind: str, fmt: str) -> None:
    import io

    from PIL import Image

    out = io.BytesIO()
    lossless = {"lossless": True} if fmt == "WEBP" else {}
    Image.fromarray(text_image()).save(out, format=fmt, **lossless)
    response = httpx.post(
        f"{env.url}/v1/infer/ppocr",
        content=out.getvalue(),
        headers={**env.auth(OP_KEY), "Content-Type": f"image/{kind}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert [d["text"] for d in response.json()["result"]] == [TEXT]


def test_signed_feedback_and_export(env: Env, tmp_path: Path) -> None:
    case = escalation_case("cam-01", stream_id="cheap-fb", edge=[("AB-12", 0.9)])
    assert _post_case(env, case, encode_png(text_image("AB-12"))).status_code == 200
    body = json.dumps({"case_id": case.case_id, "label": "AB-12", "correct": False}).encode()
    # a device signs with its device key
    ok = httpx.post(
        f"{env.url}/v1/feedback",
        content=body,
        headers={
            **env.auth(),
            "Content-Type": "application/json",
            "X-EF-Signature": sign_body(env.device_key, body),
        },
    )
    assert ok.status_code == 201, ok.text
    # an operator signs with the hex SHA-256 of its API key
    op = httpx.post(
        f"{env.url}/v1/feedback",
        content=body,
        headers={
            **env.auth(OP_KEY),
            "Content-Type": "application/json",
            "X-EF-Signature": sign_body(key_digest(OP_KEY).encode(), body),
        },
    )
    assert op.status_code == 201, op.text
    export = httpx.get(f"{env.url}/v1/export", params={"format": "jsonl"}, headers=env.auth(OP_KEY))
    assert export.status_code == 200
    records = {r["case_id"]: r for r in map(json.loads, export.text.splitlines())}
    assert records[case.case_id]["label"] == "AB-12"
    assert records[case.case_id]["label_source"] == "feedback"
    assert Path(records[case.case_id]["image"]).is_file()
    # devices may not export
    assert httpx.get(f"{env.url}/v1/export", headers=env.auth()).status_code == 403
    # the CLI writes the same training set
    from edgefleet.cli import app as root

    out = tmp_path / "train.jsonl"
    result = CliRunner().invoke(
        root, ["cloud", "export", "-c", str(env.config_path), "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    cli_records = {r["case_id"] for r in map(json.loads, out.read_text().splitlines())}
    assert set(records) == cli_records
    assert f"{len(cli_records)} examples from" in result.output  # cases scanned beside it


# --- bad input: every one a 4xx JSON error, and the server keeps serving ---------------


def _png_header_only(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk) & 0xFFFFFFFF)
    )


def _assert_error(response: httpx.Response, status: int, code: str | None = None) -> None:
    assert response.status_code == status, (response.status_code, response.text)
    error = response.json()["error"]
    assert set(error) >= {"code", "message", "trace_id"}
    assert len(error["trace_id"]) == 32
    # one trace id header, the one in the body
    assert response.headers.get_list("x-trace-id") == [error["trace_id"]]
    if code is not None:
        assert error["code"] == code, error


def test_bad_inputs_are_typed_4xx_and_the_server_keeps_serving(env: Env) -> None:
    url, png = env.url, encode_png(text_image())
    case = escalation_case("cam-01")
    meta = case.model_dump(mode="json", by_alias=True)

    def post(files=None, data=None, headers=None, **kw):
        return httpx.post(
            f"{url}/v1/escalations",
            files=files,
            data=data,
            headers={**env.auth(), **(headers or {})},
            timeout=60,
            **kw,
        )

    # malformed JSON
    _assert_error(
        post({"image": ("a.png", png, "image/png")}, {"metadata": "{not json"}),
        400,
        "malformed_json",
    )
    # missing fields: no image part; metadata missing stream_id
    note = {"note": ("n.txt", b"x", "text/plain")}  # multipart, but without the image part
    _assert_error(post(note, {"metadata": json.dumps(meta)}), 422)
    partial = {k: v for k, v in meta.items() if k != "stream_id"}
    _assert_error(
        post({"image": ("a.png", png, "image/png")}, {"metadata": json.dumps(partial)}), 422
    )
    # wrong types
    wrong = {**meta, "frame_index": "seven"}
    _assert_error(
        post({"image": ("a.png", png, "image/png")}, {"metadata": json.dumps(wrong)}), 422
    )
    # unknown model
    _assert_error(
        httpx.post(
            f"{url}/v1/infer/no-such-model",
            content=png,
            headers={**env.auth(), "Content-Type": "image/png"},
        ),
        404,
        "model_not_found",
    )
    # oversize: by Content-Length, and streamed (chunked, no length) counted as it arrives
    big = b"\x89PNG\r\n\x1a\n" + b"\0" * 1_200_000
    _assert_error(
        httpx.post(
            f"{url}/v1/infer/ppocr",
            content=big,
            headers={**env.auth(), "Content-Type": "image/png"},
        ),
        413,
        "payload_too_large",
    )

    def chunks():
        for _ in range(40):
            yield b"\0" * 64_000

    _assert_error(
        httpx.post(
            f"{url}/v1/infer/ppocr",
            content=chunks(),
            headers={**env.auth(), "Content-Type": "image/png"},
        ),
        413,
        "payload_too_large",
    )
    # wrong content type: JSON to the multipart endpoint, text to infer, GIF in the image part
    _assert_error(post(None, None, json=meta), 415, "unsupported_media_type")
    _assert_error(
        httpx.post(
            f"{url}/v1/infer/ppocr",
            content=png,
            headers={**env.auth(), "Content-Type": "text/plain"},
        ),
        415,
    )
    _assert_error(
        post({"image": ("a.gif", b"GIF89a....", "image/gif")}, {"metadata": json.dumps(meta)}), 415
    )
    # a file that lies about being a JPEG (PNG bytes, then garbage)
    jpeg_meta = {**meta, "content_type": "image/jpeg"}
    _assert_error(
        post({"image": ("a.jpg", png, "image/jpeg")}, {"metadata": json.dumps(jpeg_meta)}), 415
    )
    liar = httpx.post(
        f"{url}/v1/infer/ppocr",
        content=b"this is not a jpeg at all" * 10,
        headers={**env.auth(), "Content-Type": "image/jpeg"},
    )
    assert liar.status_code in (400, 415), liar.text
    # a decompression bomb: a tiny PNG declaring 100k x 100k pixels
    _assert_error(
        httpx.post(
            f"{url}/v1/infer/ppocr",
            content=_png_header_only(100_000, 100_000),
            headers={**env.auth(), "Content-Type": "image/png"},
        ),
        413,
    )
    # a truncated image
    truncated = httpx.post(
        f"{url}/v1/infer/ppocr",
        content=png[: len(png) // 2],
        headers={**env.auth(), "Content-Type": "image/png"},
    )
    _assert_error(truncated, 400)
    # bad and missing token
    _assert_error(
        httpx.post(f"{url}/v1/infer/ppocr", content=png, headers={"Content-Type": "image/png"}),
        401,
        "unauthorized",
    )
    _assert_error(
        httpx.post(
            f"{url}/v1/infer/ppocr",
            content=png,
            headers={"Authorization": "Bearer eft_wrong", "Content-Type": "image/png"},
        ),
        401,
    )
    # a device acting for another device
    _assert_error(
        post(
            {"image": ("a.png", png, "image/png")},
            {"metadata": json.dumps(meta)},
            headers=env.auth(env.other_token),
        ),
        403,
    )
    # bad signature on feedback, and none at all
    body = json.dumps({"case_id": case.case_id, "label": "x", "correct": True}).encode()
    headers = {**env.auth(), "Content-Type": "application/json"}
    _assert_error(
        httpx.post(
            f"{url}/v1/feedback",
            content=body,
            headers={**headers, "X-EF-Signature": sign_body(b"wrong key", body)},
        ),
        401,
        "signature_invalid",
    )
    _assert_error(httpx.post(f"{url}/v1/feedback", content=body, headers=headers), 401)
    # a signature of odd bytes is a refusal too, never a 500
    for odd in ("sha256=ééé".encode(), b"sha256=\xff\xfe", "sha256=٣٤".encode()):
        _assert_error(
            httpx.post(
                f"{url}/v1/feedback", content=body, headers={**headers, "X-EF-Signature": odd}
            ),
            401,
            "signature_invalid",
        )
    # a replayed case over REST is a 409 that points at the stored verdict
    fresh = escalation_case("cam-01", stream_id="cheap-replay")
    assert _post_case(env, fresh, png).status_code == 200
    _assert_error(_post_case(env, fresh, png), 409, "duplicate_case")
    # a badly signed MQTT case is rejected and counted, never answered
    bad = escalation_wire(escalation_case("cam-01"), b"not the key", png)
    rejected_before = _metric(url, 'ef_messages_rejected_total{reason="bad_signature"}')
    publish(env.device_client, bad, qos=1).wait_for_publish(10)
    eventually(
        lambda: (
            _metric(url, 'ef_messages_rejected_total{reason="bad_signature"}') > rejected_before
        ),
        30,
        "the bad signature counted",
        interval_s=0.1,
    )
    # and after all that the server still serves
    assert httpx.get(f"{url}/healthz").status_code == 200
    assert _post_case(env, escalation_case("cam-01", stream_id="cheap-2"), png).status_code == 200


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_unsigned_wire_without_sig_is_rejected(env: Env) -> None:
    case = escalation_case("cam-01")
    wire = escalation_wire(case, env.device_key, encode_png(text_image()))
    stripped = WireMessage(
        wire.topic,
        wire.payload,
        tuple(p for p in wire.user_properties if p[0] != "ef-sig"),
        wire.content_type,
    )
    before = _metric(env.url, 'ef_messages_rejected_total{reason="unsigned"}')
    publish(env.device_client, stripped, qos=1).wait_for_publish(10)
    eventually(
        lambda: _metric(env.url, 'ef_messages_rejected_total{reason="unsigned"}') > before,
        30,
        "the unsigned message counted",
        interval_s=0.1,
    )
    # and nothing was stored for it
    assert case.case_id not in env.services.store.ledger.attempts()


# --- one device's refusals, deep JSON, who labelled (#32) -------------------------------


def _image_files(env: Env) -> int:
    return sum(1 for p in env.services.store.images.root.rglob("*") if p.is_file())


def test_a_refused_duplicate_writes_nothing_and_refusals_are_charged(env: Env) -> None:
    cam = env.services.fleet_registry.enroll("cam-refused")
    case = escalation_case("cam-refused", stream_id="dup", edge=[("AB-12", 0.9)])
    rng = np.random.default_rng(32)
    assert _post_case(env, case, encode_png(text_image("AB-12")), wait=None, token=cam.token)
    before = _image_files(env)
    # when the same case_id comes 30 more times, each with another (large) image
    for _ in range(30):
        noise = encode_png(rng.integers(0, 255, (200, 200, 3), dtype=np.uint8))
        answer = _post_case(env, case, noise, wait=None, token=cam.token)
        assert answer.status_code == 409, answer.text
    # then none of those images was written
    assert _image_files(env) == before
    # and the refusals are charged: within its budget of a minute, the next ones are 429
    statuses = []
    for _ in range(env.settings.queue.max_refusals_per_device):
        answer = _post_case(env, case, encode_png(text_image("X")), wait=None, token=cam.token)
        statuses.append(answer.status_code)
        if answer.status_code == 429:
            assert int(answer.headers["Retry-After"]) >= 1
            break
    assert statuses[-1] == 429 and set(statuses[:-1]) == {409}
    fresh = escalation_case("cam-refused", stream_id="fresh", edge=[("AB-12", 0.9)])
    refused = _post_case(env, fresh, encode_png(text_image("X")), wait=None, token=cam.token)
    assert refused.status_code == 429
    # while another device is not held back by it
    other = escalation_case("cam-01", stream_id="unhurt", edge=[("AB-12", 0.9)])
    assert _post_case(env, other, encode_png(text_image("X")), wait=None).status_code == 202


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_nested_deep_is_a_typed_4xx_everywhere(env: Env) -> None:
    # metadata nested 1,000 deep in the multipart form (it was a 500, a RecursionError)
    meta = escalation_case("cam-01", stream_id="deep").model_dump(mode="json")
    answer = httpx.post(
        f"{env.url}/v1/escalations",
        files={"image": ("c.png", encode_png(text_image("X")), "image/png")},
        data={"metadata": json.dumps(meta)[:-1] + ', "extra": ' + _nested(1000) + "}"},
        headers=env.auth(),
        timeout=60,
    )
    assert 400 <= answer.status_code < 500, answer.text
    assert answer.json()["error"]["code"]
    # a feedback body nested 100,000 deep, and a deployment's
    deep = ('{"case_id": ' + _nested(100_000) + "}").encode()
    for path, key in (("/v1/feedback", env.device_token), ("/v1/deployments", OP_KEY)):
        answer = httpx.post(
            f"{env.url}{path}",
            content=deep,
            headers={**env.auth(key), "Content-Type": "application/json",
                     "X-EF-Signature": sign_body(env.device_key, deep)},
            timeout=60,
        )  # fmt: skip
        assert answer.status_code == 422, (path, answer.text)
        assert "nests deeper" in answer.json()["error"]["message"]
    # the same body without a JSON content type, where a route reads it itself
    answer = httpx.post(
        f"{env.url}/v1/deployments", content=deep, headers=env.auth(OP_KEY), timeout=60
    )
    assert answer.status_code == 422, answer.text


def test_the_export_names_who_gave_the_label_not_who_it_claims(env: Env) -> None:
    case = escalation_case("cam-01", stream_id="claims", edge=[("AB-12", 0.9)])
    assert _post_case(env, case, encode_png(text_image("AB-12"))).status_code == 200
    body = json.dumps(
        {"case_id": case.case_id, "label": "ZZ-99", "correct": False, "author": "operator-alice"}
    ).encode()
    headers = {**env.auth(), "Content-Type": "application/json",
               "X-EF-Signature": sign_body(env.device_key, body)}  # fmt: skip
    assert httpx.post(f"{env.url}/v1/feedback", content=body, headers=headers).status_code == 201
    export = httpx.get(f"{env.url}/v1/export", params={"format": "jsonl"}, headers=env.auth(OP_KEY))
    record = {r["case_id"]: r for r in map(json.loads, export.text.splitlines())}[case.case_id]
    assert record["label"] == "ZZ-99" and record["label_by"] == "device:cam-01"
