"""`edgefleet cloud ...`: serve the orchestrator, export the training set, hash API keys."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from edgefleet.shared.config import load_settings
from edgefleet.shared.errors import EdgefleetError

if TYPE_CHECKING:
    import socket

    from rich.console import Console

    from edgefleet.cloud.settings import CloudSettings

app = typer.Typer(
    help="The cloud orchestrator: REST + MQTT ingest, cascade, case store.\n\n"
    "Example: edgefleet cloud serve -c cloud.yaml"
)

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="cloud.yaml (defaults work without one)")
]


def _settings(config: Path | None) -> CloudSettings:
    from edgefleet.cloud.settings import CloudSettings

    try:
        return load_settings(CloudSettings, config)
    except EdgefleetError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="override http.host")] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="override http.port (0 = any free port)")
    ] = None,
) -> None:
    """Run the REST API and the MQTT ingest in one process (uvicorn).

    Example: edgefleet cloud serve -c cloud.yaml --port 8080
    """
    import uvicorn

    from edgefleet.cloud.app import create_app
    from edgefleet.shared.executor.selftest import run_selftest
    from edgefleet.shared.logs import configure_logging
    from edgefleet.shared.malloc import cap_arenas

    cap_arenas()  # before any thread: request threads decoding at once bloat glibc's arenas
    settings = serve_settings(_settings(config), host=host, port=port)
    configure_logging(settings.log_level)
    # first the backend the models will get, logged and in /readyz; a host where no GPU
    # backend loads goes on, on the CPU, saying why
    run_selftest(settings.execution)
    sock = None
    if settings.http.port == 0:
        # bind first, so the port the links name is the port that is served
        sock = _bind(settings.http.host)
        settings = serve_settings(settings, port=sock.getsockname()[1])
    try:
        api = create_app(settings)
    except EdgefleetError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    logging.getLogger(__name__).info(
        "serving on %s:%d; download links name %s",
        settings.http.host,
        settings.http.port,
        settings.resolved_public_url(),
    )
    server = uvicorn.Server(
        uvicorn.Config(
            api,
            host=settings.http.host,
            port=settings.http.port,
            log_config=None,
            access_log=False,
        )
    )
    server.run(sockets=[sock] if sock is not None else None)
    if not server.started:
        raise typer.Exit(3)


@app.command()
def selftest(
    config: ConfigOption = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
) -> None:
    """Load a tiny model on the first backend of the order that runs here and say which
    backend and provider it got, and why each one before it was passed over.

    What `cloud serve` does first; exit status 1 when no backend ran it.

    Example: docker run --rm --gpus all edgefleet-cloud:0.1.0 cloud selftest --json
    """
    from edgefleet.shared.executor.selftest import selftest_output

    text, status = selftest_output(_settings(config).execution, json_out)
    typer.echo(text)
    raise typer.Exit(status)


def serve_settings(
    settings: CloudSettings, *, host: str | None = None, port: int | None = None
) -> CloudSettings:
    """The settings with `--host/--port` written into `http`, so everything built from
    them (download links from `resolved_public_url`, logs) names where uvicorn listens."""
    from edgefleet.cloud.settings import HttpSettings

    update = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    if not update:
        return settings
    http = HttpSettings.model_validate({**settings.http.model_dump(), **update})
    return settings.model_copy(update={"http": http})


def _bind(host: str) -> socket.socket:
    """A TCP socket bound to a free port on `host` (IPv6 literals included)."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, 0))
    except OSError as exc:
        sock.close()
        typer.secho(f"cannot bind {host}: {exc.strerror}", fg="red", err=True)
        raise typer.Exit(2) from None
    return sock


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

    from edgefleet.cloud.store import CaseStore
    from edgefleet.shared.db import Database

    settings = _settings(config)
    db = Database.connect(settings.resolved_database_url())
    try:
        store = CaseStore(db, settings.data_dir / "images")
        total = store.feedback.count_exportable()
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
            task = progress.add_task("scanning cases", total=total)
            for record in store.feedback.export(on_scanned=lambda: progress.advance(task)):
                out.write(record.to_json() + "\n")
                written += 1
        if output:
            out.close()
            typer.echo(f"{written} examples from {total} cases written to {output}", err=True)
    finally:
        db.close()


@app.command("hash-key")
def hash_key(key: Annotated[str, typer.Argument(help="an operator API key")]) -> None:
    """Print the SHA-256 to put in `api_keys[].sha256` (the key itself is never stored).

    Example: edgefleet cloud hash-key "$(openssl rand -hex 24)"
    """
    from edgefleet.cloud.auth import key_digest

    typer.echo(key_digest(key))


def _stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


@app.command("triton-repo")
def triton_repo(
    out: Annotated[Path, typer.Argument(help="the model repository folder to write")],
    config: ConfigOption = None,
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="a model to include; default: the served models"),
    ] = None,
    backend: Annotated[
        str, typer.Option(help="onnxruntime (NVIDIA's container) or python (ORT in Python)")
    ] = "onnxruntime",
    tensorrt: Annotated[bool, typer.Option(help="ONNX Runtime's TensorRT provider")] = False,
    precision: Annotated[str, typer.Option(help="TensorRT precision: fp16 or fp32")] = "fp16",
    kind: Annotated[str, typer.Option(help="instances on the gpu or the cpu")] = "gpu",
    instances: Annotated[int, typer.Option(min=1, max=64, help="instances per device")] = 1,
    max_batch_size: Annotated[
        int, typer.Option(min=1, max=1024, help="largest batch Triton's batcher forms")
    ] = 16,
) -> None:
    """Write a Triton model repository for the cloud's models (ONNX files hash-checked),
    served as it is by `tritonserver --model-repository OUT`.

    Example: edgefleet cloud triton-repo /srv/triton/models --tensorrt --instances 2
    """
    from pydantic import ValidationError

    from edgefleet.cloud.services import model_registry
    from edgefleet.cloud.triton.repository import RepositoryOptions, write_repository

    settings = _settings(config)
    try:
        options = RepositoryOptions(
            backend=backend,  # type: ignore[arg-type]  # checked by the model
            tensorrt=tensorrt,
            precision=precision,  # type: ignore[arg-type]
            kind=kind,  # type: ignore[arg-type]
            instances=instances,
            max_batch_size=max_batch_size,
        )
        written = write_repository(
            out, model_registry(settings), model or settings.models.served, options
        )
    except ValidationError as exc:
        typer.secho(f"bad option: {exc.errors()[0]['msg']}", fg="red", err=True)
        raise typer.Exit(2) from None
    except EdgefleetError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    for path in written:
        typer.echo(path.parent.name)
    typer.echo(f"{len(written)} models written to {out}", err=True)
