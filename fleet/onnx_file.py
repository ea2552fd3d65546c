"""Is this file an ONNX model? Checked before it enters the model store, so that an
operator who adds the wrong file hears it then, not from a device that cannot load it.

An ONNX file is a serialised `ModelProto`: its top-level protobuf fields parse to the end
of the file and include `ir_version` (field 1) and `graph` (field 7). Walking those few
fields needs no ONNX package and skips over the weights without reading them as numbers.
"""

from __future__ import annotations

from pathlib import Path

from edgefleet.shared.errors import InvalidInput

IR_VERSION, GRAPH = 1, 7
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if not byte & 0x80:
            return value, at


def _top_level_fields(data: bytes) -> set[int]:
    fields, at = set(), 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, at = _varint(data, at)
        elif wire == _BYTES:
            size, at = _varint(data, at)
            at += size
        elif wire in (_FIXED64, _FIXED32):
            at += 8 if wire == _FIXED64 else 4
        else:
            raise ValueError(f"wire type {wire}")
        if number == 0 or at > len(data):
            raise ValueError("not a protobuf message")
        fields.add(number)
    return fields


def check_onnx(path: Path) -> None:
    """InvalidInput unless `path` reads as an ONNX model."""
    try:
        fields = _top_level_fields(Path(path).read_bytes())
    except ValueError:
        fields = set()
    except OSError as exc:
        raise InvalidInput(f"cannot read model file {path}: {exc.strerror}") from None
    if not {IR_VERSION, GRAPH} <= fields:
        raise InvalidInput(
            f"{path} is not an ONNX model",
            hint="add the .onnx file the model was exported to (devices load ONNX models)",
        )
