"""`edgefleet demo`: the whole system on one machine, with a score at the end.

It starts a real Mosquitto, the cloud orchestrator and N edge agents as separate
processes, enrolled through `edgefleet fleet enroll` like real devices, each agent playing
a video that the demo renders with known text (edgefleet.demo_video). While it runs it
shows what the fleet view shows; at the end it scores the edge alone and the edge with
the cloud's corrections against the ground truth, and counts the bytes each device sent.
"""

from __future__ import annotations

import json
import secrets
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from edgefleet.shared.errors import ConfigError, EdgefleetError

if TYPE_CHECKING:  # the command imports the heavy parts only when it runs
    from rich.console import Console

    from edgefleet.demo_report import DeviceScore
    from edgefleet.demo_stack import Device, Stack
    from edgefleet.demo_video import GroundTruth


def prepare_videos(
    workdir: Path, devices: int, videos: list[Path] | None, seed: int, duration: float
) -> list[tuple[Path, GroundTruth | None]]:
    """One video per device: the user's (cycled), or rendered with known text."""
    from edgefleet.demo_video import VideoSpec, render_video

    if videos:
        checked = [_users_video(Path(v)) for v in videos]
        return [checked[i % len(checked)] for i in range(devices)]
    # Long enough that no agent loops within the run (startup included).
    spec = VideoSpec(duration_s=min(3600.0, duration + 60.0))
    rendered = []
    for i in range(devices):
        path = workdir / "videos" / f"scene-{i}.mp4"
        rendered.append((path, render_video(path, spec.model_copy(update={"seed": seed + i}))))
    return rendered


def _users_video(video: Path) -> tuple[Path, GroundTruth | None]:
    """A user's file, checked before anything starts: the agent reads it with OpenCV, and
    a JSON of the same name beside it must be a ground truth (it enables the scoring)."""
    import cv2

    from edgefleet.demo_video import GroundTruth, truth_path

    path = video.expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"--video {path}: no such file")
    capture = cv2.VideoCapture(str(path))
    try:
        readable, _ = capture.read()
    finally:
        capture.release()
    if not readable:
        raise ConfigError(f"--video {path}: OpenCV cannot decode a frame of it")
    truth_file = truth_path(path)
    if not truth_file.is_file():
        return path, None
    try:
        return path, GroundTruth.load(truth_file)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{truth_file} lies beside --video {path.name} but is not its ground truth: "
            f"{str(exc).splitlines()[0]}",
            hint="rename or remove it to run without accuracy scoring",
        ) from None


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
        None, "--workdir", help="keep everything (logs, stores, videos) here; default: temporary"
    ),
) -> None:
    """Run the whole system here: broker, cloud, agents, dashboard, report.

    No arguments and no network needed. It starts Mosquitto, the cloud and
    DEVICES edge agents, each enrolled with `edgefleet fleet enroll` and fed
    a rendered video of known moving text. Live: fps, escalations, cloud
    corrections. On Ctrl-C or after DURATION seconds it prints edge-only and
    edge+cloud accuracy, the share escalated and the bytes uplinked.

    Example: edgefleet demo --duration 30 --devices 2
    """
    from rich.console import Console

    from edgefleet.demo_report import pct, report_table, total_score
    from edgefleet.demo_stack import MOSQUITTO_MISSING, Interrupted, Stack, mosquitto_binary

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
    try:
        scores = _run(stack, mosquitto, duration, devices, video or [], port, seed, interrupted)
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
    console.print()
    console.print(report_table(scores))
    total = total_score(scores)
    if total.frames == 0:
        console.print("[red]no frame was processed[/]: see the agents' logs")
        raise typer.Exit(1)
    console.print(
        f"[bold]edge-only accuracy {pct(total.edge_accuracy)}, "
        f"edge+cloud {pct(total.combined_accuracy)}, "
        f"{pct(total.escalated_share)} of frames escalated, "
        f"{total.bytes_per_frame:,.0f} bytes uplinked per frame[/]"
    )
    if total.jpeg_bytes_per_frame and total.bytes_per_frame:
        console.print(
            f"streaming every frame as JPEG would send {total.jpeg_bytes_per_frame:,.0f} bytes "
            f"per frame: {total.jpeg_bytes_per_frame / total.bytes_per_frame:.1f}x more"
        )


