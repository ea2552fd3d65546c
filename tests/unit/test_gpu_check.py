"""The GPU check's CPU-checkable parts: plan and caps, arguments, the runner's caps and
timeouts (through tiny step commands, run for real), the report and its table, skip
reasons where there is no GPU, and the pure pieces of the steps (INT8 gate, junit counts).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jsonschema
import pytest

from edgefleet.bench import gpu_check, gpu_steps
from edgefleet.bench.gpu_check import (
    PLAN,
    REPORT_SCHEMA,
    TOTAL_CAP_S,
    GpuInfo,
    Step,
    build_report,
    detect_gpu,
    main,
    parse_args,
    plan_total,
    report_table,
    run_plan,
    run_step,
    select_steps,
    write_report,
)
from edgefleet.bench.gpu_paths import INT8_MAX_DROP, int8_gate
from edgefleet.bench.gpu_steps import junit_counts, marker_test_files

ROOT = Path(__file__).resolve().parents[2]
ASSUMED_GPU = GpuInfo(True, "assumed by the test: the runner's path with a GPU")
HOST_HAS_GPU = detect_gpu().present
no_gpu_host = pytest.mark.skipif(
    HOST_HAS_GPU, reason="this host has an NVIDIA GPU: the no-GPU path does not run here"
)


def fake_step(name: str, cap_s: int, body: str) -> Step:
    """A step whose command is a few lines of Python; `result` is the path it must write."""
    prelude = "import json, sys, threading\nresult = sys.argv[sys.argv.index('--result') + 1]\n"
    return Step(name, f"fake {name}", cap_s, (sys.executable, "-c", prelude + body))


def write_result(status: str | None, **figures: object) -> str:
    outcome: dict[str, object] = {"figures": figures, "goals": []}
    if status is not None:
        outcome["status"] = status
    return f"open(result, 'w').write({json.dumps(json.dumps(outcome))})\n"


# --- plan, caps and arguments ---------------------------------------------------------------


def test_plan_fits_eight_minutes_and_every_step_has_a_body():
    assert plan_total(PLAN) == TOTAL_CAP_S <= 480
    names = [s.name for s in PLAN]
    assert len(names) == len(set(names))
    assert set(names) == set(gpu_steps.STEPS)  # each planned step has code that runs it
    assert all(s.cap_s >= 1 for s in PLAN)
    assert {"markers", "kernels", "tensorrt", "batching", "nvml"} <= set(names)


def test_select_steps_keeps_plan_order_and_names_unknown_steps():
    picked = select_steps(PLAN, " nvml,kernels ")
    assert [s.name for s in picked] == ["kernels", "nvml"]
    assert select_steps(PLAN, None) == list(PLAN)
    with pytest.raises(ValueError, match="unknown step\\(s\\) warp-drive; steps are: setup"):
        select_steps(PLAN, "kernels,warp-drive")
    with pytest.raises(ValueError, match="none given"):
        select_steps(PLAN, ",")


def test_arguments_have_safe_defaults():
    args = parse_args([])
    assert (args.steps, args.out, args.dry_run, args.cap_scale) == (None, None, False, 1.0)
    args = parse_args(["--steps", "nvml", "--out", "/tmp/r", "--dry-run", "--cap-scale", "2"])
    assert (args.steps, args.out, args.dry_run, args.cap_scale) == (
        "nvml",
        Path("/tmp/r"),
        True,
        2.0,
    )


def test_dry_run_prints_each_step_with_its_cap_and_runs_nothing(tmp_path, capsys):
    assert main(["--dry-run", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert f"at most {TOTAL_CAP_S} s in all" in out
    for i, step in enumerate(PLAN, 1):
        assert f"step {i}/{len(PLAN)} {step.name} (cap {step.cap_s} s)" in out
    assert not (tmp_path / "r").exists()


def test_cap_scale_and_bad_steps(tmp_path, capsys):
    assert main(["--dry-run", "--steps", "tensorrt", "--cap-scale", "0.5"]) == 0
    assert "step 1/1 tensorrt (cap 58 s)" in capsys.readouterr().out
    assert main(["--steps", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown step(s) nope" in capsys.readouterr().err
    assert main(["--dry-run", "--cap-scale", "0"]) == 2


# --- the runner: caps, timeouts, failures ---------------------------------------------------


def test_a_hanging_step_is_killed_at_its_cap_and_the_next_step_still_runs(tmp_path):
    hang = fake_step("hang", 1, write_result(None, before_hang=7) + "threading.Event().wait()\n")
    after = fake_step("after", 60, write_result("ok", ran=True))
    lines: list[str] = []
    results = run_plan([hang, after], tmp_path, ASSUMED_GPU, echo=lambda m, **_: lines.append(m))
    assert [r.status for r in results] == ["timeout", "ok"]
    assert "killed at its 1 s cap" in results[0].reason
    assert results[0].figures == {"before_hang": 7}  # what it wrote before the hang is kept
    assert results[0].seconds >= 1
    assert results[1].figures == {"ran": True}
    assert lines[0] == "step 1/2 hang (cap 1 s): fake hang"
    assert lines[2] == "step 2/2 after (cap 60 s): fake after"


def test_a_step_that_dies_without_a_result_is_failed_with_its_output(tmp_path):
    crash = fake_step("crash", 60, "print('the GPU caught fire'); sys.exit(3)\n")
    (result,) = run_plan([crash], tmp_path, ASSUMED_GPU, echo=lambda m, **_: None)
    assert result.status == "failed"
    assert "exited with status 3" in result.reason
    assert "the GPU caught fire" in result.reason
    assert (tmp_path / "crash.log").read_text().strip() == "the GPU caught fire"


def test_a_step_receives_its_cap_and_reports_goals(tmp_path):
    body = textwrap.dedent(
        """
        cap = float(sys.argv[sys.argv.index('--cap') + 1])
        goals = [{"name": "fast", "target": ">= 3x", "met": False}]
        open(result, 'w').write(json.dumps(
            {"status": "ok", "reason": "", "figures": {"cap": cap}, "goals": goals}))
        """
    )
    result = run_step(fake_step("goals", 42, body), tmp_path)
    assert result.status == "ok" and result.figures == {"cap": 42.0}
    assert [(g.name, g.target, g.met) for g in result.goals] == [("fast", ">= 3x", False)]


# --- without a GPU ---------------------------------------------------------------------------


def test_detect_gpu_names_the_missing_driver_library():
    info = detect_gpu(libraries=("libnvidia-ml-absent.so.1",))
    assert not info.present
    assert "libnvidia-ml-absent.so.1 not found" in info.detail


def test_without_a_gpu_every_step_is_skipped_with_the_reason(tmp_path):
    gpu = GpuInfo(False, "no NVIDIA driver (NVML library libnvidia-ml.so.1 not found)")
    results = run_plan(PLAN, tmp_path, gpu, echo=lambda m, **_: None)
    assert [r.name for r in results] == [s.name for s in PLAN]
    assert {r.status for r in results} == {"skipped"}
    assert all(r.reason == f"no NVIDIA GPU here: {gpu.detail}" for r in results)
    assert not any(tmp_path.iterdir())  # no step was started


@no_gpu_host
def test_main_without_a_gpu_says_so_writes_the_report_and_exits_0(tmp_path, capsys):
    assert main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "no NVIDIA GPU here:" in out
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    jsonschema.validate(report, REPORT_SCHEMA)
    assert report["gpu"]["present"] is False
    assert [s["status"] for s in report["steps"]] == ["skipped"] * len(PLAN)
    assert (tmp_path / "gpu_check.md").read_text().count("| skipped |") == len(PLAN)


def test_make_gpu_check_is_wired_to_the_script():
    dry = subprocess.run(
        ["make", "-n", "gpu-check", "GPU_CHECK_ARGS=--dry-run"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    assert "-m edgefleet.bench.gpu_check --dry-run" in dry.stdout
    assert "--system-site-packages" in dry.stdout  # preinstalled GPU wheels stay visible
    assert "apt-get" not in dry.stdout


@no_gpu_host
def test_a_real_gpu_step_run_on_a_cpu_host_is_skipped_with_what_is_missing(tmp_path):
    (kernels,) = select_steps(PLAN, "kernels")
    result = run_step(kernels, tmp_path)
    assert result.status == "skipped"
    assert "pycuda" in result.reason or "CUDA" in result.reason


# --- the report ------------------------------------------------------------------------------


def _results(tmp_path: Path):
    steps = [
        fake_step("good", 60, write_result("ok", img_s=123.456, backend="tensorrt")),
        fake_step("bare", 60, "sys.exit(0)\n"),
    ]
    body = (
        "open(result, 'w').write(json.dumps({'status': 'ok', 'figures': {'ratio': 2.5}, "
        "'goals': [{'name': 'batching', 'target': '>= 3x', 'met': False}]}))\n"
    )
    steps.append(fake_step("goal", 60, body))
    return run_plan(steps, tmp_path / "steps", ASSUMED_GPU, echo=lambda m, **_: None)


def test_report_json_follows_its_schema_and_the_table_has_a_row_per_step(tmp_path):
    results = _results(tmp_path)
    report = build_report(results, ASSUMED_GPU, 12.5)
    jsonschema.validate(report, REPORT_SCHEMA)
    json_path, table_path = write_report(report, tmp_path / "out")
    assert json.loads(json_path.read_text()) == report
    table = table_path.read_text()
    assert table == report_table(report)
    assert "| good | ok | " in table and "img_s=123.5" in table and "backend=tensorrt" in table
    assert "| bare | failed | " in table and "without a result" in table
    assert "| goal | batching | >= 3x | NO |" in table
    assert report["total_cap_s"] == 180


def test_report_schema_rejects_an_unknown_status(tmp_path):
    report = build_report(_results(tmp_path), ASSUMED_GPU, 1.0)
    report["steps"][0]["status"] = "sort-of"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, REPORT_SCHEMA)


@no_gpu_host
def test_the_report_goes_under_OUT_when_no_folder_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "from-env"))
    assert gpu_check.main(["--steps", "nvml"]) == 0
    report = json.loads((tmp_path / "from-env" / "gpu_check.json").read_text())
    assert [s["name"] for s in report["steps"]] == ["nvml"]


# --- pure pieces of the steps ---------------------------------------------------------------


def test_int8_gate_refuses_a_drop_beyond_the_gate():
    accepted, why = int8_gate(0.95, 0.94)
    assert accepted and why.startswith("accepted")
    accepted, why = int8_gate(0.95, 0.95 - INT8_MAX_DROP - 0.001)
    assert not accepted and "refused" in why
    assert int8_gate(0.90, 0.92)[0]  # better than the baseline is fine


def test_marker_files_are_the_tests_that_use_the_gpu_or_trt_markers():
    names = {p.name for p in marker_test_files(ROOT / "tests")}
    assert {"test_kernels_cuda_build.py", "test_executor_tensorrt.py"} <= names
    assert "test_layers.py" not in names and "test_gpu_check.py" not in names


def test_junit_counts_of_a_real_pytest_run(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(
            """
            import pytest

            def test_passes():
                assert 1 + 1 == 2

            def test_fails():
                assert 1 + 1 == 3

            @pytest.mark.skip(reason="needs TensorRT")
            def test_skipped():
                pass
            """
        )
    )
    (tmp_path / "test_module_skip.py").write_text(
        textwrap.dedent(
            """
            import pytest

            pytest.importorskip("no_such_module_here")
            """
        )
    )
    xml = tmp_path / "junit.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    counts = junit_counts(xml)
    assert (counts["tests"], counts["passed"], counts["failed"], counts["skipped"]) == (4, 1, 1, 2)
    assert counts["failed_tests"] == ["test_sample::test_fails"]
    assert counts["skip_reasons"] == [
        "could not import 'no_such_module_here': No module named 'no_such_module_here'",
        "needs TensorRT",
    ]


def test_edgefleet_bench_gpu_check_runs_the_same_script():
    from typer.testing import CliRunner

    from edgefleet.bench.cli import app

    result = CliRunner().invoke(app, ["gpu-check", "--dry-run", "--steps", "nvml"])
    assert result.exit_code == 0, result.output
    assert "step 1/1 nvml (cap 25 s)" in result.output


def test_the_defaults_step_measures_the_models_each_role_ships_with():
    from edgefleet.bench.gpu_paths import DEFAULT_MODELS
    from edgefleet.cloud.settings import CloudSettings
    from edgefleet.edge.settings import ModelSettings

    # the edge's model setting and the cloud's primary, as their defaults stand
    assert dict(DEFAULT_MODELS) == {
        "edge": ModelSettings().name,
        "cloud": CloudSettings().models.primary,
    }
    assert "defaults" in {s.name for s in PLAN}
