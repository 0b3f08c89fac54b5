"""Trace seeds as the benches take them (`--seeds 1-3` or `1,4,7`)."""

from __future__ import annotations


def seed_list(spec: str) -> list[int]:
    """`1-10` or `1,4,7` -> the seeds, in order."""
    out: list[int] = []
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{spec!r}: use ranges and lists of seeds such as 1-10 or 1,4,7")
        out += list(range(int(lo), int(hi) + 1)) if dash else [int(lo)]
    if not out:
        raise ValueError(f"{spec!r}: no seeds")
    return out
