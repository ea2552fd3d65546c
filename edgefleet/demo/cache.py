"""The demo's rendered scenes, cached by what they are made of.

A scene is a pure function of its `VideoSpec` and of the renderer's code, so the demo
renders it once per user and machine: `$XDG_CACHE_HOME/edgefleet/demo` (default
`~/.cache/edgefleet/demo`) holds one folder per scene, named for its seed, size, length,
a hash of the whole spec and `RENDERER_VERSION`. A folder appears whole or not at all:
it is rendered under a temporary name beside it and renamed into place, so two demos
rendering at once, or a Ctrl-C mid-render, never leave a half-written video where a later
demo would pick it up. Deleting the cache folder is always safe: the next demo renders.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from edgefleet.demo.video import RENDERER_VERSION, GroundTruth, VideoSpec, render_video
from edgefleet.shared.config import Closed

SCENE_FILE = "scene.mp4"
MANIFEST_FILE = "cache.json"
# A temporary folder this old is what a killed demo left behind (a render takes seconds).
ABANDONED_AFTER_S = 3600.0


class CacheManifest(Closed):
    """What a cache folder holds, checked before it is reused."""

    renderer_version: int
    spec: VideoSpec
    video_bytes: int


def cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The demo's cache folder: `$XDG_CACHE_HOME/edgefleet/demo`, else `~/.cache/...`."""
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "edgefleet" / "demo"


def scene_key(spec: VideoSpec) -> str:
    """The folder name of a scene: readable parts, and a hash of the whole spec."""
    digest = hashlib.sha256(spec.model_dump_json().encode()).hexdigest()[:12]
    return (
        f"scene-r{RENDERER_VERSION}-seed{spec.seed}-{spec.width}x{spec.height}"
        f"-{spec.duration_s:g}s-{digest}"
    )


def cached_scene(spec: VideoSpec, cache: Path) -> tuple[Path, GroundTruth]:
    """The scene's video and ground truth, rendered only when the cache has no sound copy."""
    entry = cache / scene_key(spec)
    found = _load(entry, spec)
    if found is not None:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    _prune(cache)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache))
    try:
        render_video(tmp / SCENE_FILE, spec)
        manifest = CacheManifest(
            renderer_version=RENDERER_VERSION,
            spec=spec,
            video_bytes=(tmp / SCENE_FILE).stat().st_size,
        )
        (tmp / MANIFEST_FILE).write_text(manifest.model_dump_json())
        if _load(entry, spec) is None:  # still missing or stale: ours replaces it
            shutil.rmtree(entry, ignore_errors=True)
            # OSError: another demo renamed its (identical) render into place first.
            with contextlib.suppress(OSError):
                tmp.rename(entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    loaded = _load(entry, spec)
    if loaded is None:
        raise OSError(f"{entry}: the rendered scene could not be stored in the cache")
    return loaded


def _load(entry: Path, spec: VideoSpec) -> tuple[Path, GroundTruth] | None:
    """The folder's scene if it is whole and made from this spec by this renderer."""
    video = entry / SCENE_FILE
    try:
        manifest = CacheManifest.model_validate_json((entry / MANIFEST_FILE).read_text())
        if (
            manifest.renderer_version != RENDERER_VERSION
            or manifest.spec != spec
            or video.stat().st_size != manifest.video_bytes
        ):
            return None
        truth = GroundTruth.load(video.with_suffix(".json"))
    except (OSError, ValueError):  # missing, half-deleted or not ours: render again
        return None
    return (video, truth) if truth.spec == spec else None


def _prune(cache: Path) -> None:
    """Remove scenes of older renderers and temporary folders that killed demos left."""
    current = f"scene-r{RENDERER_VERSION}-"
    now = time.time()
    for path in cache.iterdir():
        try:
            old_render = path.name.startswith("scene-r") and not path.name.startswith(current)
            abandoned = (
                path.name.startswith(".tmp-") and now - path.stat().st_mtime > ABANDONED_AFTER_S
            )
        except OSError:
            continue  # removed meanwhile by another demo
        if old_render or abandoned:
            shutil.rmtree(path, ignore_errors=True)
