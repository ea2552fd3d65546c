"""Memory over time: the cloud, the broker and a real edge agent under a steady fleet.

Run: `edgefleet bench soak --minutes 60` (options below). Everything is real and a separate
process: a Mosquitto, one `edgefleet cloud serve` (SQLite store), one `edgefleet edge run`
reading a looping rendered clip in real time (its pipeline, outbox, uplink and telemetry),
and a publisher process playing the rest of the fleet: N devices enrolled for real,
each sending signed telemetry every `--period` seconds, plus `--case-rate` signed
escalations per second across the fleet (fleet-load's `--mode rate` devices).

Every `--sample-s` the RSS of each process (with its children) is sampled, with the
cloud's own `ef_*_entries` / `ef_*_bytes` gauges (what its caches, queues and histories
hold), so a growth can be traced to what fills. After the run: a least-squares slope in
MB per hour per process over the samples after the `--warmup` cut, and the loss counted
from the store.
"""

from __future__ import annotations

import json
import multiprocessing
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import psutil
import typer

from edgefleet.bench.bench_fleet_load import (
    Plan,
    Replica,
    _database,
    _drop,
    _enroll,
    _start_replicas,
    _stop,
    _store_counts,
    run_devices,
)

app = typer.Typer(add_completion=False)

AGENT = "soak-agent"


def tree_rss_mb(pid: int) -> float:
    """RSS of a process and all its children (a replica's workers count as the replica)."""
    import psutil

    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


def bounded_gauges(replica: Replica) -> dict[str, float]:
    """The cloud's `ef_*_entries` and `ef_*_bytes` gauges, summed over their labels."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name.startswith("ef_") and name.endswith(("_entries", "_bytes")):
                key = name + "".join(f"|{v}" for v in sample.labels.values())
                found[key] = found.get(key, 0.0) + sample.value
    return found


def growth_mb_per_h(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (minute, MB) points, in MB per hour."""
    if len(points) < 2:
        return None
    xs, ys = zip(*points, strict=True)
    return round(statistics.linear_regression(xs, ys).slope * 60, 2)


def write_clip(path: Path, fps: float, frames: int) -> Path:
    """A looping camera: one of the rendered hard clips (moving text) as an MP4."""
    import cv2

    from edgefleet.demo.scenes.clips import render_clip

    clip = render_clip(seed=7, frames=frames)
    h, w = clip.frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), fps, (w, h))
    for frame in clip.frames:
        writer.write(frame)
    writer.release()
    return path


def start_agent(
    tmp: Path, db_url: str, broker_port: int, period_s: float, fps: float
) -> subprocess.Popen[bytes]:
    """`edgefleet edge run` for one enrolled device, one inference thread, looping clip."""
    from edgefleet.fleet.registry import DeviceRegistry
    from edgefleet.shared.db import Database

    db = Database.connect(db_url)
    try:
        key = DeviceRegistry(db).enroll(AGENT).device_key
    finally:
        db.close()
    video = write_clip(tmp / "camera.mp4", fps, frames=60)
    config = {
        "device_id": AGENT,
        "device_key": key.hex(),
        "mqtt": {"host": "127.0.0.1", "port": broker_port},
        "streams": [
            {"id": "cam", "url": str(video), "loop": True, "realtime": True, "expect_result": True}
        ],
        "model": {"execution": {"intra_op_threads": 1, "inter_op_threads": 1}},
        "pipeline": {"infer_workers": 1},
        "outbox": {"path": str(tmp / "agent" / "outbox.db")},
        "state_dir": str(tmp / "agent" / "state"),
        "telemetry_interval_s": period_s,
        "health": {"port": 0},
    }
    (tmp / "agent").mkdir()
    path = tmp / "edge.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return subprocess.Popen(
        [sys.executable, "-m", "edgefleet", "edge", "run", "-c", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "agent.log").open("ab"),
    )


def agent_record(db_url: str) -> dict[str, Any]:
    """What the store holds of the real agent: when it last reported, and its cases."""
    from edgefleet.shared.db import Database

    db = Database.connect(db_url)
    try:
        rows = db.query("SELECT last_seen FROM fleet_devices WHERE device_id = ?", (AGENT,))
        cases = db.query("SELECT COUNT(*) AS n FROM ef_cases WHERE device_id = ?", (AGENT,))
    finally:
        db.close()
    last_seen = rows[0]["last_seen"] if rows else None
    return {"agent_last_seen": str(last_seen), "agent_cases": cases[0]["n"]}


