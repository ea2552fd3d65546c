"""A fleet against the real cloud: N enrolled devices, R `edgefleet cloud serve` replicas.

Run: `edgefleet bench fleet-load` (options below). Everything is real and separate
processes: a Mosquitto, R orchestrator replicas in one share group on one store
(SQLite for one replica, PostgreSQL for several: a fresh database on the local server,
dropped afterwards), and publisher processes playing N devices whose keys were enrolled in
the registry. Three measurements:

- `--mode burst`: every device sends `--per-device` signed telemetry messages plus a share
  of `--cases` escalations as fast as the broker takes them; the figure is how fast the
  replicas store them and how much CPU they spend per message (msgs per CPU-second, the
  number that must stay flat as replicas are added). `--replicas 1,2,4` compares.
- `--mode rate`: devices report every `--period` seconds and the fleet escalates
  `--case-rate` cases per second for `--seconds`; the figures are the end-to-end verdict
  latency (publish -> verdict received by the device), loss and backlog at that rate
  (memory over time: `edgefleet bench soak`).
- `--mode drain`: the burst's telemetry (no escalations) is queued by the broker while the
  replicas are paused (SIGSTOP); then they are let go (SIGCONT) and the figures are how
  fast they store the backlog and their CPU per message. Every replica is saturated, so
  msgs per CPU-second compares replica counts without the publishers' pace in it.
  `--naive` first drains the same burst with the naive consumer (bench/naive_telemetry.py).

Loss is counted from the store (cases and verdicts rows) and the devices' own receipts,
not from counters.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(add_completion=False)

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


# --- the devices (publisher processes) -----------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What one publisher process sends for its devices."""

    host: str
    port: int
    devices: list[tuple[str, str]]  # (device id, key hex)
    per_device: int  # burst: telemetry messages per device
    cases: int  # burst: escalations of this publisher
    period_s: float  # rate: each device's telemetry period
    case_rate: float  # rate: escalations per second of this publisher
    seconds: float  # rate: how long


def run_devices(plan: Plan, mode: str) -> dict[str, Any]:
    """Publish for the plan's devices; returns sent counts, case ids and verdict latencies."""
    import threading

    import numpy as np

    from edgefleet.bench.harness import escalation_case, escalation_wire, verdict_of
    from edgefleet.shared.imaging import encode_png
    from edgefleet.shared.messages import DeviceTelemetry, EscalationCounters
    from edgefleet.shared.mqtt import MqttSettings, connect, make_client, publish
    from edgefleet.shared.topics import Channel, Topics
    from edgefleet.shared.wire import encode

    topics = Topics()
    keys = {device: bytes.fromhex(key) for device, key in plan.devices}
    sent_at: dict[str, float] = {}
    answered: dict[str, float] = {}
    lock = threading.Lock()
    settings = MqttSettings(host=plan.host, port=plan.port, max_inflight=1000)
    client = make_client(settings, f"fleet-load-{secrets.token_hex(4)}")

    def on_message(c, u, message) -> None:
        verdict = verdict_of(message.payload)
        if verdict is None:  # the cloud's lag status
            return
        with lock:
            answered.setdefault(verdict.case_id, time.monotonic())

    subscribed = threading.Event()
    client.on_message = on_message
    client.on_subscribe = lambda *a: subscribed.set()
    client.on_connect = lambda c, *a: c.subscribe(topics.all_devices(Channel.RESULTS), qos=1)
    connect(client, settings, clean_start=True)
    if not subscribed.wait(30):
        raise RuntimeError("the publisher could not subscribe to the results")
    png = encode_png(np.full((16, 64, 3), 200, np.uint8))
    seq = {device: 0 for device in keys}

    def telemetry(device: str):
        seq[device] += 1
        message = DeviceTelemetry(
            device_id=device,
            seq=seq[device],
            uptime_s=float(seq[device]),
            escalations=EscalationCounters(sent=0, pending=0, dropped=0),
            outbox_depth=0,
            cpu_pct=10.0,
            ram_used_mb=100.0,
        )
        return publish(client, encode(message, keys[device], topics.telemetry(device)), qos=1)

    def case(i: int):
        device = plan.devices[i % len(plan.devices)][0]
        found = escalation_case(device, frame_index=i, edge=[("X", 0.2)])
        sent_at[found.case_id] = time.monotonic()
        return publish(client, escalation_wire(found, keys[device], png), qos=1)

    infos = []
    started = time.time()
    if mode == "burst":
        for i in range(plan.cases):
            infos.append(case(i))
        for _ in range(plan.per_device):
            infos.extend(telemetry(device) for device in keys)
        telemetry_sent = plan.per_device * len(keys)
    else:
        ticks = int(plan.seconds * 10)  # 100 ms steps: each device once per period
        per_tick = len(keys) * 0.1 / plan.period_s
        order = list(keys)
        due, case_due, i, n = 0.0, 0.0, 0, 0
        begin = time.monotonic()
        for tick in range(ticks):
            due += per_tick
            while due >= 1:
                infos.append(telemetry(order[n % len(order)]))
                n, due = n + 1, due - 1
            case_due += plan.case_rate * 0.1
            while case_due >= 1:
                infos.append(case(i))
                i, case_due = i + 1, case_due - 1
            time.sleep(max(0.0, begin + (tick + 1) * 0.1 - time.monotonic()))
        telemetry_sent = n
    for info in infos:
        info.wait_for_publish(300)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with lock:
            if len(set(answered) & set(sent_at)) >= len(sent_at):
                break
        time.sleep(0.05)
    client.loop_stop()
    client.disconnect()
    latencies = [answered[c] - sent_at[c] for c in sent_at if c in answered]
    return {
        "started": started,
        "telemetry_sent": telemetry_sent,
        "cases": list(sent_at),
        "answered": len(latencies),
        "latencies_ms": [round(x * 1000, 2) for x in latencies],
    }


