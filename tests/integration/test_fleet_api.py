"""The fleet REST routes served by uvicorn: auth, views, deployments, downloads, events."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from edgefleet.shared.messages import DeviceStatus, DeviceTelemetry, EscalationCounters
from tests.support.fleet import OPERATOR_KEY, FleetServer, tiny_onnx
from tests.support.waiting import eventually

AUTH = {"Authorization": f"Bearer {OPERATOR_KEY}"}
GOOD_HASH = "c" * 64


@pytest.fixture
def server(tmp_path: Path):
    instance = FleetServer(tmp_path).start()
    for i in range(3):
        instance.registry.enroll(f"cam-{i}", group="lab")
    yield instance
    instance.stop()


def body(**over) -> dict:
    data = {
        "group": "lab",
        "image": "ghcr.io/acme/edge@sha256:" + "1" * 64,
        "models": [{"name": "det", "version": "1", "url": "https://m/det", "sha256": GOOD_HASH}],
        "soak_s": 0,
    }
    data.update(over)
    return data


def assert_error(resp: httpx.Response, status: int, code: str) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["code"] == code and error["message"] and len(error["trace_id"]) == 32
    return error


def listen_to_events(
    server, until: Callable[[str, Any], bool]
) -> tuple[list[tuple[str, Any]], threading.Thread]:
    """Read the dashboard's SSE stream on a thread into (event, data) pairs, until `until`."""
    events: list[tuple[str, Any]] = []

    def listen() -> None:
        with httpx.stream("GET", f"{server.url}/v1/events", headers=AUTH, timeout=60) as resp:
            event = "message"
            for line in resp.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    events.append((event, json.loads(line[5:].strip())))
                    if until(*events[-1]):
                        return

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    return events, thread


def test_operator_key_is_required(server) -> None:
    assert_error(httpx.get(f"{server.url}/v1/devices"), 401, "unauthorized")
    bad = {"Authorization": "Bearer nope"}
    assert_error(httpx.get(f"{server.url}/v1/devices", headers=bad), 401, "unauthorized")
    # a device token is known but is not an operator key: forbidden
    token = server.registry.enroll("cam-9", group="lab").token
    headers = {"Authorization": f"Bearer {token}"}
    assert_error(
        httpx.post(f"{server.url}/v1/deployments", json=body(), headers=headers),
        403,
        "forbidden",
    )
    # and a stolen device token can neither write nor read the fleet's event log
    line = {"source": "x", "component": "broker", "message": "all is well"}
    events = f"{server.url}/v1/fleet/events"
    assert_error(httpx.post(events, json=line, headers=headers), 403, "forbidden")
    assert_error(httpx.get(events, headers=headers), 403, "forbidden")
    assert httpx.get(events, headers=AUTH).json()["events"] == []


def test_device_views(server) -> None:
    server.registry.record_status(
        DeviceStatus(device_id="cam-1", state="online", agent_version="0.3")
    )
    server.registry.record_telemetry(
        DeviceTelemetry(
            device_id="cam-1",
            seq=1,
            uptime_s=5,
            escalations=EscalationCounters(sent=1, pending=0, dropped=0),
            outbox_depth=7,
            cpu_pct=12,
            ram_used_mb=100,
        )
    )
    listed = httpx.get(f"{server.url}/v1/devices?group=lab", headers=AUTH).json()
    assert listed["count"] == 3
    one = httpx.get(f"{server.url}/v1/devices/cam-1", headers=AUTH).json()
    assert one["online"] is True and one["outbox_depth"] == 7 and one["telemetry"]["seq"] == 1
    history = httpx.get(f"{server.url}/v1/devices/cam-1/history", headers=AUTH).json()
    assert len(history["points"]) == 1 and history["points"][0]["outbox_depth"] == 7
    assert_error(httpx.get(f"{server.url}/v1/devices/nope", headers=AUTH), 404, "not_found")


