"""Safe decoding against what users write, side by side in one process.

Run: `.venv/bin/python -m edgefleet.bench.bench_imaging` (add `--rounds 5` on a busy machine).
- An 8000x8000 uncompressed gray TIFF (64 MB) -> RGB: peak resident memory growth and
  time of `decode_file` vs Pillow (`Image.open(p).convert("RGB")` -> numpy) vs
  `cv2.imread` + BGR->RGB. Peak is VmHWM after a reset through /proc/self/clear_refs.
- A 1920x1080 JPEG and PNG -> RGB: `decode_image` (limits, magic, truncation and EXIF
  checks included) vs `cv2.imdecode` + cvtColor and vs Pillow + numpy, to show what the
  safety costs.
- A 100000x100000 PNG of 70 bytes: time to refuse it, vs Pillow's own bomb check.
Timings are the median of `--repeat` calls, best round of `--rounds` (the machine is shared).
"""

from __future__ import annotations

import gc
import io
import logging
import struct
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import cv2
import numpy as np
import psutil
import typer
from PIL import Image

from edgefleet.bench.timing import timed
from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.imaging import ImageLimits, decode_file, decode_image, encode_jpeg, encode_png

app = typer.Typer(add_completion=False)
MB = 1 << 20
SIDE = 8000


def peak_growth(fn: Callable[[], object]) -> float:
    """MB of resident memory above the starting point at the peak of one call."""
    gc.collect()
    base = psutil.Process().memory_info().rss
    Path("/proc/self/clear_refs").write_text("5")
    result = fn()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) * 1024
    del result
    return (peak - base) / MB


def write_big_tiff(path: Path) -> None:
    entries = [(256, 4, SIDE), (257, 4, SIDE), (258, 3, 8), (259, 3, 1), (262, 3, 1)]
    entries += [(273, 4, 8 + 2 + 12 * 9 + 4), (277, 3, 1), (278, 4, SIDE)]
    entries += [(279, 4, SIDE * SIDE)]
    ifd = struct.pack("<H", len(entries))
    for tag, typ, value in entries:
        field = struct.pack("<I", value) if typ == 4 else struct.pack("<HH", value, 0)
        ifd += struct.pack("<HHI", tag, typ, 1) + field
    with path.open("wb") as fh:
        fh.write(b"II*\x00" + struct.pack("<I", 8) + ifd + b"\x00\x00\x00\x00")
        row = (np.arange(SIDE) % 251).astype(np.uint8)
        for _ in range(0, SIDE, 500):
            fh.write(np.tile(row, (500, 1)).tobytes())


def pillow_rgb(source: object) -> np.ndarray:
    with Image.open(source) as im:
        return np.asarray(im.convert("RGB"))


def cv2_file_rgb(path: Path) -> np.ndarray:
    return cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def cv2_bytes_rgb(data: bytes) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def bomb_png() -> bytes:
    def chunk(kind: bytes, payload: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + payload))
        return struct.pack(">I", len(payload)) + kind + payload + crc

    ihdr = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def refuse(fn: Callable[[], object]) -> None:
    try:
        fn()
    except (EdgefleetError, Image.DecompressionBombError):
        return
    raise AssertionError("the bomb was not refused")


@app.command()
def main(
    repeat: Annotated[int, typer.Option(help="calls per round")] = 5,
    rounds: Annotated[int, typer.Option(help="rounds; the best round's median is reported")] = 3,
) -> None:
    """Print peak memory and time for ours vs naive decoding, with ratios.

    A 64 MB TIFF, 1080p JPEG/PNG and a decompression bomb, against Pillow and OpenCV.

    Example: edgefleet bench imaging --rounds 5
    """
    logging.getLogger("edgefleet.shared.imaging").setLevel(logging.ERROR)  # refusals are expected here
    limits = ImageLimits(max_bytes=128 * MB, max_pixels=SIDE * SIDE, max_side=SIDE)
    Image.MAX_IMAGE_PIXELS = None  # the naive Pillow path as users run big scans
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.tif"
        write_big_tiff(path)
        out_mb = SIDE * SIDE * 3 / MB
        print(f"8000x8000 gray TIFF, {path.stat().st_size / MB:.0f} MB file, {out_mb:.0f} MB RGB")
        ours_mem = peak_growth(lambda: decode_file(path, limits=limits))
        pil_mem = peak_growth(lambda: pillow_rgb(path))
        cv_mem = peak_growth(lambda: cv2_file_rgb(path))
        ours_t = timed(lambda: decode_file(path, limits=limits), 1, rounds)
        pil_t = timed(lambda: pillow_rgb(path), 1, rounds)
        cv_t = timed(lambda: cv2_file_rgb(path), 1, rounds)
        print(
            f"  peak MB   ours {ours_mem:7.0f}  pillow {pil_mem:7.0f} ({pil_mem / ours_mem:.2f}x)"
            f"  cv2 {cv_mem:7.0f} ({cv_mem / ours_mem:.2f}x)"
        )
        print(
            f"  time ms   ours {ours_t * 1e3:7.1f}  pillow {pil_t * 1e3:7.1f} "
            f"({pil_t / ours_t:.2f}x)  cv2 {cv_t * 1e3:7.1f} ({cv_t / ours_t:.2f}x)"
        )

    y, x = np.mgrid[0:1080, 0:1920]
    frame = np.stack([x % 256, y % 256, (x + y) % 256], axis=-1).astype(np.uint8)
    for name, data in (("JPEG q90", encode_jpeg(frame, 90)), ("PNG", encode_png(frame))):
        ours_t = timed(lambda data=data: decode_image(data), repeat, rounds)
        cv_t = timed(lambda data=data: cv2_bytes_rgb(data), repeat, rounds)
        pil_t = timed(lambda data=data: pillow_rgb(io.BytesIO(data)), repeat, rounds)
        print(
            f"1920x1080 {name}: ours {ours_t * 1e3:6.2f} ms  cv2 {cv_t * 1e3:6.2f} ms "
            f"(ours/cv2 {ours_t / cv_t:.2f}x)  pillow {pil_t * 1e3:6.2f} ms "
            f"(ours/pillow {ours_t / pil_t:.2f}x)"
        )

    bomb = bomb_png()
    Image.MAX_IMAGE_PIXELS = 89_478_485  # Pillow's default guard, for a fair comparison
    ours_t = timed(lambda: refuse(lambda: decode_image(bomb)), repeat * 20, rounds)
    pil_t = timed(lambda: refuse(lambda: pillow_rgb(io.BytesIO(bomb))), repeat * 20, rounds)
    print(
        f"100000x100000 PNG ({len(bomb)} B) refused: ours {ours_t * 1e6:.0f} us, "
        f"pillow {pil_t * 1e6:.0f} us ({pil_t / ours_t:.2f}x)"
    )


if __name__ == "__main__":
    app()
