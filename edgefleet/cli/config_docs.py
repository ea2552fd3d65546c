"""The configuration reference, generated from the settings models (`docs/configuration.md`).

The pydantic field descriptions are the documentation: this module only walks the settings
trees and lays them out, so the reference cannot drift from the code. `tests/unit/test_docs.py`
fails when the committed file is stale. Regenerate it with:

    .venv/bin/python -m edgefleet.cli.config_docs
"""

from __future__ import annotations

import argparse
import enum
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
REGENERATE = ".venv/bin/python -m edgefleet.cli.config_docs"


@dataclass(frozen=True)
class SettingsDoc:
    """One process's settings tree and how a user reaches it."""

    title: str
    import_path: str  # "module:Class"
    command: str
    intro: str

    def load(self) -> type[BaseModel]:
        module, _, name = self.import_path.partition(":")
        return getattr(__import__(module, fromlist=[name]), name)


SETTINGS: tuple[SettingsDoc, ...] = (
    SettingsDoc(
        "Edge agent",
        "edgefleet.edge.settings:EdgeSettings",
        "edgefleet edge run -c edge.yaml",
        "One edge agent: its identity, streams, model, escalation policy, outbox and uplink.",
    ),
    SettingsDoc(
        "Cloud orchestrator",
        "edgefleet.cloud.settings:CloudSettings",
        "edgefleet cloud serve -c cloud.yaml",
        "The REST API, the MQTT ingest, the cascade, the cache and the case store.",
    ),
    SettingsDoc(
        "Fleet commands",
        "edgefleet.fleet.settings:FleetSettings",
        "edgefleet fleet ... -c fleet.yaml",
        "Where the device registry lives and what enrollment bundles point at.",
    ),
)


@dataclass(frozen=True)
class FieldDoc:
    """One setting as the reference shows it."""

    key: str  # YAML path, e.g. `policy.unsure_low`, `streams[].url`
    type: str
    default: str
    env: str  # environment variable, or "" where the value comes only as part of a list
    description: str
    constraints: str
    note: str = ""  # added by the generator, e.g. for optional sections


def iter_fields(
    model: type[BaseModel], env_prefix: str | None, key: str = ""
) -> Iterator[FieldDoc]:
    """Every leaf and section of `model`, depth first, in declaration order.

    `env_prefix` is None below a list: its items are set as JSON through the list's variable.
    """
    for name, info in model.model_fields.items():
        path = f"{key}.{name}" if key else name
        env = f"{env_prefix}{name.upper()}" if env_prefix is not None else ""
        nested = _nested_model(info.annotation)
        default = default_text(info)
        optional_section = nested is not None and not nested[1] and default == "none"
        yield FieldDoc(
            key=path,
            type=type_name(info.annotation),
            default=default,
            env=env,
            description=(info.description or "").strip(),
            constraints=constraints_text(info),
            note="the defaults below apply once the section is set" if optional_section else "",
        )
        if nested is not None:
            sub_model, is_list = nested
            if is_list:
                yield from iter_fields(sub_model, None, f"{path}[]")
            else:
                yield from iter_fields(sub_model, f"{env}__" if env else None, path)


def env_prefix_of(settings: type[BaseModel]) -> str:
    """The prefix pydantic-settings really uses (upper-cased: matching is case-insensitive)."""
    return str(settings.model_config.get("env_prefix", "") or "").upper()


