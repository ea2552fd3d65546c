"""TensorRT planning that needs no GPU: optimisation profiles, engine cache keys and
calibration batches. Unit-tested on any host; `tensorrt_backend` uses it where TensorRT runs.

An engine is valid only for the TensorRT version and GPU it was built on, so the cache
key is (ONNX sha256, TensorRT version, GPU name, compute capability, precision,
profile, INT8 calibration set): a device never rebuilds an engine it already has, and
never loads one built for another GPU or calibrated on other images.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgefleet.shared.errors import ConfigError, EdgefleetError
from edgefleet.shared.executor.base import TensorSpec
from edgefleet.shared.messages import Precision, Sha256

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


@dataclass(frozen=True)
class ProfileShape:
    """min/opt/max shapes of one input in an optimisation profile."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def plan_profile(
    inputs: Sequence[TensorSpec],
    *,
    max_batch: int,
    opt_batch: int | None = None,
    min_hw: tuple[int, int] = (32, 32),
    opt_hw: tuple[int, int] = (640, 640),
    max_hw: tuple[int, int] = (1024, 1024),
) -> list[ProfileShape]:
    """One optimisation profile: dynamic batch 1..max_batch (tuned at opt_batch), dynamic
    H/W of NCHW inputs in min_hw..max_hw (tuned at opt_hw); fixed dimensions stay fixed.
    """
    if max_batch < 1:
        raise ConfigError(f"max_batch must be at least 1, got {max_batch}")
    opt_b = min(max_batch, opt_batch or max_batch)
    if opt_b < 1:
        raise ConfigError(f"opt_batch must be at least 1, got {opt_batch}")
    for label, hw in (("min_hw", min_hw), ("opt_hw", opt_hw), ("max_hw", max_hw)):
        if min(hw) < 1:
            raise ConfigError(f"{label} must be positive, got {hw}")
    if not (min_hw[0] <= opt_hw[0] <= max_hw[0] and min_hw[1] <= opt_hw[1] <= max_hw[1]):
        raise ConfigError(f"need min_hw <= opt_hw <= max_hw, got {min_hw}, {opt_hw}, {max_hw}")
    out = []
    for spec in inputs:
        lo, mid, hi = [], [], []
        for axis, dim in enumerate(spec.shape):
            if dim is not None:
                lo.append(dim)
                mid.append(dim)
                hi.append(dim)
            elif axis == 0:
                lo.append(1)
                mid.append(opt_b)
                hi.append(max_batch)
            elif len(spec.shape) == 4 and axis in (2, 3):
                k = axis - 2
                lo.append(min_hw[k])
                mid.append(opt_hw[k])
                hi.append(max_hw[k])
            else:
                raise ConfigError(
                    f"input {spec.name} has a dynamic axis {axis} of shape {spec.shape} that a "
                    "profile cannot plan; export the model with that axis fixed"
                )
        out.append(ProfileShape(spec.name, tuple(lo), tuple(mid), tuple(hi)))
    return out


def _safe(name: str) -> str:
    """A file-name-safe form of a model name (no separators, no leading dots)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).lstrip("._") or "model"


@dataclass(frozen=True)
class EngineKey:
    """Everything an engine depends on; its digest names the cached file."""

    onnx_sha256: Sha256
    trt_version: str
    gpu_name: str
    compute_capability: str
    precision: Precision
    profile: tuple[ProfileShape, ...]
    calibration_sha256: str = ""  # the INT8 calibration set's digest; empty otherwise

    def canonical(self) -> str:
        data = asdict(self)
        data["profile"] = [asdict(p) for p in self.profile]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def filename(self, model: str) -> str:
        return f"{self.stem(model)}.engine"

    def stem(self, model: str) -> str:
        """The model, precision and digest: an engine's name, or a runtime's cache folder."""
        return f"{_safe(model)}-{self.precision}-{self.digest()[:16]}"

    def timing_cache_name(self) -> str:
        """Timing caches are per TensorRT version and GPU, shared across models."""
        gpu = re.sub(r"[^A-Za-z0-9]+", "_", self.gpu_name).strip("_").lower()
        return f"timing-{gpu}-sm{self.compute_capability}-trt{self.trt_version}.cache"

    def calibration_cache_name(self, model: str) -> str:
        """INT8 scales depend on the model and the data, not on the GPU."""
        data = self.calibration_sha256[:16] or "none"
        return f"{_safe(model)}-{self.onnx_sha256[:16]}-{data}.calib"


def image_files(folder: Path) -> list[Path]:
    """Calibration images in a folder, in a stable (sorted) order."""
    if not folder.is_dir():
        raise ConfigError(f"calibration folder {folder} does not exist")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ConfigError(f"calibration folder {folder} holds no images")
    return files


def calibration_digest(files: Sequence[Path]) -> str:
    """sha256 over the calibration images' names and bytes, in order: other images give
    other INT8 scales, so another engine."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def calibration_batches(
    files: Sequence[Path],
    batch_size: int,
    load: Callable[[Path], np.ndarray],
    *,
    max_images: int = 512,
) -> Iterator[np.ndarray]:
    """Fixed-size float32 batches for the calibrator.

    Images that fail to load are skipped (logged); the last partial batch is filled by
    repeating images from the start, so every batch has the profile's shape.
    """
    if batch_size < 1:
        raise ConfigError(f"calibration batch size must be at least 1, got {batch_size}")
    tensors: list[np.ndarray] = []
    for path in files[:max_images]:
        try:
            tensors.append(np.asarray(load(path), dtype=np.float32))
        except EdgefleetError as exc:
            log.warning("calibration image skipped", extra={"path": str(path), "why": str(exc)})
    if not tensors:
        raise ConfigError("no calibration image could be loaded")
    shapes = {t.shape for t in tensors}
    if len(shapes) != 1:
        raise ConfigError(f"calibration tensors differ in shape: {sorted(shapes)}")
    for start in range(0, len(tensors), batch_size):
        chunk = tensors[start : start + batch_size]
        k = 0
        while len(chunk) < batch_size:
            chunk.append(tensors[k % len(tensors)])
            k += 1
        yield np.ascontiguousarray(np.stack(chunk))


def letterbox_loader(
    hw: tuple[int, int], mean: Sequence[float], std: Sequence[float], bgr: bool = False
) -> Callable[[Path], np.ndarray]:
    """Image file -> CHW float32 as the model sees it (letterboxed, normalised, its order):
    the same kernel as at run time, so INT8 calibration sees the run's tensors."""
    # mean/std come in the model's channel order; the kernels take them per R, G, B
    rgb_mean, rgb_std = (mean[::-1], std[::-1]) if bgr else (mean, std)

    def load(path: Path) -> np.ndarray:
        from edgefleet.shared import kernels
        from edgefleet.shared.imaging.decode import decode_file

        tensor, _ = kernels.frame_to_tensor(
            decode_file(path), "rgb", hw, rgb_mean, rgb_std, 114, channels="bgr" if bgr else "rgb"
        )
        return tensor[0]

    return load
