"""The fleet dashboard in a real browser with a large fleet: first paint and update cost.

Run: `edgefleet bench dashboard --devices 10000` (needs Chromium: Debian's `chromium`,
driven by Playwright, as the dashboard's end-to-end tests do). The real cloud app is
served by uvicorn over a SQLite registry of N enrolled devices, each with telemetry. The
figures, from the browser's own clocks (`performance.now()`, Chrome's `Performance`
metrics over CDP):

- first paint: from navigation to the fleet count and the first device rows on screen;
- update cost: `--changed` devices report new telemetry before each of `--ticks` live
  ticks; the browser's main-thread time (scripts, style, layout) spent per tick, and
  how long one device's change takes to show (the tick is 1 s);
- the page's JS heap and the rows in its DOM (the table is virtualised).

`edgefleet bench fleet` measures the server's side of the same feed against re-sending
the whole fleet.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(add_completion=False)

KEY = "bench-operator-key-0123456789"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"]


def _telemetry(device: str, seq: int, fps: float) -> Any:
    from edgefleet.shared.messages import (
        DeviceTelemetry,
        EscalationCounters,
        Latency,
        StreamTelemetry,
    )

    return DeviceTelemetry(
        device_id=device,
        seq=seq,
        uptime_s=10.0 * seq,
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
        cpu_pct=30.0,
        ram_used_mb=900.0,
        ts=datetime.now(timezone.utc),
    )


def _metrics(cdp: Any) -> dict[str, float]:
    return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}


def measure(devices: int, changed: int, ticks: int, chromium: str) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    from edgefleet.bench.harness import ServerThread
    from edgefleet.bench.mosquitto import free_port
    from edgefleet.cloud.app import create_app
    from edgefleet.cloud.auth import key_digest
    from edgefleet.cloud.settings import (
        CloudSettings,
        HttpSettings,
        IngestSettings,
        ModelsSettings,
        OperatorKey,
    )
    from edgefleet.shared.messages import DeviceStatus

    with tempfile.TemporaryDirectory(prefix="ef-dash-") as tmp:
        port = free_port()
        settings = CloudSettings(
            data_dir=Path(tmp),
            http=HttpSettings(port=port, events_interval_s=1.0),
            ingest=IngestSettings(enabled=False),
            models=ModelsSettings(preload=False),
            api_keys=[OperatorKey(name="ops", sha256=key_digest(KEY))],
        )
        api = create_app(settings)
        registry = api.state.services.fleet_registry
        ids = [f"cam-{i:05d}" for i in range(devices)]
        for i, device in enumerate(ids):
            registry.enroll(device, group=f"site-{i % 8}")
            registry.record_status(
                DeviceStatus(device_id=device, state="online", agent_version="1.0")
            )
            registry.record_telemetry(_telemetry(device, 1, 25.0))
        server = ServerThread(api, port).start()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=chromium, args=FLAGS, headless=True)
                page = browser.new_page(viewport={"width": 1600, "height": 1000})
                cdp = page.context.new_cdp_session(page)
                cdp.send("Performance.enable")
                page.goto(f"{server.url}/#key={KEY}")
                page.wait_for_function(
                    f"document.getElementById('stat-devices').textContent === '{devices} devices'",
                    timeout=120_000,
                )
                page.wait_for_selector(".row[data-device]", timeout=120_000)
                first_paint_ms = page.evaluate("performance.now()")
                rows_in_dom = page.locator(".row").count()
                page.wait_for_function(
                    "document.getElementById('conn').textContent === 'live'", timeout=60_000
                )
                before = _metrics(cdp)
                started = time.monotonic()
                seq = 2
                for tick in range(ticks):
                    start = (tick * changed) % devices
                    for device in ids[start : start + changed]:
                        registry.record_telemetry(_telemetry(device, seq, 20.0 + tick % 10))
                    seq += 1
                    time.sleep(1.0)  # one live tick (events_interval_s) per round
                after = _metrics(cdp)
                elapsed = time.monotonic() - started
                # one change on screen: a visible device's new fps
                visible = page.get_attribute(".row[data-device]", "data-device")
                shown_at = time.monotonic()
                registry.record_telemetry(_telemetry(str(visible), seq + 1, 77.5))
                page.wait_for_function(
                    f"document.querySelector('.row[data-device=\"{visible}\"]')"
                    "?.textContent.includes('77.5')",
                    timeout=30_000,
                )
                change_ms = (time.monotonic() - shown_at) * 1000
                heap_mb = after.get("JSHeapUsedSize", 0) / 2**20
                browser.close()
        finally:
            server.stop()
    per_tick = {
        name: (after.get(name, 0) - before.get(name, 0)) / elapsed * 1000
        for name in ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration")
    }
    return {
        "devices": devices,
        "changed_per_tick": changed,
        "first_paint_ms": round(first_paint_ms, 1),
        "rows_in_dom": rows_in_dom,
        "main_thread_ms_per_s": round(per_tick["TaskDuration"], 1),
        "script_ms_per_s": round(per_tick["ScriptDuration"], 1),
        "layout_style_ms_per_s": round(
            per_tick["LayoutDuration"] + per_tick["RecalcStyleDuration"], 1
        ),
        "change_shown_ms": round(change_ms, 1),
        "js_heap_mb": round(heap_mb, 1),
    }


@app.command()
def main(
    devices: Annotated[str, typer.Option(help="comma list of fleet sizes")] = "1000,10000",
    changed: Annotated[int, typer.Option(help="devices reporting per 1 s tick")] = 200,
    ticks: Annotated[int, typer.Option(help="live ticks measured")] = 10,
) -> None:
    """The dashboard in headless Chromium: first paint and per-tick cost with N devices.

    Example: edgefleet bench dashboard --devices 10000 --changed 200
    """
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        raise typer.BadParameter("needs Chromium (Debian: apt-get install chromium)")
    rows = []
    for count in (int(n) for n in devices.split(",")):
        row = measure(count, changed, ticks, chromium)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n## The dashboard in headless Chromium")
    print(
        "| devices | first paint ms | rows in DOM | main thread ms per 1 s tick "
        "(scripts / layout+style) | a change on screen after, ms | JS heap MB |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['devices']} | {r['first_paint_ms']} | {r['rows_in_dom']} "
            f"| {r['main_thread_ms_per_s']} ({r['script_ms_per_s']} / "
            f"{r['layout_style_ms_per_s']}) | {r['change_shown_ms']} | {r['js_heap_mb']} |"
        )


if __name__ == "__main__":
    app()
