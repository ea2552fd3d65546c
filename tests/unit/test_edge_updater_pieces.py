"""The host updater's pieces through their own constructors: the shared folder and what
it asks of the engine (the updater itself, on a real Docker engine:
tests/integration/test_image_updater.py)."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgefleet.edge.agent_images import AgentImages, Refused
from edgefleet.edge.update_folder import UpdateFolder


def test_the_folder_reads_what_is_not_there_as_nothing_and_writes_whole_files(
    tmp_path: Path,
) -> None:
    files = UpdateFolder(tmp_path / "update")
    assert files.folder.is_dir()
    assert files.request() is None and files.status() is None
    assert files.journal() == {"current": None, "previous": None, "pending": None}
    files.write_journal({"current": "a@sha256:1", "previous": None, "pending": None})
    files.write_status({"outcome": "running"})
    files.request_file.write_text('{"topic": "t"}')
    again = UpdateFolder(tmp_path / "update")  # another process reading the same folder
    assert again.journal()["current"] == "a@sha256:1"
    assert again.status() == {"outcome": "running"} and again.request() == '{"topic": "t"}'
    files.journal_file.write_text("{not json")  # a torn file written by something else
    assert again.journal()["pending"] is None
    assert stat.S_IMODE(files.status_file.stat().st_mode) & 0o022 == 0


def test_a_pull_is_refused_before_it_starts_when_the_disk_is_short(tmp_path: Path) -> None:
    images = AgentImages(engine=None, min_free_bytes=1 << 62, disk_path=tmp_path)
    with pytest.raises(Refused, match=r"not pulled: \d+ MiB free on .*, the updater keeps"):
        images.check_disk()
    AgentImages(engine=None, min_free_bytes=0, disk_path=tmp_path).check_disk()
    agent = SimpleNamespace(labels={"io.edgefleet.image": "a@sha256:1"})
    assert AgentImages.image_of(agent) == "a@sha256:1"
    assert AgentImages.image_of(SimpleNamespace(labels={})) is None
