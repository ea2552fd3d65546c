"""Glyph twins: O and 0, which fonts draw nearly alike, settled by the word around them.

The recogniser tells O from 0 by shape, and where the shapes match it guesses, often
surely (`OOLU` read `00LU` at 0.99). A reader settles them by context: between letters
the glyph is O, between digits 0. Only this pair: S/5, B/8, Z/2 and I/1 are told apart
by shape, and settling them by context lost hard-scene accuracy (BENCHMARKS.md)."""

from __future__ import annotations

TWINS = {"O": "0", "0": "O"}


def settle_twins(text: str) -> str:
    """`text` with each O or 0 made a letter where its word's nearest other characters on
    both sides (or the one side it has) are letters, a digit where they are digits; where
    they disagree, or the word is all twins, the recogniser's choice stands."""
    chars = list(text)
    for i, char in enumerate(chars):
        if char not in TWINS:
            continue
        kinds = {_neighbour(chars, i, -1), _neighbour(chars, i, 1)} - {None}
        if len(kinds) == 1 and kinds.pop() != char.isalpha():
            chars[i] = TWINS[char]
    return "".join(chars)


def _neighbour(chars: list[str], i: int, step: int) -> bool | None:
    """Whether the nearest character from i towards `step` in the same word, twins
    skipped, is a letter (True) or a digit (False); None where the word ends first (a
    space, a hyphen or other mark ends it, as does the text's end)."""
    j = i + step
    while 0 <= j < len(chars) and not chars[j].isspace():
        if chars[j] not in TWINS:
            return True if chars[j].isalpha() else False if chars[j].isdigit() else None
        j += step
    return None
