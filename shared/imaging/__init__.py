"""Input adaptation: decode, colour, letterbox, normalise.

Everything a frame or an uploaded image goes through before the executor: untrusted
bytes are decoded under limits (`decode_image`, `decode_file`), camera formats become
RGB (`nv12_to_rgb`, ...), and `letterbox` + `to_tensor` make the model input.
`preprocess_reference` is the definition the fused kernels are tested against.
"""

from edgefleet.shared.imaging.colour import (
    bgr_to_rgb,
    i420_to_rgb,
    nv12_to_rgb,
    nv12_to_rgb_formula,
    yuv_to_rgb_bt601,
    yuyv_to_rgb,
)
from edgefleet.shared.imaging.decode import (
    ImageLimits,
    check_limits,
    decode_file,
    decode_image,
    encode_jpeg,
    encode_png,
    image_size,
    sniff_format,
)
from edgefleet.shared.imaging.letterbox import LetterboxTransform, letterbox
from edgefleet.shared.imaging.tensor import preprocess_reference, to_tensor

__all__ = [
    "ImageLimits",
    "LetterboxTransform",
    "bgr_to_rgb",
    "check_limits",
    "decode_file",
    "decode_image",
    "encode_jpeg",
    "encode_png",
    "i420_to_rgb",
    "image_size",
    "letterbox",
    "nv12_to_rgb",
    "nv12_to_rgb_formula",
    "preprocess_reference",
    "sniff_format",
    "to_tensor",
    "yuv_to_rgb_bt601",
    "yuyv_to_rgb",
]
