"""`edgefleet bench cascade` per scenario, end to end on the real models: its table has a
row per scenario and the total, and its plot is a PNG."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from edgefleet.bench.bench_cascade import app


def test_the_cascade_bench_reports_each_scenario_and_draws_the_budgets(tmp_path: Path) -> None:
    plot = tmp_path / "cascade.png"
    result = CliRunner().invoke(
        app,
        ["--scenarios", "entering,low-light", "--clips", "1", "--frames", "8",
         "--budgets", "0.1", "--cloud-every", "4", "--plot", str(plot)],
    )
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| scenario | edge-only | tracks alone | edge+cloud")
    assert [r.split("|")[1].strip() for r in rows[2:]] == ["entering", "low-light", "**all**"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_unknown_scenario_is_refused_by_name() -> None:
    result = CliRunner().invoke(app, ["--scenarios", "entering,fog"])
    assert result.exit_code == 2 and "fog" in result.output
