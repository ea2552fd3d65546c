"""What cameras do to moving text, as seeded scenarios: each one a renderer of short clips.

A scenario is one thing a camera does to the text it films, on top of the ordinary
(textured background, sensor noise, JPEG): text entering or leaving the frame across
its border, approaching or receding (the scale changes along the track), perspective and
shear, camera shake, a passing occluder, two plates crossing, low light, H.264 at a low
bitrate. Its text is small (7-14 pixels high in a 640x360 frame) and faded on some
plates, as far cameras see it. Each clip draws its plates in one font, either one of
OpenCV's Hershey fonts or a TrueType font (DejaVu, shipped with matplotlib, or Pillow's
own): `FONTS_TUNED` are the ones policy choices may look at, `FONTS_HELD_OUT` (and seeds
from `HELD_OUT_SEED` on) the ones a choice is checked on.

A line's truth in a frame is its whole text, from the frame where at least
`VISIBLE_TRUTH` of it shows: what a reader who follows the line should report.
"""

from __future__ import annotations

import importlib.util
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from pathlib import Path

import av
import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from edgefleet.demo.scenes.clips import Clip, LineTruth
from edgefleet.demo.scenes.text import Kind, make_text

SCENARIOS = (
    "entering",
    "leaving",
    "approaching",
    "receding",
    "perspective",
    "shake",
    "occluded",
    "crossing",
    "low-light",
    "h264",
)
FONTS_TUNED = ("hershey-simplex", "hershey-duplex", "dejavu-sans")
FONTS_HELD_OUT = ("hershey-complex", "hershey-triplex", "dejavu-serif", "dejavu-mono", "pillow")
HELD_OUT_SEED = 1000
VISIBLE_TRUTH = 0.6

_HERSHEY = {
    "hershey-simplex": cv2.FONT_HERSHEY_SIMPLEX,
    "hershey-duplex": cv2.FONT_HERSHEY_DUPLEX,
    "hershey-complex": cv2.FONT_HERSHEY_COMPLEX,
    "hershey-triplex": cv2.FONT_HERSHEY_TRIPLEX,
}
_TRUETYPE = {
    "dejavu-sans": "DejaVuSans-Bold.ttf",
    "dejavu-serif": "DejaVuSerif.ttf",
    "dejavu-mono": "DejaVuSansMono.ttf",
}
_KINDS: tuple[Kind, ...] = ("container", "plate", "sign")
_TEXT_PX = 40  # the plate's text height as drawn, before the scenario scales it
FADED = 0.3  # share of plates whose ink is faded


@cache
def _font_dir() -> Path | None:
    """Where the DejaVu TrueType fonts lie: matplotlib's copy, else the system's."""
    spec = importlib.util.find_spec("matplotlib")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "mpl-data" / "fonts" / "ttf"
        if (bundled / "DejaVuSans.ttf").exists():
            return bundled
    system = Path("/usr/share/fonts/truetype/dejavu")
    return system if (system / "DejaVuSans.ttf").exists() else None


def available_fonts(fonts: tuple[str, ...]) -> tuple[str, ...]:
    """The fonts of `fonts` this machine can draw (Hershey and Pillow's always)."""
    folder = _font_dir()
    return tuple(
        f for f in fonts if f not in _TRUETYPE or (folder and (folder / _TRUETYPE[f]).exists())
    )


def plate_image(text: str, font: str, ink: int, paper: int) -> np.ndarray:
    """The plate, flat and upright: text of `_TEXT_PX` pixels with a margin, grey levels."""
    if font in _HERSHEY:
        hershey = _HERSHEY[font]
        scale = cv2.getFontScaleFromHeight(hershey, _TEXT_PX, 2)
        (tw, th), base = cv2.getTextSize(text, hershey, scale, 2)
        pad = _TEXT_PX // 3
        image = np.full((th + base + 2 * pad, tw + 2 * pad), paper, np.uint8)
        cv2.putText(image, text, (pad, pad + th), hershey, scale, ink, 2, cv2.LINE_AA)
        return image
    face: ImageFont.FreeTypeFont | ImageFont.ImageFont
    if font == "pillow":
        face = ImageFont.load_default(_TEXT_PX * 1.3)
    else:
        folder = _font_dir()
        assert folder is not None, "available_fonts() leaves out what cannot be drawn"
        face = ImageFont.truetype(str(folder / _TRUETYPE[font]), round(_TEXT_PX * 1.3))
    left, top, right, bottom = (round(v) for v in face.getbbox(text))
    pad = _TEXT_PX // 3
    canvas = Image.new("L", (right - left + 2 * pad, bottom - top + 2 * pad), paper)
    ImageDraw.Draw(canvas).text((pad - left, pad - top), text, fill=ink, font=face)
    return np.asarray(canvas)


