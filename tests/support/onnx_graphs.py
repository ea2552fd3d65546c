"""Tiny ONNX graphs with known outputs: a YOLO head's candidates without a trained model."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

# canvas 64x64; candidates: (cx, cy, w, h, class scores)
CANDIDATES = [
    (20, 30, 10, 8, [0.9, 0.1, 0.0]),  # kept: class 0
    (21, 30, 10, 8, [0.8, 0.0, 0.0]),  # same class, overlaps the first: suppressed
    (21, 30, 10, 8, [0.0, 0.7, 0.0]),  # other class at the same place: kept (class-aware)
    (50, 40, 6, 6, [0.1, 0.1, 0.2]),  # below the 0.25 threshold: dropped
]


def constant_model(output: np.ndarray, input_shape: list) -> bytes:
    """A graph whose output is `output` (plus 0 * mean(input), so it depends on the input)."""
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["m"], keepdims=0),
        helper.make_node("Mul", ["m", "zero"], ["z"]),
        helper.make_node("Add", ["const", "z"], ["output0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, input_shape)],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, list(output.shape))],
        initializer=[
            helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
            helper.make_tensor(
                "const", TensorProto.FLOAT, list(output.shape), output.flatten().tolist()
            ),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


def v8_output() -> np.ndarray:
    cols = [[cx, cy, w, h, *cls] for cx, cy, w, h, cls in CANDIDATES]
    return np.array(cols, np.float32).T[None]  # (1, 4 + C, N)


def v5_output() -> np.ndarray:
    # objectness 1.0 except the first row split as obj 0.9 * class 1.0
    rows = [[cx, cy, w, h, 1.0, *cls] for cx, cy, w, h, cls in CANDIDATES]
    rows[0][4], rows[0][5] = 0.9, 1.0
    return np.array(rows, np.float32)[None]  # (1, N, 5 + C)
