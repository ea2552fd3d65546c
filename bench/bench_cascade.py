"""Does the cascade pay? Edge-only, cloud-only and the cascade side by side, in one run.

Run: `edgefleet bench cascade` (about 4-5 minutes on 2 cores; `--quick` for ~1 minute).

It renders seeded hard clips (edgefleet/demo/scenes/clips.py: small, faint, moving text with motion
blur, glare and JPEG quality 35-70), then on the same frames:

- the OCR ladder (`--ladder`): ms/image p50/p95 and accuracy of each pipeline of the pack
  on every 5th frame, one image at a time;
- edge-only: the edge model (`--edge`) on every frame, each frame's own reads;
- cloud-only: the cloud model (`--cloud`) on every frame, as if every frame were streamed;
- the cascade at each escalation budget (share of frames): the real edge policy (text
  tracks, confidence-weighted votes, the budget controller, rate limit and
  de-duplication) escalates tracks as real `ef.escalation/2` cases with their best
  crops tiled, the real cloud cascade (cloud/cascade.py, tiles read and fused) answers,
  and the verdict reaches the edge's VerdictBook `--verdict-delay` frames later; from then
  on the track reports the cloud's answer. Before that it reports its own vote. Each frame
  reports the stream's live tracks (seen within the last `max_gap` frames).

Scores, per true line per frame: character accuracy (1 - edit distance / length, case and
spaces ignored) and exact lines, against the best read overlapping the line (0 if none).
Bytes: what the cases put on the uplink (image + metadata) against streaming every frame
as the camera's JPEG. Gain captured = (cascade - edge) / (cloud - edge).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from edgefleet.cloud.cache import VerdictCache
from edgefleet.cloud.cascade import Cascade, ModelPool
from edgefleet.cloud.router import Route
from edgefleet.demo.scenes.clips import Clip, Tally, frame_scores, render_clips
from edgefleet.demo.scenes.scenarios import SCENARIOS, scenario_clips
from edgefleet.edge.policy import Escalation, EscalationPolicy
from edgefleet.edge.settings import BudgetSettings, PolicySettings, TrackSettings
from edgefleet.edge.tracks import Track
from edgefleet.edge.verdicts import VerdictBook
from edgefleet.shared.imaging.decode import decode_image
from edgefleet.shared.messages import CloudVerdict, Detection, EscalationCase, ModelInfo
from edgefleet.shared.models import load_model
from edgefleet.shared.wire import fit_meta

app = typer.Typer(add_completion=False)

LADDER = ("ppocr", "ppocr-heavy", "ppocr6-tiny", "ppocr6-small", "ppocr6-cloud")


@dataclass
class Row:
    name: str
    tally: Tally
    cases: int = 0
    bytes_up: int = 0


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else 0.0


def ladder(clips: list[Clip], names: tuple[str, ...]) -> None:
    frames = [(c.frames[i], c.truth[i]) for c in clips for i in range(0, len(c.frames), 5)]
    typer.echo(f"\nOCR ladder: {len(frames)} frames, one image at a time (2 shared cores: noisy)")
    typer.echo(f"{'pipeline':<14}{'p50 ms':>8}{'p95 ms':>8}{'char acc':>10}{'exact':>8}")
    for name in names:
        with load_model(name) as model:
            model.predict(frames[0][0], fmt="bgr")
            tally, times = Tally(), []
            for image, truth in frames:
                started = time.perf_counter()
                lines = model.predict(image, fmt="bgr")  # the clips are BGR, as decoded
                times.append(time.perf_counter() - started)
                tally.add(frame_scores([(d.text or "", d.box) for d in lines], truth))
        typer.echo(
            f"{name:<14}{_pct(times, 50):>8.0f}{_pct(times, 95):>8.0f}"
            f"{tally.char_accuracy:>10.3f}{tally.exact_share:>8.3f}"
        )


def _case(clip: Clip, index: int, escalation: Escalation, info: ModelInfo) -> EscalationCase:
    case = EscalationCase(
        device_id="bench",
        stream_id=f"cam-{clip.seed}",
        frame_index=index,
        reason=escalation.reason,
        edge_result=list(escalation.edge_result or ()),
        model=info,
        content_type="image/jpeg",
        track_id=escalation.track_id,
        tiles=list(escalation.tiles),
    )
    return case


def cascade_run(
    clips: list[Clip],
    edge_reads: list[list[list[Detection]]],
    cascade: Cascade,
    route: Route,
    share: float,
    delay: int,
    info: ModelInfo,
    track_settings: TrackSettings,
) -> Row:
    """The cascade at one budget over every clip (a fresh edge policy: nothing carried)."""
    settings = PolicySettings(
        sample_share=0.0,
        rate_per_min=600.0,  # the hard ceiling; the budget is what is measured here
        budget=BudgetSettings(share=share),
        tracks=track_settings,
    )
    clock = [0.0]
    policy = EscalationPolicy(settings, clock=lambda: clock[0])
    book = VerdictBook(tracker=policy.tracker, budget=policy.budget)
    row = Row(f"cascade {share:.0%}", Tally())
    for clip, reads in zip(clips, edge_reads, strict=True):
        stream = f"cam-{clip.seed}"
        due: dict[int, list[CloudVerdict]] = {}
        for index, (frame, lines) in enumerate(zip(clip.frames, reads, strict=True)):
            clock[0] += 0.1  # 10 frames per second
            for verdict in due.pop(index, []):
                book.receive(verdict)
            tracks: list[Track] = policy.tracker.update(stream, index, frame, lines)
            for escalation in policy.escalations_for(stream, tracks):
                case, meta = fit_meta(_case(clip, index, escalation, info))
                row.cases += 1
                row.bytes_up += len(meta) + len(escalation.jpeg)
                book.expect(case.case_id, stream, case.edge_result, index, escalation.score)
                outcome = cascade.run(route, case, decode_image(escalation.jpeg), case.case_id)
                verdict = CloudVerdict(
                    device_id="bench",
                    trace_id=case.trace_id,
                    case_id=case.case_id,
                    result=outcome.result,
                    model=outcome.model,
                    route=route.name,
                    fallback_level=outcome.fallback_level,
                    latency_ms=0.0,
                    track_id=case.track_id,
                )
                due.setdefault(index + delay, []).append(verdict)
            reported: list[tuple[str, tuple[float, float, float, float] | None]] = [
                (t.result()[0], t.box) for t in policy.tracker.live(stream)
            ]
            row.tally.add(frame_scores(reported, clip.truth[index]))
        policy.tracker.end_stream(stream)
    return row


@dataclass
class ScenarioResult:
    """One scenario's rows: edge-only, cloud-only (sampled frames) and the cascade at each
    budget (the first, budget 0, is the tracks alone)."""

    name: str
    edge: Tally
    cloud: Tally
    budgets: list[float]
    cascade: list[Row]
    frames: int

    @property
    def tracks(self) -> Row:
        return self.cascade[0]


def _edge_tally(clips: list[Clip], reads: list[list[list[Detection]]]) -> Tally:
    tally = Tally()
    for clip, clip_reads in zip(clips, reads, strict=True):
        for lines, truth in zip(clip_reads, clip.truth, strict=True):
            tally.add(frame_scores([(d.text or "", d.box) for d in lines], truth))
    return tally


def run_scenario(
    name: str,
    clips: list[Clip],
    edge_model: Any,
    pool: ModelPool,
    cloud: str,
    budgets: list[float],
    delay: int,
    cloud_every: int,
) -> ScenarioResult:
    """Every row of one scenario on the same frames."""
    reads = [[edge_model.predict(f, fmt="bgr") for f in clip.frames] for clip in clips]
    cloud_tally = Tally()
    for clip in clips:
        for index in range(0, len(clip.frames), cloud_every):
            lines = pool.call(cloud, decode_image(clip.jpegs[index]), 120.0)
            cloud_tally.add(frame_scores([(d.text or "", d.box) for d in lines], clip.truth[index]))
    cascade = Cascade(pool, VerdictCache(0, 1.0), lighter=None, accept_edge_min_score=0.9)
    route = Route("default", cloud, 120.0, 0, False)
    rows = [
        cascade_run(clips, reads, cascade, route, b, delay, edge_model.info, TrackSettings())
        for b in [0.0, *budgets]
    ]
    frames = sum(len(c.frames) for c in clips)
    return ScenarioResult(name, _edge_tally(clips, reads), cloud_tally, budgets, rows, frames)


def scenario_table(results: list[ScenarioResult], budget: float) -> list[str]:
    """Markdown: per scenario, edge-only, tracks alone, edge+cloud at `budget`, cloud-only,
    the cloud's move over the tracks, the share escalated and the uplink."""
    lines = [
        "| scenario | edge-only | tracks alone | edge+cloud | cloud-only (every "
        "sampled frame) | cloud's move over tracks | escalated | uplink kB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    totals = [Tally(), Tally(), Tally(), Tally()]
    cases = frames = bytes_up = 0
    for r in results:
        row = r.cascade[1 + r.budgets.index(budget)]
        for total, t in zip(totals, (r.edge, r.tracks.tally, row.tally, r.cloud), strict=True):
            total.chars, total.exact = total.chars + t.chars, total.exact + t.exact
            total.lines += t.lines
        cases, frames, bytes_up = cases + row.cases, frames + r.frames, bytes_up + row.bytes_up
        lines.append(_table_row(r.name, r.edge, r.tracks.tally, row.tally, r.cloud,
                                row.cases / r.frames, row.bytes_up))
    edge, tracks, both, cloud = totals
    lines.append(_table_row("**all**", edge, tracks, both, cloud, cases / max(1, frames), bytes_up))
    return lines


def _table_row(
    name: str, edge: Tally, tracks: Tally, both: Tally, cloud: Tally, share: float, up: int
) -> str:
    def pct(t: Tally) -> str:
        return f"{100 * t.char_accuracy:.1f} %"

    move = 100 * (both.char_accuracy - tracks.char_accuracy)
    return (
        f"| {name} | {pct(edge)} | {pct(tracks)} | {pct(both)} | {pct(cloud)} | "
        f"{move:+.1f} | {share:.1%} | {up / 1000:.1f} |"
    )


def plot(results: list[ScenarioResult], path: Path) -> None:
    """Accuracy and uplink against the escalation budget, one line per scenario."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise typer.BadParameter("--plot needs matplotlib: pip install matplotlib") from exc
    figure, (acc, up) = plt.subplots(1, 2, figsize=(12, 5))
    for r in results:
        budgets = [0.0, *r.budgets]
        acc.plot([100 * b for b in budgets], [100 * row.tally.char_accuracy for row in r.cascade],
                 marker="o", label=r.name)
        up.plot([100 * b for b in budgets], [row.bytes_up / 1000 for row in r.cascade],
                marker="o", label=r.name)
    acc.set(xlabel="escalation budget (% of frames)", ylabel="edge+cloud character accuracy (%)")
    up.set(xlabel="escalation budget (% of frames)", ylabel="uplink (kB)")
    acc.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def scenarios(
    chosen: tuple[str, ...],
    clips: int,
    frames: int,
    levels: list[float],
    report_budget: float,
    tuned: bool,
    edge: str,
    cloud: str,
    verdict_delay: int,
    cloud_every: int,
    plot_to: Path | None,
) -> None:
    """Per scenario of edgefleet/demo/scenes/scenarios.py: edge-only, tracks alone, edge+cloud,
    cloud-only."""
    started = time.perf_counter()
    pool = ModelPool([cloud], load_model)
    results = []
    with load_model(edge) as edge_model:
        for name in chosen:
            rendered = scenario_clips(name, clips, frames, held_out=not tuned)
            results.append(
                run_scenario(name, rendered, edge_model, pool, cloud, levels, verdict_delay,
                             cloud_every)
            )
            typer.echo(f"{name}: done ({time.perf_counter() - started:.0f} s)", err=True)
    pool.close()
    which = "tuned" if tuned else "held-out"
    typer.echo(
        f"{len(chosen)} scenarios x {clips} clips x {frames} frames ({which} fonts and seeds), "
        f"edge {edge}, cloud {cloud}, budget {report_budget:.0%}, verdicts back "
        f"{verdict_delay} frames later; character accuracy"
    )
    for line in scenario_table(results, report_budget):
        typer.echo(line)
    if plot_to is not None:
        plot(results, plot_to)
        typer.echo(f"plot: {plot_to}")
    typer.echo(f"{time.perf_counter() - started:.0f} s")


@app.command()
def main(
    clips: Annotated[
        int | None, typer.Option(help="clips per scenario [3], or hard clips [10]")
    ] = None,
    frames: Annotated[int | None, typer.Option(help="frames per clip, 10 fps [40; 30]")] = None,
    budgets: Annotated[str, typer.Option(help="escalation budgets, share of frames")] = (
        "0.05,0.10,0.15,0.25"
    ),
    edge: Annotated[str, typer.Option(help="the edge model")] = "ppocr6-tiny",
    cloud: Annotated[str, typer.Option(help="the cloud's primary model")] = "ppocr6-cloud",
    verdict_delay: Annotated[int, typer.Option(help="frames until a verdict is back")] = 5,
    ready_frames: Annotated[
        int, typer.Option(help="frames a track is read on before it may be escalated")
    ] = TrackSettings().ready_frames,
    crops: Annotated[int, typer.Option(help="best crops sent per track")] = (
        TrackSettings().max_crops
    ),
    run_ladder: Annotated[bool, typer.Option("--ladder/--no-ladder", help="the OCR ladder")] = (
        True
    ),
    quick: Annotated[bool, typer.Option(help="3 clips of 20 frames, no ladder")] = False,
    hard_clips: Annotated[
        bool, typer.Option("--hard-clips", help="the hard clips and the OCR ladder instead")
    ] = False,
    names: Annotated[str, typer.Option("--scenarios", help="comma-separated, or all")] = "all",
    report_budget: Annotated[float, typer.Option(help="the budget the table reports")] = (
        BudgetSettings().share
    ),
    tuned: Annotated[
        bool, typer.Option("--tuned/--held-out", help="the fonts and seeds choices look at")
    ] = False,
    cloud_every: Annotated[int, typer.Option(help="cloud-only reads every n-th frame")] = 4,
    plot_to: Annotated[Path | None, typer.Option("--plot", help="draw the budgets (PNG)")] = None,
) -> None:
    """Per scenario (edgefleet/demo/scenes/scenarios.py), on held-out fonts and seeds:
    edge-only, tracks alone, edge+cloud, cloud-only; `--hard-clips`: the hard clips, the OCR
    ladder and every budget side by side.

    Example: edgefleet bench cascade --clips 3 --frames 40 --plot cascade.png
    """
    if not hard_clips:
        chosen = SCENARIOS if names == "all" else tuple(n.strip() for n in names.split(","))
        unknown = sorted(set(chosen) - set(SCENARIOS))
        if unknown:
            raise typer.BadParameter(f"unknown scenarios {unknown}; known: {SCENARIOS}")
        levels = sorted({*(float(b) for b in budgets.split(",")), report_budget})
        clips, frames = (2, 20) if quick else (clips or 3, frames or 40)
        scenarios(chosen, clips, frames, levels, report_budget,
                  tuned, edge, cloud, verdict_delay, cloud_every, plot_to)
        return
    clips, frames = clips or 10, frames or 30
    if quick:
        clips, frames, run_ladder = 3, 20, False
    started = time.perf_counter()
    rendered = render_clips(clips, frames)
    total = clips * frames
    streamed = sum(len(j) for c in rendered for j in c.jpegs)
    typer.echo(
        f"{clips} seeded hard clips x {frames} frames = {total} frames, 640x360, "
        f"{sum(len(c.truth[0]) for c in rendered)} moving lines; 2 shared CPU cores"
    )
    if run_ladder:
        ladder(rendered, LADDER)

    with load_model(edge) as edge_model:
        edge_reads = [[edge_model.predict(f, fmt="bgr") for f in clip.frames] for clip in rendered]
        info = edge_model.info
    edge_row = Row(f"edge only ({edge})", Tally())
    for clip, reads in zip(rendered, edge_reads, strict=True):
        for lines, truth in zip(reads, clip.truth, strict=True):
            edge_row.tally.add(frame_scores([(d.text or "", d.box) for d in lines], truth))

    pool = ModelPool([cloud], load_model)
    cloud_row = Row(f"cloud only ({cloud})", Tally(), cases=total, bytes_up=streamed)
    for clip in rendered:
        for jpeg, truth in zip(clip.jpegs, clip.truth, strict=True):
            lines = pool.call(cloud, decode_image(jpeg), 120.0)
            cloud_row.tally.add(frame_scores([(d.text or "", d.box) for d in lines], truth))
    cascade = Cascade(pool, VerdictCache(0, 1.0), lighter=None, accept_edge_min_score=0.9)
    route = Route("default", cloud, 120.0, 0, False)
    rows = [edge_row, cloud_row]
    rows += [
        cascade_run(
            rendered,
            edge_reads,
            cascade,
            route,
            float(b),
            verdict_delay,
            info,
            TrackSettings(ready_frames=ready_frames, max_crops=crops),
        )
        for b in ["0", *budgets.split(",")]
    ]
    pool.close()

    e, c = edge_row.tally, cloud_row.tally
    typer.echo(f"\nCascade: verdicts back {verdict_delay} frames after the case")
    typer.echo(
        f"{'':<28}{'char acc':>9}{'exact':>8}{'escalated':>11}{'uplink kB':>11}"
        f"{'vs stream':>11}{'gain (char)':>13}{'gain (exact)':>14}"
    )
    for row in rows:
        t = row.tally
        gain_c = (t.char_accuracy - e.char_accuracy) / max(1e-9, c.char_accuracy - e.char_accuracy)
        gain_x = (t.exact_share - e.exact_share) / max(1e-9, c.exact_share - e.exact_share)
        typer.echo(
            f"{row.name:<28}{t.char_accuracy:>9.3f}{t.exact_share:>8.3f}"
            f"{row.cases / total:>11.1%}{row.bytes_up / 1000:>11.1f}"
            f"{row.bytes_up / streamed:>11.2%}{gain_c:>13.0%}{gain_x:>14.0%}"
        )
    per_clip = statistics.fmean([len(x.truth[0]) for x in rendered])
    typer.echo(
        f"\ncloud - edge: {100 * (c.char_accuracy - e.char_accuracy):+.1f} points of characters,"
        f" {100 * (c.exact_share - e.exact_share):+.1f} points of exact lines; streaming every "
        f"frame: {streamed / 1000:.0f} kB; {per_clip:.1f} lines a clip; "
        f"{time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    app()
