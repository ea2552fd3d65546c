"""Seeded hard scenes as short videos: small, low-contrast, moving text with motion blur,
glare and heavy JPEG, plus the truth of every frame, and the scores to compare readers.

Each clip is a few seconds of one camera: two or three text plates drift across a
textured background; every frame is JPEG-compressed at the clip's quality (35-70), as a
cheap camera's stream would be. The same seed renders the same clip, bit for bit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import cv2
import numpy as np

from edgefleet.demo.scenes.text import Kind, make_text
from edgefleet.demo.scoring import edit_distance, normalise_text

_FONTS = [cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX_SMALL]
_KINDS: tuple[Kind, ...] = ("container", "plate", "sign")


@dataclass(frozen=True)
class LineTruth:
    """One text line in one frame: which moving line it is, its text, its box (xyxy)."""

    line: int
    text: str
    box: tuple[int, int, int, int]


@dataclass(frozen=True)
class Clip:
    """A rendered clip: BGR frames as a camera would deliver them, JPEG bytes, truth."""

    seed: int
    quality: int
    frames: list[np.ndarray]
    jpegs: list[bytes]
    truth: list[list[LineTruth]]
    kinds: dict[int, Kind] = field(default_factory=dict)  # what each line's text is


@dataclass
class _Plate:
    text: str
    font: int
    scale: float
    thickness: int
    x: float
    y: float
    vx: float
    vy: float
    ink: float
    paper: float
    blur: int
    glare_phase: float
    w: int
    h: int
    base: int
    pad: int


def _texture(w: int, h: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    f1, f2 = rng.uniform(0.02, 0.08, size=2)
    base = rng.uniform(70, 170)
    img = base + np.sin(xx * f1 + yy * f2 * 0.5) * np.cos(yy * f2) * 35
    img = img[..., None] + rng.normal(0, 6, size=(h, w, 3)) + rng.uniform(-15, 15, size=3)
    return np.clip(img, 0, 255).astype(np.float32)


def _plate(lid: int, n: int, w: int, h: int, rng: random.Random) -> _Plate:
    text = make_text(_KINDS[rng.randrange(3)], rng)
    font = rng.choice(_FONTS)
    thickness = 1
    cap = rng.uniform(11.0, 17.0)  # pixel height of the capitals: small text
    (_, th), _ = cv2.getTextSize("H", font, 1.0, thickness)
    scale = cap / th
    (tw, th), base = cv2.getTextSize(text, font, scale, thickness)
    pad = max(3, th // 2)
    pw, ph = tw + 2 * pad, th + base + 2 * pad
    band = h / n
    paper = rng.uniform(90, 200)
    contrast = rng.uniform(35, 80) * rng.choice([-1, 1])  # faint ink, dark or light
    return _Plate(
        text=text,
        font=font,
        scale=scale,
        thickness=thickness,
        x=rng.uniform(0, max(1.0, w - pw)),
        y=band * lid + rng.uniform(0, max(1.0, band - ph)),
        vx=rng.uniform(2.0, 7.0) * rng.choice([-1, 1]),  # pixels per frame: motion blur
        vy=rng.uniform(-0.6, 0.6),
        ink=float(np.clip(paper + contrast, 0, 255)),
        paper=paper,
        blur=0,
        glare_phase=rng.uniform(0, 2 * np.pi),
        w=pw,
        h=ph,
        base=base,
        pad=pad,
    )


def _draw(frame: np.ndarray, p: _Plate, index: int, nrng: np.random.Generator) -> tuple:
    fh, fw = frame.shape[:2]
    x0, y0 = round(p.x), round(p.y)
    x1, y1 = min(fw, x0 + p.w), min(fh, y0 + p.h)
    layer = np.full((y1 - y0, x1 - x0), round(p.paper), np.uint8)
    cv2.putText(
        layer,
        p.text,
        (p.pad, y1 - y0 - p.pad - p.base),
        p.font,
        p.scale,
        round(p.ink),
        p.thickness,
        cv2.LINE_AA,
    )
    frame[y0:y1, x0:x1] = layer[..., None].astype(np.float32)
    # motion blur along the plate's motion, as long as it moved in one frame's exposure
    length = max(1, round(abs(p.vx) * nrng.uniform(0.5, 1.2)))
    if length > 1:
        kernel = np.zeros((1, length), np.float32)
        kernel[:] = 1.0 / length
        ys, ye, xs, xe = max(0, y0 - 4), min(fh, y1 + 4), max(0, x0 - length), min(fw, x1 + length)
        frame[ys:ye, xs:xe] = cv2.filter2D(frame[ys:ye, xs:xe], -1, kernel)
    # glare: a bright blob sweeping over the plate on part of the frames
    sweep = np.sin(index * 0.25 + p.glare_phase)
    if sweep > 0.3:
        cx = x0 + (0.5 + 0.5 * np.sin(index * 0.4 + p.glare_phase)) * (x1 - x0)
        glare = np.zeros((fh, fw), np.float32)
        cv2.ellipse(
            glare,
            (round(cx), (y0 + y1) // 2),
            (max(4, (x1 - x0) // 6), max(3, (y1 - y0) // 2)),
            0,
            0,
            360,
            1.0,
            thickness=-1,
        )
        halo = cv2.GaussianBlur(glare, (0, 0), max(1.0, p.h / 3))
        frame += halo[..., None] * 110 * (sweep - 0.3)
    return x0, y0, x1, y1


def _step(p: _Plate, w: int, h: int, lid: int, n: int) -> None:
    p.x += p.vx
    p.y += p.vy
    if p.x < 0 or p.x + p.w > w:
        p.vx = -p.vx
        p.x = min(max(p.x, 0.0), max(0.0, w - p.w))
    band = h / n
    top, bottom = band * lid, band * (lid + 1) - p.h
    if p.y < top or p.y > bottom:
        p.vy = -p.vy
        p.y = min(max(p.y, top), max(top, bottom))


def render_clip(seed: int, frames: int = 20, width: int = 640, height: int = 360) -> Clip:
    """One hard clip; everything follows from `seed`."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    n = rng.choice([2, 3])
    quality = rng.randint(35, 70)
    background = _texture(width, height, nrng)
    plates = [_plate(i, n, width, height, rng) for i in range(n)]
    out, jpegs, truth = [], [], []
    for index in range(frames):
        frame = background.copy()
        items = []
        for lid, plate in enumerate(plates):
            box = _draw(frame, plate, index, nrng)
            items.append(LineTruth(line=lid, text=plate.text, box=box))
            _step(plate, width, height, lid, n)
        frame += nrng.normal(0, 4, size=frame.shape)  # sensor noise
        ok, buf = cv2.imencode(
            ".jpg", np.clip(frame, 0, 255).astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, quality]
        )
        if not ok:
            raise ValueError("JPEG encoding failed")
        jpegs.append(buf.tobytes())
        decoded = cv2.imdecode(buf, cv2.IMREAD_COLOR)
        if decoded is None:
            raise ValueError("JPEG decoding failed")
        out.append(decoded)
        truth.append(items)
    return Clip(seed=seed, quality=quality, frames=out, jpegs=jpegs, truth=truth)


