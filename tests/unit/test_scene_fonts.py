"""The scenes are drawn with the fonts the figures were measured with.

The benchmarks, the accuracy tests and the demo draw their text with OpenCV's fonts, and
OpenCV 5.1 draws them differently from 5.0 (a space half as wide): every scene changes and
with it every accuracy figure, in ways that look like a regression of the reader. This test
names the cause where the others would only fail.
"""

from __future__ import annotations

import hashlib

import cv2
import numpy as np

# The bench's and the demo's fonts, drawn by opencv-python-headless 5.0.0.93 (constraints.txt).
MEASURED = "9d993badd532"


def drawn() -> str:
    img = np.full((40, 420 * 4, 3), 238, np.uint8)
    fonts = [
        cv2.FONT_HERSHEY_SIMPLEX,
        cv2.FONT_HERSHEY_DUPLEX,
        cv2.FONT_HERSHEY_TRIPLEX,
        cv2.FONT_HERSHEY_COMPLEX_SMALL,
    ]
    for i, font in enumerate(fonts):
        cv2.putText(img, "PARCEL 7781-XZ", (i * 420 + 4, 30), font, 0.9, (15, 15, 15), 2)
    return hashlib.sha256(img.tobytes()).hexdigest()[:12]


def test_the_scenes_are_drawn_with_the_measured_fonts():
    assert drawn() == MEASURED, (
        f"OpenCV {cv2.__version__} draws text unlike 5.0.0.93: the benchmark, test and demo "
        "scenes differ from those the figures were measured on; install under constraints.txt "
        "(`make test` does)"
    )
