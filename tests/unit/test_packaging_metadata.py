"""The distribution's metadata: role extras, the files derived from them, the licence."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
WEB_AND_DB = {"fastapi", "uvicorn", "python-multipart", "sse-starlette", "psycopg", "psycopg-pool"}
requirements = runpy.run_path(str(ROOT / "docker" / "requirements.py"), run_name="requirements")


def _names(reqs: list[str]) -> set[str]:
    return {requirements["name_of"](r) for r in reqs}


def test_the_edge_gets_no_web_or_database_stack() -> None:
    edge = _names(requirements["flatten"](PROJECT, "edge"))
    assert not edge & WEB_AND_DB, edge & WEB_AND_DB
    assert _names(requirements["flatten"](PROJECT, "cloud")) >= WEB_AND_DB


def test_dev_installs_the_cloud_role() -> None:
    assert "edgefleet[cloud]" in PROJECT["optional-dependencies"]["dev"]
    assert _names(requirements["flatten"](PROJECT, "dev")) >= WEB_AND_DB


def test_requirements_files_are_derived_from_pyproject() -> None:
    """Stale after a pyproject edit: run `make requirements` and commit the result."""
    for path, text in requirements["expected"](ROOT).items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is stale: make requirements"


def test_images_install_their_roles_requirements() -> None:
    docker = ROOT / "docker"
    for name, role in (("x86/Dockerfile.edge", "edge"), ("x86/Dockerfile.cloud", "cloud")):
        text = (docker / name).read_text()
        assert f"pip install --no-cache-dir -r requirements-{role}.txt" in text, name
        assert "--no-deps /wheels/edgefleet-" in text, name
    jetson = (docker / "jetson" / "Dockerfile").read_text()
    assert "-r docker/jetson/requirements-jetson.txt" in jetson
    assert "--no-deps /wheels/edgefleet-" in jetson


def test_the_licence_file_is_the_declared_one() -> None:
    assert PROJECT["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert re.search(r"Apache License\s+Version 2\.0, January 2004", text)
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text
    assert len(text.split()) > 1500  # the full text, not a pointer to it


def test_every_part_folder_installs_under_edgefleet() -> None:
    """setup.py maps each part's folder to edgefleet.<part>; a new folder must join PARTS."""
    parts = re.search(r"^PARTS = \((.*)\)$", (ROOT / "setup.py").read_text(), re.M).group(1)
    declared = set(re.findall(r'"(\w+)"', parts))
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"edgefleet", "tests"}
    assert declared == folders
