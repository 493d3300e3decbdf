"""What the user probably meant: names close to one that is not there, for error messages."""
from __future__ import annotations

import difflib
from typing import Iterable, List


def close_matches(name: str, candidates: Iterable[str], n: int = 3) -> List[str]:
    """Up to ``n`` of ``candidates`` that look like ``name``, best first: typos, then names that
    contain it (``loss`` -> ``CrossEntropyLoss_output_0``), shortest first."""
    candidates = list(candidates)
    found = difflib.get_close_matches(name, candidates, n=n, cutoff=0.6)
    if len(name) >= 3 and len(found) < n:
        lower = name.lower()
        containing = sorted((c for c in candidates if lower in c.lower() and c not in found), key=lambda c: (len(c), c))
        found += containing[:n - len(found)]
    return found


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """``" (did you mean 'a' or 'b'?)"`` for close matches of ``name``, else ``""``."""
    matches = close_matches(name, candidates)
    if not matches:
        return ""
    return " (did you mean " + " or ".join(repr(m) for m in matches) + "?)"
