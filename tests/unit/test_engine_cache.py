"""The engine cache on disk with real files and real processes: a corrupt or half-written
engine is built again, and two processes building one key make one build."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from edgefleet.shared.executor.base import ModelBlob, ModelLoadError, TensorSpec
from edgefleet.shared.executor.engine_cache import (
    cached_build,
    invalidate,
    reset_folder,
)
from edgefleet.shared.executor.onnxruntime_backend import (
    OnnxRuntimeExecutor,
    first_feeds,
    graph_inputs,
    open_and_run_once,
    ort_trt_key,
)
from edgefleet.shared.executor.proof import TINY_ONNX, TINY_SHAPE
from edgefleet.shared.executor.settings import ExecutionSettings
from edgefleet.shared.models.registry import sha256_bytes
from tests.support.waiting import counter_value, eventually

KEY = '{"model": "m"}'


def _builder(log: Path, data: bytes = b"engine bytes"):
    """A build that leaves a line in `log` per call and returns `data`."""

    def build() -> bytes:
        with open(log, "a") as out:
            out.write("built\n")
        return data

    return build


def _builds(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_second_lookup_reads_the_engine_without_building(tmp_path: Path):
    log, path = tmp_path / "builds.log", tmp_path / "cache" / "m.engine"
    first = cached_build(path, KEY, _builder(log))
    again = cached_build(path, KEY, _builder(log))
    assert (first.cached, again.cached) == (False, True)
    assert again.data == path.read_bytes() == b"engine bytes"
    assert _builds(log) == 1
    # the atomic writes leave no temporary file behind
    assert sorted(p.name for p in path.parent.iterdir()) == [
        "m.engine",
        "m.engine.json",
        "m.engine.lock",
    ]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: p.write_bytes(p.read_bytes()[:5]), "digest"),  # cut short on disk
        (lambda p: p.with_name(p.name + ".json").unlink(), "no_record"),  # build interrupted
        (lambda p: p.with_name(p.name + ".json").write_text("{not json"), "bad_record"),
    ],
)
def test_a_corrupt_engine_is_deleted_counted_and_built_again(tmp_path: Path, damage, reason):
    log, path = tmp_path / "builds.log", tmp_path / "m.engine"
    cached_build(path, KEY, _builder(log))
    damage(path)
    before = counter_value("ef_engine_cache_corrupt_total", reason=reason)
    rebuilt = cached_build(path, KEY, _builder(log, b"fresh engine"))
    assert not rebuilt.cached and rebuilt.data == path.read_bytes() == b"fresh engine"
    assert _builds(log) == 2
    assert counter_value("ef_engine_cache_corrupt_total", reason=reason) == before + 1
    assert cached_build(path, KEY, _builder(log)).cached


def test_an_engine_the_runtime_refuses_is_built_again_unless_already_replaced(tmp_path: Path):
    log, path = tmp_path / "builds.log", tmp_path / "m.engine"
    refused = cached_build(path, KEY, _builder(log)).data
    before = counter_value("ef_engine_cache_corrupt_total", reason="deserialise")
    invalidate(path, refused, "deserialise")
    assert not path.exists()
    assert counter_value("ef_engine_cache_corrupt_total", reason="deserialise") == before + 1
    # another process rebuilt it meanwhile: what a late caller refused is not this file
    cached_build(path, KEY, _builder(log, b"rebuilt"))
    invalidate(path, refused, "deserialise")
    assert path.read_bytes() == b"rebuilt"


def _waiters_on(lock: Path) -> int:
    """Processes blocked on a flock of `lock`, as the kernel lists them in /proc/locks."""
    inode = os.stat(lock).st_ino
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for line in lines if "->" in line and line.split()[-3].endswith(f":{inode}"))


def _build_in_child(path: str, log: str, started, release, out) -> None:
    def build() -> bytes:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        started.set()
        release.wait(60)
        return f"built by {os.getpid()}".encode()

    entry = cached_build(Path(path), KEY, build)
    out.put((entry.data, str(entry.path), entry.cached))


def test_two_processes_building_one_key_make_one_build(tmp_path: Path):
    ctx = multiprocessing.get_context("fork")
    path, log = tmp_path / "m.engine", tmp_path / "builds.log"
    started, release, out = ctx.Event(), ctx.Event(), ctx.Queue()
    args = (str(path), str(log), started, release, out)
    first = ctx.Process(target=_build_in_child, args=args)
    first.start()
    assert started.wait(60), "the first process never began its build"
    second = ctx.Process(target=_build_in_child, args=args)
    second.start()
    # the second waits on the key's lock while the first is still building
    eventually(lambda: _waiters_on(path.with_name("m.engine.lock")) == 1, 30, "a lock waiter")
    release.set()
    results = [out.get(timeout=60), out.get(timeout=60)]
    for proc in (first, second):
        proc.join(60)
        assert proc.exitcode == 0
    assert _builds(log) == 1
    assert {(data, where) for data, where, _ in results} == {
        (f"built by {first.pid}".encode(), str(path))
    }
    assert sorted(cached for _, _, cached in results) == [False, True]


def _build_forever(path: str, started) -> None:
    def build() -> bytes:
        started.set()
        threading.Event().wait()  # until killed
        return b""

    cached_build(Path(path), KEY, build)


def test_a_builder_killed_mid_build_leaves_the_key_to_the_next(tmp_path: Path):
    ctx = multiprocessing.get_context("fork")
    path, log = tmp_path / "m.engine", tmp_path / "builds.log"
    started = ctx.Event()
    builder = ctx.Process(target=_build_forever, args=(str(path), started))
    builder.start()
    assert started.wait(60), "the builder never began"
    leftover = tmp_path / ".m.engine.k2j4x9.tmp"  # what a kill inside the write leaves
    leftover.write_bytes(b"half an eng")
    os.kill(builder.pid, signal.SIGKILL)
    builder.join(30)
    # the kernel released its lock: the next caller builds, and sweeps the leftover
    entry = cached_build(path, KEY, _builder(log))
    assert not entry.cached and _builds(log) == 1
    assert not leftover.exists()


def test_a_cache_folder_that_fails_to_load_is_emptied_and_counted(tmp_path: Path):
    folder = tmp_path / "ort"
    assert not reset_folder(folder, "ort_load")  # nothing there: nothing to blame
    (folder / "profiles").mkdir(parents=True)
    (folder / "TensorrtExecutionProvider_TRTKernel_graph.engine").write_bytes(b"junk")
    (folder / ".lock").touch()
    before = counter_value("ef_engine_cache_corrupt_total", reason="ort_load")
    assert reset_folder(folder, "ort_load")
    assert [p.name for p in folder.iterdir()] == [".lock"]
    assert counter_value("ef_engine_cache_corrupt_total", reason="ort_load") == before + 1


def _blob(data: bytes, name: str = "det") -> ModelBlob:
    return ModelBlob(name, data, sha256_bytes(data), "onnx")


def test_the_onnx_runtime_tensorrt_cache_key_follows_every_input(tmp_path: Path):
    calib = tmp_path / "calib"
    calib.mkdir()
    (calib / "a.png").write_bytes(b"image a")
    base = ExecutionSettings(precision="int8", calibration_dir=calib)

    def key(blob=None, settings=base, runtime="ort1.20-trt10.3", gpu="NVIDIA L4", cc="8.9"):
        return ort_trt_key(blob or _blob(b"weights v1"), settings, runtime, gpu, cc).digest()

    original = key()
    tuned_hw = base.tensorrt.model_copy(update={"max_hw": (2048, 2048)})
    bigger_batch = base.batching.model_copy(update={"max_batch_size": 16})
    variants = [
        key(_blob(b"weights v2")),  # a fine-tuned model with the same graph names
        key(runtime="ort1.20-trt10.4"),
        key(gpu="NVIDIA H200"),
        key(cc="9.0"),
        key(settings=base.model_copy(update={"precision": "fp16"})),
        key(settings=base.model_copy(update={"tensorrt": tuned_hw})),
        key(settings=base.model_copy(update={"batching": bigger_batch})),
    ]
    (calib / "a.png").write_bytes(b"image a, retaken")
    variants.append(key())
    assert len(set(variants)) == len(variants) and original not in variants


def test_each_model_gets_its_own_onnx_runtime_tensorrt_cache_folder(tmp_path: Path):
    executor = OnnxRuntimeExecutor(ExecutionSettings(engine_cache_dir=tmp_path), "tensorrt")
    v1, v2 = executor.trt_cache_dir(_blob(b"v1")), executor.trt_cache_dir(_blob(b"v2"))
    assert v1 != v2 and v1.parent == v2.parent == tmp_path / "ort-trt"
    assert v1.name.startswith("det-fp32-")


class _HeldFirstRun:
    """A real ONNX Runtime CPU session whose runs are written to `log` and wait for
    `release`: the first run stands for the TensorRT provider's lazy engine build."""

    def __init__(self, log: str, started, release) -> None:
        import onnxruntime as ort

        with open(log, "a") as out:
            out.write(f"open {os.getpid()}\n")
        self._session = ort.InferenceSession(TINY_ONNX, providers=["CPUExecutionProvider"])
        self._log, self._started, self._release = log, started, release

    def run(self, names, feeds):
        with open(self._log, "a") as out:
            out.write(f"run {os.getpid()}\n")
        self._started.set()
        self._release.wait(60)
        outputs = self._session.run(names, feeds)
        with open(self._log, "a") as out:
            out.write(f"ran {os.getpid()}\n")
        return outputs


