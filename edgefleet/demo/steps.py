"""How `edgefleet demo` gets everything up: its scenes, and its start-up steps.

The steps (edgefleet.demo.startup runs them) are the scenes ‖ enrollment → Mosquitto and
the uplink meter ‖ the cloud (it subscribes as soon as the broker listens, then warms its
models) → the agents, once the cloud's subscription is in place.
"""

from __future__ import annotations

import math
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefleet.shared.errors import ConfigError, EdgefleetError

if TYPE_CHECKING:
    from edgefleet.demo.chaos import Fault
    from edgefleet.demo.stack import Child, Device, Stack, UplinkMeter
    from edgefleet.demo.video import GroundTruth


def agent_niceness(devices: int) -> int:
    """The nice value that makes the agents together weigh no more than the cloud.

    Here the agents share the cores that, in a real fleet, the cloud would not share with
    them; the cloud needs little (its budget of cases, demo_stack.CLOUD_CASES_PER_MIN, is a
    share of a core) but needs it at once, or verdicts queue: on 2 loaded cores, with the
    agents at its own priority, each escalated frame took it many times longer, and with 8
    agents the verdicts came back tens of seconds late. Each nice step is a factor of about 1.25 in
    the scheduler's weight, so n agents at nice log(n)/log(1.25) weigh as much as one
    process at nice 0.
    """
    return min(19, max(0, math.ceil(math.log(devices) / math.log(1.25))))


# Length of a rendered scene. The agents play it in a loop and restart its frame index at
# each pass, so the ground truth holds however long the demo runs.
SCENE_S = 60.0


def prepare_videos(
    cache: Path,
    devices: int,
    videos: list[Path] | None,
    seed: int,
    stop: threading.Event | None = None,
) -> list[tuple[Path, GroundTruth | None]]:
    """One video per device: the user's (cycled), or a rendered scene of known text from
    the cache (edgefleet.demo.cache), the missing ones rendered side by side."""
    from concurrent.futures import ThreadPoolExecutor

    from edgefleet.demo.cache import cached_scene
    from edgefleet.demo.video import VideoSpec

    if videos:
        checked = [_users_video(Path(v)) for v in videos]
        return [checked[i % len(checked)] for i in range(devices)]
    from edgefleet.demo.scenes.scenarios import SCENARIOS

    # every device plays every scenario, each device in its own order and with its own text
    specs = [
        VideoSpec(
            duration_s=SCENE_S,
            seed=seed + i,
            scenarios=SCENARIOS[i % len(SCENARIOS) :] + SCENARIOS[: i % len(SCENARIOS)],
        )
        for i in range(devices)
    ]

    def one(spec: VideoSpec) -> tuple[Path, GroundTruth | None]:
        if stop is not None and stop.is_set():
            from edgefleet.demo.stack import Interrupted

            raise Interrupted("the videos to be rendered")
        return cached_scene(spec, cache)

    # OpenCV drawing, blurring and encoding release the GIL: threads use every core.
    with ThreadPoolExecutor(max_workers=max(1, min(devices, os.cpu_count() or 1))) as pool:
        return list(pool.map(one, specs))


def _users_video(video: Path) -> tuple[Path, GroundTruth | None]:
    """A user's file, checked before anything starts: the agent reads it with OpenCV, and
    a JSON of the same name beside it must be a ground truth (it enables the scoring)."""
    import cv2

    from edgefleet.demo.video import GroundTruth, truth_path

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


@dataclass(frozen=True)
class Plan:
    """What the command decided before anything starts."""

    root: Path
    mosquitto: str
    duration: float
    device_ids: list[str]
    videos: list[Path]
    seed: int
    http_port: int
    broker_port: int
    operator_key: str
    faults: tuple[Fault, ...] = ()  # the chaos schedule (--chaos), empty without

    @property
    def chaos(self) -> bool:
        return bool(self.faults)

    @property
    def cut_uplinks(self) -> set[str]:
        """Devices whose uplink the schedule cuts: they reach the broker through a relay."""
        return {f.target for f in self.faults if f.kind == "uplink_cut"}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def dashboard_url(self) -> str:
        return f"{self.base_url}/#key={self.operator_key}"


