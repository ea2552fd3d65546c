"""The edge agent: wires sources, pipeline, policy, outbox, uplink, telemetry and health.

Lifecycle: `start()` opens the outbox (recovering a corrupt one), loads and warms the
model, connects, starts one capture thread per stream and the pipeline. `stop()` is the
graceful SIGTERM path: stop capture, drain the pipeline, give the uplink a moment to
flush, checkpoint the outbox to disk, publish `offline`, disconnect.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter

from edgefleet.edge.model import Predictor, edge_execution, open_model
from edgefleet.edge.outbox import Outbox
from edgefleet.edge.pipeline import Pipeline, Work
from edgefleet.edge.policy import Escalation, EscalationPolicy
from edgefleet.edge.settings import EdgeSettings, SourceSettings
from edgefleet.edge.sources import VideoSource, make_source
from edgefleet.edge.sources.capture import Capture
from edgefleet.edge.telemetry import GpuProbe, WindowStats, gpu_probe, host_usage
from edgefleet.edge.tracks import TrackReport, report
from edgefleet.edge.updater import DesiredStateApplier, runtime_from_settings
from edgefleet.edge.uplink import Uplink
from edgefleet.edge.verdicts import MatchedVerdict, VerdictBook
from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.messages import (
    CloudStatus,
    CloudVerdict,
    DesiredState,
    Detection,
    DeviceTelemetry,
    EscalationCase,
    EscalationCounters,
    ModelInfo,
    ModelRef,
    ReportedState,
    Sha256,
    StreamTelemetry,
)
from edgefleet.shared.topics import Channel
from edgefleet.shared.wire import Verified, fit_meta

if TYPE_CHECKING:  # imported when enabled, in _start()
    from edgefleet.edge.health import HealthServer

log = logging.getLogger(__name__)

META_TRIMMED = Counter(
    "ef_edge_case_meta_trimmed_total", "Cases whose edge result was cut to fit in ef-meta"
)

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
    ):
        self.settings = settings
        self.key = settings.key_bytes()
        self._model: Predictor | None = model
        self._model_ref: ModelRef | None = None
        self._source_factory = source_factory
        self._swap_lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped = False
        self._started_at = time.monotonic()
        self.stats = WindowStats()
        self.policy = EscalationPolicy(settings.policy)
        self.verdicts = VerdictBook(tracker=self.policy.tracker, budget=self.policy.budget)
        self.on_result: list[ResultCallback] = []  # each frame's own reads
        self.on_tracks: list[TrackCallback] = []  # each frame's live tracks (cloud-corrected)
        self.on_escalation: list[Callable[[EscalationCase], None]] = []
        self.escalations_created = 0
        self.outbox: Outbox | None = None
        self.uplink: Uplink | None = None
        self.pipeline: Pipeline | None = None
        self.captures: list[Capture] = []
        self.health: HealthServer | None = None
        self._gpu: GpuProbe | None = None
        self._updater: DesiredStateApplier | None = None
        self._desired_pool: ThreadPoolExecutor | None = None
        self._telemetry_thread = threading.Thread(
            target=self._telemetry_loop, name="telemetry", daemon=True
        )

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> Agent:
        """Start everything; if any part fails, what already started is stopped again (so a
        taken port or a missing model ends the process instead of leaving threads behind)."""
        try:
            return self._start()
        except BaseException:
            self.stop(drain_timeout_s=2.0, flush_timeout_s=0.0)
            raise

    def _start(self) -> Agent:
        s = self.settings
        if s.health.enabled:  # bind first: a taken port fails before anything runs
            from edgefleet.edge.health import HealthServer

            self.health = HealthServer(
                s.health.host,
                s.health.port,
                health=self.health_report,
                ready=self.readiness,
                verdicts=self.recent_verdicts,
            )
        self.outbox = Outbox(
            s.outbox.path,
            max_messages=s.outbox.max_messages,
            max_bytes=s.outbox.max_bytes,
            synchronous=s.outbox.synchronous,
        )
        if self.outbox.recovered_from is not None:
            log.error("outbox was corrupt; the old file is at %s", self.outbox.recovered_from)
        if self._model is None:
            self._model = open_model(s.model, s.pipeline.infer_workers)
        log.info("model %s ready", self._model.info.model_dump_json())
        self._updater = self._make_updater()
        self.uplink = Uplink(
            s.mqtt,
            s.uplink,
            device_id=s.device_id,
            key=self.key,
            outbox=self.outbox,
            agent_version=s.agent_version,
            on_message=self._on_message,
        ).start()
        self.captures = [Capture(cfg, self._source_factory(cfg)) for cfg in s.streams]
        self.pipeline = Pipeline(
            self.captures, self.current_model, self.policy, self._sink, self.stats, s.pipeline
        )
        self.pipeline.start()
        for capture in self.captures:
            log.info("stream %s: %s", capture.stream_id, capture.source.describe())
            capture.start()
        self._gpu = gpu_probe()
        host_usage()  # prime psutil's CPU counter
        if self.health is not None:
            self.health.start()
            log.info("health on http://%s:%d/healthz", s.health.host, self.health.port)
        self._telemetry_thread.start()
        return self

    def stop_capture(self, drain_timeout_s: float = 10.0) -> None:
        """Stop the capture threads and let the pipeline finish what it holds."""
        for capture in self.captures:
            capture.stop(timeout=2.0)
        if self.pipeline is not None:
            self.pipeline.stop(drain_timeout_s)

    def add_escalation_callback(self, callback: Callable[[EscalationCase], None]) -> None:
        """Called with each case once it is safely in the outbox."""
        self.on_escalation.append(callback)

    def stop(self, *, drain_timeout_s: float = 10.0, flush_timeout_s: float = 5.0) -> None:
        """Graceful: stop capture, drain, flush, publish offline, close (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        self.stop_capture(drain_timeout_s)
        if self._telemetry_thread.is_alive():
            self._telemetry_thread.join(2.0)
        if self.uplink is not None:
            if self.uplink.connected.is_set():
                self.uplink.flush(flush_timeout_s)
            self.uplink.stop(publish_offline=True)
        if self._desired_pool is not None:
            self._desired_pool.shutdown(wait=True, cancel_futures=True)
        if self.outbox is not None:
            self.outbox.checkpoint()
            self.outbox.close()
        if self.health is not None:
            self.health.stop()
        if self._gpu is not None:
            self._gpu.close()
        if self._model is not None:
            self._model.close()
        log.info("agent stopped")

    def run_forever(self) -> None:
        """Start, then block until SIGTERM/SIGINT, then stop gracefully."""
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        try:
            self.start()
            while not stop.wait(0.5):
                if (
                    self.captures
                    and all(c.finished for c in self.captures)
                    and (self.pipeline is not None and self.pipeline.idle)
                ):
                    log.info("every stream has ended")
                    break
        finally:
            self.stop()

    # --- the pipeline's output ---------------------------------------------------------

    def current_model(self) -> Predictor:
        assert self._model is not None
        return self._model

    def _sink(self, work: Work, escalations: list[Escalation]) -> None:
        frame = work.frame
        for callback in self.on_result:
            callback(frame.stream_id, frame.index, work.detections)
        if self.on_tracks:
            reports = [report(t) for t in self.policy.tracker.live(frame.stream_id)]
            for track_callback in self.on_tracks:
                track_callback(frame.stream_id, frame.index, reports)
        if self.outbox is not None:
            for escalation in escalations:
                self._queue_case(work, escalation)
        if escalations and self.uplink is not None:
            self.uplink.wake()

    def _queue_case(self, work: Work, escalation: Escalation) -> None:
        assert self.outbox is not None
        frame = work.frame
        edge_result = (
            list(escalation.edge_result)
            if escalation.edge_result is not None
            else work.detections[:1000]
        )
        case = EscalationCase(
            device_id=self.settings.device_id,
            stream_id=frame.stream_id,
            frame_index=frame.index,
            reason=escalation.reason,
            edge_result=edge_result,
            model=work.model or self.current_model().info,
            content_type="image/jpeg",
            crop=escalation.crop,
            track_id=escalation.track_id,
            tiles=list(escalation.tiles),
        )
        fitted, meta = fit_meta(case)
        if len(fitted.edge_result) < len(case.edge_result):
            META_TRIMMED.inc()
            log.warning(
                "case %s: %d of %d edge lines kept so its metadata fits in MQTT",
                case.case_id,
                len(fitted.edge_result),
                len(case.edge_result),
            )
            case = fitted
        topic = self.uplink.topics.escalations(self.settings.device_id) if self.uplink else ""
        if self.outbox.put("escalation", topic, meta, escalation.jpeg):
            self.escalations_created += 1
            self.verdicts.expect(
                case.case_id,
                frame.stream_id,
                case.edge_result,
                frame_index=frame.index,
                score=escalation.score,
            )
            for callback in self.on_escalation:
                callback(case)

    # --- incoming: verdicts and desired state ------------------------------------------

    def _on_message(self, channel: Channel, verified: Verified) -> None:
        message = verified.message
        if channel is Channel.RESULTS and isinstance(message, CloudVerdict):
            if self.outbox is not None:
                self.outbox.answered(message.case_id)  # its copy is no longer needed
            self.verdicts.receive(message)
        elif channel is Channel.RESULTS and isinstance(message, CloudStatus):
            self.policy.budget.cloud_wait(message.expected_wait_s)
        elif channel is Channel.DESIRED and isinstance(message, DesiredState):
            assert self._desired_pool is not None  # made in start(), before the uplink
            self._desired_pool.submit(self._apply_desired, message)

    def _apply_desired(self, desired: DesiredState) -> None:
        assert self._updater is not None
        try:
            self._updater.handle(desired)
        except Exception:  # the updater reports its own failures; never kill the agent
            log.exception("applying desired state %s failed", desired.deployment_id)

    def _make_updater(self) -> DesiredStateApplier:
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        self._desired_pool = ThreadPoolExecutor(1, thread_name_prefix="desired")
        token = self.settings.device_token
        return DesiredStateApplier(
            self,
            self.settings.state_dir,
            runtime_from_settings(self.settings.runtime, self.settings.state_dir),
            token=token.get_secret_value() if token else None,
            api_url=self.settings.api_url,
        )

    def recent_verdicts(self) -> list[dict[str, Any]]:
        return [
            {
                "verdict": m.verdict.model_dump(mode="json"),
                "stream_id": m.stream_id,
                "frame_index": m.frame_index,
                "edge_result": None
                if m.edge_result is None
                else [d.model_dump(mode="json") for d in m.edge_result],
                "agrees": m.agrees,
                "track_id": m.track_id,
                "track_result": m.track_result,
                "track_known": m.track_known,
            }
            for m in list(self.verdicts.recent)
        ]

    def add_verdict_callback(self, callback: Callable[[MatchedVerdict], None]) -> None:
        self.verdicts.callbacks.append(callback)

    # --- AgentControl ------------------------------------------------------------------

    def publish_reported(self, state: ReportedState) -> None:
        assert self.outbox is not None and self.uplink is not None
        topic = self.uplink.topics.reported(self.settings.device_id)
        self.outbox.put("reported", topic, state.model_dump_json().encode(), retain=True)
        self.uplink.wake()

    def swap_model(self, name: str, path: Path, sha256: Sha256) -> ModelInfo:
        """Load + warm the new model beside the old one; swap only once it answers."""
        from edgefleet.shared.models import load_model
        from edgefleet.shared.models.registry import ModelRegistry

        with self._swap_lock:
            registry = ModelRegistry.default()
            spec = registry.get(name)
            if spec.file is None:
                raise EdgefleetError(
                    f"{name} is a pipeline of several files; deploy its components instead"
                )
            path = Path(path).resolve()
            registry.add(
                spec.model_copy(
                    update={"file": path.name, "sha256": sha256, "base_dir": path.parent}
                )
            )
            pipelines = [
                s.name
                for s in registry.specs()
                if s.ocr and name in (s.ocr.det, s.ocr.rec, s.ocr.cls)
            ]
            target = self.settings.model.name if self.settings.model.name in pipelines else name
            try:
                execution = self.settings.model.execution or edge_execution(
                    self.settings.pipeline.infer_workers
                )
                new = load_model(target, settings=execution, registry=registry)
            except EdgefleetError:
                raise
            except Exception as exc:  # a backend's own error: wrap it, the old model stays
                raise EdgefleetError(f"loading {name} from {path} failed: {exc}") from exc
            old, self._model = self._model, new
            self._model_ref = ModelRef(
                name=name,
                version=_version_of(path, sha256, spec.version),
                url=path.as_uri(),
                sha256=sha256,
            )
            log.info("model swapped to %s (%s)", name, sha256[:12])
        if old is not None:
            threading.Timer(5.0, old.close).start()  # let in-flight frames finish on it
        return new.info

    def current_models(self) -> list[ModelRef]:
        if self._model_ref is not None:
            return [self._model_ref]
        info = self.current_model().info
        if info.sha256 is None:
            return []
        return [
            ModelRef(
                name=info.name, version=info.version, url=f"builtin:{info.name}", sha256=info.sha256
            )
        ]

    # --- telemetry and health ----------------------------------------------------------

    def _telemetry_loop(self) -> None:
        interval = self.settings.telemetry_interval_s
        next_at = time.monotonic() + interval
        while not self._stop.wait(min(0.5, max(0.0, next_at - time.monotonic()))):
            for capture in self.captures:
                capture.check_stall()
            if time.monotonic() >= next_at:
                next_at += interval
                try:
                    self.send_telemetry(interval)
                except Exception:  # telemetry must never stop the agent
                    log.exception("telemetry failed")

    def telemetry(self, window_s: float) -> DeviceTelemetry:
        assert self.outbox is not None
        streams = []
        for capture in self.captures:
            frames, latency = self.stats.take(capture.stream_id)
            streams.append(
                StreamTelemetry(
                    stream_id=capture.stream_id,
                    state=capture.state,
                    fps=round(frames / window_s, 3),
                    frames_dropped=capture.dropped,
                    latency_ms=latency,
                    reconnects=capture.reconnects,
                )
            )
        cpu, ram = host_usage()
        pending = self.outbox.depth("escalation")
        return DeviceTelemetry(
            device_id=self.settings.device_id,
            seq=self.outbox.next_seq(),
            uptime_s=round(time.monotonic() - self._started_at, 3),
            streams=streams,
            escalations=EscalationCounters(
                sent=self.uplink.sent.get("escalation", 0) if self.uplink else 0,
                pending=pending,
                dropped=self.outbox.dropped.get("escalation", 0),
            ),
            outbox_depth=self.outbox.depth(),
            outbox_dropped=self.outbox.dropped_total,
            cpu_pct=cpu,
            ram_used_mb=round(ram, 1),
            gpu=self._gpu.sample() if self._gpu else None,
            model=self.current_model().info,
            agreement_rate=self.verdicts.agreement_rate,
        )

    def send_telemetry(self, window_s: float) -> DeviceTelemetry:
        message = self.telemetry(window_s)
        assert self.outbox is not None and self.uplink is not None
        topic = self.uplink.topics.telemetry(self.settings.device_id)
        self.outbox.put(
            "telemetry",
            topic,
            message.model_dump_json().encode(),
            qos=self.settings.uplink.telemetry_qos,
        )
        self.uplink.wake()
        return message

    def health_report(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "device_id": self.settings.device_id,
            "uptime_s": round(time.monotonic() - self._started_at, 3),
            "broker_connected": bool(self.uplink and self.uplink.connected.is_set()),
            "streams": [
                {
                    "stream_id": c.stream_id,
                    "state": c.state,
                    "frames": c.frames,
                    "dropped": c.dropped,
                    "invalid": c.invalid,
                    "reconnects": c.reconnects,
                    "last_error": c.last_error,
                }
                for c in self.captures
            ],
            "outbox": {
                "depth": self.outbox.depth() if self.outbox else 0,
                "bytes": self.outbox.size_bytes if self.outbox else 0,
                "dropped": self.outbox.dropped if self.outbox else {},
                "recovered_from": str(self.outbox.recovered_from)
                if self.outbox and self.outbox.recovered_from
                else None,
            },
            "escalations_created": self.escalations_created,
            "suppressed": dict(self.policy.suppressed),
            "agreement_rate": self.verdicts.agreement_rate,
            "agreement_by_score_bucket": self.policy.budget.agreement(),
            "budget": {
                "spent": self.policy.budget.spent,
                "skipped_agreeing_buckets": self.policy.budget.skipped,
                "over_budget": self.policy.budget.over,
            },
            "verdicts_for_unknown_tracks": self.verdicts.unknown_tracks,
        }

    def readiness(self) -> tuple[bool, list[str]]:
        reasons = []
        if self._model is None:
            reasons.append("model not loaded")
        not_live = [c.stream_id for c in self.captures if c.state != "live"]
        if not_live:
            reasons.append(f"streams not live: {', '.join(not_live)}")
        if self.outbox is None or not self.outbox.writable():
            reasons.append("outbox not writable")
        return (not reasons, reasons)


def _version_of(path: Path, sha256: Sha256, default: str) -> str:
    """The version the updater filed the model under (`<version>-<sha12>/`), else `default`."""
    folder = path.parent.name
    suffix = f"-{sha256[:12]}"
    if folder.endswith(suffix) and len(folder) > len(suffix):
        return folder[: -len(suffix)][:64]
    return default
