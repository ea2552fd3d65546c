"""CTC greedy decoding for PP-OCR recognition with its character dictionary."""

from __future__ import annotations

import numpy as np

from edgefleet.shared.models.outputs.kinds import Kinds, settle_kinds


def ppocr_charset(characters: list[str]) -> list[str]:
    """PP-OCR's class list: blank at 0, the dictionary, then a space at the end."""
    return ["", *characters, " "]


def ctc_greedy(
    probs: np.ndarray, charset: list[str], kinds: Kinds | None = None, floor: float = 1.0
) -> list[tuple[str, float]]:
    """(N, T, C) softmax outputs -> (text, mean confidence of the kept characters) each.

    Greedy: best class per step, merge repeats, drop blanks (class 0). One pass over the
    (large: thousands of classes) probabilities for the argmax; the rest is on (N, T).
    With `kinds` (the charset's), each text's words are settled (`settle_kinds`): a
    character of the other kind than its word becomes the likeliest of the word's kind at
    its step where that has at least `floor`. The score stays the recogniser's.
    """
    if probs.ndim != 3:
        raise ValueError(f"CTC expects (N, T, C) probabilities, got shape {probs.shape}")
    if probs.shape[2] != len(charset):
        raise ValueError(f"model has {probs.shape[2]} classes, dictionary {len(charset)}")
    idx = probs.argmax(axis=2)
    conf = np.take_along_axis(probs, idx[..., None], axis=2)[..., 0]
    keep = idx != 0
    keep[:, 1:] &= idx[:, 1:] != idx[:, :-1]
    out: list[tuple[str, float]] = []
    for row, (row_idx, row_conf, row_keep) in enumerate(zip(idx, conf, keep, strict=True)):
        chars = row_idx[row_keep]
        text = "".join(charset[c] for c in chars)
        score = float(row_conf[row_keep].mean()) if chars.size else 0.0
        if kinds is not None and len(text) == chars.size:  # one character per class
            steps = probs[row, row_keep]

            def alternative(i: int, letter: bool, steps: np.ndarray = steps) -> str | None:
                k, p = kinds.likeliest(steps[i], letter)
                return charset[k] if p >= floor else None

            text = settle_kinds(text, alternative)
        out.append((text, score))
    return out
