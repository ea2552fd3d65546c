"""Untrusted bytes -> RGB uint8, with limits checked before a single pixel is decoded.

Order of checks, each with its own typed error:
1. empty (ImageRejected) and byte size (PayloadTooLarge);
2. magic bytes (UnsupportedMediaType) — file names and content types are never trusted;
3. declared width/height from the header alone: 0 pixels (ImageRejected), a side or the
   pixel count over the limit (PayloadTooLarge) — a 100000x100000 PNG of a few hundred
   bytes is refused here, before any allocation;
4. the bytes the decode will allocate (`decode_bytes`: size x channels x sample depth from
   the header) over `max_decode_bytes` (PayloadTooLarge); with a `DecodeBudget`, those
   bytes are reserved from the process's budget before decoding, and the result's bytes
   stay reserved while the array lives;
5. structural truncation (no JPEG EOI, no PNG IEND), then the decode itself, where any
   decoder complaint becomes ImageRejected.
Pixel rules (16-bit, alpha on black, EXIF orientation) are in `edgefleet.shared.imaging.pixels`.
"""

from __future__ import annotations

import io
import logging
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
from PIL import Image
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field

from edgefleet.shared.errors import (
    EdgefleetError,
    ImageRejected,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from edgefleet.shared.imaging.budget import DecodeBudget
from edgefleet.shared.imaging.headers import (
    PixelLayout,
    describe_unknown,
    image_size,
    jpeg_scan,
    pixel_layout,
    sniff_format,
)
from edgefleet.shared.imaging.pixels import apply_orientation, pil_to_rgb
from edgefleet.shared.imaging.tiff import ByteSource, TiffInfo, decode_raw_tiff, parse_tiff

__all__ = [
    "ImageLimits",
    "decode_file",
    "decode_image",
    "encode_jpeg",
    "encode_png",
    "image_size",
    "sniff_format",
]

logger = logging.getLogger(__name__)

IMAGES_DECODED = Counter(
    "ef_images_decoded_total", "Images decoded to RGB, by format", ["format"]
)
IMAGES_REJECTED = Counter(
    "ef_images_rejected_total", "Images refused before or during decode, by code", ["code"]
)

_PIL_FORMATS = {"jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "webp": "WEBP", "tiff": "TIFF"}
_EXIF_ORIENTATION = 0x0112
_MIB = 1 << 20


class ImageLimits(BaseModel):
    """Bounds on what one decode may cost; checked before the pixels are decoded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_bytes: int = Field(
        32 * _MIB, gt=0, description="Largest encoded image accepted, in bytes (413 beyond)."
    )
    max_pixels: int = Field(
        50_000_000,
        gt=0,
        description="Largest declared width*height accepted (about 7k x 7k); 413 beyond.",
    )
    max_side: int = Field(
        16384, gt=0, description="Largest declared width or height accepted, in pixels."
    )
    max_decode_bytes: int = Field(
        256 * _MIB,
        gt=0,
        description="Most bytes one decode may allocate (size x channels x sample depth from "
        "the header, with the RGB copies); 413 beyond.",
    )


_RGB_BYTES = 3


def decode_bytes(layout: PixelLayout) -> int:
    """Bytes a decode allocates at its peak: the decoder's buffer (Pillow keeps three
    channels as four) and up to three RGB-sized copies on the way out (Pillow's export,
    the array, the upright result)."""
    buffer_channels = 4 if layout.channels == 3 else layout.channels
    per_pixel = buffer_channels * layout.bytes_per_sample + 3 * _RGB_BYTES
    return layout.pixels * per_pixel


def decode_image(
    data: bytes | bytearray | memoryview | np.ndarray,
    *,
    limits: ImageLimits | None = None,
    budget: DecodeBudget | None = None,
) -> np.ndarray:
    """Decode untrusted image bytes to RGB uint8 HxWx3 (C-contiguous, writable)."""
    if isinstance(data, (memoryview, np.ndarray)):
        data = data.tobytes()
    if not isinstance(data, (bytes, bytearray)):
        raise InvalidInput(f"decode_image needs the encoded bytes, got {type(data).__name__}")
    return _counted(lambda: _decode(data, limits or ImageLimits(), budget), "bytes")


def decode_file(
    path: str | os.PathLike[str],
    limits: ImageLimits | None = None,
    budget: DecodeBudget | None = None,
) -> np.ndarray:
    """Decode an image file read through a memory map (large TIFFs stay out of the heap)."""
    p = Path(path)
    return _counted(lambda: _decode_path(p, limits or ImageLimits(), budget), p.name)


def _decode_path(
    p: Path, limits: ImageLimits, budget: DecodeBudget | None
) -> tuple[str, np.ndarray]:
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise ImageRejected(f"empty image: {p.name} has 0 bytes")
            if size > limits.max_bytes:
                raise PayloadTooLarge(
                    f"{p.name} is {size} bytes, over the limit of {limits.max_bytes} bytes"
                )
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _decode(mm, limits, budget)
    except FileNotFoundError as exc:
        raise NotFound(f"no image file at {p}") from exc
    except OSError as exc:
        raise InvalidInput(f"cannot read image file {p}: {exc.strerror or exc}") from exc


def _counted(decode: Callable[[], tuple[str, np.ndarray]], source: str) -> np.ndarray:
    try:
        fmt, rgb = decode()
    except EdgefleetError as exc:
        IMAGES_REJECTED.labels(exc.code).inc()
        logger.warning(
            "image rejected", extra={"code": exc.code, "reason": exc.message, "source": source}
        )
        raise
    IMAGES_DECODED.labels(fmt).inc()
    return rgb


def check_limits(width: int, height: int, limits: ImageLimits) -> None:
    """Refuse declared sizes before decoding: 0 pixels, a side or the area over the limit."""
    if width <= 0 or height <= 0:
        raise ImageRejected(f"image declares {width}x{height}: 0 pixels")
    if max(width, height) > limits.max_side:
        raise PayloadTooLarge(
            f"image declares {width}x{height}, a side over the limit of {limits.max_side} px"
        )
    if width * height > limits.max_pixels:
        raise PayloadTooLarge(
            f"image declares {width}x{height} = {width * height} pixels, over the limit of "
            f"{limits.max_pixels} (decompression bomb guard)"
        )


def _decode(
    data: ByteSource, limits: ImageLimits, budget: DecodeBudget | None
) -> tuple[str, np.ndarray]:
    if len(data) == 0:
        raise ImageRejected("empty image: 0 bytes received")
    if len(data) > limits.max_bytes:
        raise PayloadTooLarge(
            f"image is {len(data)} bytes, over the limit of {limits.max_bytes} bytes"
        )
    fmt = sniff_format(data)
    if fmt is None:
        raise UnsupportedMediaType(describe_unknown(data))
    layout = pixel_layout(data)
    check_limits(layout.width, layout.height, limits)
    raw_tiff = _check_structure(data, fmt)
    # the raw TIFF reader writes RGB straight from the file, band by band (and turns it
    # upright in a second buffer)
    if raw_tiff is not None:
        cost = layout.pixels * _RGB_BYTES * (1 if raw_tiff.orientation == 1 else 2)
    else:
        cost = decode_bytes(layout)
    if cost > limits.max_decode_bytes:
        raise PayloadTooLarge(
            f"image declares {layout.width}x{layout.height} with {layout.channels} channel(s) "
            f"of {layout.bytes_per_sample} byte(s): decoding takes {cost} bytes, over the "
            f"limit of {limits.max_decode_bytes} (decompression bomb guard)"
        )
    if budget is None:
        return fmt, _decode_pixels(data, fmt, layout, limits, raw_tiff)
    with budget.reserve(cost) as reservation:
        rgb = _decode_pixels(data, fmt, layout, limits, raw_tiff)
        if rgb.base is not None:  # the budget follows the buffer's owner: own it
            rgb = rgb.copy()
        return fmt, reservation.hold(rgb, rgb.nbytes)


def _check_structure(data: ByteSource, fmt: str) -> TiffInfo | None:
    """Refuse truncated files before decoding; the TIFF's layout when it is read raw."""
    if fmt == "jpeg":
        _, _, sos = jpeg_scan(data)
        if data.find(b"\xff\xd9", sos) < 0:
            raise ImageRejected("truncated JPEG: the end-of-image marker is missing")
    elif fmt == "png" and data.rfind(b"\x00\x00\x00\x00IEND") < 0:
        raise ImageRejected("truncated PNG: the IEND chunk is missing")
    elif fmt == "tiff":
        info = parse_tiff(data)
        if info.samples > 4:
            raise ImageRejected(
                f"TIFF has {info.samples} channels per pixel; only 1 (gray), 2 (gray+alpha), "
                "3 (RGB) or 4 (RGBA/CMYK) are supported"
            )
        if info.raw_readable:
            return info
    return None


def _decode_pixels(
    data: ByteSource,
    fmt: str,
    layout: PixelLayout,
    limits: ImageLimits,
    raw_tiff: TiffInfo | None,
) -> np.ndarray:
    if raw_tiff is not None:
        return decode_raw_tiff(data, raw_tiff)
    return _decode_with_pillow(data, fmt, layout, limits)


def _decode_with_pillow(
    data: ByteSource, fmt: str, layout: PixelLayout, limits: ImageLimits
) -> np.ndarray:
    stream = data if isinstance(data, mmap.mmap) else io.BytesIO(data)
    stream.seek(0)
    try:
        # Pillow reads any object with read/seek/tell; its stub names only IO[bytes].
        with Image.open(stream, formats=[_PIL_FORMATS[fmt]]) as im:  # type: ignore[arg-type]
            check_limits(im.width, im.height, limits)  # the decoder's view, if headers disagree
            if im.width * im.height > layout.pixels:
                raise ImageRejected(
                    f"the decoder sees {im.width}x{im.height}, larger than the header's "
                    f"{layout.width}x{layout.height}"
                )
            im.load()
            orientation = _orientation(im)
            rgb = pil_to_rgb(im)
    except EdgefleetError:
        raise
    except Image.DecompressionBombError as exc:
        raise PayloadTooLarge(f"decompression bomb refused by the decoder: {exc}") from exc
    except Exception as exc:  # untrusted bytes meet C decoders: every complaint is a 400
        raise ImageRejected(f"corrupt or truncated {fmt.upper()}: {exc}") from exc
    return np.ascontiguousarray(apply_orientation(rgb, orientation))


def _orientation(im: Image.Image) -> int:
    """The EXIF orientation, or 1 when EXIF is absent or corrupt (logged, never fatal)."""
    try:
        exif = im.getexif()
        value = exif.get(_EXIF_ORIENTATION, 1)
    except Exception as exc:  # corrupt EXIF must not lose the image
        logger.warning("corrupt EXIF ignored", extra={"error": repr(exc)})
        return 1
    if not exif and len(im.info.get("exif") or b"") > 6:  # present, but nothing parsed
        logger.warning("unreadable EXIF ignored", extra={"exif_bytes": len(im.info["exif"])})
    if not isinstance(value, int) or not 1 <= value <= 8:
        logger.warning("invalid EXIF orientation ignored", extra={"orientation": repr(value)})
        return 1
    return value


def _as_encodable(rgb: np.ndarray) -> np.ndarray:
    arr = np.asarray(rgb)
    if arr.dtype != np.uint8 or not (arr.ndim == 2 or (arr.ndim == 3 and arr.shape[2] == 3)):
        raise InvalidInput(f"encode needs RGB uint8 HxWx3 or gray HxW, got {arr.dtype} {arr.shape}")
    if arr.size == 0:
        raise InvalidInput(f"encode needs a non-empty image, got shape {arr.shape}")
    return arr if arr.ndim == 2 else cv2.cvtColor(arr, cv2.COLOR_RGB2BGR)


def encode_jpeg(rgb: np.ndarray, quality: int = 90) -> bytes:
    """RGB (or gray) uint8 -> baseline JPEG bytes."""
    if not 1 <= quality <= 100:
        raise InvalidInput(f"JPEG quality must be 1-100, got {quality}")
    ok, buf = cv2.imencode(".jpg", _as_encodable(rgb), [cv2.IMWRITE_JPEG_QUALITY, int(quality)])
    if not ok:
        raise InvalidInput(f"JPEG encoder refused an image of shape {np.shape(rgb)}")
    return buf.tobytes()


def encode_png(rgb: np.ndarray) -> bytes:
    """RGB (or gray) uint8 -> PNG bytes (lossless)."""
    ok, buf = cv2.imencode(".png", _as_encodable(rgb), [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise InvalidInput(f"PNG encoder refused an image of shape {np.shape(rgb)}")
    return buf.tobytes()
