"""Still images for the OCR benchmark, as JPEG bytes with the truth of every line.

Three sets, all seeded (the same seed renders the same bytes):
- easy: 1080p camera stills, 3-5 clean plates of large text (caps 22-60 px), mild noise,
  JPEG quality 85-95; the detector downscales them ~2.6x (the area-filter case);
- hard: frames of the hard clips (`clips`: 640x360, small faint text, motion blur, glare,
  JPEG 35-70, OpenCV's Hershey fonts), one frame every few so that neighbours do not repeat;
- ttf: hard frames in TrueType fonts, from the cascade's scenario renderer (`scenarios`:
  640x360, text 7-14 px, faded plates, perspective, shake, low light, H.264, ...): clip i is
  scenario `SCENARIOS[i % 10]`, its seed the set's seed + i, the
  fonts of `TTF_FONTS` taken in turn (shifted by one after each round of the ten
  scenarios, so that every font meets every scenario); frames with no line to read are
  left out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np

from edgefleet.demo.scenes.clips import LineTruth, render_clip
from edgefleet.demo.scenes.scenarios import SCENARIOS, available_fonts, render_scenario
from edgefleet.demo.scenes.text import Kind, make_text

Level = Literal["easy", "hard", "ttf"]
# The scenario renderer's TrueType fonts (DejaVu and Pillow's own), taken in turn by the
# ttf set; a machine without DejaVu draws Pillow's only.
TTF_FONTS = ("dejavu-sans", "dejavu-serif", "dejavu-mono", "pillow")
_KINDS: tuple[Kind, ...] = ("container", "plate", "sign")
_FONTS = [cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_TRIPLEX]


@dataclass(frozen=True)
class Scene:
    level: Level
    seed: int
    jpeg: bytes
    truth: list[LineTruth]
    font: str = ""  # the ttf set's font, a scenario's name after it ("dejavu-mono/shake")


def easy_scene(seed: int, width: int = 1920, height: int = 1080) -> Scene:
    """One clean 1080p still: large dark-on-light or light-on-dark plates."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    image = 90 + 40 * np.sin(xx / rng.uniform(90, 200)) * np.cos(yy / rng.uniform(90, 200))
    tint = np.repeat(image[..., None], 3, axis=2) + nrng.uniform(-20, 20, size=3)
    frame = np.clip(tint, 0, 255).astype(np.uint8)
    n = rng.randint(3, 5)
    band = height / n
    truth = []
    for i in range(n):
        text = make_text(_KINDS[rng.randrange(3)], rng)
        font = rng.choice(_FONTS)
        (_, cap), _ = cv2.getTextSize("H", font, 1.0, 2)
        scale = rng.uniform(22.0, 60.0) / cap
        thickness = max(2, round(scale * 1.6))
        (tw, th), base = cv2.getTextSize(text, font, scale, thickness)
        pad = th // 2
        pw, ph = tw + 2 * pad, th + base + 2 * pad
        x0 = rng.randint(0, max(0, width - pw))
        y0 = round(band * i + rng.uniform(0, max(0.0, band - ph)))
        paper, ink = (235, 25) if rng.random() < 0.7 else (30, 240)
        frame[y0 : y0 + ph, x0 : x0 + pw] = paper
        cv2.putText(
            frame, text, (x0 + pad, y0 + ph - pad - base), font, scale, (ink,) * 3, thickness,
            cv2.LINE_AA,
        )  # fmt: skip
        truth.append(LineTruth(line=i, text=text, box=(x0, y0, x0 + pw, y0 + ph)))
    noisy = np.clip(frame + nrng.normal(0, 3, size=frame.shape), 0, 255).astype(np.uint8)
    quality = rng.randint(85, 95)
    ok, buf = cv2.imencode(".jpg", noisy, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return Scene("easy", seed, buf.tobytes(), truth)


def hard_scenes(count: int, seed: int, every: int = 5) -> list[Scene]:
    """`count` frames of hard clips (seeds seed, seed+1, ...), one every `every` frames."""
    out: list[Scene] = []
    clip_seed = seed
    per_clip = 4
    while len(out) < count:
        clip = render_clip(clip_seed, frames=per_clip * every)
        for index in range(0, len(clip.frames), every):
            if len(out) < count:
                out.append(Scene("hard", clip_seed, clip.jpegs[index], clip.truth[index]))
        clip_seed += 1
    return out


def ttf_scenes(
    count: int, seed: int, every: int = 5, fonts: tuple[str, ...] = TTF_FONTS
) -> list[Scene]:
    """`count` frames of scenario clips in TrueType fonts (clip seeds seed, seed+1, ...),
    one every `every` frames, those with at least one line to read."""
    drawable = available_fonts(fonts)
    out: list[Scene] = []
    index = 0
    while len(out) < count:
        kind = SCENARIOS[index % len(SCENARIOS)]
        font = drawable[(index + index // len(SCENARIOS)) % len(drawable)]
        clip = render_scenario(kind, seed + index, font, frames=4 * every)
        for k in range(0, len(clip.frames), every):
            if len(out) < count and clip.truth[k]:
                out.append(Scene("ttf", clip.seed, clip.jpegs[k], clip.truth[k], f"{font}/{kind}"))
        index += 1
    return out


def scenes(easy: int, hard: int, seed: int, ttf: int = 0) -> list[Scene]:
    """The benchmark's images: `easy` stills, `hard` frames, then `ttf` frames, all
    following from `seed`."""
    return (
        [easy_scene(seed + i) for i in range(easy)]
        + hard_scenes(hard, seed)
        + ttf_scenes(ttf, seed)
    )
