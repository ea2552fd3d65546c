"""The rollout planner, built from its own constructor against a real SQLite registry and
model store: a request made whole before anything is sent, or a typed error."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from edgefleet.fleet.models import ModelStore
from edgefleet.fleet.registry import DeviceRegistry
from edgefleet.fleet.rollout_plan import RolloutPlanner
from edgefleet.shared.db import Database
from edgefleet.shared.errors import InvalidInput, NotFound
from edgefleet.shared.messages import DesiredState, DeviceStatus

GOOD = "a" * 64


@pytest.fixture
def registry(tmp_path: Path) -> DeviceRegistry:
    registry = DeviceRegistry(Database.connect(f"sqlite:///{tmp_path}/fleet.db"))
    for i in range(7):
        registry.enroll(f"cam-{i:02d}", group="yard")
    return registry


def body(**over) -> dict:
    out = {
        "group": "yard",
        "image": "ghcr.io/acme/edge:1.2.0",
        "models": [{"name": "det", "version": "2", "url": "http://x/det", "sha256": GOOD}],
        "canary_percent": 30,
    }
    out.update(over)
    return out


def test_the_canaries_are_the_share_rounded_up_online_devices_first(registry) -> None:
    # given a group of seven, of which cam-05 and cam-06 are online, cam-01 running dep-old
    before = DesiredState(
        device_id="cam-01", deployment_id="dep-old", image="ghcr.io/acme/edge:1.1", models=[]
    )
    registry.set_desired(before, "cam-01")
    for device in ("cam-05", "cam-06"):
        registry.record_status(DeviceStatus(device_id=device, state="online", agent_version="1"))
    pinned: list[str] = []

    def pin(image: str) -> str:
        pinned.append(image)
        return "ghcr.io/acme/edge@sha256:" + "c" * 64

    planner = RolloutPlanner(registry, resolve_image=pin)
    # when a rollout to 30 % of it is planned
    plan = planner.plan(body())
    # then 3 canaries (30 % of 7, rounded up): the online two, then the first by name
    assert plan.canaries == ["cam-05", "cam-06", "cam-00"]
    roles = {device: role for device, role, _ in plan.targets}
    assert sorted(d for d, r in roles.items() if r == "canary") == sorted(plan.canaries)
    assert len(roles) == 7 and plan.deployment["canary_count"] == 3
    # and each target keeps what it ran before, to be given back on a rollback
    previous = {device: state for device, _, state in plan.targets}
    assert previous["cam-01"] == before and previous["cam-00"] is None
    # and the tag is pinned to its digest once, the request's tag kept beside it
    assert pinned == ["ghcr.io/acme/edge:1.2.0"]
    assert plan.spec["image"].endswith("c" * 64)
    assert plan.spec["image_requested"] == "ghcr.io/acme/edge:1.2.0"
    # and every plan has its own id
    assert plan.dep_id.startswith("dep-") and planner.plan(body()).dep_id != plan.dep_id


def test_a_model_without_its_file_is_taken_from_the_store_and_must_match_it(
    registry, tmp_path: Path
) -> None:
    # given a store holding det@3
    source = tmp_path / "det.onnx"
    source.write_bytes(b"onnx bytes")
    digest = hashlib.sha256(b"onnx bytes").hexdigest()
    store = ModelStore(tmp_path / "store")
    store.add("det", "3", source)
    planner = RolloutPlanner(registry, model_store=store)
    # then a model named by version gets the store's url and hash
    [model] = planner.plan(body(models=[{"name": "det", "version": "3"}])).spec["models"]
    assert model["sha256"] == digest and model["url"].endswith("/det/3")
    # and a hash the stored file does not have is refused, as is a model without a store
    with pytest.raises(InvalidInput, match="does not match"):
        planner.plan(body(models=[{"name": "det", "version": "3", "sha256": "d" * 64}]))
    with pytest.raises(InvalidInput, match="no model store"):
        RolloutPlanner(registry).plan(body(models=[{"name": "det", "version": "3"}]))


def test_a_group_without_devices_is_not_found(registry) -> None:
    with pytest.raises(NotFound, match="no enrolled devices"):
        RolloutPlanner(registry).plan(body(group="dock"))
