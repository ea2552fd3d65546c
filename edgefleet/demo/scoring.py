"""Text accuracy as the benchmarks and the demo score it: character accuracy (1 - normalised
edit distance) of each true line against the prediction that reads it best."""

from __future__ import annotations


def normalise_text(text: str) -> str:
    """Compare texts the way a reader would: case and spacing do not count."""
    return "".join(text.upper().split())


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (two-row dynamic programme)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def char_accuracy(predicted: str, truth: str) -> float:
    """1 - normalised edit distance, floored at 0: the usual OCR character accuracy."""
    p, t = normalise_text(predicted), normalise_text(truth)
    if not t:
        return 1.0 if not p else 0.0
    return max(0.0, 1.0 - edit_distance(p, t) / len(t))


def best_match_accuracy(predicted: list[str], truth: list[str]) -> float:
    """Mean over the true strings of the best character accuracy among the predictions.

    The edge reports lines in its own order and may split or miss some; each true line
    is scored against the prediction that reads it best (0 when nothing was read).
    """
    if not truth:
        return 1.0
    preds = [p for p in predicted if normalise_text(p)]
    return sum(max((char_accuracy(p, t) for p in preds), default=0.0) for t in truth) / len(truth)
