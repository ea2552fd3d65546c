"""Scoring and display for `edgefleet demo`: live fleet table and the final report.

The agents record each frame's reading and each cloud verdict (edgefleet.demo_agent);
the cloud's case records give the frame each verdict answers. Accuracy is the OCR
character accuracy of edgefleet.demo_video against the rendered ground truth.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from edgefleet.bench.scoring import best_match_accuracy, normalise_text
from edgefleet.demo_stack import Device


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
    corrections: int = 0
    edge_accuracy: float | None = None
    combined_accuracy: float | None = None
    bytes_uplinked: int = 0
    jpeg_bytes_per_frame: float | None = None

    @property
    def escalated_share(self) -> float | None:
        return self.escalated / self.frames if self.frames else None

    @property
    def bytes_per_frame(self) -> float | None:
        return self.bytes_uplinked / self.frames if self.frames else None


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

    `cases` maps case_id to the cloud's record of it (with its verdict). A frame that was
    escalated and got a real answer from the cloud (not the `busy` level) is scored on
    that answer in the edge+cloud column; every other frame on the edge's own reading.
    """
    rows = read_jsonl(device.results)
    frames = [r for r in rows if r.get("kind") == "frame"]
    escalated = [r for r in rows if r.get("kind") == "escalated"]
    score = DeviceScore(device.device_id, frames=len(frames), bytes_uplinked=uplink_bytes)
    score.escalated = len(escalated)
    corrected: dict[tuple[str, int], list[str]] = {}
    for case in escalated:
        answer = cloud_answer(cases.get(case["case_id"]))
        if answer is None:
            continue
        score.verdicts += 1
        score.corrections += is_correction(answer)
        if answer["fallback_level"] < 3 and case.get("frame_index") is not None:
            corrected[(case["stream_id"], int(case["frame_index"]))] = answer["cloud_texts"]
    if device.truth is None or not frames:
        return score
    edge_total = combined_total = 0.0
    for frame in frames:
        truth = device.truth.texts(int(frame["frame_index"]))
        edge_total += best_match_accuracy(frame["texts"], truth)
        key = (frame["stream_id"], int(frame["frame_index"]))
        combined_total += best_match_accuracy(corrected.get(key, frame["texts"]), truth)
    score.edge_accuracy = edge_total / len(frames)
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


def report_table(scores: list[DeviceScore]) -> Table:
    table = Table(title="final report", title_justify="left")
    for column in (
        "device",
        "frames",
        "edge-only accuracy",
        "edge+cloud accuracy",
        "escalated",
        "cloud corrections",
        "bytes uplinked / frame",
        "every frame as JPEG",
    ):
        table.add_column(column, justify="left" if column == "device" else "right")
    for s in [*scores, total_score(scores)]:
        table.add_row(
            s.device_id,
            str(s.frames),
            pct(s.edge_accuracy),
            pct(s.combined_accuracy),
            pct(s.escalated_share),
            str(s.corrections),
            "–" if s.bytes_per_frame is None else f"{s.bytes_per_frame:,.0f}",
            "–" if s.jpeg_bytes_per_frame is None else f"{s.jpeg_bytes_per_frame:,.0f}",
        )
    return table


def total_score(scores: list[DeviceScore]) -> DeviceScore:
    total = DeviceScore("all devices")
    total.frames = sum(s.frames for s in scores)
    total.escalated = sum(s.escalated for s in scores)
    total.verdicts = sum(s.verdicts for s in scores)
    total.corrections = sum(s.corrections for s in scores)
    total.bytes_uplinked = sum(s.bytes_uplinked for s in scores)
    sized = [
        (s.jpeg_bytes_per_frame, s.frames)
        for s in scores
        if s.jpeg_bytes_per_frame is not None and s.frames
    ]
    if sized:
        total.jpeg_bytes_per_frame = sum(b * n for b, n in sized) / sum(n for _, n in sized)
    scored = [  # both accuracies are set together (score_device)
        (s.edge_accuracy, s.combined_accuracy, s.frames)
        for s in scores
        if s.edge_accuracy is not None and s.combined_accuracy is not None and s.frames
    ]
    frames = sum(n for _, _, n in scored)
    if frames:
        total.edge_accuracy = sum(edge * n for edge, _, n in scored) / frames
        total.combined_accuracy = sum(combined * n for _, combined, n in scored) / frames
    return total


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
