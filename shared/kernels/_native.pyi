# The C extension built from src/module.c (the argument order of its PyArg_ParseTuple
# formats; the buffers are C-contiguous arrays); native.py validates them before each call.
import numpy as np

def preprocess(
    frame: np.ndarray,
    format: int,
    src_h: int,
    src_w: int,
    dst_h: int,
    dst_w: int,
    new_h: int,
    new_w: int,
    top: int,
    left: int,
    scale: object,
    bias: object,
    pad: object,
    out: np.ndarray,
    f16: int,
    impl: int,
    threads: int,
    /,
) -> None: ...
def quads_to_tensor(
    frame: np.ndarray,
    format: int,
    src_h: int,
    src_w: int,
    homographies: np.ndarray,
    taps: np.ndarray,
    widths: np.ndarray,
    slots: np.ndarray,
    out: np.ndarray,
    out_h: int,
    out_w: int,
    scale: object,
    bias: object,
    fill: float,
    threads: int,
    /,
) -> None: ...
def nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    class_ids: np.ndarray | None,
    iou_threshold: float,
    score_threshold: float,
    max_det: int,
    keep: np.ndarray,
    impl: int,
    /,
) -> int: ...
def keypoint_nms(
    keypoints: np.ndarray,
    scores: np.ndarray,
    areas: np.ndarray,
    sigmas: np.ndarray,
    k: int,
    oks_threshold: float,
    score_threshold: float,
    max_det: int,
    keep: np.ndarray,
    /,
) -> int: ...
def have_neon() -> bool: ...
