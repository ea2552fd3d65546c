"""CUDA kernels: every .cu compiles for Orin (sm_87) and H200 (sm_90) with the installed
nvcc (runs in CI, no GPU needed); their code, run on the CPU through a shim
(tests/native/cuda_emulation.cpp), is bit-identical to the C kernels; on a GPU, the CUDA
backend matches the reference."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from edgefleet.shared.kernels import cuda_backend, reference

CU_FILES = sorted(cuda_backend.CUDA_DIR.glob("*.cu"))
ARCHS = ["sm_87", "sm_90"]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA toolkit)")


def nvcc(source, arch: str, tmp_path) -> bytes:
    out = tmp_path / f"{source.stem}-{arch}.cubin"
    cmd = ["nvcc", f"-arch={arch}", *cuda_backend.NVCC_OPTIONS, "-cubin", "-o", str(out)]
    proc = subprocess.run([*cmd, str(source)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out.read_bytes()


def test_there_are_kernels_to_build():
    assert {p.name for p in CU_FILES} >= {"preprocess.cu", "nms.cu"}


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("source", CU_FILES, ids=lambda p: p.name)
def test_cu_file_compiles(source, arch, tmp_path):
    cubin = nvcc(source, arch, tmp_path)
    assert cubin[:4] == b"\x7fELF"  # a cubin is an ELF image
    assert b"ef_" in cubin  # our extern "C" entry points are in it


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_launcher_translation_unit_compiles(arch, tmp_path):
    # The pycuda launcher compiles both files as one unit: that must build too.
    src = tmp_path / "combined.cu"
    src.write_text(cuda_backend.combined_source())
    cubin = nvcc(src, arch, tmp_path)
    for name in (
        b"ef_to_tensor_f32",
        b"ef_to_tensor_f16",
        b"ef_quads_to_tensor_f32",
        b"ef_nms_mask",
    ):
        assert name in cubin


ROOT = cuda_backend.CUDA_DIR.parents[2]


@pytest.mark.skipif(
    shutil.which("g++") is None or shutil.which("gcc") is None, reason="needs gcc and g++"
)
def test_cuda_kernel_code_emulated_on_cpu_matches_c_kernels(tmp_path):
    src = ROOT / "shared/kernels/src"
    flags = ["-O2", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror"]
    objects = []
    for name in ("preprocess", "preprocess_x86", "nms", "lines"):
        obj = tmp_path / f"{name}.o"
        c_flags = ["-std=c99", "-D_GNU_SOURCE", "-I", str(src)]
        cmd = ["gcc", *flags, *c_flags, "-c", str(src / f"{name}.c"), "-o", str(obj)]
        subprocess.run(cmd, check=True, timeout=120)
        objects.append(str(obj))
    exe = tmp_path / "emu"
    shim = ROOT / "tests/native/cuda_shim"
    cmd = ["g++", *flags, "-std=c++14", "-I", str(shim), "-I", str(src)]
    cmd += [str(ROOT / "tests/native/cuda_emulation.cpp"), *objects, "-pthread", "-o", str(exe)]
    subprocess.run(cmd, check=True, timeout=180)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert proc.stdout.rstrip().splitlines()[-1].startswith("OK ")


def test_backend_reports_why_it_is_unavailable():
    ok, why = cuda_backend.available()
    assert ok or why  # never silently unavailable


MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


@pytest.fixture
def cuda_active():
    pytest.importorskip("pycuda", reason="the CUDA backend needs pycuda")
    import edgefleet.shared.kernels as kernels

    assert kernels.use_backend("cuda") == "cuda"
    yield kernels
    kernels.use_backend(None)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("fmt", "h", "w", "size"),
    [
        ("nv12", 1080, 1920, (640, 640)),
        ("nv12", 2, 2, (5, 7)),
        ("i420", 720, 1280, (384, 640)),
        ("bgr", 1, 1, (8, 8)),
        ("rgb", 481, 641, (640, 640)),
        ("bgr", 999, 3, (320, 320)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cuda_preprocess_matches_reference(cuda_active, fmt, h, w, size, dtype):
    rng = np.random.default_rng(h * w)
    shape = (h * 3 // 2, w) if fmt in ("nv12", "i420") else (h, w, 3)
    frame = rng.integers(0, 256, shape, dtype=np.uint8)
    fn = getattr(cuda_active, f"{fmt}_to_tensor")
    got, t = fn(frame, size, MEAN, STD, 114, dtype)
    want, t_ref = reference.frame_to_tensor(frame, fmt, size, MEAN, STD, 114, dtype)
    assert t == t_ref and got.dtype == dtype and isinstance(got, np.ndarray)
    s = np.float32(STD)[None, :, None, None]
    diff = np.abs((got.astype(np.float32) - want.astype(np.float32)) * s).max()
    assert diff <= 1 / 255 + (1e-3 if dtype == np.float16 else 1e-6)


@pytest.mark.gpu
def test_cuda_preprocess_device_in_device_out(cuda_active):
    from pycuda import gpuarray

    frame = np.random.default_rng(1).integers(0, 256, (1620, 1920), dtype=np.uint8)
    dev_frame = gpuarray.to_gpu(frame)
    dev_out = gpuarray.empty((1, 3, 640, 640), np.float32)
    got, _ = cuda_active.nv12_to_tensor(dev_frame, (640, 640), MEAN, STD, out=dev_out)
    assert got is dev_out
    want, _ = reference.frame_to_tensor(frame, "nv12", (640, 640), MEAN, STD)
    assert np.abs((got.get() - want) * np.float32(STD)[None, :, None, None]).max() <= 1 / 255


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nv12", "i420", "bgr", "rgb"])
def test_cuda_quads_to_tensor_matches_reference(cuda_active, fmt):
    # the CUDA kernel maps coordinates in float (the CPU in double): within 0.05 of a level
    rng = np.random.default_rng(7)
    h, w = 720, 1280
    shape = (h * 3 // 2, w) if fmt in ("nv12", "i420") else (h, w, 3)
    frame = rng.integers(0, 256, shape, dtype=np.uint8)
    centre = rng.uniform(0, 1, (20, 2)) * (w, h)
    half = rng.uniform([4, 2], [400, 150], (20, 2))
    quads = np.stack(
        [centre - half, centre + half * (1, -1), centre + half, centre + half * (-1, 1)], 1
    ).astype(np.float32)
    sizes, _ = cuda_active.line_sizes(quads)
    widths = np.minimum(600, np.ceil(48 * sizes[:, 0] / sizes[:, 1])).astype(np.int32)
    slots = np.arange(20, dtype=np.int32)[::-1].copy()
    got = np.full((21, 3, 48, 600), 3.0, np.float32)
    want = got.copy()
    cuda_active.quads_to_tensor(frame, fmt, quads, widths, slots, got, MEAN, STD, 0.0, "bgr")
    reference.quads_to_tensor(frame, fmt, quads, widths, slots, want, MEAN, STD, 0.0, "bgr")
    s = np.float32(STD[::-1])[None, :, None, None]
    assert np.abs((got - want) * s).max() <= 0.05 / 255


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 64, 65, 1000, 10000])
def test_cuda_nms_matches_reference(cuda_active, n):
    rng = np.random.default_rng(n)
    xy = rng.uniform(0, 1000, (n, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(10, 100, (n, 2))], 1).astype(np.float32)
    scores = (rng.integers(0, 50, n) / 50).astype(np.float32)  # ties on purpose
    cls = rng.integers(0, 3, n)
    for kwargs in ({"max_det": n}, {"class_ids": cls, "max_det": 300, "score_threshold": 0.2}):
        np.testing.assert_array_equal(
            cuda_active.nms(boxes, scores, 0.5, **kwargs),
            reference.nms(boxes, scores, 0.5, **kwargs),
        )
