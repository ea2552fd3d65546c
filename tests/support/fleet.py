"""Fleet test support: the shipped cloud app served for real, a broker from the generated
config, and a device side with real ONNX Runtime loads."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgefleet.bench.harness import ServerThread
from edgefleet.cloud.app import create_app
from edgefleet.cloud.auth import key_digest
from edgefleet.cloud.settings import CloudSettings
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.shared.wire import WireMessage
from tests.support.broker import MosquittoBroker, free_port

OPERATOR_KEY = "op-test-key-0123456789"


def fleet_broker(registry: DeviceRegistry, folder: Path) -> MosquittoBroker:
    """A real Mosquitto run exactly as `fleet broker-files` configures it (dynamic-security
    plugin, per-device ACLs, bound client ids), on a free port of 127.0.0.1."""
    from edgefleet.fleet.acl import BrokerListener, write_broker_files

    port = free_port()
    files = write_broker_files(registry, folder, BrokerListener(port, "127.0.0.1"))
    return MosquittoBroker(folder, port, generated=files.config_file).start()


@dataclass
class FleetServer:
    """The cloud app that ships (`edgefleet.cloud.app.create_app`: registry, rollouts, model
    store, operator auth, its one error handler), served for real by uvicorn, without MQTT
    ingest; the desired states it would publish go to `publish` (default: `sent`)."""

    workdir: Path
    publish: Callable[[WireMessage, bool], None] | None = None
    events_interval_s: float = 0.5
    sent: list[tuple[WireMessage, bool]] = field(default_factory=list)

    def start(self) -> FleetServer:
        port = free_port()
        settings = CloudSettings(
            data_dir=self.workdir,
            http={"port": port, "events_interval_s": self.events_interval_s},
            ingest={"enabled": False},
            models={"preload": False},
            api_keys=[{"name": "ops", "sha256": key_digest(OPERATOR_KEY)}],
        )
        app = create_app(settings)
        services = app.state.services
        self.db, self.registry = services.db, services.fleet_registry
        self.rollouts, self.store = services.rollouts, services.model_store
        self.case_store = services.store
        self.rollouts.desired.publish = self.publish or self._record
        self.http = ServerThread(app, port).start()
        return self

    def deploy(self, name: str, version: str, group: str = "lab") -> None:
        """A rollout of NAME@VERSION from the store to `group`, rolled back at once: its
        devices may download the model from now on."""
        view = self.rollouts.create(
            {
                "group": group,
                "image": "ghcr.io/acme/edge@sha256:" + "1" * 64,
                "models": [{"name": name, "version": version}],
                "soak_s": 0,
            }
        )
        self.rollouts.cancel(view.id)

    def _record(self, wire: WireMessage, retain: bool) -> None:
        self.sent.append((wire, retain))

    @property
    def url(self) -> str:
        return self.http.url

    def stop(self) -> None:
        self.http.stop()


# --- a device side for tests: real ONNX Runtime loads and warm-ups ------------------------


def tiny_onnx(path: Path, scale: float = 2.0) -> Path:
    """A one-node ONNX model (y = x * scale) written to `path`."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "s"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor("s", TensorProto.FLOAT, [1], [scale])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


class OnnxControl:
    """An `edgefleet.edge.control.AgentControl` that loads and warms models with ONNX Runtime.

    Used where a whole edge agent is not needed: the swap is real (a file that is not a
    working ONNX model fails warm-up and the old model stays), reports go to `publish`.
    """

    def __init__(self, publish, initial: list | None = None):
        self.publish = publish
        self.models: dict[str, object] = {m.name: m for m in (initial or [])}
        self.sessions: dict[str, object] = {}
        self.swaps: list[str] = []

    def publish_reported(self, state) -> None:
        self.publish(state)

    def swap_model(self, ref, path: Path):
        import numpy as np
        import onnxruntime as ort

        from edgefleet.shared.errors import EdgefleetError
        from edgefleet.shared.messages import ModelInfo

        try:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            inp = session.get_inputs()[0]
            shape = [d if isinstance(d, int) else 1 for d in inp.shape]
            session.run(None, {inp.name: np.zeros(shape, dtype=np.float32)})
        except Exception as exc:  # ONNX Runtime's own errors: the old model keeps running
            raise EdgefleetError(f"warm-up of {ref.name} failed: {exc}") from None
        self.sessions[ref.name] = session
        self.models[ref.name] = ref
        self.swaps.append(f"{ref.name}@{ref.version}")
        return ModelInfo(
            name=ref.name, version=ref.version, sha256=ref.sha256, backend="onnxruntime-cpu"
        )

    def current_models(self) -> list:
        return list(self.models.values())
