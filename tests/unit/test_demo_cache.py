"""The demo's scene cache: reused when sound, rendered again when stale, never half-written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgefleet.demo import cache as demo_cache
from edgefleet.demo.cache import (
    ABANDONED_AFTER_S,
    MANIFEST_FILE,
    cache_dir,
    cached_scene,
    scene_key,
)
from edgefleet.demo.video import GroundTruth, VideoSpec, truth_path

SMALL = VideoSpec(width=320, height=180, fps=5, duration_s=2, seed=3)


def _stamp(path: Path) -> tuple[int, int]:
    info = path.stat()
    return info.st_ino, info.st_mtime_ns


def test_cache_folder_follows_xdg_cache_home(tmp_path: Path) -> None:
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "edgefleet" / "demo"
    assert cache_dir({}) == Path.home() / ".cache" / "edgefleet" / "demo"


def test_key_names_seed_size_length_and_renderer_and_changes_with_any_field() -> None:
    key = scene_key(SMALL)
    assert key.startswith(f"scene-r{demo_cache.RENDERER_VERSION}-seed3-320x180-2s-")
    assert scene_key(SMALL.model_copy(update={"hard_share": 0.5})) != key
    assert scene_key(SMALL.model_copy()) == key


def test_a_cached_scene_is_reused_not_rendered_again(tmp_path: Path) -> None:
    # given a scene rendered once into the cache
    video, truth = cached_scene(SMALL, tmp_path)
    assert video.is_file() and GroundTruth.load(truth_path(video)) == truth
    before = _stamp(video)
    # when it is asked for again
    again, truth_again = cached_scene(SMALL, tmp_path)
    # then the same file comes back untouched, with the same truth
    assert again == video and _stamp(again) == before
    assert truth_again == truth
    assert [p.name for p in tmp_path.iterdir()] == [scene_key(SMALL)]  # no temporary left


@pytest.mark.parametrize(
    "spoil",
    ["truncated video", "no manifest", "foreign truth", "other spec in the manifest"],
)
def test_a_stale_or_broken_entry_is_rendered_again(tmp_path: Path, spoil: str) -> None:
    # given a cached scene that something spoiled
    video, truth = cached_scene(SMALL, tmp_path)
    entry = video.parent
    if spoil == "truncated video":
        video.write_bytes(video.read_bytes()[:100])
    elif spoil == "no manifest":
        (entry / MANIFEST_FILE).unlink()
    elif spoil == "foreign truth":
        truth_path(video).write_text('{"camera": "dock 3"}')
    else:
        manifest = (entry / MANIFEST_FILE).read_text().replace('"seed":3', '"seed":4')
        (entry / MANIFEST_FILE).write_text(manifest)
    # when it is asked for
    again, truth_again = cached_scene(SMALL, tmp_path)
    # then it is rendered again, whole, and equal to the first render
    assert again == video and truth_again == truth
    assert again.read_bytes() == _fresh(tmp_path / "fresh").read_bytes()


def _fresh(cache: Path) -> Path:
    return cached_scene(SMALL, cache)[0]


def test_scenes_of_an_older_renderer_and_abandoned_temporaries_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a scene of renderer version 1 and a temporary folder a killed demo left
    monkeypatch.setattr(demo_cache, "RENDERER_VERSION", 1)
    old, _ = cached_scene(SMALL, tmp_path)
    abandoned = tmp_path / ".tmp-killed"
    abandoned.mkdir()
    long_ago = abandoned.stat().st_mtime - ABANDONED_AFTER_S - 60
    os.utime(abandoned, (long_ago, long_ago))
    running = tmp_path / ".tmp-rendering-now"  # another demo's render in progress
    running.mkdir()
    # when the current renderer (version 2) asks for the same spec
    monkeypatch.setattr(demo_cache, "RENDERER_VERSION", 2)
    new, _ = cached_scene(SMALL, tmp_path)
    # then it renders anew; the old scene and the abandoned folder are gone, the live one kept
    assert new.parent.name.startswith("scene-r2-") and new.is_file()
    assert not old.parent.exists() and not abandoned.exists()
    assert running.exists()


def test_the_cache_is_safe_to_delete(tmp_path: Path) -> None:
    import shutil

    video, truth = cached_scene(SMALL, tmp_path / "cache")
    shutil.rmtree(tmp_path / "cache")
    again, truth_again = cached_scene(SMALL, tmp_path / "cache")
    assert again == video and again.is_file() and truth_again == truth
