"""`edgefleet cloud ...`: serve the orchestrator, export the training set, hash API keys."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from shared.config import load_settings
from shared.errors import EdgefleetError

app = typer.Typer(
    help="The cloud orchestrator: REST + MQTT ingest, cascade, feedback store.\n\n"
    "Example: edgefleet cloud serve -c cloud.yaml"
)

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="cloud.yaml (defaults work without one)")
]


def _settings(config: Path | None):
    from cloud.settings import CloudSettings

    try:
        return load_settings(CloudSettings, config)
    except EdgefleetError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="override http.host")] = None,
    port: Annotated[int | None, typer.Option(help="override http.port")] = None,
) -> None:
    """Run the REST API and the MQTT ingest in one process (uvicorn).

    Example: edgefleet cloud serve -c cloud.yaml --port 8080
    """
    import uvicorn

    from cloud.app import create_app
    from shared.logs import configure_logging

    settings = _settings(config)
    configure_logging(settings.log_level)
    try:
        api = create_app(settings)
    except EdgefleetError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    uvicorn.run(
        api,
        host=host or settings.http.host,
        port=settings.http.port if port is None else port,
        log_config=None,
        access_log=False,
    )


@app.command()
def export(
    config: ConfigOption = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="JSONL file; default stdout")
    ] = None,
) -> None:
    """Write the training set (JSONL: image path, label, source) with a progress bar.

    Example: edgefleet cloud export -c cloud.yaml -o train.jsonl
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from cloud.store import FeedbackStore
    from shared.db import Database

    settings = _settings(config)
    db = Database.connect(settings.resolved_database_url())
    try:
        store = FeedbackStore(db, settings.data_dir / "images")
        total = store.count_exportable()
        out = output.open("w", encoding="utf-8") if output else sys.stdout
        written = 0
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=None if output else _stderr_console(),
            transient=output is None,
        ) as progress:
            task = progress.add_task("exporting cases", total=total)
            for record in store.export():
                out.write(record.to_json() + "\n")
                written += 1
                progress.advance(task)
            progress.update(task, completed=total)
        if output:
            out.close()
            typer.echo(f"{written} examples written to {output}", err=True)
    finally:
        db.close()


@app.command("hash-key")
def hash_key(key: Annotated[str, typer.Argument(help="an operator API key")]) -> None:
    """Print the SHA-256 to put in `api_keys[].sha256` (the key itself is never stored).

    Example: edgefleet cloud hash-key "$(openssl rand -hex 24)"
    """
    from cloud.auth import key_digest

    typer.echo(key_digest(key))


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)
