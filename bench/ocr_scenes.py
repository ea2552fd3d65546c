"""Still images for the OCR benchmark, as JPEG bytes with the truth of every line.

Two sets, both seeded (the same seed renders the same bytes):
- easy: 1080p camera stills, 3-5 clean plates of large text (caps 22-60 px), mild noise,
  JPEG quality 85-95; the detector downscales them ~2.6x (the area-filter case);
- hard: frames of the hard clips (bench/hard_scenes.py: 640x360, small faint text, motion
  blur, glare, JPEG 35-70), one frame every few so that neighbours do not repeat.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np

from edgefleet.bench.hard_scenes import LineTruth, render_clip
from edgefleet.bench.scene_text import Kind, make_text

Level = Literal["easy", "hard"]
_KINDS: tuple[Kind, ...] = ("container", "plate", "sign")
_FONTS = [cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_TRIPLEX]


@dataclass(frozen=True)
class Scene:
    level: Level
    seed: int
    jpeg: bytes
    truth: list[LineTruth]


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


def scenes(easy: int, hard: int, seed: int) -> list[Scene]:
    """The benchmark's images: `easy` stills then `hard` frames, all following from `seed`."""
    return [easy_scene(seed + i) for i in range(easy)] + hard_scenes(hard, seed)
