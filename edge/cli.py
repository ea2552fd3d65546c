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
    from edgefleet.edge.settings import EdgeSettings
    from edgefleet.shared.config import load_settings
    from edgefleet.shared.logs import configure_logging

    configure_logging(log_level, json_format=json_logs)
    try:
        settings = load_settings(EdgeSettings, config).beside(config)
        agent = Agent(settings)
        agent.run_forever()
    except EdgefleetError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:  # e.g. the outbox folder is not writable, the port is taken
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