def test_deployment_created_and_read_back(server) -> None:
    resp = httpx.post(f"{server.url}/v1/deployments", json=body(canary_percent=34), headers=AUTH)
    assert resp.status_code == 201, resp.text
    dep = resp.json()
    assert dep["status"] == "canary" and len(dep["canaries"]) == 2
    again = httpx.get(f"{server.url}/v1/deployments/{dep['id']}", headers=AUTH).json()
    assert again["id"] == dep["id"] and again["counts"] == {"sent": 2, "pending": 1}
    assert len(server.sent) == 2 and all(retain for _, retain in server.sent)
    assert_error(httpx.get(f"{server.url}/v1/deployments/dep-x", headers=AUTH), 404, "not_found")


def test_an_operator_rolls_a_deployment_back_over_rest(server) -> None:
    dep = httpx.post(f"{server.url}/v1/deployments", json=body(), headers=AUTH).json()
    url = f"{server.url}/v1/deployments/{dep['id']}"
    # a device (or nobody) may not cancel a rollout
    device = {"Authorization": f"Bearer {server.registry.enroll('cam-x', group='lab').token}"}
    assert_error(httpx.delete(url, headers=device), 403, "forbidden")
    assert_error(httpx.delete(url), 401, "unauthorized")
    # the operator may, once: the canaries got their previous state (none) back
    cancelled = httpx.delete(url, headers=AUTH)
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "rolled_back"
    assert_error(httpx.delete(url, headers=AUTH), 409, "conflict")
    # and the group is free for the next rollout
    assert httpx.post(f"{server.url}/v1/deployments", json=body(), headers=AUTH).status_code == 201


@pytest.mark.parametrize(
    ("payload", "status", "code", "needle"),
    [
        (body(group="elsewhere"), 404, "not_found", "elsewhere"),
        (
            body(models=[{"name": "det", "version": "1", "url": "https://m", "sha256": "12ab"}]),
            422,
            "invalid_input",
            "sha256",
        ),
        (body(image="ghcr.io/acme/edge:bad tag"), 422, "invalid_input", "image"),
        (body(image="UPPER/Case:1"), 422, "invalid_input", "image"),
        (body(models=[{"name": "det", "version": "404"}]), 404, "model_not_found", "det@404"),
        (body(extra_field=1), 422, "invalid_input", "extra_field"),
        ("not json", 422, "invalid_input", "JSON"),
    ],
)
def test_bad_deployments_are_refused_and_change_nothing(server, payload, status, code, needle):
    kwargs = {"content": payload} if isinstance(payload, str) else {"json": payload}
    resp = httpx.post(f"{server.url}/v1/deployments", headers=AUTH, **kwargs)
    assert needle in assert_error(resp, status, code)["message"]
    assert server.sent == []
    assert httpx.get(f"{server.url}/v1/deployments", headers=AUTH).json()["deployments"] == []


