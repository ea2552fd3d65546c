"""The fleet dashboard in a real headless Chromium (Debian's), driven by Playwright."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.shared.messages import (
    CloudVerdict,
    Detection,
    DeviceStatus,
    DeviceTelemetry,
    EscalationCounters,
    GpuTelemetry,
    Latency,
    ModelInfo,
    ReportedState,
    StreamTelemetry,
)
from tests.support.fleet import OPERATOR_KEY, FleetServer
from tests.support.waiting import eventually

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
N_DEVICES = 1000
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cf000001010100"
    "18dd8db00000000049454e44ae426082"
)


def telemetry(device: str, seq: int, fps: float, temp: float) -> DeviceTelemetry:
    return DeviceTelemetry(
        device_id=device,
        seq=seq,
        uptime_s=60.0 * seq,
        streams=[
            StreamTelemetry(
                stream_id="gate",
                state="live",
                fps=fps,
                frames_dropped=0,
                latency_ms=Latency(p50=8, p95=14, p99=20),
            )
        ],
        escalations=EscalationCounters(sent=seq, pending=0, dropped=0),
        outbox_depth=seq % 5,
        cpu_pct=30,
        ram_used_mb=900,
        gpu=GpuTelemetry(util_pct=55, mem_used_mb=900, mem_total_mb=8000, temp_c=temp, power_w=11),
        model=ModelInfo(name="det", version="3", sha256="d" * 64, backend="tensorrt"),
        agreement_rate=0.93,
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory):
    server = FleetServer(tmp_path_factory.mktemp("dash"), events_interval_s=0.5).start()
    reg = server.registry
    for i in range(N_DEVICES):
        reg.enroll(f"cam-{i:04d}", group=f"site-{i % 4}")
    for i in range(0, N_DEVICES, 7):
        device = f"cam-{i:04d}"
        reg.record_status(DeviceStatus(device_id=device, state="online", agent_version="0.4.1"))
        reg.record_telemetry(telemetry(device, 1, fps=24.5, temp=61))
    reg.record_reported(
        ReportedState(
            device_id="cam-0000", deployment_id="dep-seed", image="edge:1", status="healthy"
        )
    )
    dep = server.rollouts.create(
        {
            "group": "site-1",
            "image": "ghcr.io/acme/edge@sha256:" + "2" * 64,
            "models": [{"name": "det", "version": "3", "url": "https://m/d", "sha256": "d" * 64}],
            "soak_s": 600,
        }
    )
    # a case the cloud answered with nothing read (older, so its card comes second)
    empty = escalation_case("cam-0007", edge=[("ABC-12", 0.2)])
    server.case_store.ledger.claim(
        empty,
        image_sha256=hashlib.sha256(PNG).hexdigest(),
        image=PNG,
        source="rest",
        replica="test",
        stale_after_s=60,
    )
    server.case_store.ledger.save_verdict(
        CloudVerdict(
            device_id="cam-0007",
            trace_id=empty.trace_id,
            case_id=empty.case_id,
            result=[],
            model="ocr@1",
            route="ocr",
            fallback_level=0,
            latency_ms=9.0,
        ),
        replica="test",
    )
    server.empty_case_id = empty.case_id
    # a case answered by the cloud, stored for real (the card reads the store)
    case = escalation_case("cam-0007", edge=[("ABC-12", 0.4)])
    server.case_store.ledger.claim(
        case,
        image_sha256=hashlib.sha256(PNG).hexdigest(),
        image=PNG,
        source="rest",
        replica="test",
        stale_after_s=60,
    )
    server.case_store.ledger.save_verdict(
        CloudVerdict(
            device_id="cam-0007",
            trace_id=case.trace_id,
            case_id=case.case_id,
            result=[Detection(text="ABC-123", score=0.97)],
            model="ocr@1",
            route="ocr",
            fallback_level=0,
            latency_ms=12.0,
        ),
        replica="test",
    )
    server.deployment_id = dep.id
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian's chromium is not installed")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        yield instance
        instance.close()


def test_a_verdict_that_read_nothing_says_so_not_its_route(fleet, browser) -> None:
    page = browser.new_page(viewport={"width": 1600, "height": 1200})
    page.goto(f"{fleet.url}/#key={OPERATOR_KEY}")
    card = page.locator(".case", has=page.locator(f'img[alt="case {fleet.empty_case_id}"]'))
    card.wait_for()
    assert card.locator(".verdict").text_content() == "nothing read (route ocr)"
    page.close()


def test_dashboard_shows_the_fleet_and_updates_live(fleet, browser) -> None:
    page = browser.new_page(viewport={"width": 1600, "height": 1200})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    # given the page opened with the operator key
    page.goto(f"{fleet.url}/#key={OPERATOR_KEY}")
    # then it shows the seeded fleet (counts, rows, the rollout with its canary, a case)
    page.wait_for_function(
        f"document.getElementById('stat-devices').textContent === '{N_DEVICES} devices'"
    )
    assert page.text_content("#stat-online") == f"{len(range(0, N_DEVICES, 7))} online"
    page.wait_for_selector('.row[data-device="cam-0000"]')
    first = page.text_content('.row[data-device="cam-0000"]')
    assert "site-0" in first and "24.5" in first and "dep-seed" in first and "det@3" in first
    # the table is virtualised: a thousand devices, a few dozen rows in the DOM
    assert page.locator(".row").count() < 80
    page.wait_for_selector(f'.rollout[data-deployment="{fleet.deployment_id}"]')
    assert "canary" in page.text_content(f'.rollout[data-deployment="{fleet.deployment_id}"]')
    page.wait_for_selector(".case .verdict")
    assert page.text_content(".case .verdict") == "ABC-123"
    page.wait_for_function("document.getElementById('conn').textContent === 'live'")

    # when telemetry arrives for a device that was silent
    page.fill("#filter", "cam-0001")
    page.wait_for_selector('.row[data-device="cam-0001"]')
    assert "offline" in page.text_content('.row[data-device="cam-0001"]')
    fleet.registry.record_status(
        DeviceStatus(device_id="cam-0001", state="online", agent_version="0.4.1")
    )
    fleet.registry.record_telemetry(telemetry("cam-0001", 2, fps=31.25, temp=88))
    # then the row updates without a reload
    page.wait_for_function(
        "document.querySelector('.row[data-device=\"cam-0001\"]')?.textContent.includes('31.3')",
        timeout=30_000,
    )
    row = page.text_content('.row[data-device="cam-0001"]')
    assert "online" in row and "88" in row
    assert page.locator('.row[data-device="cam-0001"] .bad').count() >= 1  # 88 °C is hot

    # when the device is opened, its charts come from the stored history
    page.click('.row[data-device="cam-0001"]')
    page.wait_for_selector("#charts .chart polyline", state="attached")
    assert page.locator("#charts .chart").count() == 8

    ARTIFACTS.mkdir(exist_ok=True)
    page.fill("#filter", "")
    page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000
    assert problems == []
    page.close()


def test_dashboard_shows_fleet_event_lines_and_new_ones_live(fleet, browser) -> None:
    import httpx

    # given an event line already in the log (a fault `edgefleet demo --chaos` saw)
    auth = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    first = "t=7.8 s cloud-b: kill -9; restarted 1x; healthy again after 4.0 s"
    event = {"source": "demo", "component": "cloud-b", "message": first, "healthy_after_s": 4.0}
    assert httpx.post(f"{fleet.url}/v1/fleet/events", json=event, headers=auth).status_code == 201
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(str(e)))
    # when the page opens, then it lists it
    page.goto(f"{fleet.url}/#key={OPERATOR_KEY}")
    page.wait_for_function(
        f"document.getElementById('events').textContent.includes({first!r})", timeout=30_000
    )
    # and a line posted once the live stream is up arrives over it, newest first
    page.wait_for_function("document.getElementById('conn').textContent === 'live'")
    second = "t=26.2 s broker: frozen (SIGSTOP) 13.7 s > keepalive 5 s; healthy again after 14.3 s"
    event = {"source": "demo", "component": "broker", "message": second, "healthy_after_s": 14.3}
    assert httpx.post(f"{fleet.url}/v1/fleet/events", json=event, headers=auth).status_code == 201
    page.wait_for_function(
        f"document.querySelector('#events li').textContent === {second!r}", timeout=30_000
    )
    assert problems == []
    page.close()


def test_dashboard_in_the_cloud_shows_a_case_with_its_thumbnail_and_verdict(
    broker, browser, tmp_path: Path
) -> None:
    """The real cloud app: a device's escalation is answered, and the dashboard card shows
    the stored image (fetched from /v1/escalations/{id}/image with the operator key)."""
    import json
    import secrets

    import httpx
    import numpy as np

    from edgefleet.bench.harness import ServerThread, escalation_case
    from edgefleet.bench.mosquitto import free_port
    from edgefleet.cloud.app import create_app
    from edgefleet.cloud.auth import key_digest
    from edgefleet.cloud.settings import CloudSettings
    from edgefleet.shared.imaging import encode_jpeg

    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 30}\n")
    port = free_port()
    settings = CloudSettings(
        data_dir=tmp_path / "data",
        public_url=f"http://127.0.0.1:{port}",
        mqtt={"host": broker.host, "port": broker.port},
        ingest={"share_group": f"dash-{secrets.token_hex(3)}"},
        api_keys=[{"name": "ops", "sha256": key_digest(OPERATOR_KEY)}],
        rules={"file": rules, "poll_s": 60},
        models={"preload": False},
    )
    app = create_app(settings)
    cam = app.state.services.fleet_registry.enroll("cam-dash", group="dock")
    server = ServerThread(app, port=port).start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    try:
        eventually(
            lambda: httpx.get(f"{server.url}/readyz", timeout=10).status_code == 200,
            60,
            "the cloud ready",
            detail=lambda: httpx.get(f"{server.url}/readyz", timeout=10).text,
            interval_s=0.1,
        )
        # given a 160x64 crop the device escalated and the cloud answered
        image = np.full((64, 160, 3), 255, np.uint8)
        image[20:44, 20:140] = 0
        case = escalation_case("cam-dash", content_type="image/jpeg", edge=[("DOCK-7", 0.9)])
        answered = httpx.post(
            f"{server.url}/v1/escalations",
            params={"wait": 30},
            files={"image": ("c.jpg", encode_jpeg(image), "image/jpeg")},
            data={"metadata": json.dumps(case.model_dump(mode="json", by_alias=True))},
            headers={"Authorization": f"Bearer {cam.token}"},
            timeout=60,
        )
        assert answered.status_code == 200, answered.text
        # when the operator opens the cloud's own page
        page.goto(f"{server.url}/#key={OPERATOR_KEY}")
        page.wait_for_selector('.row[data-device="cam-dash"]')
        # then the case card shows the stored image as its thumbnail, and the verdict
        page.wait_for_function(
            "document.querySelector('.case img.thumb')?.naturalWidth === 160", timeout=30_000
        )
        assert page.text_content(".case .verdict") == "DOCK-7"
        assert "cam-dash" in page.text_content(".case")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-cloud.png"), full_page=True)
        assert problems == []
    finally:
        page.close()
        server.stop()
