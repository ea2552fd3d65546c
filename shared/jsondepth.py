"""How deeply a JSON text nests, read in linear time before any parser sees it.

Python's `json` recurses once per level: a body of 100,000 `[` takes the stack down
(`RecursionError`, a 500). The check reads only the structural tokens (quotes, escapes,
brackets) with one regular expression that never backtracks, and stops at the first level
past the limit.
"""

from __future__ import annotations

import re

MAX_DEPTH = 64  # no message of the contract nests a third of that

_TOKENS = re.compile(rb'\\.|["\[\]{}]', re.DOTALL)


def too_deep(raw: bytes | str, limit: int = MAX_DEPTH) -> bool:
    """True when arrays and objects in `raw` nest deeper than `limit`."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    depth, in_string = 0, False
    for match in _TOKENS.finditer(data):
        token = match.group()
        if token == b'"':
            in_string = not in_string
        elif in_string or token[0] == 0x5C:  # a bracket in a string, or an escape
            continue
        elif token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False
