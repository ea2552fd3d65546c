"""The edge agent: builds sources, pipeline, policy, outbox, uplink, telemetry and health.

Every part is built whole in the constructor, in the order a failure should surface: the
health port is bound first (a taken port fails before the slow model load), then the
outbox is opened (recovering a corrupt one) and the model loaded and warmed. If any part
fails, what was already built is closed again. `start()` only connects and starts
threads. `stop()` is the graceful SIGTERM path: stop capture, drain the pipeline, give
the uplink a moment to flush, checkpoint the outbox to disk, publish `offline`,
disconnect.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from edgefleet.edge.cases import CaseWriter
from edgefleet.edge.clock import ClockWatch
from edgefleet.edge.device_lock import DeviceLock
from edgefleet.edge.health import HealthReport, HealthServer
from edgefleet.edge.host_runtime import runtime_from_settings
from edgefleet.edge.model import Predictor, load_deployed, open_model
from edgefleet.edge.outbox import Outbox
from edgefleet.edge.pipeline import Pipeline, Work
from edgefleet.edge.policy import Escalation, EscalationPolicy
from edgefleet.edge.settings import EdgeSettings, SourceSettings
from edgefleet.edge.slot import ModelSlot
from edgefleet.edge.sources import VideoSource, make_source
from edgefleet.edge.sources.capture import Capture
from edgefleet.edge.telemetry import TelemetryReporter, WindowStats, gpu_probe
from edgefleet.edge.tracks import TrackReport, report
from edgefleet.edge.updater import DesiredStateApplier
from edgefleet.edge.uplink import Uplink
from edgefleet.edge.verdicts import MatchedVerdict, VerdictBook
from edgefleet.shared.errors import DeviceTaken
from edgefleet.shared.messages import (
    CloudStatus,
    CloudVerdict,
    DesiredState,
    Detection,
    EscalationCase,
    ModelInfo,
    ModelRef,
    ReportedState,
)
from edgefleet.shared.topics import Channel
from edgefleet.shared.wire import Verified, WireMessage, serialise

log = logging.getLogger(__name__)

ResultCallback = Callable[[str, int, list[Detection]], None]
TrackCallback = Callable[[str, int, list[TrackReport]], None]


class Agent:
    """One edge agent process. Implements `edgefleet.edge.control.AgentControl` for the updater."""

    def __init__(
        self,
        settings: EdgeSettings,
        *,
        model: Predictor | None = None,
        source_factory: Callable[[SourceSettings], VideoSource] = make_source,
        wall_clock: Callable[[], float] = time.time,
    ):
        s = self.settings = settings
        with ExitStack() as undo:  # closes what was built if a later part fails
            self.lock = DeviceLock(s.outbox.path, s.device_id)  # before any port or file
            undo.callback(self.lock.release)
            # None when disabled in the settings
            self.health: HealthServer | None = None
            if s.health.enabled:
                self.health = HealthServer(
                    s.health.host,
                    s.health.port,
                    health=lambda: self.report.health(),
                    ready=lambda: self.report.ready(),
                    verdicts=lambda: self.report.recent_verdicts(),
                )
                undo.callback(self.health.stop)
            self.outbox = Outbox(
                s.outbox.path,
                max_messages=s.outbox.max_messages,
                max_bytes=s.outbox.max_bytes,
                synchronous=s.outbox.synchronous,
            )
            undo.callback(self.outbox.close)
            if self.outbox.recovered_from is not None:
                log.error("outbox was corrupt; the old file is at %s", self.outbox.recovered_from)
            self.model = ModelSlot(model or open_model(s.model, s.pipeline.infer_workers))
            undo.callback(self.model.close)
            log.info("model %s ready", self.model.info.model_dump_json())
            self.stats = WindowStats()
            self.policy = EscalationPolicy(s.policy)
            self.verdicts = VerdictBook(tracker=self.policy.tracker, budget=self.policy.budget)
            self.uplink = Uplink(
                s.mqtt,
                s.uplink,
                device_id=s.device_id,
                key=s.key_bytes(),
                outbox=self.outbox,
                agent_version=s.agent_version,
                on_message=self._on_message,
            )
            self.captures = [Capture(cfg, source_factory(cfg)) for cfg in s.streams]
            self.pipeline = Pipeline(
                self.captures, self.model, self.policy, self._sink, self.stats, s.pipeline
            )
            self.cases = CaseWriter(
                s.device_id, outbox=self.outbox, verdicts=self.verdicts, model=self.model
            )
            self.telemetry = TelemetryReporter(
                s.device_id,
                interval_s=s.telemetry_interval_s,
                qos=s.uplink.telemetry_qos,
                captures=self.captures,
                stats=self.stats,
                outbox=self.outbox,
                uplink=self.uplink,
                model=self.model,
                verdicts=self.verdicts,
                gpu=gpu_probe(),
            )
            undo.callback(self.telemetry.gpu.close)
            self.clock = ClockWatch(s.api_url, s.clock, now=wall_clock)
            self.report = HealthReport(
                s.device_id,
                uptime_s=self.telemetry.uptime_s,
                captures=self.captures,
                outbox=self.outbox,
                uplink=self.uplink,
                cases=self.cases,
                policy=self.policy,
                verdicts=self.verdicts,
                clock=self.clock,
            )
            s.state_dir.mkdir(parents=True, exist_ok=True)
            token = s.device_token
            self.updater = DesiredStateApplier(
                self,
                s.state_dir,
                runtime_from_settings(s.runtime, s.state_dir),
                token=token.get_secret_value() if token else None,
                api_url=s.api_url,
            )
            self.on_result: list[ResultCallback] = []  # each frame's own reads
            self.on_tracks: list[TrackCallback] = []  # each frame's live tracks (cloud-corrected)
            self._desired_pool = ThreadPoolExecutor(1, thread_name_prefix="desired")
            self._swap_lock = threading.Lock()
            self._stopped = False
            undo.pop_all()

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> Agent:
        """Connect and start every thread; if that fails, what already started is stopped
        again (so the process ends instead of leaving threads behind)."""
        try:
            self.clock.start()  # first: a clock the cloud will refuse is said before anything
            self.uplink.start()
            self.pipeline.start()
            for capture in self.captures:
                log.info("stream %s: %s", capture.stream_id, capture.source.describe())
                capture.start()
            if self.health is not None:
                self.health.start()
                s = self.settings.health
                log.info("health on http://%s:%d/healthz", s.host, self.health.port)
            self.telemetry.start()
        except BaseException:
            self.stop(drain_timeout_s=2.0, flush_timeout_s=0.0)
            raise
        return self

    def stop_capture(self, drain_timeout_s: float = 10.0) -> None:
        """Stop the capture threads and let the pipeline finish what it holds."""
        for capture in self.captures:
            capture.stop(timeout=2.0)
        self.pipeline.stop(drain_timeout_s)

    def stop(self, *, drain_timeout_s: float = 10.0, flush_timeout_s: float = 5.0) -> None:
        """Graceful: stop capture, drain, flush, publish offline, close (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self.stop_capture(drain_timeout_s)
        self.telemetry.stop()
        self.clock.stop()
        if self.uplink.connected.is_set():
            self.uplink.flush(flush_timeout_s)
        self.uplink.stop(publish_offline=True)
        stop_waiting = getattr(self.updater.runtime, "stop_waiting", None)
        if stop_waiting is not None:  # an update handed to the host updater: stop waiting
            stop_waiting()
        self._desired_pool.shutdown(wait=True, cancel_futures=True)
        self.outbox.checkpoint()
        self.outbox.close()
        if self.health is not None:
            self.health.stop()
        self.model.close()
        self.lock.release()
        log.info("agent stopped")

    def run_forever(self) -> None:
        """Start, then block until SIGTERM/SIGINT or every stream has ended; stop gracefully."""
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        try:
            self.start()
            while not stop.wait(0.5):
                if self.uplink.taken_over.is_set():
                    raise DeviceTaken(
                        f"device id {self.settings.device_id} is already connected: another "
                        "agent holds its broker session"
                    )
                if self.captures and all(c.finished for c in self.captures) and self.pipeline.idle:
                    log.info("every stream has ended")
                    break
        finally:
            self.stop()

    # --- the application's callbacks ---------------------------------------------------

    def add_escalation_callback(self, callback: Callable[[EscalationCase], None]) -> None:
        """Called with each case once it is safely in the outbox."""
        self.cases.callbacks.append(callback)

    def add_verdict_callback(self, callback: Callable[[MatchedVerdict], None]) -> None:
        self.verdicts.callbacks.append(callback)

    # --- the pipeline's output ---------------------------------------------------------

    def _sink(self, work: Work, escalations: list[Escalation]) -> None:
        frame = work.frame
        for callback in self.on_result:
            callback(frame.stream_id, frame.index, work.detections)
        if self.on_tracks:
            reports = [report(t) for t in self.policy.tracker.live(frame.stream_id)]
            for track_callback in self.on_tracks:
                track_callback(frame.stream_id, frame.index, reports)
        for escalation in escalations:
            self.cases.write(work, escalation)
        if escalations:
            self.uplink.wake()

    # --- incoming: verdicts and desired state ------------------------------------------

    def _on_message(self, channel: Channel, verified: Verified) -> None:
        message = verified.message
        if channel is Channel.RESULTS and isinstance(message, CloudVerdict):
            self.outbox.answers.answered(message.case_id)  # its copy is no longer needed
            self.verdicts.receive(message)
        elif channel is Channel.RESULTS and isinstance(message, CloudStatus):
            self.policy.budget.cloud_wait(message.expected_wait_s)
        elif channel is Channel.DESIRED and isinstance(message, DesiredState):
            self._desired_pool.submit(self._apply_desired, message, verified.wire)

    def _apply_desired(self, desired: DesiredState, signed: WireMessage | None) -> None:
        try:
            self.updater.handle(desired, signed=signed)
        except Exception:  # the updater reports its own failures; never kill the agent
            log.exception("applying desired state %s failed", desired.deployment_id)

    # --- AgentControl ------------------------------------------------------------------

    def publish_reported(self, state: ReportedState) -> None:
        self.outbox.put(serialise(state), retain=True)
        self.uplink.wake()

    def swap_model(self, ref: ModelRef, path: Path) -> ModelInfo:
        """Load + warm the new model beside the old one; swap only once it answers. The old
        model closes when the last frame still running on it is done."""
        with self._swap_lock:
            new = load_deployed(ref, path, self.settings)
            self.model.swap(new, ref)
        log.info("model swapped to %s@%s (%s)", ref.name, ref.version, ref.sha256[:12])
        return new.info

    def current_models(self) -> list[ModelRef]:
        if self.model.ref is not None:
            return [self.model.ref]
        info = self.model.info
        if info.sha256 is None:
            return []
        return [
            ModelRef(
                name=info.name, version=info.version, url=f"builtin:{info.name}", sha256=info.sha256
            )
        ]