def _open_in_child(cache: str, log: str, started, release, out) -> None:
    feeds = first_feeds([TensorSpec("x", TINY_SHAPE)], [])
    session = open_and_run_once(Path(cache), lambda: _HeldFirstRun(log, started, release), feeds)
    out.put(type(session).__name__)


def test_two_processes_opening_one_onnx_runtime_key_open_and_run_it_one_at_a_time(
    tmp_path: Path,
):
    # given two processes opening a session on one cache folder, the first held in its run
    ctx = multiprocessing.get_context("fork")
    cache, log = tmp_path / "ort-trt" / "det-fp16-0123", tmp_path / "sessions.log"
    started, release, out = ctx.Event(), ctx.Event(), ctx.Queue()
    args = (str(cache), str(log), started, release, out)
    first = ctx.Process(target=_open_in_child, args=args)
    first.start()
    assert started.wait(60), "the first process never ran its session"
    second = ctx.Process(target=_open_in_child, args=args)
    second.start()
    # then the second waits on the key's lock while the first is in its first run
    eventually(lambda: _waiters_on(cache / ".lock") == 1, 30, "a lock waiter")
    assert log.read_text().splitlines() == [f"open {first.pid}", f"run {first.pid}"]
    release.set()
    assert [out.get(timeout=60), out.get(timeout=60)] == ["_HeldFirstRun"] * 2
    for proc in (first, second):
        proc.join(60)
        assert proc.exitcode == 0
    # and it opened only once the first had run: one build, then a reader of it
    assert log.read_text().splitlines() == [
        f"{step} {proc.pid}" for proc in (first, second) for step in ("open", "run", "ran")
    ]


