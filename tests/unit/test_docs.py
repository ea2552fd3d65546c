"""The docs a new user meets stay true: the configuration reference is regenerated from the
settings models, every settings field is described, and every command's --help is complete
and shows an example."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from edgefleet.cli import app, config_docs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_LINE = re.compile(r"^\s*(\$ )?edgefleet ", re.MULTILINE)


def _commands() -> list[tuple[list[str], object]]:
    """Every command and group under `edgefleet`, as (argv path, click command)."""
    found: list[tuple[list[str], object]] = []

    def walk(command: object, path: list[str]) -> None:
        found.append((path, command))
        children = getattr(command, "commands", None) or {}
        for name in sorted(children):
            walk(children[name], [*path, name])

    walk(typer.main.get_command(app), [])
    return found


COMMANDS = _commands()


def test_configuration_reference_is_current() -> None:
    # given the settings models as they are now
    expected = config_docs.render_markdown()
    # when compared with the committed reference
    path = ROOT / "docs" / "configuration.md"
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    # then they are the same
    assert current == expected, (
        f"{path.relative_to(ROOT)} is stale: run `{config_docs.REGENERATE}` and commit it"
    )


def test_configuration_reference_covers_every_settings_tree() -> None:
    text = config_docs.render_markdown()
    for doc in config_docs.SETTINGS:
        settings = doc.load()
        prefix = config_docs.env_prefix_of(settings)
        for name in settings.model_fields:
            assert f"| `{name}` |" in text, f"{doc.import_path}.{name} missing from the reference"
            assert f"`{prefix}{name.upper()}`" in text


def test_env_var_names_are_the_ones_pydantic_settings_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a nested setting set only through the variable the reference names
    from edgefleet.edge.settings import EdgeSettings

    env = {
        f.key: f.env
        for f in config_docs.iter_fields(EdgeSettings, config_docs.env_prefix_of(EdgeSettings))
    }
    monkeypatch.setenv(env["device_id"], "cam-01")
    monkeypatch.setenv(env["device_key"], "k" * 16)
    monkeypatch.setenv(env["policy.unsure_low"], "0.25")
    monkeypatch.setenv(env["model.execution.batching.max_delay_ms"], "7.5")
    # when the settings are built from the environment
    settings = EdgeSettings()
    # then the values arrive where the reference says they do
    assert settings.device_id == "cam-01"
    assert settings.policy.unsure_low == 0.25
    assert settings.model.execution is not None
    assert settings.model.execution.batching.max_delay_ms == 7.5


@pytest.mark.parametrize(
    ("import_path", "key", "value", "read"),
    [
        ("edgefleet.cloud.settings:CloudSettings", "http.port", "9123", lambda s: s.http.port),
        (
            "edgefleet.cloud.settings:CloudSettings",
            "ingest.share_group",
            "g2",
            lambda s: s.ingest.share_group,
        ),
        ("edgefleet.fleet.settings:FleetSettings", "broker_port", "8883", lambda s: s.broker_port),
    ],
)
def test_cloud_and_fleet_variables_are_read_as_documented(
    import_path: str, key: str, value: str, read, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, _, name = import_path.partition(":")
    settings_cls = getattr(__import__(module, fromlist=[name]), name)
    prefix = config_docs.env_prefix_of(settings_cls)
    env = {f.key: f.env for f in config_docs.iter_fields(settings_cls, prefix)}
    monkeypatch.setenv(env[key], value)
    assert str(read(settings_cls())) == value


def test_readme_states_the_real_environment_prefixes() -> None:
    readme = (ROOT / "README.md").read_text()
    for doc in config_docs.SETTINGS:
        prefix = config_docs.env_prefix_of(doc.load())
        if prefix:
            assert f"`{prefix}" in readme, f"README should name the {prefix} prefix"
        else:
            assert "**no prefix**" in readme, f"README should say {doc.import_path} has none"


def test_every_settings_field_has_a_description() -> None:
    missing = [
        f"{doc.import_path} {field.key}"
        for doc in config_docs.SETTINGS
        for field in config_docs.iter_fields(doc.load(), "")
        if not field.description
    ]
    assert not missing, "settings fields without description=: " + ", ".join(missing)


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n", encoding="utf-8")
    assert config_docs.main(["--check", "--output", str(stale)]) == 1
    assert config_docs.main(["--output", str(stale)]) == 0
    assert config_docs.main(["--check", "--output", str(stale)]) == 0


SETTINGS_BY_FILE = {
    "edge.yaml": "edgefleet.edge.settings:EdgeSettings",
    "cloud.yaml": "edgefleet.cloud.settings:CloudSettings",
    "fleet.yaml": "edgefleet.fleet.settings:FleetSettings",
}
YAML_BLOCK = re.compile(r"```yaml\n# (edge|cloud|fleet)\.yaml\n(.*?)```", re.DOTALL)


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_settings_examples_in_the_docs_are_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given every ```yaml block in the docs that starts with `# edge.yaml` (cloud, fleet)
    from edgefleet.shared.config import load_settings
    from edgefleet.shared.errors import ConfigError

    for name in list(os.environ):
        if name.upper().startswith(("EDGEFLEET_", "HTTP__", "MQTT__", "DATABASE_URL")):
            monkeypatch.delenv(name)
    examples = [
        (doc, kind, text)
        for doc in _doc_files()
        for kind, text in YAML_BLOCK.findall(doc.read_text())
    ]
    assert examples, "the README should show at least one settings example"
    for doc, kind, text in examples:
        # when it is loaded as the process would load it
        path = tmp_path / f"{kind}.yaml"
        path.write_text(text)
        module, _, cls = SETTINGS_BY_FILE[f"{kind}.yaml"].partition(":")
        settings_cls = getattr(__import__(module, fromlist=[cls]), cls)
        # then it is accepted (a ConfigError names the key and line otherwise)
        try:
            load_settings(settings_cls, path)
        except ConfigError as exc:
            pytest.fail(f"{doc.name}: its {kind}.yaml example is refused: {exc}")


def test_contracts_page_covers_every_message_and_field() -> None:
    from edgefleet.shared.messages import MESSAGE_TYPES

    text = (ROOT / "docs" / "contracts.md").read_text()
    for schema_id, model in MESSAGE_TYPES.items():
        assert f"`{schema_id}`" in text, f"docs/contracts.md does not mention {schema_id}"
        for field in model.model_json_schema(by_alias=True)["properties"]:
            assert f"`{field}`" in text, f"docs/contracts.md: {schema_id} field `{field}` missing"


def test_links_between_docs_resolve() -> None:
    for doc in _doc_files():
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


@pytest.mark.parametrize(
    "path", [p for p, _ in COMMANDS], ids=[" ".join(["edgefleet", *p]) for p, _ in COMMANDS]
)
def test_command_help_is_complete_with_an_example(path: list[str]) -> None:
    command = dict((tuple(p), c) for p, c in COMMANDS)[tuple(path)]
    name = " ".join(["edgefleet", *path])
    # when the user asks for help
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
    # then it renders, says what the command does and describes every option and argument
    assert result.exit_code == 0, f"{name} --help failed ({result.exception!r}): {result.output}"
    problems = []
    if not (getattr(command, "help", None) or "").strip():
        problems.append("no help text")
    undescribed = [
        param.name
        for param in getattr(command, "params", [])
        if param.name != "help" and not (getattr(param, "help", None) or "").strip()
    ]
    if undescribed:
        problems.append(f"parameters without help: {undescribed}")
    # and its own text (help up to click's \f cut, epilog; not its children's summaries)
    # shows an example: the word, or a line that is a command line. A command without its
    # own --help option forwards it (`edgefleet bench NAME`): what it printed is its text.
    help_text = (getattr(command, "help", None) or "").split("\f")[0]
    own = help_text + "\n" + (getattr(command, "epilog", None) or "")
    if not getattr(command, "add_help_option", True):
        own = result.output
    if "Example" not in own and not EXAMPLE_LINE.search(own):
        problems.append("no example ('Example' or a line starting `$ edgefleet `)")
    assert not problems, f"{name} --help: " + "; ".join(problems)


def test_contracts_page_lists_every_rest_endpoint(tmp_path: Path) -> None:
    # given the orchestrator's real routes (no broker, models loaded lazily)
    from edgefleet.cloud.app import create_app
    from edgefleet.cloud.settings import CloudSettings

    settings = CloudSettings(
        data_dir=tmp_path, ingest={"enabled": False}, models={"preload": False}
    )
    api = create_app(settings)
    try:
        routes = set(api.openapi()["paths"])
    finally:
        api.state.services.close()

    # when the contracts page is read, placeholders compared by position only
    def shape(path: str) -> str:
        return re.sub(r"\{[^}]*\}", "{}", path)

    documented = {
        shape(p)
        for p in re.findall(
            r"(/(?:v1/[^\s`?,|]*|healthz|readyz|metrics))",
            (ROOT / "docs" / "contracts.md").read_text(),
        )
    }
    # then every route is there
    missing = sorted(r for r in routes if shape(r) not in documented)
    assert not missing, f"docs/contracts.md does not list: {missing}"
