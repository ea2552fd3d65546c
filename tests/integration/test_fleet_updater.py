"""The device side of a rollout against the real fleet HTTP server and ONNX Runtime."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest

from edgefleet.edge.updater import DesiredStateApplier
from edgefleet.shared.messages import DesiredState, ModelRef, ReportedState
from tests.support.fleet import FleetServer, OnnxControl, tiny_onnx
from tests.support.process_runtime import ProcessRuntime
from tests.support.waiting import eventually


@pytest.fixture
def server(tmp_path: Path):
    instance = FleetServer(tmp_path / "cloud").start()
    instance.enrollment = instance.registry.enroll("cam-01", group="lab")
    yield instance
    instance.stop()


def desired(ref: ModelRef, dep: str = "dep-1", image: str = "") -> DesiredState:
    """A desired state of `ref`; no image (keep the one running) unless given."""
    return DesiredState(device_id="cam-01", deployment_id=dep, image=image, models=[ref])


def device_ref(server: FleetServer, name: str, version: str) -> ModelRef:
    server.deploy(name, version)  # a device downloads only models deployed to it
    ref = server.store.ref(name, version)
    return server.store.for_device(ref, "cam-01", server.enrollment.device_key)


def applier(tmp_path: Path, server: FleetServer, **kw):
    reports: list[ReportedState] = []
    control = OnnxControl(reports.append)
    return DesiredStateApplier(control, tmp_path / "state", **kw), control, reports


def test_good_model_is_downloaded_verified_swapped_and_reported(tmp_path, server) -> None:
    # given a model in the cloud's store
    server.store.add("det", "1", tiny_onnx(tmp_path / "src" / "det.onnx"))
    app, control, reports = applier(tmp_path, server)
    # when the device applies a desired state naming it
    app.handle(desired(device_ref(server, "det", "1")))
    # then it reported applying → healthy, runs det@1, and the file is kept by version
    assert [r.status for r in reports] == ["applying", "healthy"]
    assert control.swaps == ["det@1"]
    files = list((tmp_path / "state" / "models" / "det").glob("1-*/det.onnx"))
    assert len(files) == 1
    assert app.state()["deployment_id"] == "dep-1"
    # when the same retained desired state arrives again, nothing is redone
    app.handle(desired(device_ref(server, "det", "1")))
    assert [r.status for r in reports][-1] == "healthy" and control.swaps == ["det@1"]


def test_without_a_container_runtime_an_image_is_not_applied(tmp_path, server) -> None:
    # given an agent on the host (runtime.kind none) running det@1
    server.store.add("det", "1", tiny_onnx(tmp_path / "src1" / "det.onnx"))
    server.store.add("det", "2", tiny_onnx(tmp_path / "src2" / "det.onnx", scale=3.0))
    app, control, reports = applier(tmp_path, server)
    app.handle(desired(device_ref(server, "det", "1")))
    # when a deployment names det@2 and a new image
    image = "ghcr.io/acme/edge@sha256:" + "c" * 64
    app.handle(desired(device_ref(server, "det", "2"), dep="dep-2", image=image))
    # then it says the image was not applied, runs no known image, and det@1 is back
    last = reports[-1]
    assert last.status == "not_applied" and "image not applied" in (last.error or "")
    assert last.running_image is None
    assert [m.version for m in control.current_models()] == ["1"]
    assert app.state()["deployment_id"] == "dep-1"


def test_sha256_mismatch_fails_and_keeps_the_old_model(tmp_path, server) -> None:
    server.store.add("det", "1", tiny_onnx(tmp_path / "src1" / "det.onnx"))
    server.store.add("det", "2", tiny_onnx(tmp_path / "src2" / "det.onnx", scale=3.0))
    app, control, reports = applier(tmp_path, server)
    app.handle(desired(device_ref(server, "det", "1")))
    # when a desired state carries a hash that the served file does not have
    ref = device_ref(server, "det", "2").model_copy(update={"sha256": "0" * 64})
    app.handle(desired(ref, dep="dep-2"))
    # then it fails with the integrity error, nothing was swapped, nothing half-written kept
    assert reports[-1].status == "failed" and "does not match" in reports[-1].error
    assert control.swaps == ["det@1"]
    assert not list((tmp_path / "state" / "downloads").iterdir())
    assert app.state()["deployment_id"] == "dep-1"


def test_model_that_fails_warm_up_is_not_swapped(tmp_path, server) -> None:
    server.store.add("det", "1", tiny_onnx(tmp_path / "src1" / "det.onnx"))
    broken = tmp_path / "src2" / "det.onnx"
    broken.parent.mkdir()
    broken.write_bytes(b"this is not an onnx model" * 100)
    server.store.add("det", "2", broken)
    app, control, reports = applier(tmp_path, server)
    app.handle(desired(device_ref(server, "det", "1")))
    app.handle(desired(device_ref(server, "det", "2"), dep="dep-2"))
    assert reports[-1].status == "failed" and "warm-up" in reports[-1].error
    assert [m.version for m in control.current_models()] == ["1"]


def test_interrupted_download_resumes_with_range(tmp_path, server) -> None:
    src = tiny_onnx(tmp_path / "src" / "det.onnx")
    server.store.add("det", "1", src)
    data = src.read_bytes()
    ref = device_ref(server, "det", "1")
    # given half the file already downloaded before the connection dropped
    part = tmp_path / "state" / "downloads" / f"{ref.sha256}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(data[: len(data) // 2])
    seen: list[str | None] = []
    http = httpx.Client(event_hooks={"request": [lambda r: seen.append(r.headers.get("range"))]})
    app, control, reports = applier(tmp_path, server, http=http)
    # when the device applies the desired state
    app.handle(desired(ref))
    # then it asked only for the rest, and the assembled file is the right one
    assert seen == [f"bytes={len(data) // 2}-"]
    assert reports[-1].status == "healthy"
    assert control.swaps == ["det@1"]
    kept = next((tmp_path / "state" / "models" / "det").glob("1-*/det.onnx"))
    assert hashlib.sha256(kept.read_bytes()).hexdigest() == ref.sha256


def test_download_without_capability_or_token_is_refused(tmp_path, server) -> None:
    server.store.add("det", "1", tiny_onnx(tmp_path / "src" / "det.onnx"))
    server.deploy("det", "1")
    bare = server.store.ref("det", "1")
    app, _, reports = applier(tmp_path, server)
    app.handle(desired(bare))
    assert reports[-1].status == "failed" and "HTTP 401" in reports[-1].error
    # with the device's REST token, sent to the cloud it was enrolled with, it works
    app2, _, reports2 = applier(
        tmp_path / "b", server, token=server.enrollment.token, api_url=server.url
    )
    app2.handle(desired(bare))
    assert reports2[-1].status == "healthy"


def test_the_token_goes_to_the_clouds_origin_only_and_never_over_plain_http(
    tmp_path, server
) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[str | None] = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # another host a forged deployment might name
            seen.append(self.headers.get("Authorization"))
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        token = server.enrollment.token
        app, _, reports = applier(tmp_path, server, token=token, api_url=server.url)
        # when a deployment names a file on another origin, the request carries no token
        url = f"http://127.0.0.1:{other.server_address[1]}/det.onnx"
        app.handle(desired(ModelRef(name="det", version="9", url=url, sha256="a" * 64)))
        assert seen and all(header is None for header in seen)
        assert reports[-1].status == "failed"
        # and plain http to anything but this host is refused before a connection is made
        off_host = "http://models.invalid/det.onnx"
        remote = ModelRef(name="det", version="8", url=off_host, sha256="a" * 64)
        app.handle(desired(remote, dep="dep-2"))
        assert reports[-1].status == "failed" and "https" in (reports[-1].error or "")
    finally:
        other.shutdown()


def test_image_change_goes_to_the_process_runtime(tmp_path, server) -> None:
    import sys

    server.store.add("det", "1", tiny_onnx(tmp_path / "src" / "det.onnx"))
    marker = tmp_path / "image.txt"
    script = (
        f"import os, time; open({str(marker)!r}, 'w').write(os.environ['EF_IMAGE']); time.sleep(60)"
    )
    runtime = ProcessRuntime([sys.executable, "-c", script], settle_s=0.2)
    app, _, reports = applier(tmp_path, server, runtime=runtime)
    try:
        app.handle(desired(device_ref(server, "det", "1"), image="ghcr.io/acme/edge:2.0"))
        assert reports[-1].status == "healthy"
        assert runtime.current_image() == "ghcr.io/acme/edge:2.0"
        eventually(lambda: marker.exists() and marker.read_text() == "ghcr.io/acme/edge:2.0")
        first_pid = runtime.pid
        # a runtime whose process dies at start fails the update and is reported
        bad = ProcessRuntime([sys.executable, "-c", "raise SystemExit(3)"], settle_s=0.5)
        app_bad, _, bad_reports = applier(tmp_path / "bad", server, runtime=bad)
        app_bad.handle(desired(device_ref(server, "det", "1"), image="ghcr.io/acme/edge:3.0"))
        assert bad_reports[-1].status == "failed" and "exited with 3" in bad_reports[-1].error
        assert runtime.pid == first_pid
    finally:
        runtime.stop()
