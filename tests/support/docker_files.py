"""The images' Dockerfiles and settings, as the image, demo and k8s tests read them."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser
from pydantic import BaseModel

from edgefleet.cloud.settings import CloudSettings
from edgefleet.edge.settings import EdgeSettings
from edgefleet.fleet.settings import FleetSettings
from edgefleet.shared.config import load_settings

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DOCKERFILES = {
    "l4t": DOCKER / "jetson" / "Dockerfile",
    "x86-edge": DOCKER / "x86" / "Dockerfile.edge",
    "x86-cloud": DOCKER / "x86" / "Dockerfile.cloud",
}
COMPOSE_FILES = [
    DOCKER / "x86" / "compose.yaml",
    DOCKER / "jetson" / "compose.yaml",
    DOCKER / "x86" / "compose.edge.yaml",
]
# added on top of the Jetson compose file where the device has cameras
JETSON_CAMERAS = DOCKER / "jetson" / "compose.cameras.yaml"

# Every Path-typed setting, classified. A new Path setting fails
# test_every_path_setting_is_classified until it is added to one of these.
EDGE_WRITES = {
    "outbox.path": "file",
    "state_dir": "dir",
    "model.execution.engine_cache_dir": "dir",
    "runtime.updater_dir": "dir",
}
EDGE_READS = {
    "device_key_file",
    "mqtt.tls_ca",
    "mqtt.tls_cert",
    "mqtt.tls_key",
    "model.execution.calibration_dir",
}
CLOUD_WRITES = {"data_dir": "dir", "execution.engine_cache_dir": "dir"}
CLOUD_READS = {
    "mqtt.tls_ca",
    "mqtt.tls_cert",
    "mqtt.tls_key",
    "models.manifest",
    "rules.file",
    "execution.calibration_dir",
}
FLEET_WRITES = {"data_dir": "dir", "bundles_dir": "dir", "broker_dir": "dir", "ca_dir": "dir"}
FLEET_READS = {"broker_plugin"}


@dataclass(frozen=True)
class SettingsSpec:
    """One settings class a process in the image builds, and its classified paths."""

    cls: type[BaseModel]
    writes: dict[str, str]
    reads: set[str]
    required: dict[str, Any] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        return str(self.cls.model_config.get("env_prefix", ""))


EDGE = SettingsSpec(EdgeSettings, EDGE_WRITES, EDGE_READS, {"device_id": "c-1", "device_key": "k"})
CLOUD = SettingsSpec(CloudSettings, CLOUD_WRITES, CLOUD_READS)
# `edgefleet fleet enroll` runs in the cloud image (`docker compose run cloud fleet ...`).
FLEET = SettingsSpec(FleetSettings, FLEET_WRITES, FLEET_READS)
IMAGES: dict[str, list[SettingsSpec]] = {
    "l4t": [EDGE],
    "x86-edge": [EDGE],
    "x86-cloud": [CLOUD, FLEET],
}
IMAGE_SPECS = [(name, spec) for name, specs in IMAGES.items() for spec in specs]
IMAGE_SPEC_IDS = [f"{name}-{spec.cls.__name__}" for name, spec in IMAGE_SPECS]


class Stage:
    def __init__(self, base: str, name: str | None):
        self.base, self.name = base, name
        self.instructions: list[tuple[str, str]] = []

    def values(self, instruction: str) -> list[str]:
        return [v for i, v in self.instructions if i == instruction]


def dockerfile_parser(text: str) -> Any:
    # From a file object: a parser made from a path (default ./Dockerfile) writes its
    # `content` back to that path.
    return DockerfileParser(fileobj=io.BytesIO(text.encode()))


def parse_stages(text: str) -> list[Stage]:
    """Stages of a Dockerfile, FROM arguments resolved against the global ARG defaults."""
    parser = dockerfile_parser(text)
    parents = list(parser.parent_images)
    stages: list[Stage] = []
    for item in parser.structure:
        if item["instruction"] == "FROM":
            words = item["value"].split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(parents[len(stages)], name))
        elif stages:
            stages[-1].instructions.append((item["instruction"], item["value"]))
    return stages


def final_stage(name: str) -> Stage:
    return parse_stages(DOCKERFILES[name].read_text())[-1]


def final_env(name: str) -> dict[str, str]:
    return dict(dockerfile_parser(DOCKERFILES[name].read_text()).envs)


def declared_volumes(name: str) -> list[PurePosixPath]:
    volumes: list[PurePosixPath] = []
    for value in final_stage(name).values("VOLUME"):
        items = json.loads(value) if value.strip().startswith("[") else value.split()
        volumes += [PurePosixPath(v) for v in items]
    return volumes


def setting_value(settings: BaseModel, dotted: str) -> Any:
    value: Any = settings
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


NOT_SETTINGS = {
    "PATH",
    "HOME",
    "TMPDIR",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "DEBIAN_FRONTEND",
    "PGPASSFILE",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
}


def assert_env_sets_real_settings(
    specs: list[SettingsSpec], env: dict[str, str], mp: pytest.MonkeyPatch
) -> int:
    """Every variable that is not a known system one must land in a real setting.

    pydantic-settings silently ignores a misspelt variable, so each is read back from the
    settings class whose prefix it carries (the longest prefix wins).
    """
    for key, value in env.items():
        mp.setenv(key, value)
    built = {spec.cls: load_settings(spec.cls, None, **spec.required) for spec in specs}
    by_prefix = sorted(specs, key=lambda spec: len(spec.prefix), reverse=True)
    checked = 0
    for key, value in env.items():
        if key in NOT_SETTINGS:
            continue
        spec = next((sp for sp in by_prefix if key.startswith(sp.prefix)), None)
        assert spec is not None, f"{key} carries none of the prefixes of {specs}"
        dotted = key[len(spec.prefix) :].lower().replace("__", ".")
        try:
            actual = setting_value(built[spec.cls], dotted)
        except AttributeError:
            pytest.fail(f"{key} names no setting of {spec.cls.__name__}")
        assert _same(actual, value), f"{key}={value} read back as {actual!r}"
        checked += 1
    return checked


def _same(actual: Any, text: str) -> bool:
    if isinstance(actual, float):
        return actual == float(text)
    return str(actual) == text
