"""Format sniffing and image size from headers alone, so limits hold before any decode.

Formats are told by their magic bytes, never by a file name. Sizes come from the
JPEG frame header (SOF), the PNG IHDR (CRC checked), the BMP info header, the WebP
VP8/VP8L/VP8X chunk and the first TIFF IFD; nothing past the header is read.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from edgefleet.shared.errors import ImageRejected, UnsupportedMediaType
from edgefleet.shared.imaging.tiff import ByteSource, parse_tiff

FORMATS = ("jpeg", "png", "bmp", "webp", "tiff")
# The media types of those formats: what an HTTP endpoint that decodes images accepts.
MEDIA_TYPES = tuple(f"image/{fmt}" for fmt in FORMATS)

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_BMP_INFO_SIZES = frozenset({12, 16, 40, 52, 56, 64, 108, 124})
# SOF0..SOF15 carry the frame size; C4 (DHT), C8 (JPG) and CC (DAC) share the range.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})

# Formats we recognise only to name them in the refusal.
_OTHER_MAGIC = (
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"%PDF", "PDF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"II+\x00", "BigTIFF"),
    (b"MM\x00+", "BigTIFF"),
    (b"\xff\x0a", "JPEG XL"),
    (b"8BPS", "Photoshop PSD"),
)


def sniff_format(data: ByteSource) -> str | None:
    """The format named by the magic bytes ("jpeg", "png", "bmp", "webp", "tiff") or None."""
    head = bytes(memoryview(data)[:32])
    if head[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if head[:8] == _PNG_MAGIC:
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    if head[:2] == b"BM" and len(head) >= 18:
        (info_size,) = struct.unpack_from("<I", head, 14)
        if info_size in _BMP_INFO_SIZES:
            return "bmp"
    return None


def describe_unknown(data: ByteSource) -> str:
    """Why bytes are not an image we take, for the error message."""
    head = bytes(memoryview(data)[:64])
    for magic, name in _OTHER_MAGIC:
        if head.startswith(magic):
            return f"{name} is not a supported image format"
    if len(head) >= 12 and head[4:8] == b"ftyp":
        brand = head[8:12].decode("ascii", "replace")
        return f"ISO media ({brand!r}, e.g. HEIC/AVIF/MP4) is not a supported image format"
    text = head.lstrip(b"\xef\xbb\xbf")
    if text and all(32 <= c < 127 or c in b"\t\r\n" for c in text):
        return f"the data is text, not an image (starts with {text[:24]!r})"
    return f"unrecognised magic bytes {head[:8].hex(' ')}: not JPEG, PNG, BMP, WebP or TIFF"


def image_size(data: ByteSource | memoryview) -> tuple[int, int]:
    """(width, height) declared by the header, without decoding pixels."""
    if isinstance(data, memoryview):
        data = data.tobytes()
    fmt = sniff_format(data)
    if fmt is None:
        if len(memoryview(data)) == 0:
            raise ImageRejected("empty image: 0 bytes received")
        raise UnsupportedMediaType(describe_unknown(data))
    return _SIZE_READERS[fmt](data)


@dataclass(frozen=True)
class PixelLayout:
    """What the header says a decoder will allocate: size, channels, bytes per sample."""

    width: int
    height: int
    channels: int
    bytes_per_sample: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def pixel_layout(data: ByteSource) -> PixelLayout:
    """The declared size, channel count and sample depth, without decoding pixels."""
    fmt = sniff_format(data)
    if fmt is None:
        if len(memoryview(data)) == 0:
            raise ImageRejected("empty image: 0 bytes received")
        raise UnsupportedMediaType(describe_unknown(data))
    return _LAYOUT_READERS[fmt](data)


def jpeg_scan(data: ByteSource) -> tuple[int, int, int]:
    """(width, height, offset of the first SOS marker) of a JPEG, walking its segments."""
    layout, sos = _jpeg_walk(data)
    return layout.width, layout.height, sos


def _jpeg_walk(data: ByteSource) -> tuple[PixelLayout, int]:
    n = len(data)
    pos = 2
    size: PixelLayout | None = None
    while True:
        found = data.find(b"\xff", pos)
        pos = n if found < 0 else found  # stray bytes between segments: libjpeg skips them
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos >= n:
            raise ImageRejected("truncated JPEG: the headers end before the image data")
        marker = data[pos]
        pos += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker == 0xD9:
            raise ImageRejected("corrupt JPEG: end-of-image marker before any image data")
        if pos + 2 > n:
            raise ImageRejected("truncated JPEG: a segment header is cut off")
        (length,) = struct.unpack_from(">H", data, pos)
        if length < 2:
            raise ImageRejected(f"corrupt JPEG: segment FF{marker:02X} has length {length}")
        if marker == 0xDA:
            if size is None:
                raise ImageRejected("corrupt JPEG: image data (SOS) before the frame header")
            return size, pos - 2
        if marker in _JPEG_SOF and size is None:
            if pos + 8 > n:
                raise ImageRejected("truncated JPEG: the frame header is cut off")
            precision, height, width, components = struct.unpack_from(">BHHB", data, pos + 2)
            size = PixelLayout(width, height, components, 2 if precision > 8 else 1)
        pos += length


def _jpeg_size(data: ByteSource) -> tuple[int, int]:
    width, height, _ = jpeg_scan(data)
    return width, height


def _png_size(data: ByteSource) -> tuple[int, int]:
    layout = _png_layout(data)
    return layout.width, layout.height


# PNG colour type -> channels as decoded (a palette may expand to RGBA)
_PNG_CHANNELS = {0: 1, 2: 3, 3: 4, 4: 2, 6: 4}


def _png_layout(data: ByteSource) -> PixelLayout:
    ihdr = bytes(memoryview(data)[8:33])
    if len(ihdr) < 25:
        raise ImageRejected("truncated PNG: the IHDR header is cut off")
    length, ctype = struct.unpack_from(">I4s", ihdr)
    if ctype != b"IHDR" or length != 13:
        raise ImageRejected("corrupt PNG: the first chunk is not a 13-byte IHDR")
    (crc,) = struct.unpack_from(">I", ihdr, 21)
    if zlib.crc32(ihdr[4:21]) != crc:
        raise ImageRejected("corrupt PNG: the IHDR checksum does not match")
    width, height, depth, colour = struct.unpack_from(">IIBB", ihdr, 8)
    if colour not in _PNG_CHANNELS:
        raise ImageRejected(f"corrupt PNG: unknown colour type {colour}")
    return PixelLayout(width, height, _PNG_CHANNELS[colour], 2 if depth == 16 else 1)


def _bmp_size(data: ByteSource) -> tuple[int, int]:
    head = bytes(memoryview(data)[:26])
    if len(head) < 26:
        raise ImageRejected("truncated BMP: the info header is cut off")
    (info_size,) = struct.unpack_from("<I", head, 14)
    if info_size == 12:
        width, height = struct.unpack_from("<HH", head, 18)
        return width, height
    width, height = struct.unpack_from("<ii", head, 18)
    if width < 0:
        raise ImageRejected(f"corrupt BMP: negative width {width}")
    return width, abs(height)  # a negative height marks a top-down bitmap


def _webp_size(data: ByteSource) -> tuple[int, int]:
    head = bytes(memoryview(data)[:30])
    if len(head) < 30:
        raise ImageRejected("truncated WebP: the header is cut off")
    chunk = head[12:16]
    if chunk == b"VP8 ":
        if head[23:26] != b"\x9d\x01\x2a":
            raise ImageRejected("corrupt WebP: VP8 start code missing")
        width, height = struct.unpack_from("<HH", head, 26)
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":
        if head[20] != 0x2F:
            raise ImageRejected("corrupt WebP: VP8L signature missing")
        (bits,) = struct.unpack_from("<I", head, 21)
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        width = int.from_bytes(head[24:27], "little") + 1
        height = int.from_bytes(head[27:30], "little") + 1
        return width, height
    raise ImageRejected(f"corrupt WebP: unknown first chunk {chunk!r}")


def _tiff_size(data: ByteSource) -> tuple[int, int]:
    info = parse_tiff(data)
    return info.width, info.height


def _jpeg_layout(data: ByteSource) -> PixelLayout:
    return _jpeg_walk(data)[0]


def _bmp_layout(data: ByteSource) -> PixelLayout:
    width, height = _bmp_size(data)
    head = bytes(memoryview(data)[:30])
    (info_size,) = struct.unpack_from("<I", head, 14)
    offset = 24 if info_size == 12 else 28
    bits = struct.unpack_from("<H", head, offset)[0] if len(head) >= offset + 2 else 24
    return PixelLayout(width, height, 4 if bits == 32 else 3, 1)


def _webp_layout(data: ByteSource) -> PixelLayout:
    width, height = _webp_size(data)
    head = bytes(memoryview(data)[:21])
    lossy_opaque = head[12:16] == b"VP8 " or (head[12:16] == b"VP8X" and not head[20] & 0x10)
    return PixelLayout(width, height, 3 if lossy_opaque else 4, 1)


def _tiff_layout(data: ByteSource) -> PixelLayout:
    info = parse_tiff(data)
    depth = max(1, -(-max(info.bits) // 8))
    return PixelLayout(info.width, info.height, info.samples, depth)


_LAYOUT_READERS = {
    "jpeg": _jpeg_layout,
    "png": _png_layout,
    "bmp": _bmp_layout,
    "webp": _webp_layout,
    "tiff": _tiff_layout,
}

_SIZE_READERS = {
    "jpeg": _jpeg_size,
    "png": _png_size,
    "bmp": _bmp_size,
    "webp": _webp_size,
    "tiff": _tiff_size,
}
