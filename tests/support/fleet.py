"""Fleet test support: a real uvicorn server in a thread, and a seeded fleet app."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import uvicorn

from edgefleet.fleet.app import create_app
from edgefleet.fleet.models import ModelStore
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.fleet.rollout import RolloutController
from edgefleet.shared.db import Database
from edgefleet.shared.wire import WireMessage
from tests.support.broker import MosquittoBroker, free_port, wait_for_port

OPERATOR_KEY = "op-test-key-0123456789"


def fleet_broker(registry: DeviceRegistry, folder: Path) -> MosquittoBroker:
    """A real Mosquitto run exactly as `fleet broker-files` configures it (dynamic-security
    plugin, per-device ACLs, bound client ids), on a free port of 127.0.0.1."""
    from edgefleet.fleet.acl import BrokerListener, write_broker_files

    port = free_port()
    files = write_broker_files(registry, folder, BrokerListener(port, "127.0.0.1"))
    return MosquittoBroker(folder, port, generated=files.config_file).start()


class UvicornThread:
    """Serves an ASGI app on a free port of 127.0.0.1 until `stop`."""

    def __init__(self, app, port: int | None = None):
        self.port = port or free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
            )
        )
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> UvicornThread:
        self.thread.start()
        wait_for_port(self.port, timeout_s=30)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@dataclass
class FleetServer:
    """Registry + rollouts + model store behind the standalone fleet app, served for real."""

    workdir: Path
    publish: object = None
    events_interval_s: float = 0.5
    sent: list[tuple[WireMessage, bool]] = field(default_factory=list)

    def start(self) -> FleetServer:
        self.db = Database.connect(f"sqlite:///{self.workdir}/fleet.db")
        self.registry = DeviceRegistry(self.db)
        port = free_port()
        self.store = ModelStore(self.workdir / "models", base_url=f"http://127.0.0.1:{port}")
        self.rollouts = RolloutController(
            self.registry,
            self.db,
            self.publish or (lambda wire, retain: self.sent.append((wire, retain))),
            model_store=self.store,
        )
        self.cases: list[dict] = []
        app = create_app(
            self.registry,
            self.rollouts,
            [OPERATOR_KEY],
            model_store=self.store,
            recent_cases=lambda n: self.cases[:n],
            events_interval_s=self.events_interval_s,
        )
        self.http = UvicornThread(app, port).start()
        return self

    @property
    def url(self) -> str:
        return self.http.url

    def stop(self) -> None:
        self.http.stop()
        self.rollouts.stop()
        self.db.close()


def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.05) -> bool:
    """Poll `predicate` until it is truthy (generous timeouts; never a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


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

    def swap_model(self, name: str, path: Path, sha256: str):
        import numpy as np
        import onnxruntime as ort

        from edgefleet.shared.errors import EdgefleetError
        from edgefleet.shared.messages import ModelInfo, ModelRef

        try:
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            inp = session.get_inputs()[0]
            shape = [d if isinstance(d, int) else 1 for d in inp.shape]
            session.run(None, {inp.name: np.zeros(shape, dtype=np.float32)})
        except Exception as exc:  # ONNX Runtime's own errors: the old model keeps running
            raise EdgefleetError(f"warm-up of {name} failed: {exc}") from None
        version = Path(path).parent.name.split("-")[0]
        self.sessions[name] = session
        self.models[name] = ModelRef(name=name, version=version, url=path.as_uri(), sha256=sha256)
        self.swaps.append(f"{name}@{version}")
        return ModelInfo(name=name, version=version, sha256=sha256, backend="onnxruntime-cpu")

    def current_models(self) -> list:
        return list(self.models.values())
