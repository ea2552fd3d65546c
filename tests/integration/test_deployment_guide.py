"""docs/deployment.md works as written: its `bash` blocks, run in order in an empty folder
(real Mosquitto, `cloud serve` and `edge run` on free ports), end with the device online
in the guide's last command."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from edgefleet.bench.mosquitto import free_port, mosquitto_binary
from tests.support.edge import write_video
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "deployment.md"


def guide_blocks() -> list[str]:
    """The guide's `bash` blocks, in order (unmarked blocks are not run: install, Docker)."""
    return re.findall(r"^```bash\n(.*?)^```$", GUIDE.read_text(), re.M | re.S)


def _env() -> dict[str, str]:
    path = os.pathsep.join(
        [str(Path(sys.executable).parent), str(Path(mosquitto_binary()).parent), os.environ["PATH"]]
    )
    env = {
        **os.environ,
        "PATH": path,
        "PYTHONPATH": str(REPO),
        "BROKER_PORT": str(free_port()),
        "CLOUD_PORT": str(free_port()),
        "EDGEFLEET_CLOUD_MODELS__PRELOAD": "false",  # the test needs no cloud model loaded
        "EDGEFLEET_EDGE_HEALTH__PORT": "0",
    }
    if os.geteuid() == 0:  # as the guide says: the broker must read the folder it drops to
        env["EDGEFLEET_FLEET_BROKER_USER"] = "root"
    return env


def test_the_guide_has_setup_blocks_and_a_check() -> None:
    blocks = guide_blocks()
    assert len(blocks) >= 6 and "fleet status" in blocks[-1]


@pytest.mark.slow
def test_the_deployment_guide_brings_a_host_agent_online(tmp_path: Path) -> None:
    # given an empty folder with a video, and the guide's commands
    write_video(tmp_path / "gate.mp4", [f"GATE {i:02d}" for i in range(20)], fps=10)
    *setup, check = guide_blocks()
    env = _env()
    # when its setup blocks run in order (the broker, cloud and agent left running)
    script = subprocess.Popen(
        ["bash", "-euc", "\n".join(setup)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its background jobs share its process group
    )
    try:
        out, _ = script.communicate(timeout=300)
        assert script.returncode == 0, out.decode()

        def logs() -> str:
            return "\n".join(
                f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp_path.glob("*.log"))
            )

        def status() -> str:
            done = subprocess.run(
                ["bash", "-euc", check], cwd=tmp_path, env=env, capture_output=True, text=True
            )
            return done.stdout + done.stderr

        # then the guide's last command shows the device online
        eventually(lambda: re.search(r"cam-01 .*● online", status()), 180, detail=logs)
        # and the cloud used the broker credentials the guide gave it
        assert "not authorised" not in logs().lower()
    finally:
        os.killpg(script.pid, signal.SIGTERM)
        script.wait(30)
