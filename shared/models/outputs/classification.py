"""Classification output: top-k labels with probabilities."""

from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def as_probabilities(scores: np.ndarray) -> np.ndarray:
    """Logits -> probabilities; rows that already are probabilities are kept as they are."""
    scores = np.asarray(scores, dtype=np.float32)
    sums = scores.sum(axis=-1)
    if scores.min() >= 0 and scores.max() <= 1 and np.allclose(sums, 1.0, atol=1e-3):
        return scores
    return softmax(scores)


def top_k(scores: np.ndarray, labels: list[str] | None, k: int) -> list[list[tuple[str, float]]]:
    """(N, C) scores -> per row the k best (label, probability), best first."""
    probs = as_probabilities(scores.reshape(scores.shape[0], -1))
    k = max(1, min(k, probs.shape[1]))
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    names = labels or [str(i) for i in range(probs.shape[1])]
    if len(names) != probs.shape[1]:
        raise ValueError(f"model has {probs.shape[1]} classes, manifest lists {len(names)} labels")
    return [[(names[j], float(row[j])) for j in idx] for row, idx in zip(probs, order, strict=True)]
