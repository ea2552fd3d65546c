"""Root of the `edgefleet` CLI. Each part owns its sub-commands; this only mounts them."""

from __future__ import annotations

import importlib

import typer

from shared import cli as shared_cli

app = typer.Typer(
    name="edgefleet",
    help="Edge-plus-cloud computer vision for Jetson fleets. Start with `edgefleet demo`.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.command("schema")(shared_cli.schema)


@app.callback()
def _root() -> None:
    """Edge-plus-cloud computer vision for Jetson fleets. Start with `edgefleet demo`."""

# (module, attribute, name): sub-apps are mounted when their part exists.
_SUBCOMMANDS = [
    ("shared.model_cli", "app", "model"),
    ("edge.cli", "app", "edge"),
    ("cloud.cli", "app", "cloud"),
    ("fleet.cli", "app", "fleet"),
    ("bench.cli", "app", "bench"),
]
_COMMANDS = [
    ("shared.model_cli", "infer", "infer"),
    ("edgefleet.demo", "demo", "demo"),
]

for module_name, attr, name in _SUBCOMMANDS:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise
        continue
    app.add_typer(getattr(module, attr), name=name)

for module_name, attr, name in _COMMANDS:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):
            raise
        continue
    app.command(name)(getattr(module, attr))


def main() -> None:
    app()
