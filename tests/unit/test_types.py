"""mypy (with the pydantic plugin) is clean on the parts under their import names, and the
message contracts (messages, wire, topics), the edge, the cloud and the fleet are checked with
mypy's strict flags."""

from __future__ import annotations

import tomllib

from tests.support.layers import ROOT
from tests.support.types import mypy

STRICT_MODULES = {
    "edgefleet.shared.messages",
    "edgefleet.shared.wire",
    "edgefleet.shared.topics",
    "edgefleet.edge.*",
    "edgefleet.cloud.*",
    "edgefleet.fleet.*",
}
# What `mypy --strict` enables that a per-module section can set (`strict = true` there
# would apply to every module).
STRICT_FLAGS = {
    "disallow_any_generics",
    "disallow_subclassing_any",
    "disallow_untyped_calls",
    "disallow_untyped_defs",
    "disallow_incomplete_defs",
    "check_untyped_defs",
    "disallow_untyped_decorators",
    "warn_return_any",
    "no_implicit_reexport",
    "strict_equality",
    "extra_checks",
}


def test_mypy_is_clean():
    result = mypy()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout, result.stdout


def test_the_contracts_edge_cloud_and_fleet_are_checked_strictly():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert "pydantic.mypy" in config["plugins"]
    strict = [
        o
        for o in config["overrides"]
        if set(o["module"]) >= STRICT_MODULES and all(o.get(f) is True for f in STRICT_FLAGS)
    ]
    assert strict, "no override sets the strict flags on messages, wire, topics, edge, cloud, fleet"
    assert "strict" not in config, "a global strict would hide which modules are strict"
    for override in config["overrides"]:
        assert "strict" not in override, "mypy applies an override's `strict` to every module"
