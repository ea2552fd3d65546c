"""Unit tests of the orchestrator's pure parts: routing, cache, cascade, drift, auth, settings."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from edgefleet.bench.harness import escalation_case
from edgefleet.cloud.auth import Authenticator, Principal, key_digest, sign_body
from edgefleet.cloud.cache import Cached, CacheKey, VerdictCache
from edgefleet.cloud.cascade import Cascade, ModelPool
from edgefleet.cloud.drift import ks_statistic
from edgefleet.cloud.registry import StaticRegistry
from edgefleet.cloud.router import Route, Router, RouteSpec
from edgefleet.cloud.settings import CloudSettings, OperatorKey
from edgefleet.shared.config import load_settings
from edgefleet.shared.errors import AuthError, ConfigError, ModelNotFound
from edgefleet.shared.executor import BatcherSettings, DynamicBatcher
from edgefleet.shared.messages import Detection, ModelInfo
from tests.support.waiting import eventually

RULES = """
default: {model: ppocr-heavy, timeout_s: 9}
rules:
  - name: gate-unsure
    when: {device: "gate-*", reason: [unsure], edge_score_max: 0.5}
    route: {model: ppocr, timeout_s: 3, priority: 7}
  - name: small
    when: {size_max: 100}
    route: {model: rules}
  - name: catch-gate
    when: {device: "gate-*"}
    route: {model: ppocr-heavy, fallback: false}
