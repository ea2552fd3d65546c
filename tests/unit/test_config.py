from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from edgefleet.shared.config import EdgefleetSettings, load_settings
from edgefleet.shared.errors import ConfigError


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    port: int = Field(1883, description="port")


class DemoSettings(EdgefleetSettings):
    model_config = EdgefleetSettings.model_config | {"env_prefix": "EDGEFLEET_TEST_"}
    name: str = Field("x", description="a name")
    inner: Inner = Field(default_factory=Inner, description="nested")


def test_defaults_need_no_file():
    assert load_settings(DemoSettings).inner.port == 1883


def test_yaml_then_environment_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "c.yaml"
    path.write_text("name: from-file\ninner:\n  port: 2000\n")
    assert load_settings(DemoSettings, path).inner.port == 2000
    monkeypatch.setenv("EDGEFLEET_TEST_INNER__PORT", "3000")
    settings = load_settings(DemoSettings, path)
    assert (settings.name, settings.inner.port) == ("from-file", 3000)


def test_errors_name_the_file_line_and_key(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text("name: ok\ninner:\n  port: not-a-port\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:3: inner\.port"):
        load_settings(DemoSettings, path)


def test_a_bad_environment_variable_is_blamed_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # given a good file whose port a variable overrides with a bad value
    path = tmp_path / "c.yaml"
    path.write_text("name: ok\ninner:\n  port: 2000\n")
    monkeypatch.setenv("EDGEFLEET_TEST_INNER__PORT", "not-a-port")
    # then the error names the variable, not the file's line
    with pytest.raises(ConfigError) as caught:
        load_settings(DemoSettings, path)
    assert "environment variable EDGEFLEET_TEST_INNER__PORT: inner.port" in str(caught.value)
    assert "c.yaml" not in str(caught.value)


def test_unknown_keys_are_refused(tmp_path: Path):
    path = tmp_path / "c.yaml"
    path.write_text("name: ok\nnmae: typo\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:2: nmae"):
        load_settings(DemoSettings, path)


@pytest.mark.parametrize("text", ["- a\n- b\n", "name: [unclosed\n"])
def test_non_mapping_or_broken_yaml_is_a_config_error(tmp_path: Path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_settings(DemoSettings, path)


def test_missing_file_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(DemoSettings, tmp_path / "nope.yaml")


def test_a_file_that_is_not_utf8_is_a_config_error_not_a_traceback(tmp_path: Path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_settings(DemoSettings, path)
