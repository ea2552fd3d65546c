"""`edgefleet demo`: the whole system on one machine, with a score at the end.

It starts a real Mosquitto, the cloud orchestrator and N edge agents as separate
processes (edgefleet.demo.steps), enrolled through `edgefleet fleet enroll` like real
devices, each agent playing a scene that the demo renders with known text and caches
(edgefleet.demo.video, edgefleet.demo.cache). While it runs it shows what the fleet view
shows; at the end it scores the edge alone, the edge with the cloud's corrections and the
cloud alone against the ground truth, times the verdicts and counts the bytes each device
sent (edgefleet.demo.report).
"""

from __future__ import annotations

import json
import secrets
import signal
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from edgefleet.shared.errors import ConfigError, EdgefleetError

if TYPE_CHECKING:  # the command imports the heavy parts only when it runs
    from collections.abc import Callable

    from rich.console import Console

    from edgefleet.demo.chaos import Fault
    from edgefleet.demo.ledger import Ledger
    from edgefleet.demo.report import DeviceScore
    from edgefleet.demo.stack import Child, Device, Stack
    from edgefleet.demo.steps import Plan
    from edgefleet.demo.supervisor import Supervisor


# ----------------------------------------------------------------- the command


def demo(
    duration: float = typer.Option(
        60.0, "--duration", min=5.0, help="seconds the agents run before the final report"
    ),
    devices: int = typer.Option(3, "--devices", min=1, max=16, help="edge agents to start"),
    video: list[Path] = typer.Option(
        None,
        "--video",
        help="your own video file(s) instead of the rendered scenes (repeat the option; "
        "a ground truth JSON beside a video, same name, enables its accuracy columns)",
    ),
    port: int = typer.Option(0, "--port", min=0, max=65535, help="HTTP port (0 = a free one)"),
    seed: int = typer.Option(0, "--seed", min=0, help="seed of the rendered scenes"),
    workdir: Path = typer.Option(
        None, "--workdir", help="keep everything (logs, stores) here; default: temporary"
    ),
    linger: float = typer.Option(
        60.0,
        "--linger",
        min=0.0,
        help="seconds the dashboard stays up after the report (Ctrl-C ends it sooner)",
    ),
    chaos: bool = typer.Option(
        False,
        "--chaos",
        help="while it runs, kill and freeze the broker, kill a cloud replica and an agent, "
        "cut an agent's uplink (a seeded schedule); the report's ledger proves nothing was lost",
    ),
    chaos_seed: int = typer.Option(
        None, "--chaos-seed", min=0, help="seed of the chaos schedule (default: a random one)"
    ),
) -> None:
    """Run the whole system here: broker, cloud, agents, dashboard, report.

    No arguments and no network needed. It starts Mosquitto, the cloud and
    DEVICES edge agents, each enrolled with `edgefleet fleet enroll` and fed
    a rendered video of known moving text (cached in ~/.cache/edgefleet/demo).
    Live: fps, escalations, cloud corrections. On Ctrl-C or after DURATION
    seconds it prints edge-only, edge+cloud and cloud-only accuracy, the share
    escalated, the bytes uplinked and how fast verdicts came back; the
    dashboard stays up LINGER seconds more. With --chaos, faults hit the real
    processes while it runs (each shown with how long until healthy again) and
    the report's ledger follows every case from its device to the answer back.

    Example: edgefleet demo --duration 30 --devices 2

    Example: edgefleet demo --chaos --duration 120 --chaos-seed 7
    """
    from rich.console import Console

    from edgefleet.demo.report import report_table, story, total_score
    from edgefleet.demo.stack import (
        MOSQUITTO_MISSING,
        Interrupted,
        Stack,
        mosquitto_binary,
    )
    from edgefleet.demo.steps import Plan
    from edgefleet.shared.ports import free_port

    console = Console()
    try:
        mosquitto = mosquitto_binary()
    except ConfigError:
        console.print(f"[red]error:[/] {MOSQUITTO_MISSING}")
        raise typer.Exit(2) from None
    temp = None
    if workdir is None:
        temp = tempfile.TemporaryDirectory(prefix="edgefleet-demo-")
        root = Path(temp.name)
    else:
        root = Path(workdir).expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
    stack = Stack(root, console)
    interrupted = threading.Event()
    # Ctrl-C, `kill` and a closed terminal all end the demo the same orderly way: the
    # children run in their own sessions and would otherwise outlive it.
    previous = {
        sig: signal.signal(sig, lambda *_: interrupted.set())
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    faults: tuple[Fault, ...] = ()
    if chaos:
        from edgefleet.demo.chaos import chaos_schedule

        seed_used = secrets.randbelow(10_000) if chaos_seed is None else chaos_seed
        device_ids = [f"demo-cam-{i + 1:02d}" for i in range(devices)]
        faults = tuple(chaos_schedule(seed_used, duration, device_ids))
        console.print(f"chaos schedule (seed {seed_used}; --chaos-seed {seed_used} repeats it):")
        for fault in faults:
            console.print(f"  {fault.describe()}")
    plan = Plan(
        root=root,
        mosquitto=mosquitto,
        duration=duration,
        device_ids=[f"demo-cam-{i + 1:02d}" for i in range(devices)],
        videos=video or [],
        seed=seed,
        http_port=port or free_port(),
        broker_port=free_port(),
        operator_key="efk_" + secrets.token_urlsafe(24),
        faults=faults,
    )
    try:
        scores, ledger = _run(stack, plan, interrupted)
        console.print()
        console.print(report_table(scores))
        total = total_score(scores)
        for line in story(total, len(scores)):
            console.print(line)
        console.print()
        console.print(ledger.table())
        for line in ledger.verdict_lines():
            console.print(line)
        if plan.chaos and (ledger.lost or ledger.duplicates_processed):
            console.print("[red]the chaos run lost or re-did cases[/]: see the ledger above")
            raise typer.Exit(1)
        if total.frames == 0:
            console.print("[red]no frame was processed[/]: see the agents' logs")
            raise typer.Exit(1)
        if linger > 0:
            console.print(
                f"\nthe dashboard stays up {linger:.0f} s more: {plan.dashboard_url} "
                "— Ctrl-C ends it now"
            )
            interrupted.wait(linger)
    except Interrupted:
        console.print("stopped during start-up: nothing ran yet, so there is no report")
        raise typer.Exit(130) from None
    except EdgefleetError as exc:
        console.print(f"[red]error:[/] {exc}")
        console.print(f"logs are in {root / 'logs'}" if temp is None else "")
        raise typer.Exit(1) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stack.stop_all()
        if temp is not None:
            temp.cleanup()


def _run(
    stack: Stack, plan: Plan, interrupted: threading.Event
) -> tuple[list[DeviceScore], Ledger]:
    import httpx
    import psutil

    from edgefleet.demo.report import jpeg_bytes_per_frame, score_device
    from edgefleet.demo.stack import UplinkMeter
    from edgefleet.demo.steps import start_up

    console = stack.console
    http = httpx.Client(
        base_url=plan.base_url,
        headers={"Authorization": f"Bearer {plan.operator_key}"},
        timeout=5.0,
    )
    supervisor: Supervisor | None = None
    try:
        started = start_up(stack, plan, http, interrupted)
        fleet_devices: list[Device] = started["agents"]
        meter: UplinkMeter = started["meter"]
        console.print(f"dashboard: [link={plan.dashboard_url}]{plan.dashboard_url}[/link]")
        console.print(f"REST API:  {plan.base_url}/docs   (operator key: {plan.operator_key})")
        console.print(f"work dir:  {plan.root}   — Ctrl-C stops the demo early")
        console.print(f"up in {time.time() - psutil.Process().create_time():.1f} s\n")
        supervisor = _supervise(stack, plan, http, started)
        pace = _live(stack, plan, http, fleet_devices, supervisor, started, interrupted)
        interrupted.clear()  # from here a (second) Ctrl-C skips waiting for late answers
        _drain(fleet_devices, supervisor, console, interrupted)
        with console.status("stopping the agents (they flush their outboxes)…"):
            for device in fleet_devices:
                supervisor.forget(device.device_id)  # asked to stop: not to be restarted
            for device in fleet_devices:
                if device.agent is not None:
                    device.agent.terminate()  # all at once: each flushes in parallel
            for device in fleet_devices:
                if device.agent is not None:
                    device.agent.stop(30.0)
        meter.close()
        cases = _collect_cases(http, fleet_devices, console, interrupted)
        sampled = _cloud_only(
            http, started["models"], fleet_devices, not plan.videos, console, interrupted
        )
        scores = [score_device(d, cases, meter.bytes.get(d.device_id, 0)) for d in fleet_devices]
        for score, device in zip(scores, fleet_devices, strict=True):
            score.jpeg_bytes_per_frame = jpeg_bytes_per_frame(device.video)
            score.fps, score.cpu_ms_per_frame = pace[device.device_id]
            score.cloud_only_accuracy = sampled.get(device.device_id)
        ledger = _ledger(plan, fleet_devices)
        (plan.root / "report.json").write_text(json.dumps([s.as_json() for s in scores], indent=1))
        (plan.root / "ledger.json").write_text(
            json.dumps(
                {
                    "ledger": ledger.as_json(),
                    "faults": [f.describe() for f in plan.faults],
                    "incidents": [i.as_json() for i in supervisor.incidents],
                },
                indent=1,
            )
        )
        return scores, ledger
    finally:
        if supervisor is not None:
            supervisor.stop()
        http.close()


def _supervise(stack: Stack, plan: Plan, http: Any, started: dict[str, Any]) -> Supervisor:
    """Every component under the supervisor (a death restarts it), each with its health;
    each incident goes to the dashboard's event feed."""
    from edgefleet.demo.chaos import SECOND_CLOUD, broker_answers, get_json
    from edgefleet.demo.events import post_incident
    from edgefleet.demo.supervisor import Supervised, Supervisor

    supervisor = Supervisor(notify=lambda incident: post_incident(http, incident))

    def again(name: str) -> Callable[[], Child]:
        return lambda: stack.restart(supervisor.components[name].child)

    def ready(url: str) -> Callable[[], bool]:
        return lambda: get_json(f"{url}/readyz").get("ready") is True

    supervisor.add(
        Supervised(
            "broker",
            started["broker"],
            again("broker"),
            lambda: broker_answers(plan.broker_port),
        )
    )
    supervisor.add(Supervised("cloud", started["cloud"], again("cloud"), ready(plan.base_url)))
    if SECOND_CLOUD in started:
        child, port = started[SECOND_CLOUD]
        url = f"http://127.0.0.1:{port}"
        supervisor.add(Supervised(SECOND_CLOUD, child, again(SECOND_CLOUD), ready(url)))
    for device in started["agents"]:

        def connected(device: Device = device) -> bool:
            url = f"http://127.0.0.1:{device.health_port}/healthz"
            return get_json(url).get("broker_connected") is True

        def restarted(child: Child, device: Device = device) -> None:
            device.agent = child

        supervisor.add(
            Supervised(
                device.device_id, device.agent, again(device.device_id), connected, restarted
            )
        )
    supervisor.start()
    return supervisor


def _live(
    stack: Stack,
    plan: Plan,
    http: Any,
    devices: list[Device],
    supervisor: Supervisor,
    started_up: dict[str, Any],
    interrupted: threading.Event,
) -> dict[str, tuple[float | None, float | None]]:
    """The live table until `duration` or Ctrl-C, with the chaos schedule playing if any;
    each agent's fps and CPU ms per frame."""
    import httpx
    import psutil
    from rich.console import Group
    from rich.live import Live

    from edgefleet.demo.chaos import SECOND_CLOUD, ChaosRunner, ChaosTargets
    from edgefleet.demo.report import agent_pace, incidents_table, live_table, read_jsonl

    def cpu_s(device: Device) -> float | None:
        try:
            times = psutil.Process(device.agent.process.pid).cpu_times()  # type: ignore[union-attr]
        except (psutil.Error, AttributeError):
            return None
        return float(times.user + times.system)

    runner = None
    if plan.chaos:
        second = f"http://127.0.0.1:{started_up[SECOND_CLOUD][1]}"
        clouds = {"cloud": plan.base_url, SECOND_CLOUD: second}
        runner = ChaosRunner(
            list(plan.faults),
            supervisor,
            ChaosTargets(
                broker_port=plan.broker_port,
                cloud_urls=clouds,
                cloud_replicas={name: f"demo-{name}" for name in clouds},
                database=plan.root / "cloud" / "cloud.db",
                agent_health={
                    d.device_id: f"http://127.0.0.1:{d.health_port}/healthz" for d in devices
                },
                relays=started_up["relays"],
            ),
        )
    cpu_before = {d.device_id: cpu_s(d) for d in devices}
    since = time.time()
    started = time.monotonic()
    fleet: dict[str, dict[str, Any]] = {}

    def view() -> Group:
        return Group(
            live_table(devices, fleet, time.monotonic() - started),
            incidents_table(supervisor.recent()),
        )

    if runner is not None:
        runner.start()
    try:
        with Live(view(), console=stack.console, refresh_per_second=2) as live:
            while not interrupted.is_set() and time.monotonic() - started < plan.duration:
                try:
                    listing = http.get("/v1/devices").json().get("devices", [])
                    fleet = {d["device_id"]: d for d in listing}
                except (httpx.HTTPError, ValueError):
                    pass  # the table keeps the last answer
                live.update(view())
                supervisor.check()
                interrupted.wait(1.0)
    finally:
        if runner is not None:
            runner.stop()
    until = time.time()
    pace = {}
    for device in devices:
        before, after = cpu_before[device.device_id], cpu_s(device)
        used = None if before is None or after is None else after - before
        pace[device.device_id] = agent_pace(read_jsonl(device.results), since, until, used)
    return pace


def _drain(
    devices: list[Device],
    supervisor: Supervisor,
    console: Console,
    skip: threading.Event,
    timeout_s: float = 180.0,
    quiet_s: float = 75.0,  # over an unanswered case's resend (CHAOS_RESEND_UNANSWERED_S)
) -> None:
    """Stop the agents' capture (no new cases) and wait until each case they made has its
    answer on its device: the ledger then checks the whole round trip. Gives up after
    `timeout_s`, after `quiet_s` without progress, or on Ctrl-C (the ledger says what is
    missing and where it stopped)."""
    import signal as signals

    from edgefleet.demo.report import read_jsonl

    signalled: dict[str, float] = {}  # device id → when its current agent was told
    told: set[int] = set()
    deadline = time.monotonic() + timeout_s
    last_progress, last_pending = time.monotonic(), -1
    with console.status("waiting for every case's answer on its device…") as status:
        while True:
            supervisor.check()
            for device in devices:  # an agent restarted meanwhile is told again
                agent = device.agent
                if agent is not None and agent.alive() and agent.process.pid not in told:
                    signalled[device.device_id] = time.time()
                    agent.process.send_signal(signals.SIGUSR1)
                    told.add(agent.process.pid)
            made: set[str] = set()
            answered: set[str] = set()
            capturing = 0  # agents whose pipeline may still make a case
            for device in devices:
                drained_at = 0.0
                for row in read_jsonl(device.results):
                    if row.get("kind") == "escalated":
                        made.add(row["case_id"])
                    elif row.get("kind") == "verdict":
                        answered.add(row["case_id"])
                    elif row.get("kind") == "drained":
                        drained_at = max(drained_at, float(row.get("t", 0.0)))
                capturing += drained_at < signalled.get(device.device_id, float("inf"))
            pending = len(made - answered) + capturing
            if pending != last_pending:
                last_pending, last_progress = pending, time.monotonic()
            status.update(
                f"waiting for every case's answer on its device… {pending} of {len(made)} due "
                "(Ctrl-C: report now)"
            )
            now = time.monotonic()
            if pending == 0 or now > deadline or now - last_progress > quiet_s:
                return
            if skip.wait(1.0):
                return


def _ledger(plan: Plan, devices: list[Device]) -> Ledger:
    """The ledger from the agents' records, their outboxes and the cloud's store."""
    from edgefleet.cloud.store import CaseStore
    from edgefleet.demo.ledger import build_ledger, outbox_case_ids
    from edgefleet.demo.report import read_jsonl
    from edgefleet.shared.db import Database

    db = Database.connect(f"sqlite:///{plan.root / 'cloud' / 'cloud.db'}")
    try:
        accounts = CaseStore(db, plan.root / "cloud" / "images").ledger.accounts()
    finally:
        db.close()
    rows = {d.device_id: read_jsonl(d.results) for d in devices}
    outboxes = {
        d.device_id: outbox_case_ids(plan.root / "devices" / d.device_id / "outbox.db")
        for d in devices
    }
    return build_ledger(rows, accounts, outboxes)


def _cloud_only(
    http: Any,
    models: list[dict[str, Any]],
    devices: list[Device],
    cached: bool,
    console: Console,
    skip: threading.Event,
) -> dict[str, float]:
    """The cloud-only column: the primary model on sampled frames of each scene with a truth.

    Asked once the agents have stopped and their cases are answered, so that it never
    delays a verdict; a rendered scene keeps its score in the cache, so only a demo on new
    scenes (or a new reader: model files, options, version) asks at all. Ctrl-C: the
    scores there are.
    """
    from edgefleet.cloud.settings import ModelsSettings
    from edgefleet.demo.cloud_only import cache_file, reader_key, score_cloud_only

    primary = ModelsSettings().primary  # the demo's cloud.yaml keeps the default
    sha256 = {m.get("name"): m.get("sha256") for m in models}.get(primary)
    if not sha256:
        return {}
    key = reader_key(primary, sha256)
    by_video: dict[Path, float | None] = {}
    with console.status(f"cloud-only column: {primary} on sampled frames of each scene…"):
        for device in devices:
            if device.truth is None or device.video in by_video or skip.is_set():
                continue
            keep = cache_file(device.video, primary, key) if cached else None
            score = score_cloud_only(http, primary, key, device.video, device.truth, skip, keep)
            by_video[device.video] = None if score is None else score.accuracy
    return {
        d.device_id: accuracy for d in devices if (accuracy := by_video.get(d.video)) is not None
    }


def _collect_cases(
    http: Any,
    devices: list[Device],
    console: Console,
    skip: threading.Event,
    timeout_s: float = 120.0,
    quiet_s: float = 30.0,
) -> dict[str, dict[str, Any]]:
    """The cloud's record of every escalated case, waiting for the answers still due.

    Cases the agents flushed on the way out are still in the broker or the cloud's queue;
    stop waiting when all are answered, after `timeout_s`, when nothing moved for `quiet_s`, or
    on Ctrl-C (the report then counts the rest as unanswered).
    """
    import httpx

    from edgefleet.demo.report import read_jsonl

    wanted = {
        row["case_id"]
        for device in devices
        for row in read_jsonl(device.results)
        if row.get("kind") == "escalated"
    }
    cases: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    last_progress = time.monotonic()
    with console.status("waiting for the cloud's answers…") as status:
        while True:
            for case_id in sorted(wanted - set(cases)):
                try:
                    response = http.get(f"/v1/escalations/{case_id}")
                except httpx.HTTPError:
                    continue
                if response.status_code == 200 and response.json().get("verdict"):
                    cases[case_id] = response.json()
                    last_progress = time.monotonic()
            pending = len(wanted) - len(cases)
            status.update(
                f"waiting for the cloud's answers… {pending} of {len(wanted)} due "
                "(Ctrl-C: report now)"
            )
            now = time.monotonic()
            if pending == 0 or now > deadline or now - last_progress > quiet_s:
                return cases
            if skip.wait(1.0):
                return cases
