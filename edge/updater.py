"""The device side of a rollout: apply a `DesiredState` safely and report every step.

Order of work, chosen so a failure at any point leaves the device running what it ran:
1. report `applying`;
2. download each changed model (HTTP Range resumes a partial download, the SHA-256 from
   the signed desired state is checked before the file is used, then an atomic rename);
3. `control.swap_model` loads and warms it beside the old one and swaps only when warmed
   (it raises, and the old model keeps running, if that fails);
4. hand an image change to the runtime (the host updater on a device, a process in tests;
   `runtime.kind: none` reports `not_applied`);
5. report `healthy`, or `failed` with the reason after undoing this attempt's swaps.

The previous version of every model stays on disk, so the fleet's rollback (the old
desired state again) is a swap without a download.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import httpx
from prometheus_client import Counter
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from edgefleet.shared.errors import EdgefleetError, ModelIntegrityError
from edgefleet.shared.hashing import sha256_file
from edgefleet.shared.messages import DeploymentStatus, DesiredState, ModelRef, ReportedState
from edgefleet.shared.wire import WireMessage

if TYPE_CHECKING:
    from edgefleet.edge.control import AgentControl

log = logging.getLogger(__name__)

APPLIED = Counter("ef_edge_desired_applied_total", "Desired states applied", ["outcome"])
DOWNLOADED = Counter("ef_edge_model_download_bytes_total", "Model bytes downloaded")
RESUMED = Counter("ef_edge_model_download_resumed_total", "Downloads resumed with Range")

_FILENAME_RE = re.compile(r'filename="?([A-Za-z0-9._-]{1,128})"?')
_CHUNK = 1 << 16


class UpdateFailed(EdgefleetError):
    code = "update_failed"
    http_status = 502


class Runtime(Protocol):
    """Where the agent's container image runs; swapped by `apply`."""

    def current_image(self) -> str | None:
        """The image running now (None if unknown)."""

    def apply(self, image: str, config: dict[str, Any]) -> None:
        """Run `image`; raise EdgefleetError if it cannot be started."""


class HandedOver(EdgefleetError):
    """The image is with the host updater and this agent stops before its answer: the
    agent that runs next reports the outcome, so this one reports nothing."""

    code = "image_handed_over"
    http_status = 202


class ImageNotApplied(EdgefleetError):
    """The device has no container runtime, so a deployment's image cannot run on it."""

    code = "image_not_applied"
    http_status = 409


class NullRuntime:
    """No container runtime (the agent runs on the host): an image is never applied, and
    saying so keeps a rollout from counting this device healthy for an image it never ran."""

    def current_image(self) -> str | None:
        return None

    def apply(self, image: str, config: dict[str, Any]) -> None:
        raise ImageNotApplied(
            f"image not applied: {image} (runtime.kind is none: the agent runs on the host)"
        )


