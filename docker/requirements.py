"""The requirements files, derived from pyproject.toml's dependencies and extras.

    python docker/requirements.py           rewrite them (`make requirements`)
    python docker/requirements.py --check   exit 1 if any is stale (the unit tests do this)

requirements-edge.txt and requirements-cloud.txt are `edgefleet[edge]` and
`edgefleet[cloud]` flattened, for installs that want the dependencies before the package
(the x86 images install them in their own cached layer). The Jetson list is the edge's
minus what JetPack ships. Never edit them by hand: edit pyproject.toml and regenerate.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip vendors the same parser
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    path: str
    extra: str
    why: str
    drop: dict[str, str] = field(default_factory=dict)  # name -> reason
    replace: dict[str, str] = field(default_factory=dict)  # name -> requirement


TARGETS = (
    Target("requirements-edge.txt", "edge", "the edge agent: pip install 'edgefleet[edge]'"),
    Target(
        "requirements-cloud.txt",
        "cloud",
        "the orchestrator and the fleet service: pip install 'edgefleet[cloud]'",
    ),
    Target(
        "docker/jetson/requirements-jetson.txt",
        "edge",
        "the Jetson image: edgefleet[edge] MINUS what JetPack ships as system packages,\n"
        "# which the venv sees through --system-site-packages",
        drop={
            "opencv-python-headless": "JetPack's OpenCV (built with GStreamer + nvv4l2decoder)",
            "nvidia-ml-py": "no NVML on Jetson: telemetry reads tegrastats instead",
            "onnxruntime": "onnxruntime-gpu from NVIDIA's Jetson index (the image's build ARG)",
        },
        # JetPack 6's cv2 is compiled against the numpy 1.x ABI.
        replace={"numpy": "numpy>=1.26,<2"},
    ),
)


def name_of(requirement: str) -> str:
    return re.split(r"[\[<>=!~ ;]", requirement.strip(), maxsplit=1)[0].lower()


def flatten(project: dict, extra: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """The base dependencies plus the extra's, with `edgefleet[...]` self-references expanded."""
    out: list[str] = list(project["dependencies"])
    for requirement in project["optional-dependencies"][extra]:
        own = re.fullmatch(r"edgefleet\[([\w,-]+)\]", requirement.replace(" ", ""))
        if own is None:
            out.append(requirement)
            continue
        for inner in own.group(1).split(","):
            if inner not in seen:
                out += flatten(project, inner, seen | {extra})
    unique: dict[str, str] = {}
    for requirement in out:
        unique.setdefault(name_of(requirement), requirement)
    return list(unique.values())


def render(target: Target, pyproject: dict) -> str:
    lines = [
        f"# {target.why}.",
        "# Generated from pyproject.toml by `make requirements` (docker/requirements.py); do not",
        "# edit: tests/unit/test_packaging_metadata.py fails when this file is stale.",
    ]
    for name, reason in target.drop.items():
        lines.append(f"#   {name}  -> {reason}")
    for requirement in flatten(pyproject["project"], target.extra):
        name = name_of(requirement)
        if name not in target.drop:
            lines.append(target.replace.get(name, requirement))
    return "\n".join(lines) + "\n"


def expected(root: Path = ROOT) -> dict[Path, str]:
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    return {root / t.path: render(t, pyproject) for t in TARGETS}


def main(argv: list[str]) -> int:
    stale = [p for p, text in expected().items() if not p.exists() or p.read_text() != text]
    if "--check" in argv:
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)} (run `make requirements`)")
        return 1 if stale else 0
    for path, text in expected().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
