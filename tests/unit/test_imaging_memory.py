"""Memory stays flat: bad inputs leave nothing behind, big TIFFs are not copied.

These tests measure memory, never time. Peak resident memory is read from VmHWM after
resetting it through /proc/self/clear_refs (Linux), so a transient copy shows even when
it is freed before the call returns.
"""

from __future__ import annotations

import gc
import io
import mmap
import struct
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from edgefleet.shared.errors import EdgefleetError, PayloadTooLarge
from edgefleet.shared.imaging import ImageLimits, decode_file, decode_image, encode_jpeg, image_size

MB = 1 << 20
SIDE = 8000  # 8000x8000 gray: a 64 MB file that decodes to 192 MB of RGB


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def _reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError as exc:
        pytest.skip(f"cannot reset the peak RSS here ({exc}); needs Linux /proc/self/clear_refs")


def _peak() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    pytest.skip("no VmHWM in /proc/self/status")
    return 0


def _pattern(rows: slice, width: int) -> np.ndarray:
    r = np.arange(rows.start, rows.stop, dtype=np.uint32)[:, None]
    c = np.arange(width, dtype=np.uint32)[None, :]
    return ((r * 7 + c * 3) % 251).astype(np.uint8)


@pytest.fixture(scope="module")
def big_tiff(tmp_path_factory) -> Path:
    """An uncompressed 8-bit gray TIFF written in bands, so the test never holds it."""
    path = tmp_path_factory.mktemp("imaging") / "big.tif"
    entries = [
        (256, 4, SIDE),
        (257, 4, SIDE),
        (258, 3, 8),
        (259, 3, 1),
        (262, 3, 1),
        (273, 4, 8 + 2 + 12 * 9 + 4),  # pixels follow the IFD
        (277, 3, 1),
        (278, 4, SIDE),
        (279, 4, SIDE * SIDE),
    ]
    ifd = struct.pack("<H", len(entries))
    for tag, typ, value in entries:
        value_field = struct.pack("<I", value) if typ == 4 else struct.pack("<HH", value, 0)
        ifd += struct.pack("<HHI", tag, typ, 1) + value_field
    with path.open("wb") as fh:
        fh.write(b"II*\x00" + struct.pack("<I", 8) + ifd + b"\x00\x00\x00\x00")
        for start in range(0, SIDE, 1000):
            fh.write(_pattern(slice(start, start + 1000), SIDE).tobytes())
    assert path.stat().st_size > SIDE * SIDE
    return path


BIG_LIMITS = ImageLimits(max_bytes=128 * MB, max_pixels=SIDE * SIDE, max_side=SIDE)


def test_big_tiff_decodes_with_peak_near_the_output_size(big_tiff):
    # given a 64 MB TIFF on disk
    file_size = big_tiff.stat().st_size
    base = _rss()
    _reset_peak()
    # when decoded from the file
    out = decode_file(big_tiff, limits=BIG_LIMITS)
    peak_growth = _peak() - base
    # then the pixels are right...
    assert out.shape == (SIDE, SIDE, 3)
    for r in (0, 1, 4321, SIDE - 1):
        row = _pattern(slice(r, r + 1), SIDE)[0]
        assert np.array_equal(out[r, :, 0], row) and np.array_equal(out[r, :, 2], row)
    # ...and the peak is the output plus a band: no copy of the file, no second RGB buffer
    assert peak_growth < out.nbytes + file_size // 2, (peak_growth / MB, out.nbytes / MB)
    print(f"peak growth {peak_growth / MB:.0f} MB for {out.nbytes / MB:.0f} MB of output")
    del out
    # and nothing of that size is kept (allocator caching of band buffers aside)
    assert _rss() - base < 32 * MB


def test_limits_refuse_a_big_tiff_without_reading_it(big_tiff):
    # given the same 64 MB file and the default pixel limit (50 MP < 64 MP)
    base = _rss()
    _reset_peak()
    # when the size is read and the decode refused
    with big_tiff.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert image_size(mm) == (SIDE, SIDE)
    with pytest.raises(PayloadTooLarge, match="8000x8000"):
        decode_file(big_tiff, limits=ImageLimits(max_bytes=128 * MB))
    with pytest.raises(PayloadTooLarge, match="bytes"):
        decode_file(big_tiff)  # default 32 MiB byte limit: refused from the file size
    # then only headers were touched
    assert _peak() - base < 8 * MB


def _bad_inputs(i: int) -> bytes:
    """One of many kinds of bad input, varied by `i` so nothing is cached."""
    rng = np.random.default_rng(i)
    img = rng.integers(0, 256, (16 + i % 7, 16, 3), dtype=np.uint8)
    jpeg = encode_jpeg(img)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    png = buf.getvalue()
    kinds = [
        b"",
        jpeg[: len(jpeg) // 2],
        png[: len(png) - 12 - i % 5],
        rng.bytes(64),
        b"not an image " * (1 + i % 9),
        b"\x89PNG\r\n\x1a\n" + png[8:16] + struct.pack(">II", 100_000, 100_000) + png[24:],
        jpeg[:2] + b"\xff\xc0" + rng.bytes(40),
        png[:40] + rng.bytes(60) + png[100:],
        b"II*\x00" + rng.bytes(60),
        b"RIFF\x10\x00\x00\x00WEBPVP8 " + rng.bytes(30),
    ]
    return kinds[i % len(kinds)]


def _feed(n: int, offset: int) -> int:
    rejected = 0
    for i in range(offset, offset + n):
        try:
            decode_image(_bad_inputs(i))
        except EdgefleetError:
            rejected += 1
    return rejected


def test_a_thousand_bad_inputs_leave_memory_flat():
    # given a warm-up pass (imports, codec tables, metric children)
    _feed(200, 0)
    base = _rss()
    # when 1,000 more bad inputs of mixed kinds are decoded
    rejected = _feed(1000, 200)
    # then every one is refused with a typed error (the inputs are seeded) and memory is flat
    assert rejected == 1000
    assert _rss() - base < 20 * MB
