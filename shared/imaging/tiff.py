"""TIFF header parsing and a banded reader for uncompressed strips.

Large TIFFs from inspection cameras are usually uncompressed strips. Reading them in
bands straight out of a memory map, and dropping each band's pages once converted
(madvise DONTNEED), keeps peak memory at the output array plus one band instead of
output + a copy of the file + the decoder's own buffer.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass

import numpy as np

from edgefleet.shared.errors import ImageRejected
from edgefleet.shared.imaging.pixels import (
    apply_orientation,
    composite_gray_alpha,
    composite_rgba_on_black,
    u16_to_u8,
)

ByteSource = bytes | bytearray | mmap.mmap

BAND_BYTES = 2 << 20  # bytes converted per step: bounded extra memory, still few Python steps
_MAX_IFD_ENTRIES = 4096
_MAX_ARRAY = 1 << 18  # strips per image: far above any height the limits allow
# type id -> (struct code, size in bytes); only the integer types hold the tags we read
_TYPES = {1: ("B", 1), 3: ("H", 2), 4: ("I", 4), 6: ("b", 1), 8: ("h", 2), 9: ("i", 4)}
_ALL_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8}
_ARRAY_TAGS = frozenset({258, 273, 279, 338})
_WANTED = frozenset({256, 257, 258, 259, 262, 273, 274, 277, 278, 279, 284, 322, 338, 339})


@dataclass(frozen=True)
class TiffInfo:
    """What the first IFD says about the first image of a TIFF."""

    endian: str
    width: int
    height: int
    samples: int
    bits: tuple[int, ...]
    compression: int
    photometric: int | None
    planar: int
    sample_format: int
    strip_offsets: tuple[int, ...]
    strip_byte_counts: tuple[int, ...]
    rows_per_strip: int
    orientation: int
    extra_samples: tuple[int, ...]
    tiled: bool

    @property
    def raw_readable(self) -> bool:
        """True when the banded reader handles it (uncompressed, chunky, 8/16-bit strips)."""
        bits = set(self.bits)
        photometric_ok = self.photometric in (0, 1) if self.samples <= 2 else self.photometric == 2
        rps = min(self.rows_per_strip, self.height) or 1
        return (
            self.compression == 1
            and self.planar == 1
            and not self.tiled
            and self.sample_format == 1
            and len(bits) == 1
            and bits <= {8, 16}
            and 1 <= self.samples <= 4
            and photometric_ok
            and len(self.strip_offsets) == len(self.strip_byte_counts)
            and len(self.strip_offsets) == math.ceil(self.height / rps)
        )


def parse_tiff(data: ByteSource) -> TiffInfo:
    """Read the first IFD; every offset is bounds-checked against the data."""
    n = len(data)
    if n < 8:
        raise ImageRejected("truncated TIFF: the 8-byte header is cut off")
    endian = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(endian + "I", data, 4)
    if ifd + 2 > n:
        raise ImageRejected(f"truncated TIFF: first IFD at byte {ifd} lies past the end ({n})")
    (count,) = struct.unpack_from(endian + "H", data, ifd)
    if not 0 < count <= _MAX_IFD_ENTRIES:
        raise ImageRejected(f"corrupt TIFF: first IFD declares {count} entries")
    if ifd + 2 + 12 * count > n:
        raise ImageRejected("truncated TIFF: the first IFD is cut off")
    tags: dict[int, tuple[int, ...]] = {}
    for i in range(count):
        entry = ifd + 2 + 12 * i
        tag, typ, cnt = struct.unpack_from(endian + "HHI", data, entry)
        if tag not in _WANTED:
            continue
        if typ not in _TYPES:
            if typ in _ALL_TYPE_SIZES:
                continue  # a rational or ASCII where we expect integers: ignore the tag
            raise ImageRejected(f"corrupt TIFF: tag {tag} has unknown type {typ}")
        code, size = _TYPES[typ]
        if cnt > _MAX_ARRAY:
            raise ImageRejected(f"corrupt TIFF: tag {tag} declares {cnt} values")
        total = size * cnt  # where the values live depends on the declared count
        if total <= 4:
            offset = entry + 8
        else:
            (offset,) = struct.unpack_from(endian + "I", data, entry + 8)
            if offset + total > n:
                raise ImageRejected(f"truncated TIFF: values of tag {tag} lie past the end")
        keep = cnt if tag in _ARRAY_TAGS else min(cnt, 1)
        raw = bytes(data[offset : offset + size * keep])
        values = np.frombuffer(raw, dtype=np.dtype(endian + code), count=keep)
        if values.size and values.min() < 0:
            raise ImageRejected(f"corrupt TIFF: tag {tag} holds a negative value")
        tags[tag] = tuple(int(v) for v in values)

    def one(tag: int, default: int | None = None) -> int | None:
        return tags[tag][0] if tags.get(tag) else default

    width, height = one(256), one(257)
    if width is None or height is None:
        raise ImageRejected("corrupt TIFF: the first IFD has no ImageWidth/ImageLength")
    samples = one(277, 1) or 1
    return TiffInfo(
        endian=endian,
        width=width,
        height=height,
        samples=samples,
        bits=tags.get(258) or (1,),
        compression=one(259, 1) or 1,
        photometric=one(262),
        planar=one(284, 1) or 1,
        sample_format=one(339, 1) or 1,
        strip_offsets=tags.get(273, ()),
        strip_byte_counts=tags.get(279, ()),
        rows_per_strip=one(278, height) or height,
        orientation=one(274, 1) or 1,
        extra_samples=tags.get(338, ()),
        tiled=322 in tags,
    )


def decode_raw_tiff(data: ByteSource, info: TiffInfo) -> np.ndarray:
    """Uncompressed strips -> RGB uint8, one band at a time (see module docstring)."""
    width, height, spp = info.width, info.height, info.samples
    sample = np.dtype(info.endian + ("u1" if info.bits[0] == 8 else "u2"))
    row_bytes = width * spp * sample.itemsize
    rps = min(info.rows_per_strip, height)
    band_rows = max(1, BAND_BYTES // row_bytes)
    n = len(data)
    out = np.empty((height, width, 3), dtype=np.uint8)
    strips = zip(info.strip_offsets, info.strip_byte_counts, strict=True)
    for index, (offset, byte_count) in enumerate(strips):
        r0, r1 = index * rps, min(height, (index + 1) * rps)
        need = (r1 - r0) * row_bytes
        if byte_count < need or offset + need > n:
            raise ImageRejected(
                f"truncated TIFF: strip {index} needs {need} bytes at offset {offset}, "
                f"the file has {max(0, min(byte_count, n - offset))}"
            )
        for b0 in range(r0, r1, band_rows):
            b1 = min(r1, b0 + band_rows)
            start = offset + (b0 - r0) * row_bytes
            stop = start + (b1 - b0) * row_bytes
            band = np.frombuffer(data[start:stop], dtype=sample).reshape(b1 - b0, width, spp)
            _band_to_rgb(band, out[b0:b1], info)
            _drop_pages(data, start, stop)
    return apply_orientation(out, info.orientation)


def _band_to_rgb(band: np.ndarray, dst: np.ndarray, info: TiffInfo) -> None:
    if band.dtype.itemsize == 2:
        band = u16_to_u8(band)
    alpha_kind = info.extra_samples[0] if info.extra_samples else 2
    if info.samples <= 2:
        gray = band[..., 0]
        if info.photometric == 0:  # WhiteIsZero
            gray = 255 - gray
        if info.samples == 2 and alpha_kind == 2:
            gray = composite_gray_alpha(gray, band[..., 1])
        dst[...] = gray[..., None]
    elif info.samples == 3 or alpha_kind != 2:
        dst[...] = band[..., :3]  # premultiplied (1) is already on black; unspecified (0) dropped
    else:
        dst[...] = composite_rgba_on_black(band)


def _drop_pages(data: ByteSource, start: int, stop: int) -> None:
    """Let the kernel drop a converted band from this process's resident set."""
    if isinstance(data, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        aligned = start - start % mmap.PAGESIZE
        data.madvise(mmap.MADV_DONTNEED, aligned, stop - aligned)