def _run(
    stack: Stack,
    mosquitto: str,
    duration: float,
    n_devices: int,
    videos: list[Path],
    http_port: int,
    seed: int,
    interrupted: threading.Event,
) -> list[DeviceScore]:
    import httpx
    from rich.live import Live

    from edgefleet.demo_report import jpeg_bytes_per_frame, live_table, score_device
    from edgefleet.demo_stack import (
        Device,
        Interrupted,
        UplinkMeter,
        agent_env,
        edgefleet_argv,
        enroll_devices,
        free_port,
        port_open,
        wait_until,
        write_cloud_config,
    )

    console, root = stack.console, stack.workdir
    with console.status("rendering the demo videos…"):
        scenes = prepare_videos(root, n_devices, videos, seed, duration)
    if interrupted.is_set():
        raise Interrupted("the videos to be rendered")
    http_port = http_port or free_port()
    broker_port = free_port()
    operator_key = "efk_" + secrets.token_urlsafe(24)
    with console.status("enrolling devices with `edgefleet fleet enroll`…"):
        device_ids = [f"demo-cam-{i + 1:02d}" for i in range(n_devices)]
        enrolled = enroll_devices(root, device_ids, broker_port, http_port)
    if interrupted.is_set():
        raise Interrupted("the devices to be enrolled")
    cloud_yaml = write_cloud_config(
        root, http_port, broker_port, operator_key, enrolled.cloud_password
    )
    fleet_devices = [
        Device(
            device_id=device_id,
            bundle=enrolled.bundles[device_id],
            video=scenes[i][0],
            truth=scenes[i][1],
            results=root / "devices" / device_id / "results.jsonl",
            health_port=free_port(),
        )
        for i, device_id in enumerate(device_ids)
    ]

    with console.status("starting Mosquitto…"):
        broker = stack.start("mosquitto", [mosquitto, "-c", str(enrolled.broker_config)])
        wait_until(lambda: port_open(broker_port), 30, "the broker", [broker], interrupted)

    base = f"http://127.0.0.1:{http_port}"
    headers = {"Authorization": f"Bearer {operator_key}"}
    http = httpx.Client(base_url=base, headers=headers, timeout=5.0)

    def ready() -> bool:
        try:
            return http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    with console.status("starting the cloud orchestrator (loading and warming models)…"):
        cloud = stack.start("cloud", edgefleet_argv("cloud", "serve", "-c", str(cloud_yaml)))
        wait_until(ready, 300, "the cloud to be ready (/readyz)", [broker, cloud], interrupted)

    meter = UplinkMeter(broker_port, "cloud", enrolled.cloud_password)
    with console.status(f"starting {n_devices} edge agents…"):
        for device in fleet_devices:
            device.results.parent.mkdir(parents=True, exist_ok=True)
            device.agent = stack.start(
                device.device_id,
                [
                    sys.executable,
                    "-m",
                    "edgefleet.demo_agent",
                    str(device.bundle / "edge.yaml"),
                    str(device.results),
                ],
                env=agent_env(device, root),
            )
        agents = [d.agent for d in fleet_devices if d.agent is not None]
        wait_until(
            lambda: all(port_open(d.health_port) for d in fleet_devices),
            300,
            "the edge agents to load their models",
            [broker, cloud, *agents],
            interrupted,
        )

    console.print(f"dashboard: [link={base}/#key={operator_key}]{base}/#key={operator_key}[/link]")
    console.print(f"REST API:  {base}/docs   (operator key: {operator_key})")
    console.print(f"work dir:  {root}   — Ctrl-C stops the demo early\n")
    started = time.monotonic()
    fleet: dict[str, dict[str, Any]] = {}
    with Live(live_table(fleet_devices, fleet, 0), console=console, refresh_per_second=2) as live:
        while not interrupted.is_set() and time.monotonic() - started < duration:
            try:
                listing = http.get("/v1/devices").json().get("devices", [])
                fleet = {d["device_id"]: d for d in listing}
            except (httpx.HTTPError, ValueError):
                pass  # the table keeps the last answer
            live.update(live_table(fleet_devices, fleet, time.monotonic() - started))
            for child in [broker, cloud]:
                if not child.alive():
                    raise EdgefleetError(
                        f"{child.name} stopped unexpectedly; its log ends with:\n{child.tail()}",
                        code="demo_failed",
                    )
            interrupted.wait(1.0)

    interrupted.clear()  # from here a (second) Ctrl-C skips waiting for late answers
    with console.status("stopping the agents (they flush their outboxes)…"):
        for agent in agents:
            agent.terminate()  # all at once: each flushes in parallel
        for agent in agents:
            agent.stop(30.0)
    meter.close()
    cases = _collect_cases(http, fleet_devices, console, interrupted)
    scores = [score_device(d, cases, meter.bytes.get(d.device_id, 0)) for d in fleet_devices]
    for score, device in zip(scores, fleet_devices, strict=True):
        score.jpeg_bytes_per_frame = jpeg_bytes_per_frame(device.video)
    (root / "report.json").write_text(
        json.dumps([s.__dict__ | {"escalated_share": s.escalated_share} for s in scores], indent=1)
    )
    http.close()
    return scores


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

    from edgefleet.demo_report import read_jsonl

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