@dataclass
class _Plate:
    """One line on its way: where its corners are at time t (0..1 over the clip)."""

    line: int
    text: str
    kind: Kind
    image: np.ndarray
    corners: Callable[[float], np.ndarray]  # 4x2 float32, frame pixels


@dataclass
class _Scene:
    width: int
    height: int
    plates: list[_Plate]
    shake_px: float = 0.0
    occluder: tuple[float, float, float] | None = None  # x at t=0, x at t=1, width
    light: float = 1.0
    noise: float = 4.0
    h264_kbps: int | None = None
    quality: int = 60
    focus: float = 0.0
    background: np.ndarray = field(default_factory=lambda: np.zeros((1, 1, 3), np.uint8))


def _rect(w: float, h: float) -> np.ndarray:
    return np.array([[0, 0], [w, 0], [w, h], [0, h]], np.float32)


def _moving(
    size: tuple[float, float], start: tuple[float, float], end: tuple[float, float],
    scale: tuple[float, float] = (1.0, 1.0), shear: float = 0.0, tilt: float = 0.0,
) -> Callable[[float], np.ndarray]:
    """Corners of a plate of `size` whose top-left moves start -> end while its scale goes
    scale[0] -> scale[1] (geometric: steady approach); `shear` slants it, `tilt` shortens
    its right edge (a plate turned away: perspective)."""
    w, h = size

    def corners(t: float) -> np.ndarray:
        s = scale[0] * (scale[1] / scale[0]) ** t
        x = start[0] + (end[0] - start[0]) * t
        y = start[1] + (end[1] - start[1]) * t
        quad = _rect(w * s, h * s)
        quad[:, 0] += shear * (h * s - quad[:, 1])
        quad[1, 1] += tilt * h * s / 2
        quad[2, 1] -= tilt * h * s / 2
        return quad + np.array([x, y], np.float32)

    return corners


