"""The layer contracts of pyproject.toml hold: CLI > bench > cloud > fleet | edge > shared,
inside shared models > executor > kernels > imaging, edge and cloud independent, the cloud
reaching the fleet through one public module, no web stack under the edge, no `tests` import
from product code."""

from __future__ import annotations

import json
import subprocess
import sys

import tomllib

from tests.support.layers import ROOT, import_circles, lint_imports


def test_import_linter_contracts_hold():
    result = lint_imports()
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    count = len(contracts["contracts"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{count} kept, 0 broken" in result.stdout, result.stdout
    assert count >= 6


def test_the_edge_agent_imports_no_web_stack():
    """On a Jetson, `edgefleet[edge]` has no FastAPI: the agent and the CLI must not need it."""
    cloud_only = "{'fastapi', 'starlette', 'uvicorn', 'sse_starlette', 'psycopg', 'cryptography'}"
    code = (
        "import sys, edgefleet.cli, edgefleet.edge.agent, edgefleet.edge.cli; "
        f"loaded = {cloud_only} & set(sys.modules); assert not loaded, loaded"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert result.returncode == 0, result.stderr


def test_the_installed_packages_import_in_no_circle() -> None:
    result = import_circles()
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads(result.stdout)
    assert found["modules"] > 100, found
    assert found["circles"] == []
