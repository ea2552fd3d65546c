"""Decoding untrusted images: every bad input gets its typed error, every good one is RGB.

Fixtures are generated here (Pillow/OpenCV writers, plus hand-made PNG and TIFF headers
for what those writers refuse to produce), so each test shows the bytes it feeds.
"""

from __future__ import annotations

import io
import logging
import struct
import zlib

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageOps
from prometheus_client import REGISTRY

from edgefleet.shared.errors import (
    EdgefleetError,
    ImageRejected,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    UnsupportedMediaType,
)
from edgefleet.shared.imaging import (
    ImageLimits,
    decode_file,
    decode_image,
    encode_jpeg,
    encode_png,
    image_size,
    sniff_format,
)

# ---------------------------------------------------------------- fixtures made in code


def pil_bytes(img: Image.Image, fmt: str, **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


def gradient(h: int = 48, w: int = 64) -> np.ndarray:
    """A smooth, asymmetric RGB image: JPEG keeps it close, any flip or turn shows."""
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) % 256], axis=-1).astype(
        np.uint8
    )


def noise(h: int = 24, w: int = 32, c: int = 3, seed: int = 0) -> np.ndarray:
    shape = (h, w) if c == 1 else (h, w, c)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return (
        struct.pack(">I", len(payload))
        + kind
        + payload
        + struct.pack(">I", zlib.crc32(kind + payload))
    )


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose IHDR (valid CRC) declares any size; the IDAT holds one row."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" + b"\x00" * 16)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", idat)
        + png_chunk(b"IEND", b"")
    )


