"""`python -m tests.support.updater_process`: one host updater applying one request, in a
process of its own, so a test can kill it mid-update as a power cut would."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import docker
from edgefleet.edge.agent_container import AgentContainer
from edgefleet.edge.image_update import ImageUpdater, Probe, SignedRequest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engine", required=True, help="the Docker Engine's base URL")
    parser.add_argument("--compose", type=Path, required=True)
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--device", required=True)
    parser.add_argument("--key", required=True, help="device key, hex")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--request", type=Path, required=True)
    args = parser.parse_args(argv)
    base = f"http://127.0.0.1:{args.port}"
    updater = ImageUpdater(
        docker.DockerClient(base_url=args.engine, timeout=120),
        AgentContainer(args.compose),
        args.folder,
        args.device,
        bytes.fromhex(args.key),
        name=args.name,
        probe=Probe(ready_url=f"{base}/readyz", metrics_url=f"{base}/metrics"),
        deadline_s=600.0,
        min_free_bytes=1 << 20,
        poll_s=0.2,
    )
    status = updater.apply(SignedRequest.model_validate_json(args.request.read_text()))
    print(status.model_dump_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
