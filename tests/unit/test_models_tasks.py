"""The model tasks: one file each under `shared/models/tasks/`, one union on `task`."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing
from pathlib import Path

import pytest
import yaml

from edgefleet.shared.errors import ConfigError
from edgefleet.shared.models import ModelRegistry, load_model, tasks
from edgefleet.shared.models.spec import ModelSpec
from edgefleet.shared.models.tasks import (
    ClassificationSpec,
    ModelEntry,
    OcrSpec,
    TextAngleSpec,
    TextDetectionSpec,
    TextRecognitionSpec,
    YoloSpec,
)


def registry_of(tmp_path: Path, entries: list[dict]) -> ModelRegistry:
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"models": entries}))
    return ModelRegistry.from_file(path)


def test_every_task_file_declares_one_entry_and_the_union_holds_each():
    members = set(typing.get_args(typing.get_args(ModelEntry)[0]))
    declared = set()
    for info in pkgutil.iter_modules(tasks.__path__):
        module = importlib.import_module(f"{tasks.__name__}.{info.name}")
        specs = [
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, ModelSpec) and c is not ModelSpec and c.__module__ == module.__name__
        ]
        assert len(specs) == 1, (info.name, specs)
        declared |= set(specs)
    assert declared == members  # a task file left out of ModelEntry fails here
    for spec in members:  # and each loader names a class that is there
        if spec.loader is not None:
            module, _, attr = spec.loader.partition(":")
            assert inspect.isclass(getattr(importlib.import_module(module), attr)), spec.loader


def test_each_entry_is_read_as_its_task_with_its_own_fields(tmp_path: Path):
    pin = {"file": "m.onnx", "sha256": "0" * 64}
    registry = registry_of(
        tmp_path,
        [
            {"name": "d", "version": "1", "task": "text-detection", **pin},
            {
                "name": "r",
                "version": "1",
                "task": "text-recognition",
                "dictionary": {"file": "keys.txt", "sha256": "1" * 64},
                **pin,
            },
            {"name": "a", "version": "1", "task": "text-angle", "labels": ["0", "180"], **pin},
            {
                "name": "o",
                "version": "1",
                "task": "ocr",
                "ocr": {"det": "d", "rec": "r", "cls": "a"},
            },
            {"name": "y", "version": "1", "task": "yolo", **pin},
            {"name": "c", "version": "1", "task": "classification", "top_k": 3, **pin},
        ],
    )
    kinds = {s.name: type(s) for s in registry.specs()}
    assert kinds == {
        "d": TextDetectionSpec,
        "r": TextRecognitionSpec,
        "a": TextAngleSpec,
        "o": OcrSpec,
        "y": YoloSpec,
        "c": ClassificationSpec,
    }
    assert registry.get("o").components() == ["d", "r", "a"]
    assert registry.get("y").components() == [] and registry.get("y").yolo.max_det == 300
    assert registry.get("c").top_k == 3


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"task": "text-detection", "top_k": 3}, r"models\.0\.top_k: Extra inputs"),
        ({"task": "yolo", "dictionary": {}}, r"models\.0\.dictionary: Extra inputs"),
        ({"task": "ocr"}, r"models\.0\.ocr: Field required"),
        ({"task": "ocr", "ocr": {"det": "d"}}, r"models\.0\.ocr\.rec: Field required"),
        ({}, r"models\.0\.task: Field required"),
        ({"task": "depth"}, r"models\.0\.task: Input tag 'depth' .*'ocr', 'text-detection'"),
    ],
)
def test_a_field_of_another_task_or_a_missing_one_is_named_where_it_stands(
    tmp_path: Path, entry: dict, problem: str
):
    with pytest.raises(ConfigError, match=problem):
        registry_of(tmp_path, [{"name": "x", "version": "1", **entry}])


def test_a_component_is_not_loadable_and_has_no_dictionary_unless_it_is_a_recogniser():
    registry = ModelRegistry.default()
    with pytest.raises(ConfigError, match="ppocr-det is a text-detection component"):
        load_model("ppocr-det")
    assert registry.read_dictionary(registry.get("ppocr-det")) is None
    recognisers = [s for s in registry.specs() if isinstance(s, TextRecognitionSpec)]
    assert any(s.dictionary is not None for s in recognisers)
    assert all(registry.read_dictionary(s) for s in recognisers if s.dictionary is not None)
