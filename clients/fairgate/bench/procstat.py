"""CPU time and resident memory of a process and its descendants, from /proc (Linux).

A gateway may fork helpers (smg's launcher runs the router in a child), so the
benchmarks charge the whole process tree. Off Linux both read NaN.
"""

from __future__ import annotations

import math
import os

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces and parentheses.
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(pid: int) -> list[int]:
    """`pid` and every live process below it."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return [pid]
    children: dict[int, list[int]] = {}
    for p in pids:
        fields = _stat_fields(p)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(p)
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` alone (all its threads, none of its children)."""
    fields = _stat_fields(pid)
    if fields is None:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of the live process tree under `pid`."""
    total, seen = 0.0, False
    for p in descendants(pid):
        fields = _stat_fields(p)
        if fields is not None:
            # utime, stime: fields 14 and 15 of stat(5); index 11, 12 after the name.
            total += (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
            seen = True
    return total if seen else math.nan


def tree_rss_bytes(pid: int) -> float:
    """Resident set size of the live process tree under `pid`."""
    total, seen = 0.0, False
    for p in descendants(pid):
        fields = _stat_fields(p)
        if fields is not None:
            total += int(fields[21]) * _PAGE_BYTES  # rss, field 24 of stat(5)
            seen = True
    return total if seen else math.nan