def test_concurrent_rollouts_to_one_group_conflict(server) -> None:
    # when two operators start a rollout to the same group at the same moment
    results: list[httpx.Response] = []

    def post(tag: str) -> None:
        results.append(
            httpx.post(
                f"{server.url}/v1/deployments",
                json=body(image=f"ghcr.io/acme/edge@sha256:{tag * 32}"),
                headers=AUTH,
            )
        )

    threads = [threading.Thread(target=post, args=(t,)) for t in ("a1", "b2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # then exactly one wins and the other gets a 409 naming the active rollout
    statuses = sorted(r.status_code for r in results)
    assert statuses == [201, 409]
    winner = next(r for r in results if r.status_code == 201).json()
    loser = next(r for r in results if r.status_code == 409)
    assert winner["id"] in assert_error(loser, 409, "conflict")["message"]
    desired_images = {json.loads(w.payload)["image"] for w, _ in server.sent}
    assert desired_images == {winner["image"]}


def test_model_download_supports_range_and_capabilities(tmp_path, server) -> None:
    src = tiny_onnx(tmp_path / "det.onnx")
    data = src.read_bytes()
    server.store.add("det", "1", src)
    deployed = body(models=[{"name": "det", "version": "1"}])
    assert httpx.post(f"{server.url}/v1/deployments", json=deployed, headers=AUTH).is_success
    key = server.registry.device_key("cam-0")
    ref = server.store.for_device(server.store.ref("det", "1"), "cam-0", key)
    full = httpx.get(ref.url)
    assert full.status_code == 200 and full.content == data
    assert full.headers["accept-ranges"] == "bytes"
    assert 'filename="det.onnx"' in full.headers["content-disposition"]
    part = httpx.get(ref.url, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == data[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(data)}"
    tail = httpx.get(ref.url, headers={"Range": "bytes=-5"})
    assert tail.content == data[-5:]
    assert httpx.get(ref.url, headers={"Range": f"bytes={len(data)}-"}).status_code == 416
    assert_error(httpx.get(ref.url, headers={"Range": "lines=1-2"}), 422, "invalid_input")
    # another device's capability, or a revoked device's, is refused
    forged = ref.url.replace("device=cam-0", "device=cam-1")
    assert_error(httpx.get(forged), 401, "bad_capability")
    server.registry.revoke("cam-0")
    assert_error(httpx.get(ref.url), 401, "bad_capability")
    # nobody learns which models exist without credentials: auth comes before the lookup
    assert_error(
        httpx.get(f"{server.url}/v1/models/det/9?device=cam-1&sig=00"), 401, "bad_capability"
    )
    assert_error(httpx.get(f"{server.url}/v1/models/det/9"), 401, "unauthorized")
    token = {"Authorization": f"Bearer {server.registry.enroll('cam-9').token}"}
    assert_error(httpx.get(f"{server.url}/v1/models/det/9", headers=token), 404, "model_not_found")
    assert_error(
        httpx.get(f"{server.url}/v1/models/.hidden/1", headers=token), 422, "invalid_input"
    )
    assert_error(httpx.get(f"{server.url}/v1/models/..%2F..%2Fetc/1"), 404, "not_found")
    # and a non-ASCII signature is a refusal, not a 500
    assert_error(
        httpx.get(f"{server.url}/v1/models/det/1?device=cam-1&sig=%C3%A9t%C3%A9"),
        401,
        "bad_capability",
    )


def test_a_device_downloads_only_the_models_deployed_to_it(tmp_path, server) -> None:
    # given a model deployed only to group yard, and a device of group lab
    server.store.add("secret-yard-det", "2", tiny_onnx(tmp_path / "yard.onnx"))
    yard = server.registry.enroll("yard-0", group="yard")
    deployed = body(group="yard", models=[{"name": "secret-yard-det", "version": "2"}])
    assert httpx.post(f"{server.url}/v1/deployments", json=deployed, headers=AUTH).is_success
    cam = server.registry.enroll("cam-8", group="lab")
    token = {"Authorization": f"Bearer {cam.token}"}
    # when the lab device asks for it with its token, or with a link it signed itself
    signed = server.store.for_device(
        server.store.ref("secret-yard-det", "2"), "cam-8", cam.device_key
    )
    by_token = httpx.get(f"{server.url}/v1/models/secret-yard-det/2", headers=token)
    by_link = httpx.get(signed.url)
    unknown = httpx.get(f"{server.url}/v1/models/secret-yard-det/3", headers=token)
    # then both are the same 404 as a model that does not exist: no names to probe
    errors = [assert_error(r, 404, "model_not_found") for r in (by_token, by_link, unknown)]
    assert (
        errors[0]["message"]
        == errors[1]["message"]
        == "model secret-yard-det@2 is not in the model store"
    )
    assert unknown.json()["error"]["message"].replace("@3", "@2") == errors[0]["message"]
    # while the yard device, deployed to, and an operator both download it
    yard_token = {"Authorization": f"Bearer {yard.token}"}
    for headers in (yard_token, AUTH):
        got = httpx.get(f"{server.url}/v1/models/secret-yard-det/2", headers=headers)
        assert got.status_code == 200, got.text


def test_events_stream_batches_device_changes(server) -> None:
    # given a client on the live stream
    seen: set[str] = set()

    def done(event: str, data: Any) -> bool:
        # a tick sends devices before deployments: stop once both have come
        if event == "deployments" or (event == "devices" and any(x["online"] for x in data)):
            seen.add(event)
        return seen == {"devices", "deployments"}

    events, thread = listen_to_events(server, until=done)
    eventually(lambda: any(e == "hello" for e, _ in events), timeout_s=30)
    # when a device sends its status
    server.registry.record_status(
        DeviceStatus(device_id="cam-2", state="online", agent_version="1")
    )

    # then the stream carries it in a devices batch
    # (rows changed just before the stream opened may come once more: merging is idempotent)
    def online_batch() -> list[dict]:
        return next((d for e, d in events if e == "devices" and any(x["online"] for x in d)), [])

    thread.join(timeout=30)
    assert not thread.is_alive(), f"no online devices batch and deployments batch in 30 s: {events}"
    assert [d["device_id"] for d in online_batch() if d["online"]] == ["cam-2"]
    assert any(e == "deployments" for e, _ in events)


def test_a_hash_that_does_not_match_the_stored_model_is_refused(tmp_path, server) -> None:
    # given det@1 in the model store
    server.store.add("det", "1", tiny_onnx(tmp_path / "det.onnx"))
    # when a deployment names it with another (well-formed) sha256
    resp = httpx.post(
        f"{server.url}/v1/deployments",
        json=body(models=[{"name": "det", "version": "1", "sha256": "f" * 64}]),
        headers=AUTH,
    )
    # then it is refused and nothing was sent or stored
    assert "does not match" in assert_error(resp, 422, "invalid_input")["message"]
    assert server.sent == []
    assert httpx.get(f"{server.url}/v1/deployments", headers=AUTH).json()["deployments"] == []
    assert all(server.registry.desired(d) is None for d in ("cam-0", "cam-1", "cam-2"))


def test_fleet_event_lines_are_stored_listed_and_streamed(server) -> None:
    # given a client on the live stream
    events, thread = listen_to_events(server, until=lambda e, _: e == "events")
    eventually(lambda: any(e == "hello" for e, _ in events), timeout_s=30)
    # when the demo posts a fault's event line
    line = "t=22.3 s broker: kill -9; restarted 1x; healthy again after 1.7 s"
    posted = httpx.post(
        f"{server.url}/v1/fleet/events",
        json={"source": "demo", "component": "broker", "message": line, "healthy_after_s": 1.7},
        headers=AUTH,
    )
    assert posted.status_code == 201, posted.text
    # then it is listed and reaches the stream
    listed = httpx.get(f"{server.url}/v1/fleet/events", headers=AUTH).json()["events"]
    assert [(e["component"], e["message"], e["healthy_after_s"]) for e in listed] == [
        ("broker", line, 1.7)
    ]
    eventually(lambda: any(e == "events" for e, _ in events), timeout_s=30)
    streamed = next(d for e, d in events if e == "events")
    assert [e["message"] for e in streamed] == [line]
    thread.join(timeout=10)


@pytest.mark.parametrize(
    "payload",
    [
        {"component": "broker", "message": "x"},  # no source
        {"source": "demo", "component": "broker", "message": ""},
        {"source": "demo", "component": "broker", "message": "x", "extra": 1},
        {"source": "demo", "component": "broker", "message": "x", "healthy_after_s": -1},
        "not an object",
    ],
)
def test_bad_fleet_events_are_a_422_and_store_nothing(server, payload) -> None:
    resp = httpx.post(f"{server.url}/v1/fleet/events", json=payload, headers=AUTH)
    assert_error(resp, 422, "invalid_input")
    assert httpx.get(f"{server.url}/v1/fleet/events", headers=AUTH).json()["events"] == []
    no_key = httpx.post(f"{server.url}/v1/fleet/events", json={"source": "x"})
    assert_error(no_key, 401, "unauthorized")