def render_clips(count: int, frames: int = 20, first_seed: int = 1000) -> list[Clip]:
    return [render_clip(first_seed + i, frames) for i in range(count)]


# --- scores --------------------------------------------------------------------------------


def line_scores(read: str, truth: str) -> tuple[float, bool]:
    """(character accuracy, exact) of one read against one true line; case and spaces
    do not count."""
    r, t = normalise_text(read), normalise_text(truth)
    return max(0.0, 1.0 - edit_distance(r, t) / max(1, len(t))), r == t


def _overlap(a: tuple[float, float, float, float], b: tuple[int, int, int, int]) -> float:
    """Share of box `b` covered by box `a`."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    return w * h / max(1.0, (b[2] - b[0]) * (b[3] - b[1]))


def frame_scores(
    reads: list[tuple[str, tuple[float, float, float, float] | None]], truth: list[LineTruth]
) -> list[tuple[float, bool]]:
    """Per true line: the score of the best read among those overlapping it (0 if none)."""
    out = []
    for item in truth:
        near = [text for text, box in reads if box is None or _overlap(box, item.box) > 0.3]
        scored = [line_scores(text, item.text) for text in near]
        out.append(max(scored, default=(0.0, False)))
    return out


@dataclass
class Tally:
    """Character accuracy and exact-line share over many true lines."""

    chars: float = 0.0
    exact: int = 0
    lines: int = 0

    def add(self, scores: list[tuple[float, bool]]) -> None:
        for char, exact in scores:
            self.chars += char
            self.exact += int(exact)
            self.lines += 1

    @property
    def char_accuracy(self) -> float:
        return self.chars / self.lines if self.lines else 0.0

    @property
    def exact_share(self) -> float:
        return self.exact / self.lines if self.lines else 0.0
