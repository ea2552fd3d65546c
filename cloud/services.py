"""The orchestrator's parts, built once from the settings and wired together.

`CloudServices.build(settings)` makes the real thing (store, registry, models, router,
cascade, queue, MQTT sender and ingest, drift watch); tests and benchmarks pass their own
`registry` or `loader` through the same constructor instead of patching anything.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgefleet.cloud.auth import Authenticator
from edgefleet.cloud.cache import VerdictCache
from edgefleet.cloud.cascade import Cascade, ModelLoader, ModelPool
from edgefleet.cloud.drift import DriftWatch
from edgefleet.cloud.ingest import Ingest
from edgefleet.cloud.jobs import DecodeImage
from edgefleet.cloud.liveness import LivenessWatch
from edgefleet.cloud.processor import CaseProcessor
from edgefleet.cloud.refusals import RefusalBudget
from edgefleet.cloud.registry import Registry
from edgefleet.cloud.replica import ReplicaIdentity
from edgefleet.cloud.router import Router, RouteSpec
from edgefleet.cloud.sender import Sender
from edgefleet.cloud.settings import CloudSettings
from edgefleet.cloud.store import CaseStore
from edgefleet.shared.db import Database
from edgefleet.shared.executor.fallback import report as backend_report
from edgefleet.shared.executor.triton_backend import report as triton_report
from edgefleet.shared.image_ref import resolve_digest
from edgefleet.shared.imaging import ImageLimits, decode_image
from edgefleet.shared.imaging.budget import DecodeBudget
from edgefleet.shared.models.base import Model
from edgefleet.shared.models.registry import ModelRegistry
from edgefleet.shared.mqtt import make_client
from edgefleet.shared.private import private_dir
from edgefleet.shared.topics import Topics
from edgefleet.shared.wire import WireMessage

log = logging.getLogger(__name__)


def model_registry(settings: CloudSettings) -> ModelRegistry:
    """The built-in manifest, overridden by the operator's (`models.manifest`)."""
    registry = ModelRegistry.default()
    if settings.models.manifest is not None:
        registry = registry.merge(ModelRegistry.from_file(settings.models.manifest))
    return registry


def default_loader(settings: CloudSettings) -> ModelLoader:
    from edgefleet.shared.models import load_model

    registry = model_registry(settings)

    def load(name: str) -> Model:
        return load_model(name, settings=settings.execution, registry=registry)

    return load


