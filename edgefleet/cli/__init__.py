"""Root of the `edgefleet` CLI. Each part owns its sub-commands; this only mounts them."""

from __future__ import annotations

import typer

from edgefleet.bench.cli import app as bench_app
from edgefleet.cli.model import app as model_app
from edgefleet.cli.model import infer
from edgefleet.cli.schema import schema
from edgefleet.cloud.cli import app as cloud_app
from edgefleet.demo.cli import demo
from edgefleet.edge.cli import app as edge_app
from edgefleet.fleet.cli import app as fleet_app

ROOT_HELP = (
    "Edge-plus-cloud computer vision for Jetson fleets: run models on the devices, send "
    "unsure frames to the cloud, roll models out. Start with `edgefleet demo`.\n\n"
    "Example: edgefleet demo --duration 30 --devices 2\n\n"
    "Example: edgefleet infer photo.jpg --json"
)

app = typer.Typer(
    name="edgefleet",
    help=ROOT_HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """The root group; its --help text is ROOT_HELP (typer prefers `help=` to this)."""


app.command("demo")(demo)
app.command("infer")(infer)
app.command("schema")(schema)
app.add_typer(edge_app, name="edge")
app.add_typer(cloud_app, name="cloud")
app.add_typer(fleet_app, name="fleet")
app.add_typer(model_app, name="model")
app.add_typer(bench_app, name="bench")


def main() -> None:
    app()
