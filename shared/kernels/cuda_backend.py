"""The CUDA backend: the `.cu` kernels in shared/kernels/cuda launched through pycuda.

Pre-processing runs on device buffers: a frame already on the GPU (a pycuda GPUArray,
or anything with `__cuda_array_interface__` such as a CuPy array or a decoder surface)
is read in place and the tensor is written to a device buffer, so the frame never
visits host memory. A host numpy frame is copied up and the tensor copied back, so the
public API's contract (numpy in, numpy out) holds on every backend.

NMS builds the suppression bitmask of the score-sorted candidates on the GPU and runs
the short greedy pass over it on the host; OKS pose NMS (tens of poses) stays on the
native C code. pycuda is imported only when this backend is probed. The kernels are the
fat binaries the image built (`docker/build-cuda-kernels.sh`, loaded with cuModuleLoad)
where they fit the GPU (`fatbins.choose_fatbins`), so a Jetson does not compile them at
every start; elsewhere they are compiled from source, with the reason logged.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

import numpy as np

from edgefleet.shared.errors import InvalidInput
from edgefleet.shared.imaging.letterbox import LetterboxTransform
from edgefleet.shared.kernels import checks
from edgefleet.shared.kernels.fatbins import choose_fatbins

log = logging.getLogger(__name__)

CUDA_DIR = Path(__file__).with_name("cuda")
NVCC_OPTIONS = ["--fmad=false", "-std=c++14"]
FORMAT_CODES = {"nv12": 0, "i420": 1, "bgr": 2, "rgb": 3}
BGR_OUT = 16  # or'ed into the format code: planes out in B, G, R order (preprocess.cu)
MAX_NMS_BOXES = 40_000  # the n x n/64 bitmask stays under ~200 MB
BLOCK = (32, 8, 1)
# each kernel's source file: the fat binary it is loaded from
KERNEL_SOURCES = {
    "ef_to_tensor_f32": "preprocess",
    "ef_to_tensor_f16": "preprocess",
    "ef_quads_to_tensor_f32": "preprocess",
    "ef_nms_mask": "nms",
}


def available() -> tuple[bool, str]:
    """(True, '') when pycuda imports and sees a CUDA device; else (False, why not)."""
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        return False, f"pycuda not importable ({exc})"
    try:
        cuda.init()
        if cuda.Device.count() < 1:
            return False, "no CUDA device"
    except Exception as exc:  # pycuda raises its own LogicError/RuntimeError kinds
        return False, f"CUDA driver not usable ({exc})"
    return True, ""


def combined_source() -> str:
    """Both .cu files as one translation unit, as the launcher compiles them."""
    parts = [(CUDA_DIR / name).read_text() for name in ("preprocess.cu", "nms.cu")]
    return "\n".join(parts)


@functools.cache
def _modules() -> dict[str, Any]:
    """The kernels' modules by source, in the primary context: the built fat binaries
    where they fit this GPU, else the sources compiled (nvcc, cached by pycuda)."""
    import pycuda.autoprimaryctx  # noqa: F401  shares the context with TensorRT/ORT
    import pycuda.driver as cuda

    sources = sorted(set(KERNEL_SOURCES.values()))
    capability = cuda.Context.get_device().compute_capability()
    choice = choose_fatbins(CUDA_DIR, capability, sources, NVCC_OPTIONS)
    if choice.usable:
        try:
            modules = {name: cuda.module_from_file(str(p)) for name, p in choice.files.items()}
        except cuda.Error as exc:
            why = f"the built fat binaries did not load ({exc})"
        else:
            log.info("CUDA kernels loaded from fat binaries: %s", choice.reason)
            return modules
    else:
        why = choice.reason
    log.info("CUDA kernels compiled from source: %s", why)
    from pycuda.compiler import SourceModule

    module = SourceModule(combined_source(), options=NVCC_OPTIONS, no_extern_c=True)
    return dict.fromkeys(sources, module)


def _kernel(name: str) -> Any:
    return _modules()[KERNEL_SOURCES[name]].get_function(name)


def _device_frame(frame: object, fmt: str):
    """(device pointer, the object holding the memory, (h, w)) for a host or device frame."""
    from pycuda import gpuarray

    if isinstance(frame, np.ndarray):
        h, w = checks.frame_hw(frame, fmt)
        dev = gpuarray.to_gpu(frame)
        return int(dev.gpudata), dev, (h, w)
    if isinstance(frame, gpuarray.GPUArray):
        hw = checks.frame_geometry(frame.shape, frame.dtype, frame.flags.c_contiguous, fmt)
        return int(frame.gpudata), frame, hw
    iface = getattr(frame, "__cuda_array_interface__", None)
    if iface is None:
        raise InvalidInput(f"frame must be a numpy or CUDA device array, got {type(frame)}")
    shape, dtype = tuple(iface["shape"]), np.dtype(iface["typestr"])
    strides = iface.get("strides")
    contiguous = strides is None or tuple(strides) == np.empty(shape, dtype).strides
    hw = checks.frame_geometry(shape, dtype, contiguous, fmt)
    return int(iface["data"][0]), frame, hw


def _out_pointer(out) -> np.uintp:
    if hasattr(out, "gpudata"):
        return np.uintp(int(out.gpudata))
    return np.uintp(out.__cuda_array_interface__["data"][0])


def frame_to_tensor(
    frame,
    fmt: str,
    size,
    mean=(0.0, 0.0, 0.0),
    std=(1.0, 1.0, 1.0),
    pad=114,
    dtype=np.float32,
    out=None,
    channels="rgb",
    stretch=False,
):
    """Fused pre-processing on the GPU.

    Returns `out` when given (numpy: copied back; device array: written in place), else
    numpy for a numpy frame and a pycuda GPUArray for a device frame.
    """
    from pycuda import gpuarray

    hw, norm, dt = checks.tensor_args(size, mean, std, pad, dtype)
    swap = checks.channel_order(channels)
    ptr, holder, (h, w) = _device_frame(frame, fmt)  # holder keeps the memory alive
    t = (LetterboxTransform.stretch if stretch else LetterboxTransform.plan)((h, w), hw)
    if out is None or isinstance(out, np.ndarray):
        host = None if out is None else checks.out_buffer(out, hw, dt)
        dev_out = gpuarray.empty((1, 3, *hw), dt)
    else:
        if tuple(out.shape) != (1, 3, *hw) or np.dtype(out.dtype) != dt:
            raise InvalidInput(f"out must be {dt} of shape {(1, 3, *hw)}")
        host, dev_out = None, out
    scale, bias, padv = norm.fixed_point_affine()
    kernel = _kernel("ef_to_tensor_f16" if dt == np.float16 else "ef_to_tensor_f32")
    pitch = w * 3 if fmt in ("bgr", "rgb") else w
    grid = ((hw[1] + BLOCK[0] - 1) // BLOCK[0], (hw[0] + BLOCK[1] - 1) // BLOCK[1], 1)
    code = FORMAT_CODES[fmt] | (BGR_OUT if swap else 0)
    ints = (code, h, w, pitch, t.dst_h, t.dst_w, t.new_h, t.new_w)
    kernel(
        np.uintp(ptr),
        _out_pointer(dev_out),
        *(np.int32(v) for v in (*ints, t.pad_top, t.pad_left)),
        _float3(scale),
        _float3(bias),
        _float3(padv),
        block=BLOCK,
        grid=grid,
    )
    if host is not None:
        dev_out.get(ary=host)
        return host, t
    if isinstance(frame, np.ndarray) and out is None:
        result = dev_out.get()
        del holder  # the uploaded frame, freed only after the kernel's result came back
        return result, t
    return dev_out, t


MAX_GRID_Z = 65535  # quads per launch (gridDim.z)


def quads_to_tensor(
    frame,
    fmt: str,
    quads: np.ndarray,
    widths: np.ndarray,
    slots: np.ndarray,
    out: np.ndarray,
    mean=(0.0, 0.0, 0.0),
    std=(1.0, 1.0, 1.0),
    fill: float = 0.0,
    channels: str = "rgb",
) -> np.ndarray:
    """Text-line quads sampled into slots of `out` on the GPU (a host or device frame; `out`
    is the host batch the recogniser reads, written back after the kernel)."""
    from pycuda import gpuarray

    ptr, holder, (h, w) = _device_frame(frame, fmt)  # holder keeps the memory alive
    a = checks.line_args((h, w), quads, widths, slots, out, mean, std, fill, channels)
    n = len(a.widths)
    if n == 0:
        return a.out
    dev_out = gpuarray.to_gpu(a.out)  # slots not written keep the caller's values
    hom = gpuarray.to_gpu(a.homographies.astype(np.float32))
    taps, wid, slot = (gpuarray.to_gpu(v) for v in (a.taps, a.widths, a.slots))
    kernel = _kernel("ef_quads_to_tensor_f32")
    pitch = w * 3 if fmt in ("bgr", "rgb") else w
    code = FORMAT_CODES[fmt] | (BGR_OUT if a.bgr_out else 0)
    out_h, out_w = a.out.shape[2], a.out.shape[3]
    for first in range(0, n, MAX_GRID_Z):
        count = min(MAX_GRID_Z, n - first)
        grid = ((out_w + BLOCK[0] - 1) // BLOCK[0], (out_h + BLOCK[1] - 1) // BLOCK[1], count)
        kernel(
            np.uintp(ptr),
            np.uintp(int(hom.gpudata) + first * 9 * 4),
            np.uintp(int(taps.gpudata) + first * 2 * 4),
            np.uintp(int(wid.gpudata) + first * 4),
            np.uintp(int(slot.gpudata) + first * 4),
            np.uintp(int(dev_out.gpudata)),
            *(np.int32(v) for v in (code, h, w, pitch, count, out_h, out_w)),
            np.float32(a.fill),
            _float3(a.scale),
            _float3(a.bias),
            block=BLOCK,
            grid=grid,
        )
    dev_out.get(ary=a.out)
    del holder  # the uploaded frame, freed only after the result came back
    return a.out


def _float3(values) -> np.void:
    f3 = np.dtype([("x", np.float32), ("y", np.float32), ("z", np.float32)])
    return np.array([tuple(values)], f3)[0]


def nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    score_threshold: float = 0.0,
    class_ids: np.ndarray | None = None,
    max_det: int = 300,
) -> np.ndarray:
    """Greedy NMS: bitmask on the GPU, greedy pass on the host; same result as the CPU."""
    from pycuda import gpuarray

    b, s = _host(boxes), _host(scores)
    c = None if class_ids is None else _host(class_ids)
    a = checks.nms_args(b, s, iou_threshold, score_threshold, c, max_det)
    cand = np.flatnonzero(a.scores >= np.float32(a.score_threshold))
    order = cand[np.argsort(-a.scores[cand], kind="stable")]
    n = len(order)
    if n == 0 or a.max_det == 0:
        return np.empty(0, np.int64)
    if n > MAX_NMS_BOXES:
        from edgefleet.shared.kernels import native

        return native.nms(
            a.boxes, a.scores, a.iou_threshold, a.score_threshold, a.class_ids, a.max_det
        )
    sorted_boxes = gpuarray.to_gpu(np.ascontiguousarray(a.boxes[order]))
    cls = np.zeros(n, np.int32) if a.class_ids is None else a.class_ids[order]
    dev_cls = gpuarray.to_gpu(np.ascontiguousarray(cls, np.int32))
    words = (n + 63) // 64
    mask = gpuarray.zeros((n, words), np.uint64)
    _kernel("ef_nms_mask")(
        sorted_boxes.gpudata,
        dev_cls.gpudata,
        np.int32(n),
        np.float32(a.iou_threshold),
        mask.gpudata,
        block=(64, 1, 1),
        grid=(words, words, 1),
    )
    rows = mask.get()
    removed = np.zeros(words, np.uint64)
    kept: list[int] = []
    for i in range(n):
        if removed[i // 64] >> np.uint64(i % 64) & np.uint64(1):
            continue
        kept.append(int(order[i]))
        if len(kept) == a.max_det:
            break
        removed |= rows[i]
    return np.asarray(kept, np.int64)


def keypoint_nms(
    keypoints, scores, oks_threshold=0.5, score_threshold=0.0, boxes=None, sigmas=None, max_det=300
):
    """OKS NMS handles tens of poses: the native C code does it (no GPU launch pays)."""
    from edgefleet.shared.kernels import native

    return native.keypoint_nms(
        _host(keypoints),
        _host(scores),
        oks_threshold,
        score_threshold,
        None if boxes is None else _host(boxes),
        sigmas,
        max_det,
    )


def _host(arr):
    """A numpy view of an input: device arrays are copied down (NMS inputs are small)."""
    if isinstance(arr, np.ndarray) or arr is None:
        return arr
    if hasattr(arr, "get"):
        return arr.get()
    raise InvalidInput(f"expected a numpy or CUDA device array, got {type(arr).__name__}")
