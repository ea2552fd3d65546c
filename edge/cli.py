"""`edgefleet edge run -c edge.yaml`: the agent's command line."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from edgefleet.shared.errors import EdgefleetError

app = typer.Typer(
    help="The edge agent: reads the cameras or videos in edge.yaml, runs the model on the "
    "device and sends unsure frames and telemetry to the cloud.\n\n"
    "Example: edgefleet edge run -c edge.yaml",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
log = logging.getLogger(__name__)


@app.callback()
def _edge() -> None:
    """The `edge` group; its --help text is the `help=` above (typer prefers it)."""


@app.command()
def run(
    config: Path = typer.Option(
        ..., "--config", "-c", help="edge.yaml (EDGEFLEET_EDGE_... variables override it)"
    ),
    log_level: str = typer.Option("INFO", help="DEBUG, INFO, WARNING or ERROR"),
    json_logs: bool = typer.Option(True, help="JSON log lines (with trace ids)"),
) -> None:
    """Run the edge agent in the foreground until SIGTERM or Ctrl-C.

    It reads the streams in edge.yaml, runs the model, sends unsure frames
    to the cloud, reports telemetry and serves its health endpoints. Exit
    status 2 when it cannot start (config refused, port taken).

    Example: edgefleet edge run -c edge.yaml --log-level DEBUG --no-json-logs
    """
    from edgefleet.edge.agent import Agent
    from edgefleet.edge.model import model_execution
    from edgefleet.edge.settings import EdgeSettings
    from edgefleet.shared.config import load_settings
    from edgefleet.shared.executor.selftest import run_selftest
    from edgefleet.shared.logs import configure_logging

    configure_logging(log_level, json_format=json_logs)
    try:
        settings = load_settings(EdgeSettings, config).beside(config)
        # first the backend the model will get, logged and in the health pages; a host
        # where no GPU backend loads goes on, on the CPU, saying why
        run_selftest(model_execution(settings))
        agent = Agent(settings)
        agent.run_forever()
    except EdgefleetError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:  # e.g. the outbox folder is not writable, the port is taken
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


@app.command()
def selftest(
    config: Path | None = typer.Option(
        None, "--config", "-c", help="edge.yaml whose model.execution to test (default: none)"
    ),
    json_out: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Load a tiny model on the first backend of the order that runs here and say which
    backend and provider it got, and why each one before it was passed over.

    What `edge run` does first; exit status 1 when no backend ran it, 2 for a bad config.

    Example: docker run --rm --runtime nvidia edgefleet-edge-jetson:0.1.0 edge selftest
    """
    from edgefleet.edge.execution import edge_execution
    from edgefleet.edge.model import model_execution
    from edgefleet.edge.settings import EdgeSettings
    from edgefleet.shared.config import load_settings
    from edgefleet.shared.executor.selftest import selftest_output

    try:
        execution = (
            model_execution(load_settings(EdgeSettings, config).beside(config))
            if config is not None
            else edge_execution(1)
        )
    except EdgefleetError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    text, status = selftest_output(execution, json_out)
    typer.echo(text)
    raise typer.Exit(status)


@app.command()
def updater(
    config: Path = typer.Option(
        ..., "--config", "-c", help="the device's edge.yaml (device id and key)"
    ),
    compose: Path = typer.Option(
        ..., help="compose file whose `edge` service defines the agent's container"
    ),
    folder: Path = typer.Option(
        Path("/var/lib/edgefleet/updater"),
        help="folder shared with the agent: request.json in, status.json out",
    ),
    name: str = typer.Option("edgefleet-edge", help="the agent container's name"),
    deadline: float = typer.Option(300.0, help="seconds a new agent has to get ready"),
    min_free_gb: float = typer.Option(12.0, help="free GB the engine's disk must keep"),
    log_level: str = typer.Option("INFO", help="DEBUG, INFO, WARNING or ERROR"),
) -> None:
    """Apply deployment images on this host, outside the agent's container (a systemd
    service). It recovers an interrupted update first, then applies each signed request
    the agent hands over; exit status 2 when it cannot start.

    Example: edgefleet edge updater -c /opt/edgefleet/bundle/edge.yaml --compose compose.yaml
    """
    import signal
    import threading

    from edgefleet.edge.agent_container import AgentContainer
    from edgefleet.edge.image_update import ImageUpdater
    from edgefleet.edge.settings import EdgeSettings
    from edgefleet.shared.config import load_settings
    from edgefleet.shared.logs import configure_logging

    configure_logging(log_level, json_format=True)
    try:
        import docker

        settings = load_settings(EdgeSettings, config)
        key_file = settings.device_key_file
        if key_file is not None and not key_file.exists():
            # the bundle names its container path (/etc/edgefleet/...); on the host it lies
            # beside edge.yaml
            settings = settings.model_copy(
                update={"device_key_file": config.parent / key_file.name}
            )
        container, key = AgentContainer(compose), settings.key_bytes()
        engine = docker.from_env(timeout=600)
        service = ImageUpdater(
            engine,
            container,
            folder,
            settings.device_id,
            key,
            name=name,
            deadline_s=deadline,
            min_free_bytes=int(min_free_gb * 2**30),
        )
        service.recover()
    except (EdgefleetError, OSError, ImportError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except Exception as exc:  # docker.errors.DockerException: no engine to talk to
        typer.echo(f"error: the Docker Engine did not answer: {exc}", err=True)
        raise typer.Exit(2) from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(1.0):  # the agent writes request.json at most once per deployment
        service.handle_request()
