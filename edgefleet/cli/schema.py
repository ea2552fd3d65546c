"""`edgefleet schema`: the JSON Schema of every message, and a checker for documents."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from pydantic import ValidationError

from edgefleet.shared.messages import MESSAGE_TYPES, json_schemas


def schema(
    check: Path | None = typer.Option(
        None, "--check", help="validate this JSON document against the schema it names"
    ),
) -> None:
    """Print the JSON Schema of every message, keyed by schema id.

    Example: `edgefleet schema > schemas.json`, or `edgefleet schema --check telemetry.json`.
    """
    if check is None:
        typer.echo(json.dumps(json_schemas(), indent=2))
        return
    try:
        raw = check.read_bytes()
    except OSError as exc:
        typer.echo(f"{check}: cannot read: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None
    try:
        document = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError names line and column; UnicodeDecodeError
        typer.echo(f"{check}: not JSON: {exc}", err=True)
        raise typer.Exit(2) from None
    if not isinstance(document, dict):
        kinds: dict[type, str] = {list: "an array", str: "a string"}
        kind = kinds.get(type(document), "a bare value")
        typer.echo(f"{check}: the document is {kind}; a message is a JSON object", err=True)
        raise typer.Exit(2)
    schema_id = document.get("schema")
    model = MESSAGE_TYPES.get(schema_id) if isinstance(schema_id, str) else None
    if model is None:
        known = ", ".join(MESSAGE_TYPES)
        typer.echo(f'{check}: unknown or missing "schema" {schema_id!r} (known: {known})', err=True)
        raise typer.Exit(1)
    try:
        model.model_validate_json(raw)
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "<root>"
            typer.echo(f"{check}: {where}: {err['msg']}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"{check}: valid {schema_id}")