def start_up(stack: Stack, plan: Plan, http: Any, interrupted: threading.Event) -> dict[str, Any]:
    """Everything up, each step as soon as what it needs is there (edgefleet.demo.startup):

    videos (cached or rendered) ‖ enrollment → broker ‖ cloud (it connects as soon as the
    broker listens, then warms its models) → agents (once the cloud's subscription is in
    place, so no early case finds nobody to take it), while the models keep warming.
    """
    from edgefleet.demo.cache import cache_dir
    from edgefleet.demo.chaos import (
        CHAOS_KEEPALIVE_S,
        CHAOS_RESEND_UNANSWERED_S,
        SECOND_CLOUD,
        get_json,
    )
    from edgefleet.demo.proxy import UplinkRelay
    from edgefleet.demo.stack import (
        Device,
        UplinkMeter,
        agent_env,
        edgefleet_argv,
        enroll_devices,
        port_open,
        wait_until,
        write_cloud_config,
    )
    from edgefleet.demo.startup import Step, StepContext, run_steps
    from edgefleet.shared.ports import free_port

    root, n = plan.root, len(plan.device_ids)

    def readyz() -> dict[str, Any]:
        import httpx

        try:
            body = http.get("/readyz").json()
        except (httpx.HTTPError, ValueError):
            return {}
        return body if isinstance(body, dict) else {}

    def videos(ctx: StepContext) -> list[tuple[Path, GroundTruth | None]]:
        if not plan.videos:
            ctx.note(f"{n} scenes from {cache_dir()} (rendered when missing)")
        return prepare_videos(cache_dir(), n, plan.videos, plan.seed, ctx.stop)

    def enroll(ctx: StepContext) -> Any:
        return enroll_devices(
            root, plan.device_ids, plan.broker_port, plan.http_port, progress=ctx.note
        )

    def broker(ctx: StepContext) -> Child:
        config = ctx.results["enroll"].broker_config
        child = stack.start("mosquitto", [plan.mosquitto, "-c", str(config)])
        wait_until(lambda: port_open(plan.broker_port), 30, "the broker", [child], ctx.stop)
        return child

    def meter(ctx: StepContext) -> UplinkMeter:
        counter = UplinkMeter(plan.broker_port, "cloud", ctx.results["enroll"].cloud_password)
        if not counter.wait_subscribed(30):
            counter.close()
            raise EdgefleetError("the uplink meter got no SUBACK from the broker in 30 s")
        return counter

    def start_cloud(ctx: StepContext, name: str, http_port: int) -> Child:
        cloud_yaml = write_cloud_config(
            root,
            http_port,
            plan.broker_port,
            plan.operator_key,
            ctx.results["enroll"].cloud_password,
            name=name,
            # fixed ids under --chaos: the schedule finds the cases a replica holds
            client_id=f"demo-{name}" if plan.chaos else None,
            keepalive_s=CHAOS_KEEPALIVE_S if plan.chaos else None,
        )
        child = stack.start(name, edgefleet_argv("cloud", "serve", "-c", str(cloud_yaml)))
        ctx.note("starting; it subscribes once the broker listens")
        url = f"http://127.0.0.1:{http_port}/readyz"
        wait_until(
            lambda: bool(get_json(url).get("broker", {}).get("connected")),
            300,
            f"{name} to subscribe to the broker",
            [child],
            ctx.stop,
        )
        return child

    def cloud(ctx: StepContext) -> Child:
        return start_cloud(ctx, "cloud", plan.http_port)

    def second_cloud(ctx: StepContext) -> tuple[Child, int]:
        port = free_port()
        return start_cloud(ctx, SECOND_CLOUD, port), port

    def agents(ctx: StepContext) -> tuple[list[Device], dict[str, UplinkRelay]]:
        scenes = ctx.results["videos"]
        enrolled = ctx.results["enroll"]
        devices = [
            Device(
                device_id=device_id,
                bundle=enrolled.bundles[device_id],
                video=scenes[i][0],
                truth=scenes[i][1],
                results=root / "devices" / device_id / "results.jsonl",
                health_port=free_port(),
            )
            for i, device_id in enumerate(plan.device_ids)
        ]
        relays = {d: UplinkRelay(plan.broker_port).start() for d in sorted(plan.cut_uplinks)}
        for device in devices:
            device.results.parent.mkdir(parents=True, exist_ok=True)
            relay = relays.get(device.device_id)
            env = agent_env(
                device,
                root,
                n,
                broker_port=relay.port if relay else None,
                keepalive_s=CHAOS_KEEPALIVE_S if plan.chaos else None,
                resend_unanswered_s=CHAOS_RESEND_UNANSWERED_S if plan.chaos else None,
            )
            device.agent = stack.start(
                device.device_id,
                [
                    sys.executable,
                    "-m",
                    "edgefleet.demo.agent",
                    str(device.bundle / "edge.yaml"),
                    str(device.results),
                ],
                env=env,
                nice=agent_niceness(n),
            )
        children = [d.agent for d in devices if d.agent is not None]

        def loaded() -> bool:
            up = sum(port_open(d.health_port) for d in devices)
            ctx.note(f"{up} of {n} loaded their model")
            return up == n

        wait_until(loaded, 300, "the edge agents to load their models", children, ctx.stop)
        return devices, relays

    def models(ctx: StepContext) -> list[dict[str, Any]]:
        child = ctx.results["cloud"]

        def warm() -> bool:
            body = readyz()
            ctx.note(", ".join(body.get("reasons", [])) or "waiting for /readyz")
            return body.get("ready") is True

        wait_until(warm, 300, "the cloud's models to warm (/readyz)", [child], ctx.stop)
        return list(readyz().get("models", []))

    steps = [
        Step("videos", "scenes", videos),
        Step("enroll", "enrolling devices (fleet enroll)", enroll),
        Step("broker", "Mosquitto", broker, after=("enroll",)),
        Step("meter", "uplink meter (bytes per device)", meter, after=("broker",)),
        Step("cloud", "cloud orchestrator", cloud, after=("enroll",)),
        Step("models", "cloud models (load + warm)", models, after=("cloud",)),
    ]
    if plan.chaos:  # a second replica in the share group, to be killed mid-ingest
        steps.append(Step(SECOND_CLOUD, "second cloud replica (--chaos)", second_cloud, ("cloud",)))
    steps.append(
        Step(
            "agents",
            f"{n} edge agents",
            agents,
            after=("videos", "broker", "meter", "cloud", *([SECOND_CLOUD] if plan.chaos else [])),
        )
    )
    results = run_steps(steps, stack.console, interrupted).results
    results["agents"], results["relays"] = results["agents"]
    return results
