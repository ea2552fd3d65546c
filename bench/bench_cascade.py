"""Does the cascade pay? Edge-only, cloud-only and the cascade side by side, in one run.

Run: `edgefleet bench cascade` (about 4-5 minutes on 2 cores; `--quick` for ~1 minute).

It renders seeded hard clips (bench/hard_scenes.py: small, faint, moving text with motion
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
from typing import Annotated

import numpy as np
import typer

from edgefleet.bench.hard_scenes import Clip, Tally, frame_scores, render_clips
from edgefleet.cloud.cache import VerdictCache
from edgefleet.cloud.cascade import Cascade, ModelPool
from edgefleet.cloud.router import Route
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


@app.command()
def main(
    clips: Annotated[int, typer.Option(help="seeded clips (one stream each)")] = 10,
    frames: Annotated[int, typer.Option(help="frames per clip (10 fps)")] = 30,
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
) -> None:
    """Print edge-only, cloud-only and the cascade at each budget, side by side.

    Example: edgefleet bench cascade --quick
    """
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
