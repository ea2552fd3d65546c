"""Multi-crop cases: tiles cut from the case image, each tile's main line, the fused vote."""

from __future__ import annotations

import numpy as np

from edgefleet.bench.harness import escalation_case
from edgefleet.cloud.tiles import fuse, main_line, read_tiles, tile_images
from edgefleet.shared.messages import Detection, Tile


def _tile(y: int, h: int = 20, w: int = 80) -> Tile:
    return Tile(x=0, y=y, w=w, h=h, frame_index=y, crop=(0, 0, w, h))


def test_tiles_are_cut_clipped_and_read_one_by_one_then_fused() -> None:
    # given an image of three tiles, the last running past the image's bottom edge
    image = np.zeros((50, 80, 3), np.uint8)
    image[20:40] = 255
    case = escalation_case(
        "cam-01",
        schema="ef.escalation/2",
        track_id="cam-1",
        tiles=[_tile(0), _tile(20), _tile(40)],
        edge=[("AB12", 0.4)],
    )
    cut = tile_images(case, image)
    assert [t.shape[:2] for t in cut] == [(20, 80), (20, 80), (10, 80)]

    # when a reader reads the bright tile differently from the dark ones
    def read(tile: np.ndarray) -> list[Detection]:
        text = "A812" if tile.mean() > 100 else "AB12"
        return [Detection(text=text, score=0.9, box=(0, 0, 70, 18))]

    # then the majority wins, scored by its share of the tiles
    (answer,) = read_tiles(case, image, read)
    assert answer.text == "AB12" and abs(answer.score - 0.6) < 1e-9


def test_a_tile_s_main_line_is_the_surest_widest_and_empty_reads_fuse_to_nothing() -> None:
    wide = Detection(text="EGLU7436450", score=0.8, box=(0, 0, 200, 20))
    fragment = Detection(text="E", score=0.99, box=(190, 0, 200, 20))
    assert main_line([fragment, wide]) == wide
    assert main_line([]) is None
    assert fuse([None, None], None) == []