def _nested_model(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """(model, is_list) when the field holds a section or a list of sections."""
    for arg in _union_members(annotation):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg, False
        if typing.get_origin(arg) in (list, tuple):
            inner = [a for a in typing.get_args(arg) if a is not Ellipsis]
            if len(inner) == 1 and isinstance(inner[0], type) and issubclass(inner[0], BaseModel):
                return inner[0], True
    return None


def _union_members(annotation: Any) -> tuple[Any, ...]:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def type_name(annotation: Any) -> str:
    """A short, readable type: `float`, `"full" | "normal"`, `list[str]`, `Path | None`."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = typing.get_args(annotation)
        rest = [type_name(a) for a in members if a is not type(None)]
        return " | ".join(rest + (["None"] if type(None) in members else []))
    if origin is Literal:
        return " | ".join(_literal(v) for v in typing.get_args(annotation))
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin is not None:
        args = ", ".join(
            "..." if a is Ellipsis else type_name(a) for a in typing.get_args(annotation)
        )
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, SecretStr):
        return "secret"
    return getattr(annotation, "__name__", str(annotation))


def _literal(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def default_text(info: FieldInfo) -> str:
    """The default as a user would write it; `required` when there is none."""
    if info.is_required():
        return "required"
    factory = info.default_factory
    # pydantic types factories as maybe taking the validated data; the settings' take none
    value = factory() if factory is not None else info.default  # type: ignore[call-arg]
    if value is PydanticUndefined:
        return "required"
    return _value_text(value)


def _value_text(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return _value_text(value.value)
    if isinstance(value, Path):
        return _path_text(value)
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        return "[" + ", ".join(_value_text(v) for v in value) + "]"
    if isinstance(value, float) and value.is_integer():
        return f"{value:.1f}"
    return str(value)


def _path_text(path: Path) -> str:
    """Home-relative paths as `~/...`, so the reference is the same on every machine."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)


def constraints_text(info: FieldInfo) -> str:
    """Bounds and patterns from the field's metadata (`>= 0`, `<= 1`, `pattern ...`)."""
    parts: list[str] = []
    for meta in info.metadata:
        for attr, symbol in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            bound = getattr(meta, attr, None)
            if bound is not None:
                parts.append(f"{symbol} {_value_text(bound)}")
        for attr, label in (("min_length", "min length"), ("max_length", "max length")):
            bound = getattr(meta, attr, None)
            if bound is not None:
                parts.append(f"{label} {bound}")
        pattern = getattr(meta, "pattern", None)
        if pattern is not None:
            parts.append(f"pattern `{pattern}`")
    return ", ".join(parts)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def render_settings(doc: SettingsDoc) -> str:
    """The Markdown section of one settings tree."""
    settings = doc.load()
    prefix = env_prefix_of(settings)
    lines = [
        f"## {doc.title}",
        "",
        f"`{doc.import_path}`, read by `{doc.command}`. {doc.intro}",
        "",
    ]
    if prefix:
        lines.append(
            f"Environment variables start with `{prefix}`; `__` goes one level down "
            f"(`{prefix}A__B` sets `a.b`)."
        )
    else:
        lines.append(
            "These settings have **no environment prefix**: the variable is the key itself, "
            "upper-cased, with `__` going one level down (`A__B` sets `a.b`)."
        )
    lines += [
        "Lists (and list items, shown as `key[]`) are set as JSON in the list's variable.",
        "",
        "| key | type | default | env var | description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for field in iter_fields(settings, prefix):
        description = field.description
        if field.constraints:
            description = (
                f"{description} ({field.constraints})" if description else field.constraints
            )
        if field.note:
            description = f"{description}; *{field.note}*" if description else f"*{field.note}*"
        lines.append(
            "| "
            + " | ".join(
                [
                    _code(field.key),
                    _cell(_code(field.type)),
                    _cell(_code(field.default)),
                    _code(field.env) or "(in the list's JSON)",
                    _cell(description),
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def render_cli_env() -> str:
    """Command-line options that also read an environment variable (from the typer tree)."""
    import typer

    from edgefleet.cli import app

    rows: list[tuple[str, str, str, str]] = []

    def walk(command: Any, path: list[str]) -> None:
        for param in getattr(command, "params", []):
            envvar = getattr(param, "envvar", None)
            if not envvar:
                continue
            names = [envvar] if isinstance(envvar, str) else list(envvar)
            for name in names:
                option = "/".join(getattr(param, "opts", []) or [param.name or ""])
                rows.append((name, " ".join(path), option, getattr(param, "help", "") or ""))
        for name in sorted(getattr(command, "commands", {}) or {}):
            walk(command.commands[name], [*path, name])

    walk(typer.main.get_command(app), ["edgefleet"])
    lines = [
        "## Command-line options read from the environment",
        "",
        "| env var | command | option | description |",
        "| --- | --- | --- | --- |",
    ]
    lines += [f"| `{env}` | `{cmd}` | `{opt}` | {_cell(help_)} |" for env, cmd, opt, help_ in rows]
    if not rows:
        lines.append("| (none) | | | |")
    return "\n".join(lines) + "\n"


def render_markdown() -> str:
    """The whole reference, as written to `docs/configuration.md`."""
    head = [
        "# Configuration reference",
        "",
        f"<!-- Generated from the settings models by `{REGENERATE}`; do not edit by hand. -->",
        "",
        "Every process reads one YAML file (`-c FILE`) and environment variables; a variable",
        "overrides the file. Every setting has a default except where it says `required`, and",
        "unknown keys are refused with the file and line of the mistake. A variable or a file",
        "key sets that one key: the rest of its section keeps its defaults (the edge's",
        "`model.execution` keeps the edge's own tuning when one of its keys is set).",
        "",
        "Example, the same setting three ways:",
        "",
        "```yaml",
        "# part of edge.yaml",
        "policy:",
        "  unsure_low: 0.4",
        "```",
        "",
        "```bash",
        "EDGEFLEET_EDGE_POLICY__UNSURE_LOW=0.4 edgefleet edge run -c edge.yaml",
        "```",
        "",
        "Contents: " + ", ".join(f"[{d.title}](#{_anchor(d.title)})" for d in SETTINGS) + ".",
        "",
    ]
    sections = [render_settings(doc) for doc in SETTINGS] + [render_cli_env()]
    return "\n".join(head) + "\n" + "\n".join(sections)


def _anchor(title: str) -> str:
    return title.lower().replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    """Write `docs/configuration.md` (or, with --check, say whether it is current)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    parser.add_argument("--output", type=Path, default=DOC_PATH, help="where to write")
    args = parser.parse_args(argv)
    text = render_markdown()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
