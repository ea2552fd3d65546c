"""Images by digest: a tag is resolved against a real registry once, at deploy time."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.image_ref import RegistryUnavailable, is_pinned, resolve_digest
from edgefleet.shared.wire import Verifier
from tests.support.fleet import OPERATOR_KEY, FleetServer

AUTH = {"Authorization": f"Bearer {OPERATOR_KEY}"}


def test_a_tag_resolves_to_the_digest_the_registry_holds(image_registry) -> None:
    digest = image_registry.push_manifest("acme/edge", "1.4.2", label="one")
    image = f"{image_registry.domain}/acme/edge"
    assert resolve_digest(f"{image}:1.4.2") == f"{image}@{digest}"
    # a digest is kept as it is, a tag beside it is dropped, and nothing is asked
    pinned = f"{image}@sha256:{'e' * 64}"
    assert resolve_digest(f"{image}:9@sha256:{'e' * 64}") == pinned and is_pinned(pinned)
    with pytest.raises(RegistryUnavailable, match="no digest"):
        resolve_digest(f"{image}:no-such-tag")
    with pytest.raises(InvalidInput, match="names no registry"):
        resolve_digest("acme/edge:1.4.2")


def test_a_deployment_by_tag_sends_and_keeps_the_digest(tmp_path: Path, image_registry) -> None:
    server = FleetServer(tmp_path / "cloud").start()
    try:
        enrollment = server.registry.enroll("cam-01", group="lab")
        first = image_registry.push_manifest("acme/agent", "2.0", label="first build")
        tag = f"{image_registry.domain}/acme/agent:2.0"
        # when an operator deploys by tag
        resp = httpx.post(
            f"{server.url}/v1/deployments",
            json={"group": "lab", "image": tag, "soak_s": 0},
            headers=AUTH,
            timeout=30,
        )
        assert resp.status_code == 201, resp.text
        view = resp.json()
        pinned = f"{image_registry.domain}/acme/agent@{first}"
        # then the deployment records the tag it was given and the digest it resolved to
        assert view["image"] == pinned and view["image_requested"] == tag
        # and the device's signed desired state names the digest
        (wire, retained) = server.sent[-1]
        desired = Verifier(lambda d: enrollment.device_key, max_skew_s=3600).verify(wire).message
        assert retained and desired.image == pinned
        # when the tag moves to another build, the deployment still names the first
        moved = image_registry.push_manifest("acme/agent", "2.0", label="second build")
        assert moved != first
        again = httpx.get(f"{server.url}/v1/deployments/{view['id']}", headers=AUTH).json()
        assert again["image"] == pinned
        # a tag the registry does not have is a typed 424, and nothing is created
        missing = httpx.post(
            f"{server.url}/v1/deployments",
            json={"group": "lab", "image": f"{image_registry.domain}/acme/agent:9", "soak_s": 0},
            headers=AUTH,
            timeout=30,
        )
        assert missing.status_code == 424, missing.text
        assert missing.json()["error"]["code"] == "registry_unavailable"
    finally:
        server.stop()
