"""`edgefleet edge run -c edge.yaml`: the agent's command line."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from shared.errors import EdgefleetError

app = typer.Typer(help="The edge agent.", no_args_is_help=True, pretty_exceptions_enable=False)
log = logging.getLogger(__name__)


@app.callback()
def _edge() -> None:
    """The edge agent."""


@app.command()
def run(
    config: Path = typer.Option(
        ..., "--config", "-c", help="edge.yaml (EDGEFLEET_EDGE_... variables override it)"
    ),
    log_level: str = typer.Option("INFO", help="DEBUG, INFO, WARNING or ERROR"),
    json_logs: bool = typer.Option(True, help="JSON log lines (with trace ids)"),
) -> None:
    """Run the edge agent until SIGTERM: sources → model → escalations, telemetry, health."""
    from edge.agent import Agent
    from edge.settings import EdgeSettings
    from shared.config import load_settings
    from shared.logs import configure_logging

    configure_logging(log_level, json_format=json_logs)
    try:
        settings = load_settings(EdgeSettings, config)
        agent = Agent(settings)
        agent.run_forever()
    except EdgefleetError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:  # e.g. the outbox folder is not writable, the port is taken
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
