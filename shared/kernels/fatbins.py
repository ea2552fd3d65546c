"""Which built CUDA fat binary a GPU can load, decided without a GPU.

`docker/build-cuda-kernels.sh` compiles each `cuda/*.cu` at image build into
`<name>.fatbin` beside the package, with SASS for a list of architectures and PTX for the
last, and records them in `fatbins.json`. Loading those (cuModuleLoad) spares a Jetson
compiling the kernels at every start; what a GPU can load follows CUDA's rules: SASS
built for sm_XY runs on compute capability X.Z with Z >= Y, and PTX for compute_XY is
compiled by the driver for any capability >= X.Y. Where none fits, or a file is missing,
the reason says so and the kernels are compiled from source instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "fatbins.json"


@dataclass(frozen=True)
class FatbinChoice:
    """The fat binaries to load, by source name (empty: compile), and why (or how) they fit."""

    files: dict[str, Path]
    reason: str

    @property
    def usable(self) -> bool:
        return bool(self.files)


def _arch(text: str | int) -> tuple[int, int]:
    value = int(text)
    return value // 10, value % 10


def _fits(capability: tuple[int, int], sass: list[int], ptx: int | None) -> str | None:
    """How a GPU of `capability` runs these kernels ('sm_87' SASS, 'compute_90' PTX), or None."""
    major, minor = capability
    native = [a for a in sass if _arch(a)[0] == major and _arch(a)[1] <= minor]
    if native:
        return f"sm_{max(native)}"
    if ptx is not None and _arch(ptx) <= capability:
        return f"compute_{ptx} (PTX compiled by the driver)"
    return None


def choose_fatbins(
    folder: Path, capability: tuple[int, int], sources: list[str], options: list[str]
) -> FatbinChoice:
    """The fat binaries in `folder` for `sources` (stems of the .cu files) that a GPU of
    `capability` loads, built with the nvcc `options` the kernels need; else why not."""
    gpu = f"sm_{capability[0]}{capability[1]}"
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        sass = [int(a) for a in manifest["sass"]]
        ptx = int(manifest["ptx"]) if manifest.get("ptx") is not None else None
        built_with = list(manifest["options"])
    except FileNotFoundError:
        return FatbinChoice({}, f"no built kernels ({folder / MANIFEST} is absent)")
    except (ValueError, KeyError, TypeError) as exc:
        return FatbinChoice({}, f"{folder / MANIFEST} is unreadable ({type(exc).__name__})")
    if built_with != options:
        return FatbinChoice(
            {}, f"the fat binaries were built with {built_with}, the kernels need {options}"
        )
    how = _fits(capability, sass, ptx)
    if how is None:
        built = ", ".join(f"sm_{a}" for a in sass) + (f", compute_{ptx}" if ptx else "")
        return FatbinChoice({}, f"no fat binary code for this GPU ({gpu}); built for {built}")
    files = {name: folder / f"{name}.fatbin" for name in sources}
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        return FatbinChoice({}, f"missing fat binaries: {', '.join(missing)}")
    return FatbinChoice(files, f"{gpu} runs the built {how} code")