# --- the cloud side ------------------------------------------------------------------------


@dataclass
class Replica:
    process: subprocess.Popen[bytes]
    url: str

    def scrape(self, name: str, labels: dict[str, str]) -> float:
        import httpx
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                wanted = all(sample.labels.get(k) == v for k, v in labels.items())
                if sample.name == name and wanted:
                    total += sample.value
        return total


def _cpu_seconds(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def _start_replicas(count: int, tmp: Path, broker_port: int, db_url: str) -> list[Replica]:
    import httpx

    from edgefleet.bench.mosquitto import free_port

    rules = tmp / "rules.yaml"
    rules.write_text("default: {model: rules, timeout_s: 30}\n")
    replicas = []
    for i in range(count):
        port = free_port()
        config = tmp / f"cloud-{i}.yaml"
        config.write_text(
            json.dumps(
                {
                    "http": {"port": port},
                    "mqtt": {"host": "127.0.0.1", "port": broker_port},
                    "data_dir": str(tmp / "data"),
                    "database_url": db_url,
                    "models": {"preload": False},
                    "rules": {"file": str(rules)},
                    "log_level": "WARNING",
                }
            )
        )
        process = subprocess.Popen(
            [sys.executable, "-m", "edgefleet", "cloud", "serve", "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=(tmp / f"cloud-{i}.log").open("ab"),
        )
        replicas.append(Replica(process, f"http://127.0.0.1:{port}"))
    deadline = time.monotonic() + 180
    for replica in replicas:
        while True:
            if replica.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"a replica did not start; see {tmp}/cloud-*.log")
            try:
                if httpx.get(f"{replica.url}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    return replicas


def _stop(replicas: list[Replica]) -> None:
    for replica in replicas:
        replica.process.terminate()
    for replica in replicas:
        try:
            replica.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            replica.process.kill()


def _database(kind: str, tmp: Path) -> tuple[str, str | None]:
    """(database URL, name of a PostgreSQL database to drop afterwards or None)."""
    if kind == "sqlite":
        return f"sqlite:///{tmp / 'data' / 'cloud.db'}", None
    import psycopg

    name = f"ef_load_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return f"postgresql://postgres@127.0.0.1:5432/{name}", name


def _drop(name: str | None) -> None:
    if name is None:
        return
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _enroll(db_url: str, count: int) -> list[tuple[str, str]]:
    from edgefleet.fleet.registry import DeviceRegistry
    from edgefleet.shared.db import Database

    db = Database.connect(db_url)
    try:
        registry = DeviceRegistry(db)
        return [
            (e.device_id, e.device_key.hex())
            for e in (registry.enroll(f"load-{i:05d}") for i in range(count))
        ]
    finally:
        db.close()


def _store_counts(db_url: str, case_ids: list[str]) -> dict[str, int]:
    from edgefleet.shared.db import Database

    db = Database.connect(db_url)
    try:
        # runs that reached a stored verdict: a run cut short and retried is not a duplicate
        rows = db.query("SELECT case_id, completed_runs FROM ef_cases")
        cases = {r["case_id"]: r["completed_runs"] for r in rows}
        verdicts = {r["case_id"] for r in db.query("SELECT case_id FROM ef_verdicts")}
    finally:
        db.close()
    return {
        "stored": len(set(case_ids) & set(cases)),
        "answered": len(set(case_ids) & verdicts),
        "processed_twice": sum(1 for c in case_ids if cases.get(c, 0) > 1),
    }


def _split(devices: list[tuple[str, str]], parts: int) -> list[list[tuple[str, str]]]:
    return [devices[i::parts] for i in range(parts)]


def drain_naive(ctx: Any, broker: Any, db_url: str, plans: list[Plan]) -> dict[str, Any]:
    """The same burst, queued by the broker while the naive consumer is paused, then drained
    by it (bench/naive_telemetry.py): stored/s and CPU per message, as for the replicas."""
    from edgefleet.bench.naive_telemetry import consume

    stored = ctx.Value("q", 0)
    subscribed = ctx.Event()
    args = (broker.host, broker.port, db_url, stored, subscribed)
    process = ctx.Process(target=consume, args=args, daemon=True)
    process.start()
    try:
        if not subscribed.wait(60):
            raise RuntimeError("the naive consumer did not subscribe")
        os.kill(process.pid, signal.SIGSTOP)
        with ProcessPoolExecutor(len(plans), mp_context=ctx) as pool:
            results = [j.result() for j in [pool.submit(run_devices, p, "burst") for p in plans]]
        sent = sum(r["telemetry_sent"] for r in results)
        cpu_before = _cpu_seconds([process.pid])
        started = time.time()
        os.kill(process.pid, signal.SIGCONT)
        deadline = time.monotonic() + 600
        while stored.value < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        elapsed = time.time() - started
        cpu = _cpu_seconds([process.pid]) - cpu_before
    finally:
        process.kill()
        process.join()
    return {
        "telemetry_sent": sent,
        "telemetry_stored": stored.value,
        "stored_per_s": round(stored.value / elapsed, 1),
        "msgs_per_cpu_s": round(stored.value / cpu, 1) if cpu else None,
        "cpu_ms_per_1000": round(cpu * 1e6 / stored.value, 1) if stored.value else None,
    }


def measure(
    *,
    replicas: int,
    mode: str,
    devices: int,
    per_device: int,
    cases: int,
    period_s: float,
    case_rate: float,
    seconds: float,
    publishers: int,
    db: str,
    naive: bool = False,
) -> dict[str, Any]:
    from edgefleet.bench.mosquitto import MosquittoBroker

    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ef-load-") as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "data").mkdir()
        db_url, drop = _database(db, tmp)
        broker = MosquittoBroker(tmp / "mosquitto").start()
        fleet = None
        try:
            enrolled = _enroll(db_url, devices)
            plans = [
                Plan(
                    broker.host,
                    broker.port,
                    part,
                    per_device,
                    cases // publishers,
                    period_s,
                    case_rate / publishers,
                    seconds,
                )
                for part in _split(enrolled, publishers)
            ]
            # before the replicas exist: the naive consumer's messages are its alone
            naive_row = drain_naive(ctx, broker, db_url, plans) if naive else None
            fleet = _start_replicas(replicas, tmp, broker.port, db_url)
            pids = [r.process.pid for r in fleet]
            stored_before = sum(
                r.scrape("ef_cloud_ingest_total", {"channel": "telemetry", "outcome": "stored"})
                for r in fleet
            )
            cpu_before = _cpu_seconds(pids)
            if mode == "drain":  # the replicas hold still while the broker queues their share
                for pid in pids:
                    os.kill(pid, signal.SIGSTOP)
            with ProcessPoolExecutor(publishers, mp_context=ctx) as pool:
                jobs = [
                    pool.submit(run_devices, plan, "burst" if mode == "drain" else mode)
                    for plan in plans
                ]
                results = [j.result() for j in jobs]
            if mode == "drain":  # from here on the replicas only drain, as fast as they can
                cpu_before = _cpu_seconds(pids)
                drain_started = time.time()
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
            sent = sum(r["telemetry_sent"] for r in results)
            deadline = time.monotonic() + 300
            stored = 0.0
            while time.monotonic() < deadline:
                stored = (
                    sum(
                        r.scrape(
                            "ef_cloud_ingest_total", {"channel": "telemetry", "outcome": "stored"}
                        )
                        for r in fleet
                    )
                    - stored_before
                )
                if stored >= sent:
                    break
                time.sleep(0.2)
            started_at = drain_started if mode == "drain" else min(r["started"] for r in results)
            elapsed = time.time() - started_at
            cpu = _cpu_seconds(pids) - cpu_before
            batches = sum(r.scrape("ef_cloud_light_batch_size_count", {}) for r in fleet)
            batched = sum(r.scrape("ef_cloud_light_batch_size_sum", {}) for r in fleet)
            fallbacks = sum(r.scrape("ef_cloud_light_batch_fallbacks_total", {}) for r in fleet)
            case_ids = [c for r in results for c in r["cases"]]
            counts = _store_counts(db_url, case_ids)
            latencies = [x for r in results for x in r["latencies_ms"]]
        finally:
            if fleet is not None:
                _stop(fleet)
            broker.kill()
            _drop(drop)
    messages = stored + counts["stored"]
    return {
        "replicas": replicas,
        "telemetry_sent": sent,
        "telemetry_stored": int(stored),
        "cases_sent": len(case_ids),
        **counts,
        "verdicts_received": sum(r["answered"] for r in results),
        "seconds": round(elapsed, 2),
        "stored_per_s": round(messages / elapsed, 1),
        "cloud_cpu_s": round(cpu, 2),
        "msgs_per_cpu_s": round(messages / cpu, 1) if cpu else None,
        "cpu_ms_per_1000": round(cpu * 1000 / messages * 1000, 1) if messages else None,
        "mean_batch": round(batched / batches, 1) if batches else None,
        "batch_fallbacks": int(fallbacks),
        "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "p95_ms": round(_pct(latencies, 95), 1) if latencies else None,
        "p99_ms": round(_pct(latencies, 99), 1) if latencies else None,
        "naive": naive_row,
    }


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


@app.command()
def main(
    mode: Annotated[
        str, typer.Option(help="burst or drain (throughput), rate (latency)")
    ] = "burst",
    replicas: Annotated[str, typer.Option(help="comma list of replica counts to compare")] = "1",
    devices: Annotated[int, typer.Option(help="devices, each enrolled for real")] = 1000,
    per_device: Annotated[int, typer.Option(help="burst: telemetry messages per device")] = 5,
    cases: Annotated[int, typer.Option(help="burst: escalations across the fleet")] = 500,
    period: Annotated[float, typer.Option(help="rate: telemetry period per device, s")] = 5.0,
    case_rate: Annotated[float, typer.Option(help="rate: escalations per second")] = 1.0,
    seconds: Annotated[float, typer.Option(help="rate: how long to run")] = 60.0,
    publishers: Annotated[int, typer.Option(help="publisher processes")] = 1,
    db: Annotated[str, typer.Option(help="sqlite (one replica) or postgres")] = "sqlite",
    naive: Annotated[
        bool, typer.Option(help="drain: the naive consumer first, same broker and messages")
    ] = False,
) -> None:
    """N enrolled devices against R real replicas: stored/s, CPU, latency, loss.

    Example: edgefleet bench fleet-load --replicas 1,2,4 --db postgres
    Example: edgefleet bench fleet-load --mode drain --per-device 20 --publishers 2 --naive
    """
    from edgefleet.shared.logs import configure_logging

    configure_logging("WARNING")
    counts = [int(n) for n in replicas.split(",")]
    if mode == "drain":
        cases = 0  # telemetry only: a case would wait for a verdict from a paused replica
    elif naive:
        raise typer.BadParameter("--naive goes with --mode drain")
    if max(counts) > 1 and db != "postgres":
        raise typer.BadParameter("several replicas share a PostgreSQL store: --db postgres")
    rows = []
    for count in counts:
        row = measure(
            replicas=count,
            mode=mode,
            devices=devices,
            per_device=per_device,
            cases=cases,
            period_s=period,
            case_rate=case_rate,
            seconds=seconds,
            publishers=publishers,
            db=db,
            naive=naive and count == counts[0],
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n## fleet-load, mode {mode}, {devices} devices, store {db}")
    print(
        "| replicas | stored msg/s | msgs per CPU-s | CPU ms / 1000 msgs | lost (cases) "
        "| processed twice | verdict p50 / p95 ms |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    first = rows[0]["naive"]
    if first:
        lost = first["telemetry_sent"] - first["telemetry_stored"]
        print(
            f"| naive consumer | {first['stored_per_s']} | {first['msgs_per_cpu_s']} "
            f"| {first['cpu_ms_per_1000']} | {lost} | | |"
        )
    for row in rows:
        lost = row["cases_sent"] - row["answered"] + row["telemetry_sent"] - row["telemetry_stored"]
        print(
            f"| {row['replicas']} | {row['stored_per_s']} | {row['msgs_per_cpu_s']} "
            f"| {row['cpu_ms_per_1000']} | {lost} | {row['processed_twice']} "
            f"| {row['p50_ms']} / {row['p95_ms']} |"
        )
    base = rows[0]["msgs_per_cpu_s"]
    for row in rows[1:]:
        if base and row["msgs_per_cpu_s"]:
            share = row["msgs_per_cpu_s"] / base
            print(f"{row['replicas']} replicas keep {share:.0%} of one replica's msgs per CPU-s")
    if first and first["stored_per_s"]:
        ratio = rows[0]["stored_per_s"] / first["stored_per_s"]
        print(f"{rows[0]['replicas']} replica(s) / naive consumer, stored msg/s: {ratio:.2f}x")


if __name__ == "__main__":
    app()
