"""PP-OCR angle classifier output: is this text line upside down?"""

from __future__ import annotations

import numpy as np


def angle_flips(probs: np.ndarray, labels: list[str], threshold: float) -> list[bool]:
    """(N, 2) probabilities -> True where '180' wins with at least `threshold`."""
    if probs.ndim != 2 or probs.shape[1] != len(labels):
        raise ValueError(f"angle classifier output {probs.shape} does not fit labels {labels}")
    flip_col = labels.index("180")
    best = probs.argmax(axis=1)
    return [
        bool(b == flip_col and p[flip_col] >= threshold) for b, p in zip(best, probs, strict=True)
    ]