def test_a_first_run_that_fails_empties_the_cache_folder_and_opens_once_more(tmp_path: Path):
    import onnxruntime as ort

    # given a cache folder holding an engine, and a first run the runtime refuses (a feed
    # of the wrong shape stands for an engine it cannot read)
    cache = tmp_path / "ort-trt" / "det-fp16-0123"
    cache.mkdir(parents=True)
    (cache / "TensorrtExecutionProvider_TRTKernel_graph.engine").write_bytes(b"junk")
    opened: list[str] = []

    def open_session():
        opened.append("open")
        return ort.InferenceSession(TINY_ONNX, providers=["CPUExecutionProvider"])

    refused = {"x": np.zeros((2, 2), np.float32)}
    before = counter_value("ef_engine_cache_corrupt_total", reason="ort_load")
    # when it opens, then the folder is emptied (counted) and the session opened once more;
    # a run that fails again is the model's error, raised
    with pytest.raises(ModelLoadError, match="the first run failed"):
        open_and_run_once(cache, open_session, refused)
    assert len(opened) == 2 and [p.name for p in cache.iterdir()] == [".lock"]
    assert counter_value("ef_engine_cache_corrupt_total", reason="ort_load") == before + 1
    # with nothing left in the folder to blame, a failing run is raised at once
    with pytest.raises(ModelLoadError):
        open_and_run_once(cache, open_session, refused)
    assert len(opened) == 3
    # and a run that works returns its session
    session = open_and_run_once(cache, open_session, first_feeds([TensorSpec("x", TINY_SHAPE)], []))
    assert session.get_providers() == ["CPUExecutionProvider"] and len(opened) == 4


def test_the_tensorrt_provider_is_given_the_profile_its_cache_key_names(tmp_path: Path):
    from tests.support.onnx_graphs import constant_model

    # given a model with a dynamic batch, height and width (the key's bounds: settings')
    data = constant_model(np.zeros((1, 4), np.float32), ["N", 3, "H", "W"])
    executor = OnnxRuntimeExecutor(ExecutionSettings(engine_cache_dir=tmp_path), "tensorrt")
    inputs = graph_inputs(_blob(data))
    assert inputs == [TensorSpec("images", (None, 3, None, None), "float32")]
    # when its provider options are made, then the TensorRT provider gets that profile
    profile = executor.trt_profile("det", inputs)
    options = executor.provider_options(tmp_path, profile)[0]
    ts, batching = executor.settings.tensorrt, executor.settings.batching
    assert options["trt_profile_min_shapes"] == f"images:1x3x{ts.min_hw[0]}x{ts.min_hw[1]}"
    assert options["trt_profile_opt_shapes"] == (
        f"images:{batching.preferred_batch_size}x3x{ts.opt_hw[0]}x{ts.opt_hw[1]}"
    )
    assert options["trt_profile_max_shapes"] == (
        f"images:{batching.max_batch_size}x3x{ts.max_hw[0]}x{ts.max_hw[1]}"
    )
    # and the first run, under the lock, is at the profile's opt shape
    feeds = first_feeds(inputs, profile)
    assert feeds["images"].shape == (batching.preferred_batch_size, 3, *ts.opt_hw)
    # a model with only fixed inputs needs no profile: the provider builds it as it is
    fixed = graph_inputs(_blob(TINY_ONNX))
    assert executor.trt_profile("proof", fixed) == []
    assert "trt_profile_min_shapes" not in executor.provider_options(tmp_path, [])[0]