def tiff_bytes(
    arr: np.ndarray,
    *,
    photometric: int,
    endian: str = "<",
    rows_per_strip: int | None = None,
    extra_samples: tuple[int, ...] = (),
    orientation: int | None = None,
) -> bytes:
    """An uncompressed, chunky, strip TIFF written by hand (any samples per pixel)."""
    h, w = arr.shape[:2]
    spp = 1 if arr.ndim == 2 else arr.shape[2]
    bits = arr.dtype.itemsize * 8
    rps = rows_per_strip or h
    pixels = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder(endian)).tobytes()
    row_bytes = w * spp * arr.dtype.itemsize
    nstrips = -(-h // rps)
    offsets = [8 + i * rps * row_bytes for i in range(nstrips)]
    counts = [min(rps, h - i * rps) * row_bytes for i in range(nstrips)]
    extra = bytearray()
    base = 8 + len(pixels)
    entries = []

    def add(tag: int, typ: int, values: list[int]) -> None:
        code = {3: "H", 4: "I"}[typ]
        packed = struct.pack(f"{endian}{len(values)}{code}", *values)
        if len(packed) <= 4:
            entries.append(
                struct.pack(f"{endian}HHI", tag, typ, len(values)) + packed.ljust(4, b"\0")
            )
        else:
            offset = base + len(extra)
            extra.extend(packed + b"\0" * (len(packed) % 2))
            entries.append(struct.pack(f"{endian}HHII", tag, typ, len(values), offset))

    add(256, 4, [w])
    add(257, 4, [h])
    add(258, 3, [bits] * spp)
    add(259, 3, [1])
    add(262, 3, [photometric])
    add(273, 4, offsets)
    if orientation is not None:
        add(274, 3, [orientation])
    add(277, 3, [spp])
    add(278, 4, [rps])
    add(279, 4, counts)
    add(284, 3, [1])
    if extra_samples:
        add(338, 3, list(extra_samples))
    ifd_offset = base + len(extra)
    ifd = struct.pack(f"{endian}H", len(entries)) + b"".join(entries) + b"\0\0\0\0"
    magic = b"II*\0" if endian == "<" else b"MM\0*"
    return magic + struct.pack(f"{endian}I", ifd_offset) + pixels + bytes(extra) + ifd


def jpeg_with_app1(jpeg: bytes, payload: bytes) -> bytes:
    """Insert an APP1 segment right after SOI."""
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + jpeg[2:]


def rejected_count(code: str) -> float:
    return REGISTRY.get_sample_value("ef_images_rejected_total", {"code": code}) or 0.0


# ---------------------------------------------------------------- the bad inputs


def test_empty_bytes_are_rejected_with_400():
    # given no bytes at all / when decoded / then a 400 that says the image is empty
    with pytest.raises(ImageRejected) as info:
        decode_image(b"")
    assert type(info.value) is ImageRejected
    assert info.value.http_status == 400
    assert "empty" in info.value.message


@pytest.mark.parametrize("cut", [0.5, 0.9, -2, -1])
def test_truncated_jpeg_is_rejected(cut):
    data = encode_jpeg(gradient(), quality=90)
    end = int(len(data) * cut) if cut > 0 else len(data) + cut
    with pytest.raises(ImageRejected) as info:
        decode_image(data[:end])
    assert type(info.value) is ImageRejected
    assert "truncated" in info.value.message.lower()


@pytest.mark.parametrize("cut", ["mid-idat", "no-iend", "in-ihdr"])
def test_truncated_png_is_rejected(cut):
    data = pil_bytes(Image.fromarray(noise(64, 64)), "PNG")
    end = {"mid-idat": len(data) // 2, "no-iend": len(data) - 12, "in-ihdr": 20}[cut]
    with pytest.raises(ImageRejected) as info:
        decode_image(data[:end])
    assert type(info.value) is ImageRejected
    assert "truncated" in info.value.message.lower()


@pytest.mark.parametrize(
    "data, says",
    [
        (b"GIF89a" + bytes(40), "GIF"),
        (b"%PDF-1.7\n" + bytes(40), "PDF"),
        (bytes(range(7, 64)), "magic"),
        (b"\x00\x00\x00\x18ftypheic" + bytes(20), "HEIC"),
    ],
)
def test_wrong_magic_is_415(data, says):
    with pytest.raises(UnsupportedMediaType) as info:
        decode_image(data)
    assert info.value.http_status == 415
    assert says in info.value.message
    assert sniff_format(data) is None


def test_png_declaring_100000_squared_pixels_is_refused_before_decoding():
    # given a PNG of a few dozen bytes that declares 10^10 pixels (valid IHDR CRC)
    bomb = png_declaring(100_000, 100_000)
    assert len(bomb) < 100
    assert image_size(bomb) == (100_000, 100_000)
    before = rejected_count("payload_too_large")
    # when decoded / then 413 from the header alone, and the rejection is counted
    with pytest.raises(PayloadTooLarge) as info:
        decode_image(bomb)
    assert info.value.http_status == 413
    assert "100000x100000" in info.value.message
    assert rejected_count("payload_too_large") == before + 1


def test_pixel_side_and_byte_limits_are_enforced():
    png = pil_bytes(Image.fromarray(noise(20, 300)), "PNG")
    with pytest.raises(PayloadTooLarge, match="side over the limit"):
        decode_image(png, limits=ImageLimits(max_side=256))
    with pytest.raises(PayloadTooLarge, match="pixels, over the limit"):
        decode_image(png, limits=ImageLimits(max_pixels=5_000))
    with pytest.raises(PayloadTooLarge, match="bytes, over the limit"):
        decode_image(png, limits=ImageLimits(max_bytes=len(png) - 1))
    assert decode_image(png, limits=ImageLimits(max_side=300, max_pixels=6_000)).shape == (
        20,
        300,
        3,
    )


def test_limits_model_is_strict():
    with pytest.raises(ValueError):
        ImageLimits(max_pixels=0)
    with pytest.raises(ValueError):
        ImageLimits(max_pixel=10)  # a typo is an error, not a silent default


@pytest.mark.parametrize("size", [(0, 10), (10, 0), (0, 0)])
def test_zero_pixel_png_is_rejected(size):
    with pytest.raises(ImageRejected) as info:
        decode_image(png_declaring(*size))
    assert type(info.value) is ImageRejected
    assert "0 pixels" in info.value.message


def test_zero_height_jpeg_frame_is_rejected():
    data = bytearray(encode_jpeg(gradient()))
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 7] = b"\x00\x00"  # frame height 0
    with pytest.raises(ImageRejected, match="0 pixels"):
        decode_image(bytes(data))


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")  # Pillow's own notice
@pytest.mark.parametrize(
    "payload",
    [
        b"Exif\x00\x00MM\x00*\xff\xff\xff\xf0",  # IFD offset far past the end
        b"Exif\x00\x00II*\x00\x08\x00\x00\x00\xff\xff" + b"\x01" * 30,  # 65535 entries
        b"Exif\x00\x00" + bytes(range(256)) * 2,  # garbage
        b"Exif\x00\x00",  # nothing at all
    ],
)
def test_jpeg_with_corrupt_exif_still_decodes(payload, caplog):
    clean = encode_jpeg(gradient())
    with caplog.at_level(logging.WARNING, logger="edgefleet.shared.imaging.decode"):
        decoded = decode_image(jpeg_with_app1(clean, payload))
    assert np.array_equal(decoded, decode_image(clean))  # EXIF ignored, pixels intact
    if len(payload) > 6:
        assert any("EXIF" in r.getMessage() for r in caplog.records)


def test_text_file_named_jpg_is_415(tmp_path):
    path = tmp_path / "photo.jpg"
    path.write_text("this is not a photo, just text\n")
    with pytest.raises(UnsupportedMediaType) as info:
        decode_file(path)
    assert "text" in info.value.message


def test_extension_is_never_trusted(tmp_path):
    # a PNG named .jpg decodes as the PNG it is
    path = tmp_path / "really-a-png.jpg"
    img = noise()
    path.write_bytes(pil_bytes(Image.fromarray(img), "PNG"))
    assert np.array_equal(decode_file(path), img)


def test_tiff_with_five_channels_is_rejected_clearly():
    data = tiff_bytes(noise(8, 8, 5), photometric=2, extra_samples=(0, 0))
    with pytest.raises(ImageRejected) as info:
        decode_image(data)
    assert "5 channels" in info.value.message


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(NotFound):
        decode_file(tmp_path / "nope.png")
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(ImageRejected, match="0 bytes"):
        decode_file(tmp_path / "empty.png")


def test_corrupt_pixel_data_is_400_not_500():
    data = bytearray(pil_bytes(Image.fromarray(noise(64, 64)), "PNG"))
    idat = data.find(b"IDAT")
    data[idat + 10 : idat + 40] = b"\xaa" * 30  # zlib stream broken, chunk structure intact
    with pytest.raises(ImageRejected) as info:
        decode_image(bytes(data))
    assert type(info.value) is ImageRejected
    assert "PNG" in info.value.message


def test_truncated_tiff_strip_is_rejected():
    data = tiff_bytes(noise(16, 16), photometric=1)
    # keep the IFD (at the end) but claim a strip offset past the data
    cut = bytearray(data)
    ifd = struct.unpack_from("<I", cut, 4)[0]
    for i in range(struct.unpack_from("<H", cut, ifd)[0]):
        entry = ifd + 2 + 12 * i
        if struct.unpack_from("<H", cut, entry)[0] == 273:
            struct.pack_into("<I", cut, entry + 8, len(cut) - 10)
    with pytest.raises(ImageRejected, match="truncated TIFF"):
        decode_image(bytes(cut))


def test_negative_tiff_strip_offset_is_rejected():
    # found by fuzzing: a signed (SLONG) strip offset of -100 must not index from the end
    data = bytearray(tiff_bytes(noise(12, 10), photometric=2))
    ifd = struct.unpack_from("<I", data, 4)[0]
    for i in range(struct.unpack_from("<H", data, ifd)[0]):
        entry = ifd + 2 + 12 * i
        if struct.unpack_from("<H", data, entry)[0] == 273:
            struct.pack_into("<HHIi", data, entry, 273, 9, 1, -100)
    with pytest.raises(ImageRejected, match="negative"):
        decode_image(bytes(data))


# ---------------------------------------------------------------- good paths


@pytest.mark.parametrize(
    "fmt, kwargs",
    [
        ("PNG", {}),
        ("BMP", {}),
        ("TIFF", {}),
        ("TIFF", {"compression": "tiff_lzw"}),
        ("TIFF", {"compression": "tiff_adobe_deflate"}),
        ("TIFF", {"compression": "packbits"}),
        ("WEBP", {"lossless": True}),
    ],
)
def test_lossless_round_trip_is_exact(fmt, kwargs):
    img = noise(37, 53)
    data = pil_bytes(Image.fromarray(img), fmt, **kwargs)
    out = decode_image(data)
    assert sniff_format(data) == fmt.lower()
    assert image_size(data) == (53, 37)
    assert out.dtype == np.uint8 and out.shape == (37, 53, 3)
    assert out.flags.c_contiguous and out.flags.writeable
    assert np.array_equal(out, img)


@pytest.mark.parametrize(
    "fmt, kwargs",
    [
        ("JPEG", {"quality": 95}),
        ("JPEG", {"quality": 95, "progressive": True}),
        ("JPEG", {"quality": 95, "subsampling": 0}),
        ("WEBP", {"quality": 95}),
    ],
)
def test_lossy_round_trip_is_close(fmt, kwargs):
    img = gradient()
    data = pil_bytes(Image.fromarray(img), fmt, **kwargs)
    out = decode_image(data)
    assert image_size(data) == image_size(memoryview(data)) == (64, 48)
    assert np.abs(out.astype(int) - img).mean() < 3
    assert np.array_equal(decode_image(memoryview(data)), out)


def test_decode_accepts_numpy_buffers_and_refuses_other_types():
    img = noise()
    encoded = np.frombuffer(encode_png(img), np.uint8)  # as cv2.imencode hands it over
    assert np.array_equal(decode_image(encoded), img)
    with pytest.raises(InvalidInput, match="encoded bytes"):
        decode_image("not bytes")  # type: ignore[arg-type]


def test_encoders_round_trip():
    img = gradient()
    assert np.array_equal(decode_image(encode_png(img)), img)
    assert sniff_format(encode_jpeg(img)) == "jpeg"
    assert np.abs(decode_image(encode_jpeg(img, quality=95)).astype(int) - img).mean() < 3
    gray = img[..., 0]
    assert np.array_equal(decode_image(encode_png(gray))[..., 1], gray)


def test_webp_with_alpha_uses_vp8x_header():
    rgba = noise(10, 14, 4)
    data = pil_bytes(Image.fromarray(rgba, "RGBA"), "WEBP", quality=90)
    assert data[12:16] == b"VP8X"
    assert image_size(data) == (14, 10)
    assert decode_image(data).shape == (10, 14, 3)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(orientation):
    # given an asymmetric image tagged with each EXIF orientation
    img = Image.fromarray(noise(6, 9))
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = pil_bytes(img, "PNG", exif=exif)
    # when decoded / then it matches Pillow's own exif_transpose, pixel for pixel
    expected = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    out = decode_image(data)
    assert np.array_equal(out, expected)
    assert out.shape == ((9, 6, 3) if orientation >= 5 else (6, 9, 3))


def test_orientation_six_turns_clockwise_in_jpeg():
    exif = Image.Exif()
    exif[0x0112] = 6
    img = gradient(32, 64)
    data = pil_bytes(Image.fromarray(img), "JPEG", quality=95, exif=exif)
    out = decode_image(data)
    assert out.shape == (64, 32, 3)
    turned = cv2.rotate(img, cv2.ROTATE_90_CLOCKWISE)
    assert np.abs(out.astype(int) - turned).mean() < 3


def test_gray_and_one_bit_become_rgb():
    gray = noise(9, 11, 1)
    out = decode_image(pil_bytes(Image.fromarray(gray, "L"), "PNG"))
    assert out.shape == (9, 11, 3)
    assert all(np.array_equal(out[..., c], gray) for c in range(3))
    bits = Image.fromarray(gray > 127)
    out = decode_image(pil_bytes(bits, "PNG"))
    assert np.array_equal(out[..., 0], np.where(gray > 127, 255, 0))


def test_alpha_is_composited_on_black():
    rgba = np.zeros((1, 3, 4), np.uint8)
    rgba[..., :3] = 200
    rgba[0, :, 3] = [0, 128, 255]
    out = decode_image(pil_bytes(Image.fromarray(rgba, "RGBA"), "PNG"))
    assert out[0, :, 0].tolist() == [0, round(200 * 128 / 255), 200]
    la = Image.fromarray(rgba[..., [0, 3]], "LA")
    out = decode_image(pil_bytes(la, "PNG"))
    assert out[0, :, 1].tolist() == [0, round(200 * 128 / 255), 200]


def test_palette_with_and_without_transparency():
    img = Image.fromarray(noise(8, 8)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    expected = np.asarray(img.convert("RGB"))
    assert np.array_equal(decode_image(pil_bytes(img, "PNG")), expected)
    index = np.asarray(img)[0, 0]
    transparent = pil_bytes(img, "PNG", transparency=int(index))
    out = decode_image(transparent)
    assert (out[np.asarray(img) == index] == 0).all()
    assert np.array_equal(out[np.asarray(img) != index], expected[np.asarray(img) != index])


def test_sixteen_bit_is_scaled_to_eight():
    ramp = np.array([[0, 257, 32767, 32896, 65535, 1000]], np.uint16)
    expected = np.round(ramp / 257).astype(np.uint8)
    out = decode_image(pil_bytes(Image.fromarray(ramp), "PNG"))  # Pillow mode I;16
    assert np.array_equal(out[..., 0], expected)
    ok, png48 = cv2.imencode(".png", np.repeat(ramp[..., None], 3, axis=2))
    assert ok
    out = decode_image(png48.tobytes())
    assert np.abs(out[..., 0].astype(int) - expected).max() <= 1


def test_cmyk_jpeg_is_converted():
    data = pil_bytes(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "JPEG", quality=95)
    out = decode_image(data)
    assert out.shape == (8, 8, 3)
    assert np.abs(out[4, 4].astype(int) - [255, 0, 0]).max() <= 4


@pytest.mark.parametrize(
    "arr, photometric, kwargs",
    [
        (noise(30, 20, 1), 1, {}),
        (noise(30, 20, 1), 1, {"endian": ">", "rows_per_strip": 7}),
        (noise(30, 20), 2, {"rows_per_strip": 4}),
        (noise(30, 20, 1).astype(np.uint16) * 257, 1, {"endian": ">"}),
        (noise(30, 20).astype(np.uint16) * 257, 2, {}),
    ],
)
def test_uncompressed_tiff_matches_pillow(arr, photometric, kwargs):
    data = tiff_bytes(arr, photometric=photometric, **kwargs)
    out = decode_image(data)
    expected = arr if arr.dtype == np.uint8 else (arr // 257).astype(np.uint8)
    if expected.ndim == 2:
        expected = np.repeat(expected[..., None], 3, axis=2)
    assert np.array_equal(out, expected)
    pillow = Image.open(io.BytesIO(data))
    assert pillow.size == image_size(data) == (20, 30)


def test_tiff_white_is_zero_alpha_and_orientation():
    gray = noise(5, 7, 1)
    out = decode_image(tiff_bytes(gray, photometric=0))
    assert np.array_equal(out[..., 0], 255 - gray)
    ga = np.stack([np.full((2, 3), 200, np.uint8), np.full((2, 3), 128, np.uint8)], axis=-1)
    out = decode_image(tiff_bytes(ga, photometric=1, extra_samples=(2,)))
    assert (out == round(200 * 128 / 255)).all()
    rgba = noise(4, 6, 4)
    out = decode_image(tiff_bytes(rgba, photometric=2, extra_samples=(1,)))  # premultiplied
    assert np.array_equal(out, rgba[..., :3])
    img = noise(4, 6)
    out = decode_image(tiff_bytes(img, photometric=2, orientation=6))
    assert np.array_equal(out, cv2.rotate(img, cv2.ROTATE_90_CLOCKWISE))


def test_decode_file_matches_decode_image(tmp_path):
    data = pil_bytes(Image.fromarray(noise(40, 30)), "WEBP", lossless=True)
    (tmp_path / "a.webp").write_bytes(data)
    assert np.array_equal(decode_file(tmp_path / "a.webp"), decode_image(data))
    data = pil_bytes(Image.fromarray(noise(40, 30)), "TIFF", compression="tiff_lzw")
    (tmp_path / "b.tif").write_bytes(data)
    assert np.array_equal(decode_file(str(tmp_path / "b.tif")), decode_image(data))


# ---------------------------------------------------------------- fuzz

# derandomized: the same examples on every run, so CI never flakes on a new draw
_FUZZ_SETTINGS = dict(
    deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
_FUZZ_LIMITS = ImageLimits(max_pixels=1 << 20, max_side=4096)
_SEEDS = [
    encode_jpeg(gradient(16, 24)),
    pil_bytes(Image.fromarray(noise(12, 10)), "PNG"),
    pil_bytes(Image.fromarray(noise(12, 10)), "BMP"),
    pil_bytes(Image.fromarray(noise(12, 10)), "WEBP", lossless=True),
    pil_bytes(Image.fromarray(noise(12, 10)), "WEBP", quality=80),
    pil_bytes(Image.fromarray(noise(12, 10)), "TIFF"),
    pil_bytes(Image.fromarray(noise(12, 10)), "TIFF", compression="tiff_lzw"),
    tiff_bytes(noise(6, 5, 1).astype(np.uint16), photometric=1, endian=">"),
    tiff_bytes(noise(6, 5, 4), photometric=2, rows_per_strip=2, extra_samples=(2,)),
    pil_bytes(
        Image.fromarray(noise(9, 7)),
        "JPEG",
        exif=b"Exif\x00\x00" + tiff_bytes(noise(1, 1, 1), photometric=1, orientation=6),
    ),
]


def _only_typed_errors(data: bytes) -> None:
    try:
        out = decode_image(data, limits=_FUZZ_LIMITS)
    except EdgefleetError as exc:
        assert 400 <= exc.http_status < 500
        assert exc.message
    else:
        assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3


@settings(max_examples=150, **_FUZZ_SETTINGS)
@given(st.binary(max_size=512))
def test_fuzz_random_bytes_raise_only_typed_errors(data):
    _only_typed_errors(data)


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")
@settings(max_examples=500, **_FUZZ_SETTINGS)
@given(
    seed=st.sampled_from(_SEEDS),
    edits=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=6),
    keep=st.floats(0.05, 1.0),
)
def test_fuzz_mutated_images_raise_only_typed_errors(seed, edits, keep):
    data = bytearray(seed)
    for where, value in edits:
        data[min(len(data) - 1, int(where * len(data)))] = value
    _only_typed_errors(bytes(data[: max(1, int(len(data) * keep))]))
