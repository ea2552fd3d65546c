"""Settings: one pydantic tree per process, from a YAML file plus `EDGEFLEET_...` variables.

Nothing reads the environment at import time: `load_settings` is called in the command
that starts the process and the result is passed down.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from edgefleet.shared.errors import ConfigError
from edgefleet.shared.file_access import chown_hint, unreadable_reason

S = TypeVar("S", bound="EdgefleetSettings")


class Closed(BaseModel):
    """Base of every settings section and config document: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


class EdgefleetSettings(BaseSettings):
    """Base of every process's settings: closed, env overrides the YAML file, and both
    are merged key by key into the process's layered defaults."""

    model_config = SettingsConfigDict(
        extra="forbid", env_nested_delimiter="__", validate_default=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return env_settings, init_settings, LayeredDefaults(settings_cls)

    @classmethod
    def layered_defaults(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults of whole sections that depend on other settings (`given`: what the
        file and the environment set); a key set there refines the section, not replaces it."""
        return {}


class LayeredDefaults(PydanticBaseSettingsSource):
    """The lowest source: `layered_defaults` of the settings class, beneath file and env.

    Without it a section whose field default is None (the edge's `model.execution`, which
    the edge tunes itself) is created whole, with the generic defaults, by a single
    variable such as `EDGEFLEET_EDGE_MODEL__EXECUTION__ENGINE_CACHE_DIR`.
    """

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # the whole state comes from __call__

    def __call__(self) -> dict[str, Any]:
        settings_cls = self.settings_cls
        if not issubclass(settings_cls, EdgefleetSettings):
            return {}
        return settings_cls.layered_defaults(self.current_state)


def load_settings(cls: type[S], path: Path | None = None, **overrides: Any) -> S:
    """Build `cls` from the YAML at `path` (optional), the environment and `overrides`.

    A bad value raises ConfigError naming the key and, for YAML, the file and line.
    """
    data: dict[str, Any] = {}
    lines: dict[tuple[str, ...], int] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except PermissionError as exc:
            raise ConfigError(
                f"cannot read config file {path}: {unreadable_reason(Path(path), exc)}",
                hint=chown_hint(Path(path)),
            ) from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{path}: not UTF-8 text (byte {exc.start} cannot be decoded)",
                hint="save the file as UTF-8",
            ) from None
        try:
            loaded = yaml.safe_load(text)
            lines = _key_lines(yaml.compose(text))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of settings")
        data = loaded or {}
    data.update(overrides)
    try:
        return cls(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, lines, _env_names(cls))) from None


def _env_names(cls: type[BaseSettings]) -> dict[tuple[str, ...], str]:
    """(key path) -> the environment variable that set it, for error messages: a value from
    the environment overrides the file, so a mistake in it is the variable's, not the file's."""
    prefix = str(cls.model_config.get("env_prefix") or "").upper()
    delimiter = cls.model_config.get("env_nested_delimiter") or "__"
    if not prefix:
        return {}
    return {
        tuple(name[len(prefix) :].lower().split(delimiter)): name
        for name in (n.upper() for n in os.environ)
        if name.startswith(prefix)
    }


def _describe(
    exc: ValidationError,
    path: Path | None,
    lines: dict[tuple[str, ...], int],
    env: dict[tuple[str, ...], str],
) -> str:
    problems = []
    for err in exc.errors():
        loc = tuple(str(p) for p in err["loc"])
        prefixes = [loc[:n] for n in range(len(loc), 0, -1)]
        variable = next((env[p] for p in prefixes if p in env), None)
        line = next((lines[p] for p in prefixes if p in lines), None)
        if variable is not None:
            where = f"environment variable {variable}: "
        else:
            where = f"{path}:{line}: " if path and line else (f"{path}: " if path else "")
        problems.append(f"{where}{'.'.join(loc) or '<root>'}: {err['msg']}")
    return "invalid settings:\n  " + "\n  ".join(problems)


def _key_lines(node: yaml.Node | None, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    """(key path) -> 1-based line in the YAML file, for error messages."""
    out: dict[tuple[str, ...], int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*prefix, str(key.value))
            out[path] = key.start_mark.line + 1
            out.update(_key_lines(value, path))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            path = (*prefix, str(index))
            out[path] = item.start_mark.line + 1
            out.update(_key_lines(item, path))
    return out
