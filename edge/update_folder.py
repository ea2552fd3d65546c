"""The folder the host updater shares with the agent: the request the agent hands over
(`request.json`), the outcome it reports upward (`status.json`) and the updater's journal
(`journal.json`, each step recorded first so that a power cut is recovered)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgefleet.edge.updater import atomic_write


class UpdateFolder:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    @property
    def request_file(self) -> Path:
        return self.folder / "request.json"

    @property
    def status_file(self) -> Path:
        return self.folder / "status.json"

    @property
    def journal_file(self) -> Path:
        return self.folder / "journal.json"

    def request(self) -> str | None:
        """The request as the agent wrote it; None when there is none."""
        try:
            return self.request_file.read_text()
        except OSError:
            return None

    def journal(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.journal_file.read_text())
            return data
        except (OSError, ValueError):
            return {"current": None, "previous": None, "pending": None}

    def write_journal(self, data: dict[str, Any]) -> None:
        _write(self.journal_file, data)

    def status(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(self.status_file.read_text())
            return data
        except (OSError, ValueError):
            return None

    def write_status(self, data: dict[str, Any]) -> None:
        _write(self.status_file, data)


def _write(path: Path, data: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(data, indent=2).encode())
