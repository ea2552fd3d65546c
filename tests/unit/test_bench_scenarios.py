"""The cascade bench's scenarios: seeded, in every font this machine has, with the truth a
reader following the line should report."""

from __future__ import annotations

import numpy as np
import pytest

from edgefleet.demo.scenes.scenarios import (
    FONTS_HELD_OUT,
    FONTS_TUNED,
    SCENARIOS,
    available_fonts,
    render_scenario,
)


@pytest.mark.parametrize("kind", SCENARIOS)
def test_each_scenario_renders_the_same_clip_from_the_same_seed(kind: str) -> None:
    font = available_fonts(FONTS_HELD_OUT)[SCENARIOS.index(kind) % 3]
    a, b = render_scenario(kind, 7, font, frames=6), render_scenario(kind, 7, font, frames=6)
    assert len(a.frames) == 6 and a.frames[0].shape == (360, 640, 3)
    assert all(np.array_equal(x, y) for x, y in zip(a.frames, b.frames, strict=True))
    assert a.truth == b.truth and any(a.truth)
    other = render_scenario(kind, 8, font, frames=6)
    assert not np.array_equal(a.frames[3], other.frames[3])


def test_lines_entering_show_up_in_the_truth_only_once_mostly_in_view() -> None:
    clip = render_scenario("entering", 3, "hershey-simplex", frames=30)
    counts = [len(items) for items in clip.truth]
    assert counts[0] < counts[-1]  # the entering lines start outside the frame
    assert counts == sorted(counts)


def test_the_tuned_and_held_out_fonts_do_not_overlap_and_truetype_ones_draw() -> None:
    assert not set(FONTS_TUNED) & set(FONTS_HELD_OUT)
    assert "pillow" in available_fonts(FONTS_HELD_OUT)  # Pillow's own TrueType font
    clip = render_scenario("h264", 1, "pillow", frames=4)
    assert len(clip.frames) == 4 and clip.jpegs[0][:2] == b"\xff\xd8"
