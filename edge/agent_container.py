"""The agent's container, defined once: the `edge` service of the shipped compose file.

The host updater starts every new version from this definition, so a container it starts
has the same volumes, devices, user, capabilities and ports as one `docker compose up`
starts. A compose key it does not know is refused rather than dropped: a silently
different container is the failure this module exists to prevent.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from edgefleet.shared.errors import ConfigError

# keys that only matter to `docker compose build` or that the updater sets itself
_IGNORED = {"build", "image", "container_name"}
_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    """`${VAR}` and `${VAR:-default}` as compose does, in every string of `value`."""
    if isinstance(value, str):
        return _VAR_RE.sub(lambda m: env.get(m[1]) or (m[2] or ""), value)
    if isinstance(value, list):
        return [_interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v, env) for k, v in value.items()}
    return value


def _volume(spec: Any, project: str, base: Path) -> dict[str, Any]:
    """One compose volume as a docker mount dict (named volumes get compose's prefix)."""
    if isinstance(spec, str):
        source, target, *mode = spec.split(":")
        kind = "bind" if source.startswith(("/", ".")) else "volume"
        spec = {"type": kind, "source": source, "target": target, "read_only": mode == ["ro"]}
    kind = spec.get("type", "volume")
    mount: dict[str, Any] = {"Type": kind, "Target": spec["target"]}
    if kind == "bind":
        mount["Source"] = str((base / spec["source"]).resolve())
        if spec.get("bind", {}).get("create_host_path"):
            mount["CreateHostPath"] = True  # made by the updater; not an Engine API field
    elif kind == "volume":
        mount["Source"] = f"{project}_{spec['source']}"
    elif kind == "tmpfs":
        size = spec.get("tmpfs", {}).get("size")
        if size:
            mount["TmpfsOptions"] = {"SizeBytes": int(size)}
    else:
        raise ConfigError(f"compose volume type {kind!r} is not supported by the updater")
    mount["ReadOnly"] = bool(spec.get("read_only", False))
    return mount


def _ports(specs: list[str]) -> dict[str, Any]:
    ports: dict[str, Any] = {}
    for spec in specs:
        parts = str(spec).split(":")
        container = parts[-1] if "/" in parts[-1] else f"{parts[-1]}/tcp"
        host = (parts[0], int(parts[1])) if len(parts) == 3 else int(parts[0])
        ports[container] = host
    return ports


class AgentContainer:
    """`create_kwargs(image)`: the docker Engine API's create parameters for the agent."""

    def __init__(
        self, compose_file: Path, service: str = "edge", env: dict[str, str] | None = None
    ):
        self.compose_file = Path(compose_file)
        doc = yaml.safe_load(self.compose_file.read_text()) or {}
        env = dict(os.environ if env is None else env)
        try:
            raw = doc["services"][service]
        except (KeyError, TypeError):
            raise ConfigError(f"{compose_file} has no service {service!r}") from None
        self.project: str = doc.get("name") or self.compose_file.parent.name
        self.service = service
        self.spec: dict[str, Any] = _interpolate(raw, env)
        self.base = self.compose_file.parent
        grace = _nanoseconds(self.spec.get("stop_grace_period")) or 10 * 10**9
        # how long the agent gets to drain and flush its outbox on SIGTERM, as compose gives
        self.stop_timeout_s = max(1, round(grace / 1e9))

    def create_kwargs(self, image: str, name: str) -> dict[str, Any]:
        """Keyword arguments of `docker.containers.create` for `image`."""
        s = self.spec
        kwargs: dict[str, Any] = {"image": image, "name": name}
        labels = {
            "com.docker.compose.project": self.project,
            "com.docker.compose.service": self.service,
            "io.edgefleet.image": image,
        }
        handlers = {
            "runtime": lambda v: kwargs.update(runtime=v),
            "restart": lambda v: kwargs.update(restart_policy={"Name": v}),
            "read_only": lambda v: kwargs.update(read_only=bool(v)),
            "user": lambda v: kwargs.update(user=str(v)),
            "group_add": lambda v: kwargs.update(group_add=[str(g) for g in v]),
            "security_opt": lambda v: kwargs.update(security_opt=list(v)),
            "cap_drop": lambda v: kwargs.update(cap_drop=list(v)),
            "cap_add": lambda v: kwargs.update(cap_add=list(v)),
            "environment": lambda v: kwargs.update(
                environment={str(k): str(x) for k, x in v.items()}
                if isinstance(v, dict)
                else list(v)
            ),
            "ports": lambda v: kwargs.update(ports=_ports(v)),
            "network_mode": lambda v: kwargs.update(network_mode=v),
            "devices": lambda v: kwargs.update(devices=list(v)),
            "command": lambda v: kwargs.update(command=v),
            "entrypoint": lambda v: kwargs.update(entrypoint=v),
            "volumes": lambda v: kwargs.update(
                mounts=[_volume(x, self.project, self.base) for x in v]
            ),
            "stop_grace_period": lambda v: None,  # `stop_timeout_s`, used when stopping
            "logging": lambda v: kwargs.update(
                log_config={"Type": v.get("driver", "json-file"), "Config": v.get("options", {})}
            ),
            "labels": lambda v: labels.update(v),
            "healthcheck": lambda v: kwargs.update(healthcheck=_healthcheck(v)),
        }
        for key, value in s.items():
            if key in _IGNORED:
                continue
            if key not in handlers:
                raise ConfigError(
                    f"{self.compose_file}: service {self.service} key {key!r} is not "
                    "supported by the updater; it would start a different container"
                )
            handlers[key](value)
        kwargs["labels"] = labels
        for mount in kwargs.get("mounts", []):
            if mount.pop("CreateHostPath", False):
                Path(mount["Source"]).mkdir(parents=True, exist_ok=True)
        # the agent reads which image it is (runtime.kind host) from its environment
        env = kwargs.get("environment", {})
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        kwargs["environment"] = {**env, "EDGEFLEET_IMAGE": image}
        return kwargs


def _nanoseconds(value: str | None) -> int | None:
    """A compose duration (`30s`, `500ms`, `2m`) in nanoseconds, as the Engine API counts."""
    if not value:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(value))
    if not match:
        raise ConfigError(f"compose duration {value!r} is not NNs, NNms or NNm")
    scale = {"ms": 1e6, "s": 1e9, "m": 60e9}[match[2]]
    return int(float(match[1]) * scale)


def _healthcheck(spec: dict[str, Any]) -> dict[str, Any]:
    ns = _nanoseconds
    test = spec.get("test")
    return {
        "test": test,
        "interval": ns(spec.get("interval")),
        "timeout": ns(spec.get("timeout")),
        "retries": spec.get("retries"),
        "start_period": ns(spec.get("start_period")),
    }
