"""`python -m edgefleet.demo.agent EDGE_YAML RESULTS`: an edge agent that keeps a record.

It is the real agent (`edgefleet.edge.agent.Agent`, the one `edgefleet edge run` starts) plus the
demo's local application: it writes every frame's result and every cloud verdict, through
the agent's public callbacks, to a JSONL file so the demo can score the edge against the
ground truth afterwards.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def run_agent_recording(
    config: Path,
    results: Path,
    stop: threading.Event | None = None,
    drain: threading.Event | None = None,
) -> None:
    """Run the agent until SIGTERM, appending `frame`, `escalated` and `verdict` rows.

    Every row comes from the agent's public callbacks: each frame's result, each case once
    it is safely in the outbox (the case carries its stream and frame index, which the
    cloud's answer is scored against later), and each verdict the cloud sends back.
    """
    from edgefleet.edge.agent import Agent
    from edgefleet.edge.settings import EdgeSettings
    from edgefleet.shared.config import load_settings
    from edgefleet.shared.logs import configure_logging
    from edgefleet.shared.messages import EscalationCase

    configure_logging("WARNING")
    settings = load_settings(EdgeSettings, config)
    agent = Agent(settings)
    lock = threading.Lock()
    out = results.open("a", buffering=1)

    def write(row: dict[str, Any]) -> None:
        # `t` (wall clock) times the verdicts (escalated → verdict) and the frame rate
        with lock:
            out.write(json.dumps({**row, "t": time.time()}) + "\n")

    def on_result(stream_id: str, frame_index: int, detections: list[Any]) -> None:
        texts = [d.text for d in detections if d.text]
        write({"kind": "frame", "stream_id": stream_id, "frame_index": frame_index, "texts": texts})

    def on_escalation(case: EscalationCase) -> None:
        write(
            {
                "kind": "escalated",
                "case_id": case.case_id,
                "stream_id": case.stream_id,
                "frame_index": case.frame_index,
            }
        )

    def on_verdict(matched: Any) -> None:
        edge = None if matched.edge_result is None else [d.text or "" for d in matched.edge_result]
        write(
            {
                "kind": "verdict",
                "case_id": matched.verdict.case_id,
                "stream_id": matched.stream_id,
                "edge_texts": edge,
                "cloud_texts": [d.text or "" for d in matched.verdict.result],
                "fallback_level": matched.verdict.fallback_level,
            }
        )

    def on_tracks(stream_id: str, frame_index: int, reports: list[Any]) -> None:
        # what the device reports for the frame: each live track's result (the cloud's
        # answer once it came) and the edge's own vote, to tell the two apart when scored
        write(
            {
                "kind": "tracks",
                "stream_id": stream_id,
                "frame_index": frame_index,
                "texts": [r.text for r in reports if r.text],
                "edge_texts": [r.edge_text for r in reports if r.edge_text],
            }
        )

    agent.on_result.append(on_result)
    agent.on_tracks.append(on_tracks)
    agent.add_escalation_callback(on_escalation)
    agent.add_verdict_callback(on_verdict)

    def on_drained() -> None:
        # the pipeline has finished: every case this agent will make is recorded above
        write({"kind": "drained"})

    try:
        run_until_stopped(agent, stop or threading.Event(), drain or threading.Event(), on_drained)
    finally:
        out.close()


def run_until_stopped(
    agent: Any, stop: threading.Event, drain: threading.Event, on_drained: Callable[[], None]
) -> None:
    """Run until `stop` (SIGTERM/SIGINT); `drain` (SIGUSR1) stops the capture only (no new
    frames, so no new cases; `on_drained` once the pipeline is empty) while the uplink
    keeps sending the outbox and receiving the answers: the demo drains this way before
    its ledger, so that every case can be answered on its device."""
    try:
        agent.start()
        drained = False
        while not stop.wait(0.5):
            if drain.is_set() and not drained:
                agent.stop_capture()
                drained = True
                on_drained()
    finally:
        agent.stop()


def main(argv: list[str]) -> None:
    # The signals first, before the slow imports: a SIGUSR1 that came before its handler
    # would end the process (its default action).
    stop, drain = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: drain.set())
    if len(argv) != 2:
        sys.exit("usage: python -m edgefleet.demo.agent EDGE_YAML RESULTS_JSONL")
    run_agent_recording(Path(argv[0]), Path(argv[1]), stop, drain)


if __name__ == "__main__":
    main(sys.argv[1:])
