"""Desired state from the fleet: verified, handed to the updater, the model hot-swapped,
every step reported (retained) through the outbox."""

from __future__ import annotations

import functools
import hashlib
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from edgefleet.edge.agent import Agent
from edgefleet.shared.messages import DesiredState, ModelRef
from edgefleet.shared.models.registry import ModelRegistry
from edgefleet.shared.topics import Topics
from tests.support.broker import MosquittoBroker
from tests.support.edge import DEVICE, Collector, build_settings, edge_settings, text_frame
from tests.support.waiting import eventually


def test_desired_state_swaps_the_model_and_reports(broker: MosquittoBroker, tmp_path: Path) -> None:
    # given the edge model's detector served over HTTP, as the fleet would serve a new version
    registry = ModelRegistry.default()
    det = registry.resolve(registry.get("ppocr6-tiny-det"))
    served = tmp_path / "www"
    served.mkdir()
    shutil.copy(det, served / "det-v41.onnx")
    sha = hashlib.sha256((served / "det-v41.onnx").read_bytes()).hexdigest()
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(served))
    http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    collector = Collector(broker, "fleet-desired")
    agent = Agent(build_settings(edge_settings(tmp_path, broker, "unused", streams=[])))
    agent.start()
    try:
        eventually(agent.uplink.connected.is_set, 30, "agent connection")
        with agent.model.lease() as before:
            pass
        # when the fleet publishes a signed desired state with a new detector version
        ref = ModelRef(
            name="ppocr6-tiny-det",
            version="4.1",
            url=f"http://127.0.0.1:{http.server_address[1]}/det-v41.onnx",
            sha256=sha,
        )
        desired = DesiredState(device_id=DEVICE, deployment_id="dep-1", image="", models=[ref])
        collector.send(desired, Topics().desired(DEVICE))
        # then the agent reports applying, then healthy, and runs the new model
        eventually(
            lambda: [r.status for r in collector.reported][-1:] == ["healthy"], 60, "healthy"
        )
        assert [r.status for r in collector.reported] == ["applying", "healthy"]
        (running,) = agent.current_models()
        assert (running.name, running.version, running.sha256) == ("ppocr6-tiny-det", "4.1", sha)
        with agent.model.lease() as model:
            assert model is not before
            lines = model.predict(text_frame("SWAP"))
        assert [d.text for d in lines] == ["SWAP"]
    finally:
        agent.stop()
        http.shutdown()
        collector.close()