def soak(
    *,
    minutes: float,
    devices: int,
    period_s: float,
    case_rate: float,
    sample_s: float,
    agent_fps: float,
    db: str,
    log: Path | None,
) -> dict[str, Any]:
    from edgefleet.bench.mosquitto import MosquittoBroker

    ctx = multiprocessing.get_context("spawn")
    samples: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ef-soak-") as tmpdir:
        tmp = Path(tmpdir)
        (tmp / "data").mkdir()
        db_url, drop = _database(db, tmp)
        broker = MosquittoBroker(tmp / "mosquitto").start()
        cloud: list[Replica] = []
        agent = None
        pool: ProcessPoolExecutor | None = None
        try:
            enrolled = _enroll(db_url, devices)
            cloud = _start_replicas(1, tmp, broker.port, db_url)
            agent = start_agent(tmp, db_url, broker.port, period_s, agent_fps)
            plan = Plan(
                host=broker.host,
                port=broker.port,
                devices=enrolled,
                per_device=0,
                cases=0,
                period_s=period_s,
                case_rate=case_rate,
                seconds=minutes * 60,
            )
            pids = {"cloud": cloud[0].process.pid, "broker": broker.pid, "agent": agent.pid}
            pool = ProcessPoolExecutor(1, mp_context=ctx)
            job = pool.submit(run_devices, plan, "rate")
            started = time.monotonic()
            while not job.done():
                if agent.poll() is not None:
                    raise RuntimeError(f"the agent exited; see {tmp}/agent.log")
                if not samples or time.monotonic() - started >= sample_s * len(samples):
                    row: dict[str, Any] = {
                        "minute": round((time.monotonic() - started) / 60, 2),
                        **{f"{k}_mb": round(tree_rss_mb(p), 1) for k, p in pids.items()},
                        "gauges": bounded_gauges(cloud[0]),
                    }
                    samples.append(row)
                    line = json.dumps(row)
                    print(line, flush=True)
                    if log is not None:
                        with log.open("a") as out:
                            out.write(line + "\n")
                time.sleep(0.5)
            result = job.result()
            record = agent_record(db_url)
            counts = _store_counts(db_url, result["cases"])
        finally:
            if pool is not None:  # an interrupted soak: its publisher must not outlive it
                for child in psutil.Process().children():
                    if "spawn_main" in " ".join(child.cmdline()):  # the pool's worker
                        child.terminate()
                pool.shutdown(wait=False, cancel_futures=True)
            if agent is not None:
                agent.terminate()
                try:
                    agent.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    agent.kill()
            _stop(cloud)
            broker.kill()
            _drop(drop)
    return {
        "telemetry_sent": result["telemetry_sent"],
        "cases_sent": len(result["cases"]),
        **counts,
        **record,
        "verdicts_received": result["answered"],
        "samples": samples,
    }


@app.command()
def main(
    minutes: Annotated[float, typer.Option(help="how long the fleet publishes")] = 60.0,
    devices: Annotated[int, typer.Option(help="simulated devices, each enrolled for real")] = 1000,
    period: Annotated[float, typer.Option(help="telemetry period per device, s")] = 5.0,
    case_rate: Annotated[float, typer.Option(help="escalations per second, fleet-wide")] = 1.0,
    warmup: Annotated[float, typer.Option(help="minutes left out of the slope")] = 10.0,
    sample_s: Annotated[float, typer.Option(help="seconds between RSS samples")] = 60.0,
    agent_fps: Annotated[float, typer.Option(help="frame rate of the agent's clip")] = 2.0,
    db: Annotated[str, typer.Option(help="sqlite or postgres")] = "sqlite",
    log: Annotated[Path | None, typer.Option(help="also append each sample here (JSONL)")] = None,
) -> None:
    """RSS of the cloud, the broker and a real agent every minute; MB/h after warm-up.

    Example: edgefleet bench soak --minutes 60 --devices 1000
    """
    from edgefleet.shared.logs import configure_logging

    configure_logging("WARNING")
    # `kill` (SIGTERM) ends the soak like Ctrl-C: its processes are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    row = soak(
        minutes=minutes,
        devices=devices,
        period_s=period,
        case_rate=case_rate,
        sample_s=sample_s,
        agent_fps=agent_fps,
        db=db,
        log=log,
    )
    samples = row.pop("samples")
    print(json.dumps(row), flush=True)
    lost = row["cases_sent"] - row["answered"]
    print(
        f"\n## soak: {minutes:g} min, {devices} devices every {period:g} s + {case_rate:g} "
        f"case/s, one real agent at {agent_fps:g} fps; warm-up cut {warmup:g} min"
    )
    print("| process | RSS first / after warm-up / last MB | growth after warm-up MB/h |")
    print("| --- | --- | --- |")
    kept = [s for s in samples if s["minute"] >= warmup]
    for name in ("cloud", "broker", "agent"):
        key = f"{name}_mb"
        slope = growth_mb_per_h([(s["minute"], s[key]) for s in kept])
        first_kept = kept[0][key] if kept else None
        print(f"| {name} | {samples[0][key]} / {first_kept} / {samples[-1][key]} | {slope} |")
    print(
        f"\ncases lost: {lost}, processed twice: {row['processed_twice']}; "
        f"agent last seen {row['agent_last_seen']}, agent cases {row['agent_cases']}"
    )
    if kept:
        first, last = kept[0]["gauges"], samples[-1]["gauges"]
        print("\ncloud gauges (after warm-up -> last):")
        for key in sorted(set(first) | set(last)):
            print(f"  {key}: {first.get(key)} -> {last.get(key)}")


if __name__ == "__main__":
    app()
