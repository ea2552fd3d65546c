"""Declared-dimension image bombs: a few kilobytes that decode to hundreds of megabytes."""

from __future__ import annotations

import io
import struct

import cv2
import numpy as np
from PIL import Image


def jpeg_declaring(width: int, height: int) -> bytes:
    """A 16x16 JPEG whose frame header says `width` x `height`: libjpeg fills the rest."""
    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (90, 90, 90)).save(buf, "JPEG", quality=50)
    data = bytearray(buf.getvalue())
    sof = data.find(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def rgba16_png(width: int, height: int) -> bytes:
    """A 16-bit RGBA PNG of zeros: it compresses to almost nothing."""
    ok, buf = cv2.imencode(".png", np.zeros((height, width, 4), np.uint16))
    assert ok
    return buf.tobytes()
