"""CTC greedy decoding for PP-OCR recognition with its character dictionary."""

from __future__ import annotations

import numpy as np


def ppocr_charset(characters: list[str]) -> list[str]:
    """PP-OCR's class list: blank at 0, the dictionary, then a space at the end."""
    return ["", *characters, " "]


def ctc_greedy(probs: np.ndarray, charset: list[str]) -> list[tuple[str, float]]:
    """(N, T, C) softmax outputs -> (text, mean confidence of the kept characters) each.

    Greedy: best class per step, merge repeats, drop blanks (class 0).
    """
    if probs.ndim != 3:
        raise ValueError(f"CTC expects (N, T, C) probabilities, got shape {probs.shape}")
    if probs.shape[2] != len(charset):
        raise ValueError(f"model has {probs.shape[2]} classes, dictionary {len(charset)}")
    idx = probs.argmax(axis=2)
    conf = probs.max(axis=2)
    out: list[tuple[str, float]] = []
    for row_idx, row_conf in zip(idx, conf, strict=True):
        keep = np.ones(row_idx.shape, dtype=bool)
        keep[1:] = row_idx[1:] != row_idx[:-1]
        keep &= row_idx != 0
        chars = row_idx[keep]
        text = "".join(charset[c] for c in chars)
        score = float(row_conf[keep].mean()) if chars.size else 0.0
        out.append((text, score))
    return out
