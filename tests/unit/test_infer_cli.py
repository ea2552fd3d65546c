"""`edgefleet infer` and `edgefleet model ...`: the pinned JSON Lines contract, bad inputs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import typer
import yaml
from typer.testing import CliRunner

from edgefleet.cli.model import app as model_app
from edgefleet.cli.model import infer
from edgefleet.edge.model import open_model
from edgefleet.edge.settings import ModelSettings
from edgefleet.shared.models import DEFAULT_MODEL, ModelRegistry

cli = typer.Typer()
cli.command("infer")(infer)
cli.add_typer(model_app, name="model")
runner = CliRunner()


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("images")
    img = np.full((200, 520, 3), 238, np.uint8)
    cv2.putText(img, "PARCEL 7781-XZ", (20, 110), cv2.FONT_HERSHEY_DUPLEX, 1.4, (15, 15, 15), 2)
    good = folder / "good.png"
    cv2.imwrite(str(good), img)
    truncated = folder / "truncated.jpg"
    truncated.write_bytes(b"\xff\xd8\xff\xe0 not a whole jpeg")
    _, jpeg = cv2.imencode(".jpg", img)
    cut = folder / "cut.jpg"  # a real JPEG of the good scene, cut off half-way
    cut.write_bytes(jpeg.tobytes()[: len(jpeg) // 2])
    text = folder / "notes.png"
    text.write_text("hello, I am not an image")
    return {
        "good": good,
        "truncated": truncated,
        "cut": cut,
        "text": text,
        "missing": folder / "nope.png",
    }


def test_json_lines_one_object_per_image_bad_images_reported(images):
    args = [
        "infer",
        str(images["good"]),
        str(images["truncated"]),
        str(images["text"]),
        str(images["missing"]),
        str(images["good"]),
        "--json",
    ]
    result = runner.invoke(cli, args)
    # exit non-zero at the end because some images failed, yet every image is answered
    assert result.exit_code == 1
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [o["image"] for o in lines] == args[1:6]
    ok = lines[0]
    assert set(ok) == {"image", "model", "results", "latency_ms"}
    assert ok["model"] == DEFAULT_MODEL and ok["latency_ms"] > 0
    (line,) = ok["results"]
    assert set(line) == {"text", "label", "score", "box", "polygon"}
    assert line["text"] == "PARCEL 7781-XZ" and line["label"] is None
    assert 0.5 < line["score"] <= 1 and len(line["box"]) == 4 and len(line["polygon"]) == 4
    assert all(len(p) == 2 for p in line["polygon"])
    for bad in lines[1:4]:
        assert set(bad) == {"image", "error"} and set(bad["error"]) == {"code", "message"}
    assert lines[1]["error"]["code"] == "image_invalid"
    assert lines[2]["error"]["code"] == "unsupported_media_type"
    assert lines[3]["error"]["code"] == "not_found"
    assert lines[4]["results"] == ok["results"]


def test_a_real_jpeg_cut_short_is_an_error_line_not_a_partial_read(images):
    result = runner.invoke(cli, ["infer", str(images["cut"]), str(images["good"]), "--json"])
    assert result.exit_code == 1
    cut, good = [json.loads(line) for line in result.stdout.splitlines()]
    assert cut == {
        "image": str(images["cut"]),
        "error": {"code": "image_invalid", "message": cut["error"]["message"]},
    }
    assert "truncated" in cut["error"]["message"]
    assert good["results"][0]["text"] == "PARCEL 7781-XZ"


def test_plain_output_one_line_errors_no_traceback(images):
    result = runner.invoke(cli, ["infer", str(images["truncated"]), str(images["good"])])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"{images['truncated']}: error image_invalid")
    assert "PARCEL 7781-XZ" in result.stdout


def test_all_good_exits_zero_and_unknown_model_exits_two(images):
    assert runner.invoke(cli, ["infer", str(images["good"]), "--json"]).exit_code == 0
    result = runner.invoke(cli, ["infer", str(images["good"]), "--model", "nope", "--json"])
    assert result.exit_code == 2
    (obj,) = [json.loads(x) for x in result.stdout.splitlines()]
    assert obj["error"]["code"] == "model_not_found"


def test_model_verify_and_list(tmp_path):
    registry = ModelRegistry.default()
    det = registry.resolve(registry.get("ppocr-det"))
    ok = runner.invoke(cli, ["model", "verify", str(det)])
    assert ok.exit_code == 0 and "ppocr-det" in ok.stdout
    tampered = tmp_path / det.name
    tampered.write_bytes(b"\x08" + det.read_bytes()[1:-1])
    bad = runner.invoke(cli, ["model", "verify", str(tampered)])
    assert bad.exit_code == 1 and "does not match ppocr-det" in bad.stderr
    stranger = tmp_path / "other.onnx"
    stranger.write_bytes(det.read_bytes() + b"\x00")
    unknown = runner.invoke(cli, ["model", "verify", str(stranger)])
    assert unknown.exit_code == 1 and "is not in the trusted manifest" in unknown.stderr
    missing = runner.invoke(cli, ["model", "verify", str(tmp_path / "absent.onnx")])
    assert missing.exit_code == 1 and "cannot read" in missing.stderr
    assert "Traceback" not in unknown.output + missing.output
    listed = runner.invoke(cli, ["model", "list"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0 and "ppocr-heavy" in listed.stdout
    marked = [line for line in listed.stdout.splitlines() if "(default)" in line]
    assert len(marked) == 1 and f"{DEFAULT_MODEL} (default)" in marked[0]
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [")
    for command in (["list"], ["verify", str(det)]):
        for where in (broken, tmp_path / "absent.yaml"):
            bad = runner.invoke(cli, ["model", *command, "--manifest", str(where)])
            assert bad.exit_code == 1 and bad.exception.__class__ is SystemExit, bad.output
            assert bad.stderr.startswith("error: ") and str(where) in bad.stderr


def test_build_engine_without_tensorrt_says_so():
    from edgefleet.shared.executor.tensorrt_backend import tensorrt_available

    if tensorrt_available():
        pytest.skip("TensorRT is installed here")
    result = runner.invoke(cli, ["model", "build-engine", "ppocr-det"])
    assert result.exit_code == 2
    assert "TensorRT is not installed" in result.stderr


def test_user_yolo_model_from_a_manifest(tmp_path, images):
    pytest.importorskip("onnx")
    from tests.support.onnx_graphs import constant_model, v8_output

    data = constant_model(v8_output(), [1, 3, 64, 64])
    (tmp_path / "tiny.onnx").write_bytes(data)
    entry = {
        "name": "tiny",
        "version": "1",
        "task": "yolo",
        "file": "tiny.onnx",
        "sha256": hashlib.sha256(data).hexdigest(),
        "labels": ["a", "b", "c"],
    }
    manifest = tmp_path / "models.yaml"
    manifest.write_text(yaml.safe_dump({"models": [entry]}))
    result = runner.invoke(
        cli, ["infer", str(images["good"]), "-m", "tiny", "--manifest", str(manifest), "--json"]
    )
    assert result.exit_code == 0, result.output
    (obj,) = [json.loads(x) for x in result.stdout.splitlines()]
    assert obj["model"] == "tiny"
    assert [(r["label"], r["text"], r["polygon"]) for r in obj["results"]] == [
        ("a", None, None),
        ("b", None, None),
    ]
    assert all(len(r["box"]) == 4 for r in obj["results"])


@pytest.mark.parametrize("wrong", [{"name": "pixels"}, {"layout": "NHWC"}])
def test_a_manifest_input_spec_the_model_refuses_is_a_load_error_not_a_traceback(
    tmp_path, images, wrong
):
    pytest.importorskip("onnx")
    from tests.support.onnx_graphs import constant_model, v8_output

    # given a model whose manifest entry names the wrong input tensor or layout
    data = constant_model(v8_output(), [1, 3, 64, 64])
    (tmp_path / "tiny.onnx").write_bytes(data)
    entry = {
        "name": "tiny",
        "version": "1",
        "task": "yolo",
        "file": "tiny.onnx",
        "sha256": hashlib.sha256(data).hexdigest(),
        "input": wrong,
    }
    manifest = tmp_path / "models.yaml"
    manifest.write_text(yaml.safe_dump({"models": [entry]}))
    base = ["infer", str(images["good"]), "-m", "tiny", "--manifest", str(manifest)]
    # when it is loaded: its warm-up fails, so it never becomes ready (exit 2, typed)
    result = runner.invoke(cli, [*base, "--json"])
    assert result.exit_code == 2
    (obj,) = [json.loads(x) for x in result.stdout.splitlines()]
    assert obj["error"]["code"] == "model_load_failed"
    assert "warm-up" in obj["error"]["message"]
    plain = runner.invoke(cli, base)
    assert plain.exit_code == 2 and "Traceback" not in plain.output
    assert plain.stderr.startswith("error: cannot load model tiny: tiny failed its warm-up")


def test_the_image_field_is_the_path_exactly_as_given(images, monkeypatch):
    monkeypatch.chdir(images["good"].parent)
    given = ["./good.png", "./nope.png", str(images["good"].parent) + "//good.png"]
    result = runner.invoke(cli, ["infer", *given, "--json"])
    assert result.exit_code == 1
    assert [json.loads(line)["image"] for line in result.stdout.splitlines()] == given


def _hard_stills(folder: Path) -> list[Path]:
    """Stills where readers differ: small, faint, blurred and JPEG-worn lines."""
    rng = np.random.default_rng(7)
    paths = []
    for i, (text, scale, ink, blur, quality) in enumerate(
        [
            ("GATE 4 EXIT", 0.7, 60, 0, 90),
            ("KX-2291 LOT B", 0.55, 120, 3, 60),
            ("DOCK 12", 1.1, 150, 5, 40),
            ("SHIP 0457/A", 0.6, 40, 0, 35),
        ]
    ):
        img = np.full((240, 640, 3), 200, np.uint8)
        img += rng.integers(0, 20, img.shape, dtype=np.uint8)
        cv2.putText(img, text, (30, 130), cv2.FONT_HERSHEY_SIMPLEX, scale, (ink,) * 3, 2)
        if blur:
            img = cv2.GaussianBlur(img, (blur, blur), 0)
        path = folder / f"hard{i}.jpg"
        cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, quality])
        paths.append(path)
    return paths


def test_infer_without_a_model_reads_as_the_edge_agent(images, tmp_path):
    # the agent's model, loaded as the agent loads it (its settings' default, the edge's
    # executor tuning), and the CLI's default read the same texts off the same stills
    stills = [images["good"], *_hard_stills(tmp_path)]
    assert ModelSettings().name == DEFAULT_MODEL
    result = runner.invoke(cli, ["infer", *map(str, stills), "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert {o["model"] for o in lines} == {DEFAULT_MODEL}
    cli_texts = [[r["text"] for r in o["results"]] for o in lines]
    agent = open_model(ModelSettings())
    try:
        agent_texts = [
            [d.text for d in agent.predict(cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB))]
            for p in stills
        ]
    finally:
        agent.close()
    assert cli_texts == agent_texts
    assert cli_texts[0] == ["PARCEL 7781-XZ"] and any(cli_texts[1:])
