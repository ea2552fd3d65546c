"""`edgefleet model ...` (verify, list, build-engine) and `edgefleet infer IMAGE...`."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from edgefleet.shared.errors import EdgefleetError
from edgefleet.shared.executor.settings import BatcherSettings, ExecutionSettings
from edgefleet.shared.models.registry import DEFAULT_MODEL, ModelRegistry
from edgefleet.shared.models.tasks import OcrSpec

app = typer.Typer(
    help="Model files: check a file against the trusted manifest, list the known models, "
    "build TensorRT engines.\n\n"
    "Example: edgefleet model verify ch_PP-OCRv4_det_infer.onnx\n\n"
    "Example: edgefleet model list",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

MANIFEST_OPTION = typer.Option(
    None, "--manifest", help="extra model manifest (YAML) merged over the built-in pack"
)


def _registry(manifest: Path | None) -> ModelRegistry:
    registry = ModelRegistry.default()
    return registry.merge(ModelRegistry.from_file(manifest)) if manifest else registry


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@app.command("verify")
def verify(
    file: Path = typer.Argument(..., help="model file to check"),
    manifest: Path | None = MANIFEST_OPTION,
) -> None:
    """Check FILE's sha256 (and format) against the trusted manifest; exit 0 if it matches.

    Exit status 1, with the reason, when the file is unreadable, altered or not in it.

    Example: edgefleet model verify ch_PP-OCRv4_det_infer.onnx
    """
    try:
        spec = _registry(manifest).verify_file(file)
    except EdgefleetError as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"ok: {file} is {spec.name} {spec.version} (sha256 {spec.sha256})")


@app.command("list")
def list_models(manifest: Path | None = MANIFEST_OPTION) -> None:
    """List the models the manifest knows, and whether each file is present here; the
    default (read with when no model is named, the edge agent's) is marked.

    Example: edgefleet model list --manifest my-models.yaml
    """
    try:
        registry = _registry(manifest)
    except EdgefleetError as exc:
        raise _fail(str(exc)) from None
    table = Table("name", "version", "task", "format", "sha256", "file")
    for spec in registry.specs():
        if spec.file is None:
            where = (
                "pipeline: " + ", ".join(spec.components())
                if isinstance(spec, OcrSpec)
                else "-"
            )
        else:
            try:
                path = registry.resolve(spec)
                where = str(path) if path.exists() else f"MISSING {path}"
            except EdgefleetError as exc:
                where = f"MISSING ({exc.message})"
        table.add_row(
            f"{spec.name} (default)" if spec.name == DEFAULT_MODEL else spec.name,
            spec.version,
            spec.task,
            spec.format,
            (spec.sha256 or "-")[:16],
            where,
        )
    Console().print(table)


@app.command("build-engine")
def build_engine_command(
    model: str = typer.Argument(..., help="manifest name of an ONNX model (e.g. ppocr-det)"),
    precision: str = typer.Option("fp16", help="fp32, fp16 or int8"),
    max_batch: int = typer.Option(8, min=1, help="largest batch the engine accepts"),
    opt_batch: int | None = typer.Option(None, min=1, help="batch TensorRT tunes for"),
    height: int | None = typer.Option(None, help="input height for dynamic-size inputs"),
    width: int | None = typer.Option(None, help="input width for dynamic-size inputs"),
    calibration_dir: Path | None = typer.Option(
        None, help="folder of real images for INT8 calibration"
    ),
    cache_dir: Path | None = typer.Option(None, help="engine cache folder"),
    manifest: Path | None = MANIFEST_OPTION,
) -> None:
    """Build (or find in the cache) a TensorRT engine for MODEL on this GPU.

    Run it on the Jetson or GPU host that will use the engine (needs TensorRT).

    Example: edgefleet model build-engine ppocr-det --precision fp16 --max-batch 8
    """
    from edgefleet.shared.executor import tensorrt_backend as trtb

    if not trtb.tensorrt_available():
        raise _fail(
            "TensorRT is not installed on this host (no `tensorrt` Python package); build "
            "engines on the Jetson or GPU machine that will run them (JetPack ships TensorRT; "
            "on x86 `pip install tensorrt`)",
            code=2,
        )
    if precision not in {"fp32", "fp16", "int8"}:
        raise _fail(f"precision must be fp32, fp16 or int8, not {precision}", code=2)
    settings = ExecutionSettings.model_validate(
        {"precision": precision, "calibration_dir": calibration_dir}
    )
    if cache_dir is not None:
        settings = settings.model_copy(update={"engine_cache_dir": cache_dir})
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    try:
        registry = _registry(manifest)
        spec = registry.get(model)
        blob = registry.read_verified(spec)
        with Progress(
            TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()
        ) as progress:
            tasks: dict[str, TaskID] = {}

            def on_progress(phase: str, step: int, total: int) -> None:
                if phase not in tasks:
                    tasks[phase] = progress.add_task(phase, total=max(1, total))
                progress.update(tasks[phase], completed=step)

            result = trtb.build_or_load_engine(
                blob,
                settings,
                max_batch=max_batch,
                opt_batch=opt_batch,
                spatial=(height, width) if height and width else None,
                on_progress=on_progress,
            )
    except EdgefleetError as exc:
        raise _fail(str(exc)) from None
    state = "found in cache" if result.cached else f"built in {result.build_s:.1f}s"
    typer.echo(f"engine {result.path} ({state}; key {result.key.digest()[:16]})")


def _result_json(det) -> dict:
    return det.model_dump(mode="json", include={"text", "label", "score", "box", "polygon"})


def infer(
    # str, not Path: the JSON "image" field is the path exactly as given (Path("./a.jpg")
    # would print "a.jpg"), so scripts can match results to their arguments
    images: list[str] = typer.Argument(
        ..., metavar="IMAGE", help="image files (JPEG, PNG, BMP, WebP, TIFF)"
    ),
    model: str = typer.Option(
        DEFAULT_MODEL, "--model", "-m", help="model name from the manifest (the edge agent's)"
    ),
    json_: bool = typer.Option(False, "--json", help="JSON Lines: one object per image"),
    manifest: Path | None = MANIFEST_OPTION,
) -> None:
    """Run the local pipeline (decode -> letterbox -> executor -> decoder) on images.

    With --json: one JSON object per image. A bad image is reported and skipped.

    Exit status: 0 all read, 1 if any image failed, 2 if the model could not load.

    Example: edgefleet infer photo.jpg --json
    """
    from edgefleet.shared.imaging.decode import decode_file
    from edgefleet.shared.models import load_model

    if not logging.getLogger().handlers:  # the typed error line says it; no second line
        logging.getLogger("edgefleet.shared").addHandler(logging.NullHandler())
    settings = ExecutionSettings(batching=BatcherSettings(enabled=False))
    try:
        loaded = load_model(model, settings=settings, registry=_registry(manifest))
    except EdgefleetError as exc:
        if json_:
            for image in images:
                _emit({"image": image, "error": {"code": exc.code, "message": str(exc)}})
        raise _fail(f"cannot load model {model}: {exc}", code=2) from None
    failed = 0
    with loaded:
        for image in images:
            started = time.perf_counter()
            try:
                rgb = decode_file(Path(image))
                detections = loaded.predict_many([rgb])[0]
            except EdgefleetError as exc:
                failed += 1
                if json_:
                    _emit({"image": image, "error": {"code": exc.code, "message": str(exc)}})
                else:
                    typer.echo(f"{image}: error {exc.code}: {exc}", err=True)
                continue
            latency_ms = round((time.perf_counter() - started) * 1000, 2)
            if json_:
                _emit(
                    {
                        "image": image,
                        "model": model,
                        "results": [_result_json(d) for d in detections],
                        "latency_ms": latency_ms,
                    }
                )
            else:
                typer.echo(f"{image}: {len(detections)} results ({latency_ms} ms)")
                for d in detections:
                    what = d.text if d.text is not None else d.label
                    box = "" if d.box is None else " box=" + ",".join(f"{v:.0f}" for v in d.box)
                    typer.echo(f"  {d.score:.3f}  {what}{box}")
    if failed:
        raise typer.Exit(1)


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()
