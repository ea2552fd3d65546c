"""Cases that carry several crops of one text track: read each tile, fuse the reads.

An `ef.escalation/2` case with `tiles` is one image holding a track's best crops; each
tile is read on its own, its main line (the surest x widest) votes for its text with its
confidence, and the heaviest text is the track's answer, scored by its vote over the
number of tiles (tiles that disagree make a less sure answer).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np

from edgefleet.shared.messages import Detection, EscalationCase

Reader = Callable[[np.ndarray], list[Detection]]


def tile_images(case: EscalationCase, image: np.ndarray) -> list[np.ndarray]:
    """The pixels of each tile (clipped to the image; empty tiles left out)."""
    h, w = image.shape[:2]
    out = []
    for t in case.tiles:
        x1, y1, x2, y2 = min(t.x, w), min(t.y, h), min(t.x + t.w, w), min(t.y + t.h, h)
        if x2 - x1 >= 2 and y2 - y1 >= 2:
            out.append(np.ascontiguousarray(image[y1:y2, x1:x2]))
    return out


def main_line(lines: list[Detection]) -> Detection | None:
    """The line a tile is about: the surest x widest (neighbours' fragments are narrow)."""
    texts = [d for d in lines if d.text]
    if not texts:
        return None
    return max(texts, key=lambda d: d.score * ((d.box[2] - d.box[0]) if d.box else 1.0))


def fuse(
    reads: list[Detection | None], box: tuple[float, float, float, float] | None
) -> list[Detection]:
    """One answer from the tiles' main lines: a confidence-weighted vote."""
    pools: dict[str, float] = defaultdict(float)
    spelling: dict[str, Detection] = {}
    for read in reads:
        if read is None or not read.text:
            continue
        key = "".join(read.text.split()).casefold()
        pools[key] += read.score
        if key not in spelling or read.score > spelling[key].score:
            spelling[key] = read
    if not pools:
        return []
    key = max(pools, key=lambda k: pools[k])
    score = min(1.0, pools[key] / max(1, len(reads)))
    return [Detection(text=spelling[key].text, score=round(score, 4), box=box)]


def read_tiles(case: EscalationCase, image: np.ndarray, read: Reader) -> list[Detection]:
    """The track's answer: every tile read by `read`, fused; box = the edge's track box."""
    box = case.edge_result[0].box if case.edge_result else None
    return fuse([main_line(read(tile)) for tile in tile_images(case, image)], box)