class DesiredStateApplier:
    """Applies desired states one at a time and reports each step through `control`."""

    def __init__(
        self,
        control: AgentControl,
        state_dir: Path,
        runtime: Runtime | None = None,
        *,
        token: str | None = None,
        api_url: str | None = None,
        http: httpx.Client | None = None,
        max_model_bytes: int = 4 << 30,
    ):
        self.control = control
        self.state_dir = Path(state_dir)
        self.runtime: Runtime = runtime or NullRuntime()
        self.token = token
        self.api_origin = _origin(api_url) if api_url else None
        self.http = http or httpx.Client(timeout=httpx.Timeout(30.0, connect=10.0))
        self.max_model_bytes = max_model_bytes
        self._lock = threading.Lock()
        (self.state_dir / "downloads").mkdir(parents=True, exist_ok=True)
        (self.state_dir / "models").mkdir(parents=True, exist_ok=True)

    # --- state on disk ----------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.state_dir / "state.json"

    def state(self) -> dict[str, Any]:
        """What was last applied: deployment, image, status and installed model files."""
        try:
            state: dict[str, Any] = json.loads(self.state_file.read_text())
            return state
        except (OSError, ValueError):
            return {"deployment_id": None, "status": None, "installed": {}}

    def _save(self, state: dict[str, Any]) -> None:
        atomic_write(self.state_file, json.dumps(state, indent=2).encode())

    # --- the work ---------------------------------------------------------------------

    def handle(self, desired: DesiredState, signed: WireMessage | None = None) -> None:
        """Apply `desired`; never raises for a failed update (it is reported instead).

        `signed` is the message as the fleet signed it, for a runtime that checks the
        signature itself (the host updater).
        """
        hand_over = getattr(self.runtime, "hand_over", None)
        if signed is not None and hand_over is not None:
            hand_over(desired.deployment_id, signed)
        with self._lock:
            state = self.state()
            same = state.get("deployment_id") == desired.deployment_id
            if same and state.get("status") == "healthy" and self._matches(desired):
                self._report(desired, "healthy")  # a retained re-delivery: say so again
                return
            self._report(desired, "applying")
            swapped: list[tuple[str, dict[str, Any] | None]] = []
            installed: dict[str, Any] = dict(state.get("installed", {}))
            try:
                current = {m.name: m for m in self.control.current_models()}
                for ref in desired.models:
                    if ref.name in current and current[ref.name].sha256 == ref.sha256:
                        continue
                    path = self.fetch(ref)
                    self.control.swap_model(ref, path)
                    swapped.append((ref.name, installed.get(ref.name)))
                    installed[ref.name] = {
                        "version": ref.version,
                        "sha256": ref.sha256,
                        "url": ref.url,
                        "path": str(path),
                        "previous": installed.get(ref.name),
                    }
                if desired.image and desired.image != self.runtime.current_image():
                    self.runtime.apply(desired.image, desired.config)
            except HandedOver as exc:
                log.info("desired state left to the host updater", extra={"reason": str(exc)})
                return
            except Exception as exc:  # every failure is reported; the old version keeps running
                error = str(exc) or type(exc).__name__
                status: DeploymentStatus = (
                    "not_applied" if isinstance(exc, ImageNotApplied) else "failed"
                )
                self._undo(swapped)
                log.warning(
                    "desired state not applied",
                    extra={
                        "deployment_id": desired.deployment_id,
                        "status": status,
                        "error": error,
                    },
                )
                APPLIED.labels(status).inc()
                self._save({**state, "last_failed": desired.deployment_id, "error": error})
                self._report(desired, status, error=error[:4000])
                return
            self._save(
                {
                    "deployment_id": desired.deployment_id,
                    "image": desired.image,
                    "status": "healthy",
                    "installed": {k: _trim(v) for k, v in installed.items()},
                }
            )
            self._prune(installed)
            APPLIED.labels("healthy").inc()
            self._report(desired, "healthy")

    def _matches(self, desired: DesiredState) -> bool:
        current = {m.name: m.sha256 for m in self.control.current_models()}
        image_runs = not desired.image or desired.image == self.runtime.current_image()
        return image_runs and all(current.get(m.name) == m.sha256 for m in desired.models)

    def _undo(self, swapped: list[tuple[str, dict[str, Any] | None]]) -> None:
        """Swap back the models this attempt changed, newest first, from the kept files."""
        for name, previous in reversed(swapped):
            if previous and Path(previous["path"]).exists():
                path = Path(previous["path"])
                ref = ModelRef(
                    name=name,
                    version=previous["version"],
                    # a state file of an older agent has no url: the file is where it lies
                    url=previous.get("url") or path.resolve().as_uri(),
                    sha256=previous["sha256"],
                )
                try:
                    self.control.swap_model(ref, path)
                except Exception:  # nothing more to fall back to; logged for the operator
                    log.exception("could not swap %s back to %s", name, previous["version"])

    def _report(
        self, desired: DesiredState, status: DeploymentStatus, error: str | None = None
    ) -> None:
        self.control.publish_reported(
            ReportedState(
                device_id=desired.device_id,
                deployment_id=desired.deployment_id,
                image=desired.image,
                models=list(desired.models),
                config=desired.config,
                status=status,
                error=error,
                running_image=self.runtime.current_image(),
            )
        )

    # --- downloads --------------------------------------------------------------------

    def fetch(self, ref: ModelRef) -> Path:
        """The verified local file of `ref`: reused if present, else downloaded (resumable)."""
        final_dir = self.state_dir / "models" / ref.name / f"{ref.version}-{ref.sha256[:12]}"
        if final_dir.is_dir():
            for existing in final_dir.iterdir():
                if existing.is_file() and sha256_file(existing) == ref.sha256:
                    return existing
        part = self.state_dir / "downloads" / f"{ref.sha256}.part"
        filename = self._download(ref, part)
        digest = sha256_file(part)
        if digest != ref.sha256:
            part.unlink(missing_ok=True)
            raise ModelIntegrityError(
                f"model {ref.name}@{ref.version}: sha256 {digest[:16]}… does not match "
                f"the desired {ref.sha256[:16]}…"
            )
        final_dir.mkdir(parents=True, exist_ok=True)
        target = final_dir / filename
        os.replace(part, target)
        _fsync_dir(final_dir)
        return target

    def _download(self, ref: ModelRef, part: Path) -> str:
        @retry(
            retry=retry_if_exception_type((httpx.TransportError, _Incomplete)),
            stop=stop_after_attempt(5),
            wait=wait_exponential(multiplier=0.2, max=5),
            reraise=True,
        )
        def attempt() -> str:
            return self._download_once(ref, part)

        try:
            return attempt()
        except (httpx.TransportError, _Incomplete) as exc:
            raise UpdateFailed(f"download of {ref.name}@{ref.version} failed: {exc}") from None

    def _download_once(self, ref: ModelRef, part: Path) -> str:
        origin = _origin(ref.url)
        if origin is None:
            raise UpdateFailed(f"model url {ref.url!r} is not http(s)")
        if origin[0] == "http" and origin[1] not in _LOOPBACK:
            raise UpdateFailed(f"model url {ref.url!r}: plain http only to this host; use https")
        offset = part.stat().st_size if part.exists() else 0
        headers = {}
        if self.token and origin == self.api_origin:  # the token goes to the cloud only
            headers["Authorization"] = f"Bearer {self.token}"
        if offset:
            headers["Range"] = f"bytes={offset}-"
        with self.http.stream("GET", ref.url, headers=headers) as resp:
            filename = _filename(resp.headers.get("content-disposition"), ref)
            if resp.status_code == 416 and offset:
                return filename  # the part is complete already; the hash decides
            if resp.status_code == 206 and offset:
                RESUMED.inc()
                mode = "ab"
            elif resp.status_code == 200:
                mode, offset = "wb", 0
            else:
                raise UpdateFailed(f"download of {ref.name}@{ref.version}: HTTP {resp.status_code}")
            total = resp.headers.get("content-length")
            expected = offset + int(total) if total and total.isdigit() else None
            if expected is not None and expected > self.max_model_bytes:
                raise UpdateFailed(f"model {ref.name} is {expected} bytes, over the limit")
            written = offset
            with open(part, mode) as fh:
                try:
                    for chunk in resp.iter_bytes(_CHUNK):
                        fh.write(chunk)
                        written += len(chunk)
                        DOWNLOADED.inc(len(chunk))
                        if written > self.max_model_bytes:
                            raise UpdateFailed(f"model {ref.name} exceeds the size limit")
                finally:
                    fh.flush()
                    os.fsync(fh.fileno())
            if expected is not None and written < expected:
                raise _Incomplete(f"{written} of {expected} bytes")
            return filename

    def _prune(self, installed: dict[str, Any]) -> None:
        """Keep the current and previous version of each model; delete older ones."""
        for name, entry in installed.items():
            keep = {Path(entry["path"]).parent}
            if entry.get("previous"):
                keep.add(Path(entry["previous"]["path"]).parent)
            root = self.state_dir / "models" / name
            for version_dir in root.iterdir() if root.is_dir() else []:
                if version_dir not in keep:
                    shutil.rmtree(version_dir, ignore_errors=True)


class _Incomplete(Exception):
    """The connection ended before the whole file arrived (retried with Range)."""


def _trim(entry: dict[str, Any]) -> dict[str, Any]:
    """Keep one level of `previous` (current + previous is all a rollback needs)."""
    prev = entry.get("previous")
    return {
        **entry,
        "previous": {k: v for k, v in prev.items() if k != "previous"} if prev else None,
    }


_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL; None for anything else."""
    try:
        parsed = urlsplit(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:
        return None
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return None
    return parsed.scheme, parsed.hostname.lower(), port


def _filename(disposition: str | None, ref: ModelRef) -> str:
    match = _FILENAME_RE.search(disposition or "")
    if match and match.group(1) not in (".", ".."):
        return match.group(1)
    tail = ref.url.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    return tail if re.fullmatch(r"[A-Za-z0-9_-]{1,100}\.[A-Za-z0-9]{1,10}", tail) else "model.onnx"


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` so a reader (or a power cut) sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
