"""Scoring and display for `edgefleet demo`: live fleet table and the final report.

The agents record each frame's reading and each cloud verdict (edgefleet.demo.agent);
the cloud's case records give the frame each verdict answers. Accuracy is the OCR
character accuracy of edgefleet.demo.video against the rendered ground truth.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from edgefleet.demo.scoring import best_match_accuracy, normalise_text
from edgefleet.demo.stack import Device
from edgefleet.demo.supervisor import Incident


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        with path.open() as f:
            for line in f:
                line = line.strip()
                if line.endswith("}"):
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        continue  # a line being written right now
    except OSError:
        pass
    return rows


@dataclass
class DeviceScore:
    device_id: str
    frames: int = 0
    escalated: int = 0
    verdicts: int = 0
    busy: int = 0  # verdicts at the last fallback level: the cloud had no time for the case
    corrections: int = 0
    edge_accuracy: float | None = None  # the edge model frame by frame
    # the edge's text tracks, each frame read as its tracks' own votes (no cloud answer)
    tracked_accuracy: float | None = None
    combined_accuracy: float | None = None  # what the device reports, with the cloud's answers
    cloud_only_accuracy: float | None = None  # the cloud's primary model on sampled frames
    bytes_uplinked: int = 0
    jpeg_bytes_per_frame: float | None = None
    fps: float | None = None  # frames the agent read per second of the live run
    cpu_ms_per_frame: float | None = None  # the agent process's CPU time per frame
    # escalation (case in the outbox) to verdict on the device, from the agent's record
    verdict_latencies_ms: list[float] = field(default_factory=list)

    @property
    def escalated_share(self) -> float | None:
        return self.escalated / self.frames if self.frames else None

    @property
    def bytes_per_frame(self) -> float | None:
        return self.bytes_uplinked / self.frames if self.frames else None

    @property
    def unanswered(self) -> int:
        return self.escalated - self.verdicts

    @property
    def verdict_p95_ms(self) -> float | None:
        return percentile(self.verdict_latencies_ms, 95)

    @property
    def gain_captured(self) -> float | None:
        """(edge+cloud - edge-only) / (cloud-only - edge-only): the share of what sending
        every frame to the cloud would gain that escalating only the unsure ones gains."""
        edge, combined, cloud = self.edge_accuracy, self.combined_accuracy, self.cloud_only_accuracy
        if edge is None or combined is None or cloud is None or cloud <= edge:
            return None
        return (combined - edge) / (cloud - edge)

    def as_json(self) -> dict[str, Any]:
        """The row of report.json: the fields and what is derived from them."""
        derived = (
            "escalated_share",
            "bytes_per_frame",
            "unanswered",
            "verdict_p95_ms",
            "gain_captured",
        )
        return asdict(self) | {name: getattr(self, name) for name in derived}


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile by the nearest-rank method (None without values)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def is_correction(verdict: dict[str, Any]) -> bool:
    """The cloud answered (not `busy`) and read something else than the edge did.

    Texts are compared as a reader would (case and spacing ignored), so `PD 008 HN` vs
    `PD008HN` is agreement, not a correction.
    """
    if verdict.get("fallback_level", 3) >= 3 or verdict.get("edge_texts") is None:
        return False
    edge = sorted(normalise_text(t) for t in verdict["edge_texts"] if normalise_text(t))
    cloud = sorted(normalise_text(t) for t in verdict["cloud_texts"] if normalise_text(t))
    return edge != cloud


def cloud_answer(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """A cloud case record as a verdict row (edge and cloud texts); None if unanswered."""
    if record is None or record.get("verdict") is None:
        return None
    verdict = record["verdict"]
    return {
        "edge_texts": [d.get("text") or "" for d in record.get("edge_result", [])],
        "cloud_texts": [d.get("text") or "" for d in verdict.get("result", [])],
        "fallback_level": verdict.get("fallback_level", 3),
    }


def score_device(
    device: Device, cases: dict[str, dict[str, Any]], uplink_bytes: int
) -> DeviceScore:
    """Edge-only and edge+cloud accuracy of one device over the frames it processed.

    `cases` maps case_id to the cloud's record of it (with its verdict). Where the agent
    recorded its text tracks, edge+cloud is what the device reported for each frame (each
    live track's result: the cloud's answer once it came, else the edge's vote), and the
    tracks' own votes give the edge-with-tracks column. Otherwise a frame that was
    escalated and got a real answer from the cloud (not the `busy` level) is scored on
    that answer; every other frame on the edge's own reading.
    """
    rows = read_jsonl(device.results)
    frames = [r for r in rows if r.get("kind") == "frame"]
    tracked = {
        (r["stream_id"], int(r["frame_index"])): r for r in rows if r.get("kind") == "tracks"
    }
    escalated = [r for r in rows if r.get("kind") == "escalated"]
    answered_at = {r["case_id"]: r.get("t") for r in rows if r.get("kind") == "verdict"}
    score = DeviceScore(device.device_id, frames=len(frames), bytes_uplinked=uplink_bytes)
    score.escalated = len(escalated)
    corrected: dict[tuple[str, int], list[str]] = {}
    for case in escalated:
        sent, answered = case.get("t"), answered_at.get(case["case_id"])
        if sent is not None and answered is not None:
            score.verdict_latencies_ms.append(max(0.0, answered - sent) * 1000)
        answer = cloud_answer(cases.get(case["case_id"]))
        if answer is None:
            continue
        score.verdicts += 1
        score.busy += answer["fallback_level"] >= 3
        score.corrections += is_correction(answer)
        if answer["fallback_level"] < 3 and case.get("frame_index") is not None:
            corrected[(case["stream_id"], int(case["frame_index"]))] = answer["cloud_texts"]
    if device.truth is None or not frames:
        return score
    edge_total = tracks_total = combined_total = 0.0
    for frame in frames:
        truth = device.truth.texts(int(frame["frame_index"]))
        edge_total += best_match_accuracy(frame["texts"], truth)
        key = (frame["stream_id"], int(frame["frame_index"]))
        if tracked:
            reported = tracked.get(key, {"texts": [], "edge_texts": []})
            tracks_total += best_match_accuracy(reported["edge_texts"], truth)
            combined_total += best_match_accuracy(reported["texts"], truth)
        else:
            combined_total += best_match_accuracy(corrected.get(key, frame["texts"]), truth)
    score.edge_accuracy = edge_total / len(frames)
    score.tracked_accuracy = tracks_total / len(frames) if tracked else None
    score.combined_accuracy = combined_total / len(frames)
    return score


# ----------------------------------------------------------------- display


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f} %"


def live_table(devices: list[Device], fleet: dict[str, dict[str, Any]], elapsed: float) -> Table:
    table = Table(title=f"edgefleet demo — {elapsed:5.0f} s", title_justify="left")
    for column in (
        "device",
        "online",
        "fps",
        "frames",
        "escalations",
        "verdicts",
        "corrections",
        "agreement",
        "outbox",
    ):
        table.add_column(column, justify="left" if column == "device" else "right")
    for device in devices:
        row = fleet.get(device.device_id, {})
        records = read_jsonl(device.results)
        frames = sum(1 for r in records if r.get("kind") == "frame")
        escalated = sum(1 for r in records if r.get("kind") == "escalated")
        verdicts = [r for r in records if r.get("kind") == "verdict"]
        corrections = sum(1 for v in verdicts if is_correction(v))
        answered = sum(1 for v in verdicts if v.get("fallback_level", 3) < 3)
        agreement = 1 - corrections / answered if answered else None
        fps = row.get("fps")
        table.add_row(
            device.device_id,
            "[green]yes[/]" if row.get("online") else "[red]no[/]",
            "–" if fps is None else f"{fps:.1f}",
            str(frames),
            str(escalated),
            str(len(verdicts)),
            str(corrections),
            pct(agreement),
            "–" if row.get("outbox_depth") is None else str(row["outbox_depth"]),
        )
    return table


def incidents_table(incidents: list[Incident]) -> Table:
    """The faults of the run, newest last: what, when, how long until healthy again."""
    table = Table(title="incidents", title_justify="left", show_header=False, box=None)
    table.add_column("event")
    if not incidents:
        table.add_row("[dim]none so far[/]")
    for incident in incidents:
        style = "green" if incident.closed else "yellow"
        table.add_row(f"[{style}]{incident.line()}[/]")
    return table


def report_table(scores: list[DeviceScore]) -> Table:
    table = Table(title="final report", title_justify="left")
    for column in (
        "device",
        "fps",
        "CPU / frame",
        "frames",
        "edge-only accuracy",
        "tracks alone",
        "edge+cloud accuracy",
        "cloud's answers moved",
        "cloud-only (sampled)",
        "escalated",
        "answered / busy",
        "verdict p95",
        "bytes uplinked / frame",
        "every frame as JPEG",
    ):
        table.add_column(column, justify="left" if column == "device" else "right")
    for s in [*scores, total_score(scores)]:
        table.add_row(
            s.device_id,
            _number(s.fps, "{:.1f}"),
            _number(s.cpu_ms_per_frame, "{:,.0f} ms"),
            str(s.frames),
            pct(s.edge_accuracy),
            pct(s.tracked_accuracy),
            pct(s.combined_accuracy),
            _moved(s),
            pct(s.cloud_only_accuracy),
            pct(s.escalated_share),
            f"{s.verdicts - s.busy} / {s.busy}",
            _number(s.verdict_p95_ms, "{:,.0f} ms"),
            _number(s.bytes_per_frame, "{:,.0f}"),
            _number(s.jpeg_bytes_per_frame, "{:,.0f}"),
        )
    return table


def _moved(score: DeviceScore) -> str:
    """How far the cloud's answers moved the tracks alone, in points ("–" unscored)."""
    if score.tracked_accuracy is None or score.combined_accuracy is None:
        return "–"
    # + 0.0: a move that rounds to nothing reads +0.0, not -0.0
    return f"{round(100 * (score.combined_accuracy - score.tracked_accuracy), 1) + 0.0:+.1f}"


def story(total: DeviceScore, devices: int) -> list[str]:
    """The report in a few sentences: accuracy, escalations, uplink, the agents' pace."""
    lines = [
        f"[bold]edge-only accuracy {pct(total.edge_accuracy)}, "
        f"edge+cloud {pct(total.combined_accuracy)}, "
        f"{pct(total.escalated_share)} of frames escalated, "
        f"{_number(total.bytes_per_frame, '{:,.0f}')} bytes uplinked per frame[/]"
    ]
    if total.tracked_accuracy is not None and total.combined_accuracy is not None:
        lines.append(
            f"the edge's text tracks alone read {pct(total.tracked_accuracy)}; the cloud's "
            f"answers moved that by {_moved(total)} points"
        )
    if total.jpeg_bytes_per_frame and total.bytes_per_frame:
        lines.append(
            f"streaming every frame as JPEG would send {total.jpeg_bytes_per_frame:,.0f} bytes "
            f"per frame: {total.jpeg_bytes_per_frame / total.bytes_per_frame:.1f}x more"
        )
    if total.cloud_only_accuracy is not None:
        gain = total.gain_captured
        lines.append(
            f"cloud only (its primary model on sampled frames) {pct(total.cloud_only_accuracy)}"
            + (
                f": escalating {pct(total.escalated_share)} of the frames captured "
                f"{pct(gain)} of the possible gain"
                if gain is not None
                else ": no better than the edge on these frames, so there is no gain to capture"
            )
        )
    timed = len(total.verdict_latencies_ms)
    lines.append(
        f"{total.verdicts} of {total.escalated} escalated cases answered "
        f"({total.busy} busy, {total.unanswered} unanswered); a verdict reached its device "
        f"within {_number(total.verdict_p95_ms, '{:,.0f} ms')} (p95 of the {timed} that "
        "arrived while the agents ran)"
    )
    lines.append(
        f"{devices} agents at {_number(total.fps and total.fps / devices, '{:.1f}')} fps each "
        f"on average, {_number(total.cpu_ms_per_frame, '{:,.0f} ms')} of CPU per frame"
    )
    return lines


def _number(value: float | None, form: str) -> str:
    return "–" if value is None else form.format(value)


def total_score(scores: list[DeviceScore]) -> DeviceScore:
    """The fleet's row: counts and latencies pooled, rates summed (fps) or frame-weighted."""
    total = DeviceScore("all devices")
    total.frames = sum(s.frames for s in scores)
    total.escalated = sum(s.escalated for s in scores)
    total.verdicts = sum(s.verdicts for s in scores)
    total.busy = sum(s.busy for s in scores)
    total.corrections = sum(s.corrections for s in scores)
    total.bytes_uplinked = sum(s.bytes_uplinked for s in scores)
    total.verdict_latencies_ms = [v for s in scores for v in s.verdict_latencies_ms]
    rated = [s.fps for s in scores if s.fps is not None]
    total.fps = sum(rated) if rated else None
    total.jpeg_bytes_per_frame = _frame_weighted(scores, "jpeg_bytes_per_frame")
    total.cpu_ms_per_frame = _frame_weighted(scores, "cpu_ms_per_frame")
    total.edge_accuracy = _frame_weighted(scores, "edge_accuracy")
    total.tracked_accuracy = _frame_weighted(scores, "tracked_accuracy")
    total.combined_accuracy = _frame_weighted(scores, "combined_accuracy")
    sampled = [s.cloud_only_accuracy for s in scores if s.cloud_only_accuracy is not None]
    # the same number of sampled frames per scene: a plain mean; only over the devices
    # that have one, which are those the edge columns count too (scenes with a truth)
    total.cloud_only_accuracy = sum(sampled) / len(sampled) if sampled else None
    return total


def _frame_weighted(scores: list[DeviceScore], name: str) -> float | None:
    known = [(getattr(s, name), s.frames) for s in scores if getattr(s, name) is not None]
    frames = sum(n for _, n in known)
    return sum(v * n for v, n in known) / frames if frames else None


def agent_pace(
    rows: list[dict[str, Any]], since: float, until: float, cpu_s: float | None
) -> tuple[float | None, float | None]:
    """Frames per second between two wall-clock times, from the agent's own frame rows,
    and CPU milliseconds per frame given the CPU the agent used over the same time."""
    count = sum(1 for r in rows if r.get("kind") == "frame" and since <= r.get("t", 0) < until)
    if until <= since or count == 0:
        return None, None
    return count / (until - since), None if cpu_s is None else cpu_s * 1000 / count


def jpeg_bytes_per_frame(video: Path, quality: int = 85, samples: int = 20) -> float | None:
    """What streaming the video would cost: mean JPEG size of frames spread over it.

    The baseline the uplink is compared with: a camera that sends every frame to the
    cloud (at the quality the edge uses for escalations) instead of only the hard ones.
    """
    import cv2

    capture = cv2.VideoCapture(str(video))
    try:
        count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) or samples
        sizes = []
        for index in range(0, count, max(1, count // samples)):
            capture.set(cv2.CAP_PROP_POS_FRAMES, index)
            ok, frame = capture.read()
            if not ok:
                break
            ok, data = cv2.imencode(".jpg", frame, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if ok:
                sizes.append(len(data))
    finally:
        capture.release()
    return sum(sizes) / len(sizes) if sizes else None