"""


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _router(tmp_path: Path, text: str = RULES) -> tuple[Router, Path, Clock]:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    clock = Clock()
    return Router(RouteSpec(model="ppocr-heavy"), path=path, poll_s=1.0, clock=clock), path, clock


def test_rules_are_evaluated_in_order_on_metadata(tmp_path: Path) -> None:
    router, _, _ = _router(tmp_path)
    unsure = escalation_case("gate-1", edge=[("A", 0.3)], reason="unsure")
    sure = escalation_case("gate-1", edge=[("A", 0.9)], reason="unsure")
    other = escalation_case("yard-1", edge=[("A", 0.3)])
    assert router.route(unsure, 5000) == Route("gate-unsure", "ppocr", 3.0, 7, True)
    assert router.route(unsure, 50).name == "gate-unsure"  # first match wins over `small`
    assert router.route(sure, 50).name == "small"
    assert router.route(sure, 5000) == Route("catch-gate", "ppocr-heavy", 9.0, 0, False)
    assert router.route(other, 5000) == Route("default", "ppocr-heavy", 9.0, 0, True)


def test_rules_reload_on_change_and_bad_file_keeps_old_rules(tmp_path: Path) -> None:
    router, path, clock = _router(tmp_path)
    case = escalation_case("yard-1", stream_id="s1")
    path.write_text("rules:\n  - {name: s1, when: {stream: s1}, route: {model: rules}}\n")
    assert router.route(case, 5000).name == "default"  # not polled yet
    clock.now = 2.0
    assert router.route(case, 5000).name == "s1"
    path.write_text("rules:\n  - {name: broken, when: {nonsense: 1}, route: {model: x}}\n")
    clock.now = 4.0
    assert router.route(case, 5000).name == "s1"
    assert router.last_error is not None and "nonsense" in router.last_error


def test_a_bad_rules_file_at_start_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        _router(tmp_path, "rules: [{name: x}]")


def test_a_rules_file_naming_an_unserved_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    served = ["ppocr-heavy", "ppocr"]
    # at start: a configuration error that names the rule and the model
    path.write_text("rules:\n  - {name: typo, when: {stream: s1}, route: {model: ppocr-hevy}}\n")
    with pytest.raises(ConfigError, match=r"typo -> 'ppocr-hevy'"):
        Router(RouteSpec(model="ppocr-heavy"), path=path, models=served)
    # at reload: rejected, and the rules in force stay
    path.write_text("rules:\n  - {name: s1, when: {stream: s1}, route: {model: ppocr}}\n")
    clock = Clock()
    router = Router(RouteSpec(model="ppocr-heavy"), path=path, models=served, clock=clock)
    case = escalation_case("yard-1", stream_id="s1")
    path.write_text(
        "default: {model: nope}\nrules:\n  - {name: s1, when: {}, route: {model: busy}}\n"
    )
    clock.now = 2.0
    assert router.route(case, 5000) == Route("s1", "ppocr", 20.0, 0, True)
    assert router.last_error is not None and "default -> 'nope'" in router.last_error


def test_cache_keeps_only_confident_model_results_and_drops_old_versions() -> None:
    cache = VerdictCache(size=2, min_score=0.9)
    sure = (Detection(text="A", score=0.95),)
    key = CacheKey("s" * 64, "m@1", "default")
    assert cache.put(key, Cached(sure, "m@1", 0)) is True
    assert (
        cache.put(
            CacheKey("t" * 64, "m@1", "r"), Cached((Detection(text="B", score=0.5),), "m@1", 0)
        )
        is False
    )
    assert cache.put(CacheKey("u" * 64, "rules", "r"), Cached(sure, "rules", 2)) is False
    assert cache.get(key) == Cached(sure, "m@1", 0)
    cache.model_version("m", "1")
    cache.model_version("m", "2")
    assert cache.get(key) is None and len(cache) == 0


class ScriptedModel:
    """A model whose answer (or failure) the test decides, behind a real scheduler."""

    def __init__(self, name: str, answer=None, hang: threading.Event | None = None, fail=False):
        self.info = ModelInfo(name=name, version="1")
        self.answer = answer or []
        self.hang = hang
        self.fail = fail
        self.calls = 0
        self.callers: list[tuple[str, int]] = []  # (thread name, priority) of each predict
        self.scheduler = DynamicBatcher(
            self._forward, BatcherSettings(max_delay_ms=0), name=f"scripted-{name}"
        ).start()

    def _forward(self, images):
        self.calls += len(images)
        if self.hang is not None:
            self.hang.wait()
        if self.fail:
            raise RuntimeError("model crashed")
        return [self.answer for _ in images]

    def predict(self, image_rgb, *, priority=0, timeout_s=None, tenant=None):
        self.callers.append((threading.current_thread().name, priority))
        return self.scheduler.submit(image_rgb, priority=priority, timeout_s=timeout_s).result()

    async def predict_async(self, image_rgb, *, priority=0, timeout_s=None, tenant=None):
        return await self.scheduler.submit(image_rgb, priority=priority, timeout_s=timeout_s)

    @property
    def memory_bytes(self) -> int:
        return 0

    def close(self) -> None:
        if self.hang is not None:
            self.hang.set()
        self.scheduler.close()


def _cascade(models: dict[str, ScriptedModel]) -> Cascade:
    pool = ModelPool(list(models), lambda name: models[name])
    return Cascade(pool, VerdictCache(100, 0.9), lighter="light", accept_edge_min_score=0.5)


def test_cascade_falls_through_each_level_and_records_it() -> None:
    image = np.zeros((8, 8, 3), np.uint8)
    case = escalation_case("cam-1", edge=[("SURE", 0.8), ("UNSURE", 0.2)])
    route = Route("default", "heavy", 0.5, 0, True)
    hang = threading.Event()
    good = [Detection(text="OK", score=0.99)]
    try:
        # primary hangs -> lighter answers
        out = _cascade(
            {"heavy": ScriptedModel("heavy", hang=hang), "light": ScriptedModel("light", good)}
        ).run(route, case, image, "a" * 64)
        assert (out.fallback_level, out.model, out.result) == (1, "light@1", good)
        # both crash -> the rule-based answer keeps the sure edge lines
        out = _cascade(
            {"heavy": ScriptedModel("heavy", fail=True), "light": ScriptedModel("light", fail=True)}
        ).run(route, case, image, "a" * 64)
        assert (out.fallback_level, out.model, [d.text for d in out.result]) == (
            2,
            "rules",
            ["SURE"],
        )
        # no fallback on the route -> busy
        strict = Route("strict", "heavy", 0.5, 0, False)
        out = _cascade(
            {"heavy": ScriptedModel("heavy", fail=True), "light": ScriptedModel("light")}
        ).run(strict, case, image, "a" * 64)
        assert (out.fallback_level, out.model, out.result) == (3, "busy", [])
    finally:
        hang.set()


def test_cascade_waits_on_the_model_scheduler_with_the_route_priority() -> None:
    # given a primary that hangs and a lighter model, behind their own schedulers
    hang = threading.Event()
    heavy = ScriptedModel("heavy", hang=hang)
    light = ScriptedModel("light", [Detection(text="OK", score=0.99)])
    cascade = _cascade({"heavy": heavy, "light": light})
    threads_before = threading.active_count()
    try:
        # when a case with a priority-7 route runs
        route = Route("urgent", "heavy", 0.2, 7, True)
        out = cascade.run(route, escalation_case("cam-1"), np.zeros((8, 8, 3), np.uint8), "b" * 64)
    finally:
        hang.set()
    # then each model was called on this very thread (no pool of the cascade's own), with
    # the route's priority, and the hung primary cost no more than its deadline
    me = threading.current_thread().name
    assert heavy.callers == [(me, 7)] and light.callers == [(me, 7)]
    assert out.fallback_level == 1
    assert threading.active_count() == threads_before


def test_cascade_serves_confident_results_from_the_cache() -> None:
    good = [Detection(text="OK", score=0.99)]
    heavy = ScriptedModel("heavy", good)
    cascade = _cascade({"heavy": heavy, "light": ScriptedModel("light")})
    route = Route("default", "heavy", 5, 0, True)
    image = np.zeros((8, 8, 3), np.uint8)
    first = cascade.run(route, escalation_case("cam-1"), image, "f" * 64)
    second = cascade.run(route, escalation_case("cam-1"), image, "f" * 64)
    assert not first.cached and second.cached and second.result == good
    assert heavy.calls == 1
    with pytest.raises(ModelNotFound):
        cascade.pool.get("not-served")


def test_ks_statistic() -> None:
    rng = np.random.default_rng(0)
    same = ks_statistic(rng.uniform(size=2000), rng.uniform(size=2000))
    shifted = ks_statistic(rng.uniform(size=2000), rng.uniform(size=2000) + 0.5)
    assert same < 0.06 and 0.45 < shifted < 0.55
    assert ks_statistic([0.1, 0.2], [0.8, 0.9]) == 1.0


def test_auth_operator_keys_device_tokens_and_body_signatures() -> None:
    registry = StaticRegistry({"cam-1": (b"k" * 32, "eft_device-token")})
    auth = Authenticator([OperatorKey(name="ops", sha256=key_digest("op-key"))], registry)
    assert auth.authenticate("Bearer op-key") == Principal("operator", "ops")
    assert auth.authenticate("Bearer eft_device-token") == Principal("device", "cam-1")
    for bad in (None, "", "Basic op-key", "Bearer nope"):
        with pytest.raises(AuthError):
            auth.authenticate(bad)
    body = b'{"case_id": "abcdefgh", "label": "x", "correct": true}'
    device = Principal("device", "cam-1")
    assert auth.verify_body(device, body, sign_body(b"k" * 32, body))
    operator = Principal("operator", "ops")
    assert auth.verify_body(operator, body, sign_body(key_digest("op-key").encode(), body))
    with pytest.raises(AuthError, match="does not match"):
        auth.verify_body(device, body + b" ", sign_body(b"k" * 32, body))


def test_settings_from_yaml_with_line_numbers(tmp_path: Path) -> None:
    good = tmp_path / "cloud.yaml"
    good.write_text("http: {port: 9000}\ningest: {share_group: g1}\nmodels: {primary: ppocr}\n")
    settings = load_settings(CloudSettings, good)
    assert settings.http.port == 9000 and settings.models.primary == "ppocr"
    assert settings.resolved_database_url().startswith("sqlite:///")
    bad = tmp_path / "bad.yaml"
    bad.write_text("http:\n  port: 9000\n  nope: 1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:3"):
        load_settings(CloudSettings, bad)


def test_the_example_config_and_rules_load() -> None:
    from edgefleet import cloud

    folder = Path(cloud.__file__).parent
    settings = load_settings(CloudSettings, folder / "cloud.example.yaml")
    assert settings.models.primary == "ppocr6-cloud" and settings.api_keys[0].name == "ops"
    router = Router(RouteSpec(model="ppocr-heavy"), path=folder / "rules.example.yaml")
    assert router.route(escalation_case("gate-2", edge=[("A", 0.5)]), 5000).name == "gate-unsure"


def test_unknown_errors_are_a_logged_500_with_the_json_body(tmp_path: Path, caplog) -> None:
    from fastapi.testclient import TestClient

    from edgefleet.cloud.app import create_app

    settings = CloudSettings(
        data_dir=tmp_path, ingest={"enabled": False}, models={"preload": False}
    )
    app = create_app(settings)

    def explode() -> None:
        raise RuntimeError("boom")

    app.add_api_route("/explode", explode)
    client = TestClient(app)
    trace = "ab" * 16
    response = client.get("/explode", headers={"traceparent": f"00-{trace}-{'c' * 16}-01"})
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal"
    assert response.json()["error"]["trace_id"] == trace
    assert "boom" not in response.text  # internals stay in the log
    assert any("unhandled error" in r.getMessage() for r in caplog.records)
    assert client.get("/healthz").status_code == 200
    app.state.services.close()


def test_a_store_outage_is_a_503_with_retry_after_and_readyz_says_why(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from edgefleet.cloud.app import create_app

    key = "op-outage-key-" + "o" * 20
    settings = CloudSettings(
        data_dir=tmp_path,
        ingest={"enabled": False},
        models={"preload": False},
        api_keys=[{"name": "ops", "sha256": key_digest(key)}],
    )
    app = create_app(settings)
    client = TestClient(app)
    # given the database goes away under a running app
    app.state.services.db.close()
    # then reads answer 503 + Retry-After with the JSON error body, not a 500
    response = client.get("/v1/escalations/case-0001", headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 503, response.text
    assert int(response.headers["Retry-After"]) >= 1
    error = response.json()["error"]
    assert error["code"] == "store_unavailable" and len(error["trace_id"]) == 32
    # and readiness names the store
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.headers["Retry-After"] == "5"
    assert any(r.startswith("store not writable") for r in ready.json()["reasons"])
    assert client.get("/healthz").status_code == 200
    app.state.services.close()


def test_openapi_documents_the_error_body_the_409_and_the_wait_202(tmp_path: Path) -> None:
    from edgefleet.cloud.app import create_app

    app = create_app(
        CloudSettings(data_dir=tmp_path, ingest={"enabled": False}, models={"preload": False})
    )
    schema = app.openapi()
    ours = {"$ref": "#/components/schemas/ErrorResponse"}
    post = schema["paths"]["/v1/escalations"]["post"]
    assert {"200", "202", "409", "413", "415", "422", "429"} <= set(post["responses"])
    assert post["responses"]["409"]["content"]["application/json"]["schema"] == ours
    assert "duplicate_case" in post["description"] and "202" in post["description"]
    infer = schema["paths"]["/v1/infer/{model}"]["post"]["responses"]
    assert infer["504"]["content"]["application/json"]["schema"] == ours
    # every 422 is documented as the body the app really sends, not FastAPI's `detail`
    answers = [op["responses"] for path in schema["paths"].values() for op in path.values()]
    assert all(
        a["422"]["content"]["application/json"]["schema"] == ours for a in answers if "422" in a
    )
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    detail = schema["components"]["schemas"]["ErrorDetail"]
    assert {"code", "message", "trace_id"} <= set(detail["required"])
    app.state.services.close()


def test_readyz_reports_a_rejected_rules_file_before_any_case_arrives(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from edgefleet.cloud.app import create_app

    rules = tmp_path / "rules.yaml"
    rules.write_text("default: {model: rules}\n")
    settings = CloudSettings(
        data_dir=tmp_path,
        ingest={"enabled": False},
        models={"preload": False},
        rules={"file": rules, "poll_s": 0.01},
    )
    app = create_app(settings)
    client = TestClient(app)
    assert client.get("/readyz").json()["rules_error"] is None
    # when the file is broken while no case comes in
    rules.write_text("default: {model: rules}\nrules: [oops\n")
    said: list[str | None] = []

    def noticed() -> bool:
        said.append(client.get("/readyz").json()["rules_error"])
        return said[-1] is not None

    eventually(noticed, 30, "the broken rules file noticed", interval_s=0.05)
    error = said[-1]
    # then readiness says why, and the old rules stay in force
    assert "not valid YAML" in error
    route = app.state.services.router.route(escalation_case("cam-1"), 100)
    assert route.model == "rules" and route.name == "default"
    app.state.services.close()
