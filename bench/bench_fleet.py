"""The fleet dashboard's live feed and telemetry history against the naive way, side by side.

Run: `.venv/bin/python -m edgefleet.bench.bench_fleet`
(defaults `--devices 1000 --changed 50 --rounds 20 --messages 30`).

- Live feed, per SSE tick: the naive dashboard re-sends the whole fleet every tick (one
  `list_devices()` + JSON of every row); ours sends only the rows changed since the last
  tick (an indexed `updated_at > cursor` read that, like the server, re-reads the two
  previous ticks to catch late commits and drops the repeats). With 1,000 devices each
  reporting every 20 s and a 1 s tick, about 50 rows change per tick.
- Rollout progress, per SSE tick: the naive stream rebuilds the views of the newest 10
  rollouts (every target) to see whether anything moved; ours reads a progress marker
  (counts and latest change times) and rebuilds only when it moved.
- Telemetry history: the naive store appends one row per telemetry message; ours keeps
  one sample per device per minute (upsert), which is what a chart of the last hours
  draws. Rows stored and time per message are printed for the same message stream.
Both run on a real SQLite file (WAL), in this process.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import typer

from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.db import Database
from edgefleet.shared.messages import DeviceTelemetry, EscalationCounters, Latency, StreamTelemetry

app = typer.Typer(add_completion=False)


def _telemetry(device: str, seq: int, ts: datetime) -> DeviceTelemetry:
    return DeviceTelemetry(
        device_id=device,
        ts=ts,
        seq=seq,
        uptime_s=seq * 10.0,
        streams=[
            StreamTelemetry(
                stream_id="s0",
                state="live",
                fps=25.0,
                frames_dropped=0,
                latency_ms=Latency(p50=8, p95=14, p99=20),
            )
        ],
        escalations=EscalationCounters(sent=seq, pending=0, dropped=0),
        outbox_depth=seq % 7,
        cpu_pct=30,
        ram_used_mb=900,
    )


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.2f} ms"


@app.command()
def main(
    devices: int = typer.Option(1000, help="fleet size"),
    changed: int = typer.Option(50, help="devices changed per tick"),
    rounds: int = typer.Option(20, help="ticks measured"),
    messages: int = typer.Option(30, help="telemetry messages per device (10 s apart)"),
) -> None:
    """Print the dashboard's live-feed and telemetry-history costs, naive vs ours, with ratios.

    Example: edgefleet bench fleet --devices 1000 --changed 50 --rounds 20
    """
    with tempfile.TemporaryDirectory() as tmp:
        db = Database.connect(f"sqlite:///{Path(tmp) / 'bench.db'}")
        registry = DeviceRegistry(db)
        ids = [f"cam-{i:05d}" for i in range(devices)]
        for device in ids:
            registry.enroll(device, group=f"site-{hash(device) % 8}")
        now = datetime.now(timezone.utc)
        for device in ids:
            registry.record_telemetry(_telemetry(device, 0, now))

        naive_t, ours_t, naive_b, ours_b = [], [], [], []
        cursor = datetime.now(timezone.utc)
        cursors = [cursor, cursor]  # the server re-reads 2 s (2 ticks) back, then dedups
        seq = 1
        for r in range(rounds):
            for device in ids[(r * changed) % devices :][:changed]:
                registry.record_telemetry(_telemetry(device, seq, datetime.now(timezone.utc)))
            seq += 1
            t0 = time.perf_counter()
            full = json.dumps([d.model_dump(mode="json") for d in registry.list_devices()])
            naive_t.append(time.perf_counter() - t0)
            naive_b.append(len(full))
            t0 = time.perf_counter()
            rows = registry.list_devices(updated_since=cursors[-2])
            fresh = [d for d in rows if d.updated_at > cursor]
            delta = json.dumps([d.model_dump(mode="json") for d in fresh])
            ours_t.append(time.perf_counter() - t0)
            ours_b.append(len(delta))
            cursors.append(cursor)
            cursor = max(d.updated_at for d in fresh)

        print(f"## live feed: {devices} devices, {changed} changed per tick, {rounds} ticks")
        print("| per tick | time (median) | bytes (median) |")
        print("| --- | --- | --- |")
        print(f"| naive: whole fleet | {_ms(naive_t)} | {int(statistics.median(naive_b)):,} |")
        print(f"| ours: changed rows | {_ms(ours_t)} | {int(statistics.median(ours_b)):,} |")
        print(
            f"| ratio | {statistics.median(naive_t) / statistics.median(ours_t):.1f}x less time"
            f" | {statistics.median(naive_b) / statistics.median(ours_b):.1f}x fewer bytes |"
        )

        # telemetry history: one row per message (naive) vs one per device-minute (ours)
        db.execute(
            "CREATE TABLE naive_history (device_id TEXT, ts TIMESTAMPTZ, fps REAL, "
            "latency_p95 REAL, outbox_depth INTEGER, body TEXT)"
        )
        start = now - timedelta(hours=2)
        sample = ids[: min(200, devices)]
        naive_w, ours_w = [], []
        for k in range(messages):
            ts = start + timedelta(seconds=10 * k)
            for device in sample:
                tel = _telemetry(device, 1000 + k, ts)
                t0 = time.perf_counter()
                db.execute(
                    "INSERT INTO naive_history VALUES (?, ?, ?, ?, ?, ?)",
                    (device, ts, 25.0, 14.0, tel.outbox_depth, tel.model_dump_json()),
                )
                naive_w.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                registry.record_telemetry(tel)
                ours_w.append(time.perf_counter() - t0)
        naive_rows = db.query("SELECT COUNT(*) AS n FROM naive_history")[0]["n"]
        ours_rows = db.query(
            "SELECT COUNT(*) AS n FROM fleet_telemetry_history WHERE bucket < ?",
            (int((start + timedelta(hours=1)).timestamp()),),
        )[0]["n"]
        print()
        print(f"## telemetry history: {len(sample)} devices x {messages} messages, 10 s apart")
        print("| store | rows kept | time per message (median) |")
        print("| --- | --- | --- |")
        print(f"| naive: a row per message | {naive_rows:,} | {_ms(naive_w)} |")
        print(f"| ours: last + 1 sample/device/min | {ours_rows:,} | {_ms(ours_w)} |")
        print(f"| ratio | {naive_rows / max(1, ours_rows):.1f}x fewer rows | |")
        _rollout_progress(registry, db, rounds)
        db.close()


def _rollout_progress(registry: DeviceRegistry, db: Database, rounds: int) -> None:
    """Per SSE tick with no progress: rebuild the rollout views (naive) vs check the marker."""
    from edgefleet.fleet.rollout import RolloutController

    rollouts = RolloutController(registry, db, lambda wire, retain: None, tick_interval_s=None)
    model = {"name": "det", "version": "1", "url": "https://m/det", "sha256": "a" * 64}
    for group in registry.groups():
        rollouts.create({"group": group, "image": "acme/edge:2.0", "models": [model]})
    naive_t, ours_t = [], []
    marker = rollouts.book.progress_marker(10)
    for _ in range(rounds):
        t0 = time.perf_counter()
        json.dumps([d.model_dump(mode="json") for d in rollouts.list(10)])
        naive_t.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        unchanged = rollouts.book.progress_marker(10) == marker
        ours_t.append(time.perf_counter() - t0)
        assert unchanged
    targets = db.query("SELECT COUNT(*) AS n FROM fleet_deployment_targets")[0]["n"]
    n = len(rollouts.list(10))
    print()
    print(f"## rollout progress: {n} active rollouts, {targets:,} targets, a tick with no change")
    print("| per tick | time (median) |")
    print("| --- | --- |")
    print(f"| naive: rebuild and compare the views | {_ms(naive_t)} |")
    print(f"| ours: progress marker unchanged | {_ms(ours_t)} |")
    print(f"| ratio | {statistics.median(naive_t) / statistics.median(ours_t):.1f}x less time |")


if __name__ == "__main__":
    app()
