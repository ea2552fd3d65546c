"""The text the rendered scenes show: container codes (with their ISO 6346 check digit),
number plates and signs. Shared by the demo's scenes and the benchmarks' hard clips."""

from __future__ import annotations

import random
import string
from typing import Literal

Kind = Literal["container", "plate", "sign"]

SIGN_WORDS = [
    "EXIT",
    "STOP",
    "LOADING BAY",
    "NO ENTRY",
    "GATE 7",
    "PLATFORM 4",
    "SLOW",
    "CUSTOMS",
    "DOCK 12",
    "WAREHOUSE B",
]
# Owner codes shaped like real BIC prefixes (three letters + the "U" equipment category).
_OWNERS = ["MSCU", "MAEU", "CMAU", "HLXU", "TGHU", "OOLU", "EGLU", "TCNU"]


def container_check_digit(owner_serial: str) -> int:
    """ISO 6346 check digit of 4 letters + 6 digits (letters skip multiples of 11)."""
    values: dict[str, int] = {}
    v = 10
    for ch in string.ascii_uppercase:
        if v % 11 == 0:
            v += 1
        values[ch] = v
        v += 1
    total = 0
    for i, ch in enumerate(owner_serial):
        n = values[ch] if ch.isalpha() else int(ch)
        total += n * (2**i)
    return total % 11 % 10


def make_text(kind: Kind, rng: random.Random) -> str:
    """A plausible string of the given kind."""
    if kind == "container":
        body = rng.choice(_OWNERS) + "".join(rng.choices(string.digits, k=6))
        return f"{body}{container_check_digit(body)}"
    if kind == "plate":
        letters = "ABCDEFGHJKLMNPRSTVWXYZ"  # no I/O/Q/U, as on many plates
        return (
            "".join(rng.choices(letters, k=2))
            + " "
            + "".join(rng.choices(string.digits, k=3))
            + " "
            + "".join(rng.choices(letters, k=2))
        )
    return rng.choice(SIGN_WORDS)