def _texture(w: int, h: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    f1, f2 = rng.uniform(0.02, 0.08, size=2)
    stripes = np.sin(xx * f1 + yy * f2 * 0.5) * np.cos(yy * f2)
    base = rng.integers(70, 180, size=3)
    img = base + stripes[..., None] * 35 + rng.normal(0, 6, size=(h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _plate(
    rng: random.Random, font: str, kind: Kind | None = None
) -> tuple[str, Kind, np.ndarray]:
    """A plate's text, its kind and image: dark on light mostly, faded (ink 40-90 grey
    levels from its plate: dirt, distance, a washed-out print) one time in `FADED`."""
    what: Kind = kind if kind is not None else rng.choice(_KINDS)
    text = make_text(what, rng)
    dark = rng.random() < 0.7
    paper = rng.randint(190, 245)
    ink = paper - rng.randint(40, 90) if rng.random() < FADED else rng.randint(10, 60)
    image = plate_image(text, font, ink if dark else paper, paper if dark else ink)
    return text, what, image


def _scene(kind: str, seed: int, font: str, width: int, height: int) -> _Scene:
    """The plates and effects of one clip of scenario `kind`."""
    rng = random.Random(f"{kind}-{seed}")
    nrng = np.random.default_rng(seed)
    scene = _Scene(width, height, [], background=_texture(width, height, nrng))
    scene.quality = rng.randint(45, 75)
    band = height / 3

    def add(line: int, corners_of: Callable[[tuple[float, float]], Callable], k=None) -> None:
        text, what, image = _plate(rng, font, k)
        size = (float(image.shape[1]), float(image.shape[0]))
        scene.plates.append(_Plate(line, text, what, image, corners_of(size)))

    small = rng.uniform(0.18, 0.36)  # the plate's scale: text of about 7-14 pixels
    scene.focus = rng.uniform(0.4, 1.1)  # the lens's blur (sigma, pixels)

    def across(line: int, leave: bool) -> Callable[[tuple[float, float]], Callable]:
        y = band * line + band * rng.uniform(0.2, 0.5)
        right = rng.random() < 0.5

        def corners_of(size: tuple[float, float]) -> Callable[[float], np.ndarray]:
            w = size[0] * small
            inside = rng.uniform(0.1, 0.9) * max(1.0, width - w)
            outside = width + 4 if right else -w - 4
            start, end = ((inside, y), (outside, y)) if leave else ((outside, y), (inside, y))
            return _moving(size, start, end, (small, small))

        return corners_of

    def drift(line: int, **how) -> Callable[[tuple[float, float]], Callable]:
        y = band * line + band * rng.uniform(0.15, 0.45)

        def corners_of(size: tuple[float, float]) -> Callable[[float], np.ndarray]:
            s = how.get("scale", (small, small))
            w = size[0] * max(s)
            x0 = rng.uniform(0, max(1.0, width - w))
            x1 = min(max(0.0, x0 + rng.uniform(-0.15, 0.15) * width), max(0.0, width - w))
            return _moving(size, (x0, y), (x1, y), s, how.get("shear", 0.0), how.get("tilt", 0.0))

        return corners_of

    if kind in ("entering", "leaving"):
        for line in range(rng.choice([1, 2])):
            add(line, across(line, leave=kind == "leaving"))
        add(2, drift(2))
    elif kind in ("approaching", "receding"):
        far, near = rng.uniform(0.25, 0.35), rng.uniform(0.8, 1.0)
        scales = (far, near) if kind == "approaching" else (near, far)
        add(0, drift(0, scale=scales), "plate")
        add(2, drift(2))
    elif kind == "perspective":
        for line in range(3):
            add(line, drift(line, shear=rng.uniform(-0.35, 0.35), tilt=rng.uniform(0.15, 0.4)))
    elif kind == "shake":
        scene.shake_px = rng.uniform(4, 9)
        for line in range(3):
            add(line, drift(line))
    elif kind == "occluded":
        for line in range(2):
            add(line, drift(line))
        scene.occluder = (rng.uniform(-0.2, 0.2) * width, rng.uniform(0.8, 1.2) * width, 0.08)
    elif kind == "crossing":
        y = band * rng.uniform(0.6, 1.2)
        for line, (a, b) in enumerate(((0.05, 0.6), (0.6, 0.05))):
            def corners_of(size, a=a, b=b, dy=line * 0.5 * band) -> Callable[[float], np.ndarray]:
                w = size[0] * small
                x0, x1 = a * (width - w) / 0.6, b * (width - w) / 0.6
                return _moving(size, (x0, y + dy), (x1, y + dy), (small, small))

            add(line, corners_of)
        add(2, drift(2))
    elif kind == "low-light":
        scene.light, scene.noise = rng.uniform(0.18, 0.3), rng.uniform(9, 14)
        for line in range(3):
            add(line, drift(line))
    elif kind == "h264":
        scene.h264_kbps = rng.choice([120, 160, 200])
        for line in range(3):
            add(line, drift(line))
    else:
        raise ValueError(f"unknown scenario {kind!r}; known: {', '.join(SCENARIOS)}")
    return scene


def _draw(frame: np.ndarray, plate: _Plate, quad: np.ndarray) -> tuple[int, int, int, int, float]:
    """Warp the plate onto the frame; its box (clipped) and the share of it inside."""
    h, w = plate.image.shape[:2]
    fh, fw = frame.shape[:2]
    matrix = cv2.getPerspectiveTransform(_rect(w, h), quad.astype(np.float32))
    x1, y1 = np.floor(quad.min(axis=0)).astype(int)
    x2, y2 = np.ceil(quad.max(axis=0)).astype(int)
    cx1, cy1, cx2, cy2 = max(0, x1), max(0, y1), min(fw, x2), min(fh, y2)
    area = max(1, (x2 - x1) * (y2 - y1))
    if cx2 <= cx1 or cy2 <= cy1:
        return cx1, cy1, cx2, cy2, 0.0
    shift = np.array([[1, 0, -cx1], [0, 1, -cy1], [0, 0, 1]], np.float64)
    size = (cx2 - cx1, cy2 - cy1)
    ink = cv2.warpPerspective(plate.image, shift @ matrix, size, flags=cv2.INTER_AREA)
    mask = cv2.warpPerspective(np.full((h, w), 255, np.uint8), shift @ matrix, size)
    roi = frame[cy1:cy2, cx1:cx2]
    alpha = (mask.astype(np.float32) / 255)[..., None]
    roi[:] = roi * (1 - alpha) + ink[..., None].astype(np.float32) * alpha
    return cx1, cy1, cx2, cy2, (cx2 - cx1) * (cy2 - cy1) / area


def _h264(frames: list[np.ndarray], kbps: int, fps: int = 10) -> list[np.ndarray]:
    """The frames through libx264 at `kbps` and back, as a cheap camera streams them."""
    encoder = av.CodecContext.create("libx264", "w")
    encoder.width, encoder.height = frames[0].shape[1], frames[0].shape[0]
    encoder.pix_fmt = "yuv420p"
    encoder.bit_rate = kbps * 1000
    encoder.time_base = Fraction(1, fps)
    encoder.framerate = Fraction(fps, 1)
    decoder = av.CodecContext.create("h264", "r")
    out: list[np.ndarray] = []

    def take(packets: list) -> None:
        for packet in packets:
            out.extend(d.to_ndarray(format="bgr24") for d in decoder.decode(packet))

    for index, frame in enumerate(frames):
        picture = av.VideoFrame.from_ndarray(frame, format="bgr24")
        picture.pts = index
        take(encoder.encode(picture))
    take(encoder.encode(None))
    out.extend(d.to_ndarray(format="bgr24") for d in decoder.decode(None))
    return out


def render_scenario(
    kind: str, seed: int, font: str, frames: int = 40, width: int = 640, height: int = 360
) -> Clip:
    """One clip of scenario `kind` in `font`; everything follows from the seed."""
    scene = _scene(kind, seed, font, width, height)
    nrng = np.random.default_rng(seed + 7)
    drawn: list[np.ndarray] = []
    truth: list[list[LineTruth]] = []
    for index in range(frames):
        t = index / max(1, frames - 1)
        frame: np.ndarray = scene.background.astype(np.float32)
        items = []
        dx, dy = (nrng.normal(0, scene.shake_px, 2) if scene.shake_px else (0.0, 0.0))
        for plate in scene.plates:
            quad = plate.corners(t) + np.array([dx, dy], np.float32)
            x1, y1, x2, y2, inside = _draw(frame, plate, quad)
            if inside >= VISIBLE_TRUTH:
                items.append(LineTruth(line=plate.line, text=plate.text, box=(x1, y1, x2, y2)))
        if scene.occluder is not None:
            a, b, share = scene.occluder
            x = round(a + (b - a) * t)
            pole = round(share * width)
            frame[:, max(0, x) : max(0, x + pole)] = (60, 62, 58)
        if scene.focus:
            frame = cv2.GaussianBlur(frame, (0, 0), scene.focus)
        frame = frame * scene.light + nrng.normal(0, scene.noise, size=frame.shape)
        drawn.append(np.clip(frame, 0, 255).astype(np.uint8))
        truth.append(items)
    if scene.h264_kbps is not None:
        drawn = _h264(drawn, scene.h264_kbps)
    jpegs, decoded = [], []
    for frame in drawn:
        ok, buf = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, scene.quality])
        if not ok:
            raise ValueError("JPEG encoding failed")
        jpegs.append(buf.tobytes())
        image = cv2.imdecode(buf, cv2.IMREAD_COLOR)
        if image is None:
            raise ValueError("JPEG decoding failed")
        decoded.append(image)
    return Clip(seed=seed, quality=scene.quality, frames=decoded, jpegs=jpegs, truth=truth,
                kinds={plate.line: plate.kind for plate in scene.plates})


def scenario_clips(
    kind: str, clips: int, frames: int, *, held_out: bool = True
) -> list[Clip]:
    """`clips` clips of one scenario, fonts taken in turn from the held-out set (or the
    tuned one), seeds from `HELD_OUT_SEED` (or 0)."""
    fonts = available_fonts(FONTS_HELD_OUT if held_out else FONTS_TUNED)
    first = HELD_OUT_SEED if held_out else 0
    return [
        render_scenario(kind, first + i, fonts[i % len(fonts)], frames) for i in range(clips)
    ]
