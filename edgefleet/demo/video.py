"""Synthetic demo video: moving text of known content, with a ground truth to score against.

The demo must run with no download, so it renders its own footage: container numbers,
licence-plate-like strings and sign words drift across gradient, noise and texture
backgrounds; some lines are blurred or hit by glare so that the edge model is unsure on
them and escalates; some cross the frame, entering across one border and leaving across
the other with a new text each pass (the edge sees them cut first); some are far away
(small and soft), where the edge's model misreads what the cloud's reads. Everything
follows from the seed, so two renders are identical and the accuracy the demo reports is
comparable between runs.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Literal

import cv2
import numpy as np
from pydantic import Field, field_validator

from edgefleet.demo.scenes.text import Kind, make_text
from edgefleet.shared.config import Closed
from edgefleet.shared.errors import ConfigError

Background = Literal["gradient", "noise", "texture"]

_FONTS = [cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX]
# Bump whenever the same spec would render other pixels or truth: cached scenes
# (edgefleet.demo.cache) of another version are rendered again.
RENDERER_VERSION = 3
# A line is in a frame's truth once this share of it is in view: a reader following it
# should then report the whole line.
VISIBLE_TRUTH = 0.6


class VideoSpec(Closed):
    """What to render; the defaults make a small clip that a laptop encodes in seconds."""

    width: int = Field(640, ge=160, le=3840, description="frame width in pixels")
    height: int = Field(360, ge=120, le=2160, description="frame height in pixels")
    fps: float = Field(10.0, gt=0, le=120, description="frames per second")
    duration_s: float = Field(20.0, gt=0, le=3600, description="length of the clip in seconds")
    lines: int = Field(3, ge=1, le=8, description="text lines on screen at once")
    hard_share: float = Field(
        0.34, ge=0, le=1, description="share of lines made hard with blur and glare"
    )
    hard_strength: float = Field(
        0.7, ge=0, le=2, description="how much blur, glare and fading the hard lines get"
    )
    crossing_share: float = Field(
        0.34, ge=0, le=1, description="share of lines that cross the frame, entering across "
        "one border and leaving across the other, with a new text each pass"
    )
    far_share: float = Field(
        0.34, ge=0, le=1, description="share of lines far away: small, soft and faded"
    )
    background: Background | None = Field(
        None, description="background style; none = chosen by the seed"
    )
    scenarios: tuple[str, ...] = Field(
        (),
        description="instead of the drifting lines above: these scenarios of "
        "edgefleet.demo.scenes.scenarios (entering, occluded, low-light, ...) one after "
        "the other, the clip's length shared among them, in the fonts policy choices may "
        "look at",
    )
    seed: int = Field(0, ge=0, description="everything random follows from this")

    @field_validator("scenarios")
    @classmethod
    def _known(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        from edgefleet.demo.scenes.scenarios import SCENARIOS

        if unknown := [n for n in names if n not in SCENARIOS]:
            raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
        return names

    @property
    def frame_count(self) -> int:
        return max(1, round(self.fps * self.duration_s))


class LineTruth(Closed):
    """One text line of the clip: its content and whether it was rendered hard."""

    id: int
    text: str
    kind: Kind
    hard: bool


class ItemTruth(Closed):
    """One line as it appears in one frame; box is xyxy in frame pixels."""

    line: int
    text: str
    box: tuple[int, int, int, int]
    hard: bool


class FrameTruth(Closed):
    index: int
    items: list[ItemTruth]


class GroundTruth(Closed):
    """What a perfect reader would see in each frame of the clip."""

    schema_id: Literal["ef.demo-truth/1"] = Field("ef.demo-truth/1", alias="schema")
    video: str
    spec: VideoSpec
    background: Background
    lines: list[LineTruth]
    frames: list[FrameTruth]

    def texts(self, frame_index: int) -> list[str]:
        """The strings visible in one frame (empty beyond the clip's end)."""
        if 0 <= frame_index < len(self.frames):
            return [item.text for item in self.frames[frame_index].items]
        return []

    def save(self, path: Path) -> None:
        path.write_text(self.model_dump_json(by_alias=True, indent=1))

    @classmethod
    def load(cls, path: Path) -> GroundTruth:
        return cls.model_validate_json(Path(path).read_text())


def _background(style: Background, w: int, h: int, rng: np.random.Generator) -> np.ndarray:
    if style == "gradient":
        c0, c1 = rng.integers(20, 235, size=(2, 3))
        t = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :, None]
        tilt = np.linspace(0.0, 0.3, h, dtype=np.float32)[:, None, None]
        mix = np.clip(t + tilt, 0, 1)
        img = c0 * (1 - mix) + c1 * mix
    elif style == "noise":
        base = rng.integers(60, 200, size=3)
        img = base + rng.normal(0, 18, size=(h, w, 3))
    else:
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        f1, f2 = rng.uniform(0.02, 0.09, size=2)
        stripes = np.sin(xx * f1 + yy * f2 * 0.5) * np.cos(yy * f2)
        base = rng.integers(70, 180, size=3)
        img = base + stripes[..., None] * 45 + rng.normal(0, 8, size=(h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


class _Line:
    """A moving text plate; position is a float so slow lines still move smoothly."""

    def __init__(
        self,
        lid: int,
        spec: VideoSpec,
        kind: Kind,
        rng: random.Random,
        *,
        hard: bool = False,
        crossing: bool = False,
        far: bool = False,
    ):
        self.id, self.kind, self.hard, self.crossing, self.far = lid, kind, hard, crossing, far
        self.rng = random.Random(rng.random())  # a crossing line's next texts
        self.font = rng.choice(_FONTS)
        self.scale = rng.uniform(0.8, 1.15) * spec.height / 360 * (0.35 if far else 1.0)
        self.thickness = max(1, round((1 if far else 2) * spec.height / 360))
        self.text = ""
        self._write(make_text(kind, rng))
        band = spec.height / spec.lines
        self.y = band * lid + (band - self.h) / 2
        self.x = rng.uniform(0, max(1.0, spec.width - self.w))
        speed = rng.uniform(0.05, 0.15) * spec.width  # pixels per second
        self.vx = speed / spec.fps * rng.choice([-1, 1])
        self.vy = rng.uniform(-0.02, 0.02) * spec.height / spec.fps
        if crossing:
            self.x = -float(self.w) if self.vx > 0 else float(spec.width)
        self.fg = (20, 20, 20) if rng.random() < 0.7 else (250, 250, 250)
        self.plate = tuple(255 - c for c in self.fg)
        if far:  # faded by the distance: ink 40 % of the way to the plate
            ink, paper = self.fg[0], self.plate[0]
            self.fg = (round(0.6 * ink + 0.4 * paper),) * 3
        self.glare_phase = rng.uniform(0, 2 * np.pi)

    def _write(self, text: str) -> None:
        self.text = text
        (tw, th), base = cv2.getTextSize(text, self.font, self.scale, self.thickness)
        pad = max(4, th // 2)
        self.w, self.h, self.base, self.pad = tw + 2 * pad, th + base + 2 * pad, base, pad

    def step(self, spec: VideoSpec) -> None:
        self.x += self.vx
        self.y += self.vy
        if self.crossing:
            if self.x > spec.width or self.x + self.w < 0:  # gone: the next one comes in
                self._write(make_text(self.kind, self.rng))
                self.x = -float(self.w) if self.vx > 0 else float(spec.width)
        elif self.x < 0 or self.x + self.w > spec.width:
            self.vx = -self.vx
            self.x = min(max(self.x, 0.0), max(0.0, spec.width - self.w))
        band = spec.height / spec.lines
        top, bottom = band * self.id, band * (self.id + 1) - self.h
        if self.y < top or self.y > bottom:
            self.vy = -self.vy
            self.y = min(max(self.y, top), max(top, bottom))

    def draw(
        self, frame: np.ndarray, index: int, spec: VideoSpec
    ) -> tuple[tuple[int, int, int, int], float]:
        """Draw the plate where it is; its box in the frame (clipped) and the share of it
        in view."""
        left, y0 = round(self.x), round(self.y)
        x0, x1 = max(0, left), min(spec.width, left + self.w)
        y1 = min(spec.height, y0 + self.h)
        if x1 - x0 < 1:
            return (x0, y0, x0, y1), 0.0
        plate: np.ndarray = np.empty((self.h, self.w, 3), np.uint8)
        plate[:] = self.plate
        origin = (self.pad, self.h - self.pad - self.base)
        cv2.putText(
            plate, self.text, origin, self.font, self.scale, self.fg, self.thickness, cv2.LINE_AA
        )
        if self.far:  # out of the lens's focus as well as small
            plate = cv2.GaussianBlur(plate, (0, 0), 0.7)
        frame[y0:y1, x0:x1] = plate[: y1 - y0, x0 - left : x1 - left]
        if self.hard:
            # How hard this frame is swings with time, so the same line is sometimes
            # readable and sometimes not: the edge is unsure on a share of frames.
            phase = 0.5 + 0.5 * np.sin(index * 0.21 + self.glare_phase)
            strength = spec.hard_strength * (0.35 + 0.65 * phase)
            roi = frame[y0:y1, x0:x1]
            # Washed-out ink (low contrast), then defocus blur.
            roi[:] = cv2.addWeighted(
                roi, 1 - 0.45 * strength / 2, np.full_like(roi, self.plate), 0.45 * strength / 2, 0
            )
            sigma = max(0.3, strength * self.h / 10)
            roi[:] = cv2.GaussianBlur(roi, (0, 0), sigma)
            # Glare: a bright ellipse sweeping along the plate, washing out part of it. It
            # is drawn and blurred in a window around the plate only (3 sigma of the blur
            # beyond it, where the glow has faded out), not over the whole frame.
            sigma_glare = max(1.0, self.h / 4)
            reach = int(np.ceil(3 * sigma_glare))
            wx0, wy0 = max(0, x0 - reach), max(0, y0 - reach)
            wx1, wy1 = min(spec.width, x1 + reach), min(spec.height, y1 + reach)
            cx = x0 + (0.5 + 0.45 * np.sin(index * 0.3 + self.glare_phase)) * (x1 - x0)
            glare = np.zeros((wy1 - wy0, wx1 - wx0), np.float32)
            cv2.ellipse(
                glare,
                (round(cx) - wx0, (y0 + y1) // 2 - wy0),
                (max(4, (x1 - x0) // 5), max(3, (y1 - y0) // 2)),
                0,
                0,
                360,
                1.0,
                thickness=-1,
            )
            halo = cv2.GaussianBlur(glare, (0, 0), sigma_glare)[..., None]
            window = frame[wy0:wy1, wx0:wx1]
            window[:] = np.clip(window + halo * 120 * strength, 0, 255).astype(np.uint8)
        return (x0, y0, x1, y1), (x1 - x0) / self.w


def render_video(path: Path, spec: VideoSpec | None = None) -> GroundTruth:
    """Render the clip to `path` (.mp4 or .avi) and its truth to `path` with `.json`."""
    spec = spec or VideoSpec()
    path = Path(path)
    fourcc = {".mp4": "mp4v", ".avi": "MJPG"}.get(path.suffix.lower())
    if fourcc is None:
        raise ConfigError(f"{path}: the demo renders .mp4 or .avi, not {path.suffix or 'none'}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if spec.scenarios:
        return _render_reel(path, fourcc, spec)
    rng = random.Random(spec.seed)
    nrng = np.random.default_rng(spec.seed)
    backgrounds: list[Background] = ["gradient", "noise", "texture"]
    style = rng.choice(backgrounds) if spec.background is None else spec.background
    background = _background(style, spec.width, spec.height, nrng)
    kinds: list[Kind] = ["container", "plate", "sign"]
    ids = range(spec.lines)
    hard = set(rng.sample(ids, round(spec.lines * spec.hard_share)))
    crossing = set(rng.sample(ids, round(spec.lines * spec.crossing_share)))
    far = set(rng.sample(ids, round(spec.lines * spec.far_share)))
    lines = [
        _Line(
            i, spec, kinds[(i + spec.seed) % 3], rng,
            hard=i in hard, crossing=i in crossing, far=i in far,
        )
        for i in ids
    ]
    writer = _writer(path, fourcc, spec)
    frames: list[FrameTruth] = []
    try:
        for index in range(spec.frame_count):
            frame = background.copy()
            items = []
            for line in lines:
                box, in_view = line.draw(frame, index, spec)
                if in_view >= VISIBLE_TRUTH:
                    items.append(ItemTruth(line=line.id, text=line.text, box=box, hard=line.hard))
                line.step(spec)
            writer.write(frame)
            frames.append(FrameTruth(index=index, items=items))
    finally:
        writer.release()
    truths = [LineTruth(id=ln.id, text=ln.text, kind=ln.kind, hard=ln.hard) for ln in lines]
    return _save_truth(path, spec, style, truths, frames)


def _writer(path: Path, fourcc: str, spec: VideoSpec) -> cv2.VideoWriter:
    writer = cv2.VideoWriter(
        str(path), cv2.VideoWriter.fourcc(*fourcc), spec.fps, (spec.width, spec.height)
    )
    if not writer.isOpened():
        raise ConfigError(f"{path}: OpenCV cannot write {fourcc} video here", hint="try .avi")
    return writer


def _save_truth(
    path: Path,
    spec: VideoSpec,
    background: Background,
    lines: list[LineTruth],
    frames: list[FrameTruth],
) -> GroundTruth:
    """The clip's truth, written beside its video."""
    truth = GroundTruth(
        schema="ef.demo-truth/1",
        video=path.name,
        spec=spec,
        background=background,
        lines=lines,
        frames=frames,
    )
    truth.save(truth_path(path))
    return truth


def _render_reel(path: Path, fourcc: str, spec: VideoSpec) -> GroundTruth:
    """The scenarios of `spec` one after the other, one clip each (the bench's renderer,
    seeds below its held-out ones): what a camera does to text, where the edge's tracks
    alone stay wrong and the cloud has something to add."""
    from edgefleet.demo.scenes.scenarios import (
        FONTS_TUNED,
        HELD_OUT_SEED,
        available_fonts,
        render_scenario,
    )

    fonts = available_fonts(FONTS_TUNED)
    count = len(spec.scenarios)
    per_clip = max(1, spec.frame_count // count)
    writer = _writer(path, fourcc, spec)
    frames: list[FrameTruth] = []
    lines: list[LineTruth] = []
    first = 0  # line ids run on across the clips
    try:
        for k, kind in enumerate(spec.scenarios):
            seed = (spec.seed * count + k) % HELD_OUT_SEED
            length = per_clip if k < count - 1 else spec.frame_count - per_clip * (count - 1)
            clip = render_scenario(kind, seed, fonts[k % len(fonts)], length,
                                   spec.width, spec.height)
            texts: dict[int, str] = {}
            for image, items in zip(clip.frames, clip.truth, strict=True):
                writer.write(image)
                frames.append(FrameTruth(index=len(frames), items=[
                    ItemTruth(line=first + item.line, text=item.text, box=item.box, hard=True)
                    for item in items
                ]))
                texts.update((item.line, item.text) for item in items)
            lines += [
                LineTruth(id=first + line, text=text, kind=clip.kinds[line], hard=True)
                for line, text in sorted(texts.items())
            ]
            first += max(clip.kinds, default=0) + 1
    finally:
        writer.release()
    return _save_truth(path, spec, "texture", lines, frames)


def truth_path(video: Path) -> Path:
    """Where the ground truth of a rendered video lives."""
    return Path(video).with_suffix(".json")
