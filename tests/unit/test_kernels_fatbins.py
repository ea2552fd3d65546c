"""The CUDA kernels' fat binaries: the image's build script compiles them here with the
installed nvcc, and which one a GPU loads (or why none) is decided on the CPU from what it
wrote; loading them is a GPU test."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from edgefleet.shared.kernels import cuda_backend
from edgefleet.shared.kernels.fatbins import MANIFEST, choose_fatbins

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docker" / "build-cuda-kernels.sh"
SOURCES = sorted(set(cuda_backend.KERNEL_SOURCES.values()))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kernels built by the images' own script, for Orin and Hopper (PTX for 9.0)."""
    if shutil.which("nvcc") is None:
        pytest.fail("nvcc (the CUDA toolkit) is needed to build the kernels: install it")
    out = tmp_path_factory.mktemp("fatbins")
    result = subprocess.run(
        ["bash", str(SCRIPT), "87;90", str(cuda_backend.CUDA_DIR), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_the_script_passes_the_kernels_own_nvcc_options():
    [options] = re.findall(r"(?m)^options=\((.*)\)$", SCRIPT.read_text())
    assert options.split() == cuda_backend.NVCC_OPTIONS
    assert sorted(p.stem for p in cuda_backend.CUDA_DIR.glob("*.cu")) == SOURCES


def test_the_build_writes_a_fat_binary_per_source_and_their_manifest(built: Path):
    assert sorted(p.stem for p in built.glob("*.fatbin")) == SOURCES
    manifest = json.loads((built / MANIFEST).read_text())
    assert manifest == {"sass": [87, 90], "ptx": 90, "options": cuda_backend.NVCC_OPTIONS}
    for fatbin in built.glob("*.fatbin"):
        data = fatbin.read_bytes()
        assert data[:4] == bytes.fromhex("50ed55ba")  # the fat binary's magic, little-endian
        if fatbin.stem == "nms":
            assert b"ef_nms_mask" in data


@pytest.mark.parametrize(
    ("capability", "how"),
    [
        ((8, 7), "sm_87 runs the built sm_87 code"),  # Orin
        ((9, 0), "sm_90 runs the built sm_90 code"),  # H100, H200
        ((8, 9), "sm_89 runs the built sm_87 code"),  # same major, newer minor: SASS runs
        ((10, 0), "sm_100 runs the built compute_90 (PTX compiled by the driver) code"),
    ],
)
def test_a_gpu_loads_the_fat_binaries_that_fit_it(built: Path, capability, how: str):
    choice = choose_fatbins(built, capability, SOURCES, cuda_backend.NVCC_OPTIONS)
    assert choice.usable and choice.reason == how
    assert choice.files == {name: built / f"{name}.fatbin" for name in SOURCES}


def test_a_gpu_the_fat_binaries_do_not_fit_compiles_and_says_why(built: Path):
    choice = choose_fatbins(built, (7, 5), SOURCES, cuda_backend.NVCC_OPTIONS)
    assert not choice.usable
    assert (
        choice.reason
        == "no fat binary code for this GPU (sm_75); built for sm_87, sm_90, compute_90"
    )


def test_a_missing_or_foreign_build_is_compiled_instead_with_the_reason(
    built: Path, tmp_path: Path
):
    nothing = choose_fatbins(tmp_path, (8, 7), SOURCES, cuda_backend.NVCC_OPTIONS)
    assert not nothing.usable and "fatbins.json is absent" in nothing.reason
    # a source's fat binary gone (a partial copy)
    partial = tmp_path / "partial"
    shutil.copytree(built, partial)
    (partial / "nms.fatbin").unlink()
    gone = choose_fatbins(partial, (8, 7), SOURCES, cuda_backend.NVCC_OPTIONS)
    assert not gone.usable and gone.reason == f"missing fat binaries: {partial / 'nms.fatbin'}"
    # built with other options (fused multiply-adds change results): not these kernels
    other = choose_fatbins(built, (8, 7), SOURCES, ["-std=c++14"])
    assert not other.usable and "the kernels need ['-std=c++14']" in other.reason
    (partial / MANIFEST).write_text("{not json")
    assert "is unreadable" in choose_fatbins(partial, (8, 7), SOURCES, []).reason


@pytest.mark.gpu
def test_on_a_gpu_the_built_fat_binaries_are_what_the_kernels_run(
    built: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    pytest.importorskip("pycuda", reason="the CUDA backend needs pycuda")
    import pycuda.autoprimaryctx  # noqa: F401
    import pycuda.driver as cuda

    major, minor = cuda.Context.get_device().compute_capability()
    folder = built
    fits = choose_fatbins(built, (major, minor), SOURCES, cuda_backend.NVCC_OPTIONS)
    if not fits.usable:  # a GPU of another family than the two built above: build for it
        folder = built.parent / f"sm{major}{minor}"
        subprocess.run(
            ["bash", str(SCRIPT), f"{major}{minor}", str(cuda_backend.CUDA_DIR), str(folder)],
            check=True,
            timeout=600,
        )
    monkeypatch.setattr(cuda_backend, "CUDA_DIR", folder)
    cuda_backend._modules.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=cuda_backend.__name__):
            kernel = cuda_backend._kernel("ef_nms_mask")
        assert kernel is not None
        assert "CUDA kernels loaded from fat binaries" in caplog.text, caplog.text
    finally:
        cuda_backend._modules.cache_clear()
