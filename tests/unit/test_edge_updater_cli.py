"""`edgefleet edge updater`: bad input and a missing engine exit 2 with the reason."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from edgefleet.cli import app

REPO = Path(__file__).resolve().parents[2]


def bundle(tmp_path: Path) -> Path:
    """An enrollment bundle as `fleet enroll` writes it (the key file named by its
    container path)."""
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "secrets.yaml").write_text("device_id: cam-01\ndevice_key: " + "ab" * 32 + "\n")
    (folder / "edge.yaml").write_text(
        "device_id: cam-01\ndevice_key_file: /etc/edgefleet/secrets.yaml\n"
    )
    return folder / "edge.yaml"


def test_a_missing_compose_file_exits_2_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    result = CliRunner().invoke(
        app, ["edge", "updater", "-c", str(bundle(tmp_path)), "--compose", str(missing)]
    )
    assert result.exit_code == 2, result.output
    assert "nowhere.yaml" in result.output


def test_no_engine_exits_2_after_the_bundle_key_was_found(tmp_path: Path, monkeypatch) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text((REPO / "docker/jetson/compose.yaml").read_text())
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    args = ["edge", "updater", "-c", str(bundle(tmp_path)), "--compose", str(compose)]
    result = CliRunner().invoke(app, [*args, "--folder", str(tmp_path / "updater")])
    assert result.exit_code == 2, result.output
    assert "the Docker Engine did not answer" in result.output
