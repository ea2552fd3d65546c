"""Word kinds: a letter among digits, or a digit among letters, read again by its word.

The recogniser reads each character by its shape, and where two shapes are alike it
guesses, sometimes surely (`OOLU` read `00LU`, the J of `JM` read 5 with J a distant
second). A reader settles these by the word: a character of the other kind than the
nearest characters of its word on both sides (or on the one side it has) becomes the
likeliest character of their kind, where the recogniser gives that one at least a floor.
O and 0, which fonts draw nearly alike, are settled by the word whatever the recogniser
gives. Where the two sides disagree, the recogniser's read stands. Letters are Latin
letters and digits 0-9: other scripts end a word (`第0号` stays as read: a Chinese word's
characters are letters to Python, and digits belong among them). Measured on held-out
scenes: BENCHMARKS.md "Word kinds"."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

TWINS = {"O": "0", "0": "O"}

# (position, whether a letter is wanted) -> the character to read there, or None
Alternative = Callable[[int, bool], str | None]


def kind(char: str) -> bool | None:
    """True for a Latin letter, False for a digit 0-9, None for anything else."""
    if char.isascii() and char.isdigit():
        return False
    if char.isalpha() and unicodedata.name(char, "").startswith("LATIN "):
        return True
    return None


@dataclass(frozen=True)
class Kinds:
    """Which classes of a recogniser's charset are letters and which are digits."""

    letters: np.ndarray  # (C,) bool
    digits: np.ndarray  # (C,) bool

    @classmethod
    def of(cls, charset: list[str]) -> Kinds:
        kinds = [kind(c) if len(c) == 1 else None for c in charset]
        return cls(
            letters=np.array([k is True for k in kinds], bool),
            digits=np.array([k is False for k in kinds], bool),
        )

    def likeliest(self, probs: np.ndarray, letter: bool) -> tuple[int, float]:
        """The class of the wanted kind that `probs` (C,) rates highest, and its probability."""
        scores = np.where(self.letters if letter else self.digits, probs, -1.0)
        k = int(scores.argmax())
        return k, float(probs[k])


def settle_kinds(text: str, alternative: Alternative | None = None) -> str:
    """`text` with each character of the other kind than its word settled: first every
    character but O and 0, to `alternative(i, letter)` where it gives one, then O and 0,
    to their twin. Words end at spaces and marks (`-`, `.`); neighbours skip O and 0."""
    chars = list(text)
    for twins in (False, True):
        for i, char in enumerate(chars):
            own = kind(char)
            if (char in TWINS) != twins or own is None:
                continue
            left, right = _neighbour(chars, i, -1), _neighbour(chars, i, 1)
            letter = right if left is None else left if right in (None, left) else None
            if letter is None or letter == own:
                continue
            other = TWINS[char] if twins else alternative(i, letter) if alternative else None
            chars[i] = other or char
    return "".join(chars)


def _neighbour(chars: list[str], i: int, step: int) -> bool | None:
    """Whether the nearest character from i towards `step` in the same word, O and 0
    skipped, is a letter (True) or a digit (False); None where the word ends first."""
    j = i + step
    while 0 <= j < len(chars) and chars[j] in TWINS:
        j += step
    return kind(chars[j]) if 0 <= j < len(chars) else None