@dataclass
class CloudServices:
    settings: CloudSettings
    db: Database
    store: CaseStore
    registry: Registry
    auth: Authenticator
    router: Router
    cache: VerdictCache
    pool: ModelPool
    cascade: Cascade
    processor: CaseProcessor
    drift: DriftWatch
    replica: str
    identity: ReplicaIdentity
    refusals: RefusalBudget
    decode_budget: DecodeBudget  # every image decode in this process draws on it
    ingest: Ingest | None = None
    liveness: LivenessWatch | None = None  # with the ingest: devices heard over MQTT
    fleet_registry: Any = None  # edgefleet.fleet.registry.DeviceRegistry: the fleet is here
    rollouts: Any = None  # edgefleet.fleet.rollout.RolloutController
    model_store: Any = None  # edgefleet.fleet.models.ModelStore: files devices download by NAME@VER
    _started: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def build(
        cls,
        settings: CloudSettings,
        *,
        registry: Registry | None = None,
        loader: ModelLoader | None = None,
        db: Database | None = None,
    ) -> CloudServices:
        private_dir(settings.data_dir)
        if settings.device_master_key is None:
            log.warning(
                "no device_master_key: device signing keys are stored unsealed in the store; "
                "anyone who reads %s can sign as any device. Set EDGEFLEET_CLOUD_DEVICE_"
                "MASTER_KEY (a Fernet key) before enrolling real devices",
                settings.resolved_database_url().split("@")[-1],
            )
        db = db or Database.connect(settings.resolved_database_url())
        store = CaseStore(db, settings.data_dir / "images")
        fleet_registry = rollouts = None
        if registry is None:
            from edgefleet.fleet.service import DeviceRegistry

            master = settings.device_master_key
            fleet_registry = DeviceRegistry(
                db,
                master_key=master.get_secret_value() if master else None,
                history_bucket_s=settings.telemetry.bucket_s,
                history_retention_s=settings.telemetry.retention_days * 86400,
            )
            registry = fleet_registry
        identity = (
            ReplicaIdentity.fixed(settings.ingest.client_id)
            if settings.ingest.client_id
            else ReplicaIdentity.claim(settings.data_dir)
        )
        replica = identity.name
        cache = VerdictCache(
            settings.cache.size, settings.cache.min_score, settings.cache.max_bytes
        )
        pool = ModelPool(
            settings.models.served,
            loader or default_loader(settings),
        )
        pool.on_loaded = lambda name, info: cache.model_version(name, info.version)
        router = Router(
            RouteSpec(model=settings.models.primary),
            path=settings.rules.file,
            poll_s=settings.rules.poll_s,
            default_timeout_s=settings.models.timeout_s,
            models=settings.models.served,
        )
        cascade = Cascade(
            pool,
            cache,
            lighter=settings.models.lighter,
            accept_edge_min_score=settings.rules.accept_edge_min_score,
        )
        limits = ImageLimits(
            max_bytes=settings.http.max_upload_bytes,
            max_pixels=settings.images.max_pixels,
            max_side=settings.images.max_side,
            max_decode_bytes=settings.images.max_decode_bytes,
        )
        # one budget for every decode in the process: REST, /v1/infer and MQTT cases
        budget = DecodeBudget(
            settings.images.decode_budget_bytes,
            wait_s=settings.images.decode_wait_s,
            retry_after_s=settings.queue.retry_after_s,
        )

        def decode(data: bytes) -> np.ndarray:
            return decode_image(data, limits=limits, budget=budget)

        sender = None
        client = None
        if settings.ingest.enabled:
            client = make_client(settings.mqtt, replica)
            sender = Sender(client, registry, Topics(settings.mqtt.topic_root))
        processor = CaseProcessor(
            store,
            router,
            cascade,
            decode,
            replica=replica,
            workers=settings.queue.workers,
            batch_max=settings.queue.batch_max,
            max_pending=settings.queue.max_pending,
            max_pending_per_device=settings.queue.max_pending_per_device,
            retry_after_s=settings.queue.retry_after_s,
            max_held=settings.ingest.held_max or settings.ingest.receive_maximum,
            publish=sender.verdict if sender else None,
            publish_status=sender.status if sender else None,
        )
        model_store = None
        if fleet_registry is not None:
            from edgefleet.fleet.service import ModelStore, RolloutController

            # the directory `edgefleet fleet model-add` writes to (FleetSettings.data_dir
            # defaults to the cloud's), so NAME@VER deployments resolve to its files
            model_store = ModelStore(
                settings.data_dir / "models", base_url=settings.resolved_public_url()
            )
            if settings.public_url is None and settings.http.host not in ("127.0.0.1", "::1"):
                log.warning(
                    "public_url is not set: model download links will name %s; set "
                    "public_url to the address devices reach",
                    model_store.base_url,
                )
            rollouts = RolloutController(
                fleet_registry,
                db,
                sender.wire if sender else _no_broker,
                model_store=model_store,
                resolve_image=resolve_digest,
            )
        ingest = liveness = None
        if client is not None:
            if fleet_registry is not None:  # one query now, not one per device in the first seconds
                fleet_registry.keys.load()
            ingest = Ingest(
                settings.mqtt,
                client,
                registry,
                processor,
                share_group=settings.ingest_share_group(),
                receive_maximum=settings.ingest.receive_maximum,
                light_queue=settings.ingest.light_queue,
                light_queue_bytes=settings.ingest.light_queue_bytes,
                light_workers=settings.ingest.light_workers,
                light_flush_s=settings.ingest.light_flush_s,
                client_id=replica,
                max_payload_bytes=settings.http.max_upload_bytes,
                max_skew_s=settings.ingest.max_skew_s,
                replay_max_entries=settings.ingest.replay_max_entries,
                replay_max_bytes=settings.ingest.replay_max_bytes,
                session_expiry_s=settings.ingest.session_expiry_s,
                on_reported=rollouts.on_reported if rollouts is not None else None,
            )
            listening = ingest
            liveness = LivenessWatch(
                registry,
                silence_s=settings.liveness.silence_s,
                listening=lambda: listening.connected,
            )
        services = cls(
            settings=settings,
            db=db,
            store=store,
            registry=registry,
            auth=Authenticator(settings.api_keys, registry),
            router=router,
            cache=cache,
            pool=pool,
            cascade=cascade,
            processor=processor,
            drift=DriftWatch(store.lookup, settings.drift),
            replica=replica,
            identity=identity,
            refusals=RefusalBudget(settings.queue.max_refusals_per_device),
            decode_budget=budget,
            ingest=ingest,
            liveness=liveness,
            fleet_registry=fleet_registry,
            rollouts=rollouts,
            model_store=model_store,
        )
        # its workers last: a case swept at once (this replica's from before a restart)
        # finds its verdict's way out wired
        processor.start()
        return services

    @property
    def decode(self) -> DecodeImage:
        return self.processor.decode

    def start(self) -> None:
        """Start background work (idempotent): model preload, MQTT ingest, drift, rollouts."""
        with self._lock:
            if self._started:
                return
            self._started = True
        if self.settings.models.preload:
            self.pool.preload()
        if self.ingest is not None:
            self.ingest.start()
        if self.liveness is not None:
            self.liveness.start()
        if self.rollouts is not None:
            self.rollouts.start()
        self.drift.start()

    def close(self) -> None:
        """Stop taking messages (the broker keeps what comes for our session), let the
        cases in hand finish and their verdicts reach the broker, then disconnect."""
        if self.liveness is not None:
            self.liveness.stop()
        if self.ingest is not None:
            self.ingest.hold()
        if self.rollouts is not None:
            self.rollouts.stop()
        self.drift.stop()
        self.processor.close()
        if self.ingest is not None:
            self.ingest.stop()
        self.pool.close()
        self.db.close()
        self.identity.release()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """What /readyz reports: each model, the broker, the store; reasons when not ready."""
        reasons: list[str] = []
        self.router.maybe_reload()  # a rules file edited while no case comes is seen here
        models = self.pool.status()
        degraded: list[str] = []
        if self.settings.models.preload:
            for model in models:
                if not model["warmed"]:
                    state = model["error"] or ("loading" if model["loading"] else "not loaded")
                    # a model whose Triton is down is answered down the fallback chain: the
                    # replica still serves, so it stays ready and says so
                    remote = model["error_code"] == "triton_unavailable"
                    (degraded if remote else reasons).append(f"model {model['name']}: {state}")
        triton = triton_report()
        degraded += [
            f"triton {t['url']} model {t['model']}: {t['reason']}" for t in triton if t["reason"]
        ]
        broker = {"required": self.ingest is not None, "connected": False}
        if self.ingest is not None:
            broker["connected"] = self.ingest.connected
            if not self.ingest.connected:
                reasons.append("broker not connected")
        store = {"dialect": self.db.dialect, "writable": True}
        try:
            self.store.ledger.check_writable()
        except Exception as exc:  # any failure to write means not ready; the reason says why
            store["writable"] = False
            reasons.append(f"store not writable: {exc}")
        body = {
            "ready": not reasons,
            "reasons": reasons,
            "degraded": degraded,
            "models": models,
            "triton": triton,
            "broker": broker,
            "store": store,
            "queue_depth": self.processor.depth,
            "rules_error": self.router.last_error,
            "execution": backend_report(),
        }
        return not reasons, body


def _no_broker(wire: WireMessage, retain: bool) -> None:
    log.warning("no broker configured: desired state for %s not published", wire.topic)
