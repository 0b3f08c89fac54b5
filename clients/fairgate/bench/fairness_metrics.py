"""Fairness metrics from what clients observed: per-tenant service over time,
the largest weighted service gap while two tenants are both backlogged (to
compare with the VTC bound), and Jain's index.

Service is counted in weighted tokens as the VTC paper does: w_in per prompt
token when a request is admitted (send time + the server's queue wait) and
w_out per output token when it arrives.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

# Re-exported: one Jain index for every bench.
from fairgate.bench.stats import jain_index as jain_index
from scheduler.rules import admission_charge


@dataclass
class RequestRecord:
    tenant: str
    sent_s: float
    prompt_tokens: int
    max_tokens: int = 0
    # (arrival time, output tokens in that message)
    token_times: list[tuple[float, int]] = field(default_factory=list)
    admitted_s: float | None = None
    first_token_s: float | None = None
    done_s: float | None = None
    # gRPC status name: RESOURCE_EXHAUSTED is a rejection, anything else a failure.
    rejected: str = ""
    failed: str = ""
    # Prompt tokens the engine served from its prefix cache, as the usage at the
    # end of the stream reports them (None: not reported, or the stream never ended).
    cached_tokens: int | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s


def service_events(
    records: list[RequestRecord],
    w_in: float,
    w_out: float,
    until_s: float,
    w_cached: float | None = None,
) -> dict[str, list[tuple[float, float]]]:
    """Per tenant, (time, weighted tokens) service increments before `until_s`, in time order.
    A prompt counts at admission as fairgate charges it: `w_cached` per token the
    engine reported cached (`w_cached` None: every prompt token at `w_in`)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for r in records:
        ev = out.setdefault(r.tenant, [])
        if r.admitted_s is not None and r.admitted_s <= until_s:
            cached = r.cached_tokens or 0 if w_cached is not None else 0
            charge = admission_charge(w_in, r.prompt_tokens, 1.0, cached, w_cached or 0.0)
            ev.append((r.admitted_s, charge))
        ev.extend((t, w_out * n) for t, n in r.token_times if t <= until_s)
    for ev in out.values():
        ev.sort()
    return out


def backlog_intervals(
    records: list[RequestRecord], tenant: str, until_s: float
) -> list[tuple[float, float]]:
    """Union of [sent, admitted) over the tenant's requests: when it had a request waiting."""
    spans = sorted(
        (r.sent_s, min(r.admitted_s if r.admitted_s is not None else until_s, until_s))
        for r in records
        if r.tenant == tenant and not (r.rejected or r.failed) and r.sent_s < until_s
    )
    merged: list[tuple[float, float]] = []
    for start, end in spans:
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _intersect(
    a: list[tuple[float, float]], b: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def max_weighted_gap(
    events: dict[str, list[tuple[float, float]]],
    intervals: dict[str, list[tuple[float, float]]],
    weights: dict[str, float],
    f: str,
    g: str,
    min_span_s: float = 0.0,
) -> float:
    """max over t1 < t2 in one common backlogged interval of
    |(S_f(t2) - S_f(t1)) / w_f - (S_g(t2) - S_g(t1)) / w_g|."""
    worst = 0.0
    for lo, hi in _intersect(intervals.get(f, []), intervals.get(g, [])):
        if hi - lo < min_span_s:
            continue
        merged = [(t, v / weights[f]) for t, v in _between(events.get(f, []), lo, hi)]
        merged += [(t, -v / weights[g]) for t, v in _between(events.get(g, []), lo, hi)]
        merged.sort()
        diff = d_max = d_min = 0.0
        for i, (t, dv) in enumerate(merged):
            diff += dv
            # Increments at the same instant count together.
            if i + 1 < len(merged) and merged[i + 1][0] == t:
                continue
            d_max, d_min = max(d_max, diff), min(d_min, diff)
        worst = max(worst, d_max - d_min)
    return worst


def common_intervals(per_tenant: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """When every tenant was backlogged at once."""
    if not per_tenant:
        return []
    out = per_tenant[0]
    for spans in per_tenant[1:]:
        out = _intersect(out, spans)
    return out


def _between(events: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """The time-sorted events with lo <= time <= hi."""
    start = bisect.bisect_left(events, lo, key=lambda e: e[0])
    end = bisect.bisect_right(events, hi, key=lambda e: e[0])
    return events[start:end]


def service_within(events: list[tuple[float, float]], spans: list[tuple[float, float]]) -> float:
    """Service in time-sorted `events` that fell inside the disjoint `spans`."""
    return sum(v for lo, hi in spans for _, v in _between(events, lo, hi))


def backlogged_sets(
    intervals: dict[str, list[tuple[float, float]]],
) -> dict[tuple[str, ...], list[tuple[float, float]]]:
    """The time cut where the set of backlogged tenants changes: per set of two or
    more tenants (in `intervals`' order), the spans when exactly those were."""
    names = list(intervals)
    cuts = sorted({x for spans in intervals.values() for s in spans for x in s})
    out: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for lo, hi in itertools.pairwise(cuts):
        mid = (lo + hi) / 2
        now = tuple(t for t in names if _covers(intervals[t], mid))
        if len(now) >= 2:
            out.setdefault(now, []).append((lo, hi))
    return out


def _covers(spans: list[tuple[float, float]], t: float) -> bool:
    i = bisect.bisect_right(spans, t, key=lambda s: s[0]) - 1
    return i >= 0 and spans[i][1] > t


def jain_backlogged(
    events: dict[str, list[tuple[float, float]]],
    intervals: dict[str, list[tuple[float, float]]],
    weights: dict[str, float],
) -> float:
    """Jain over weighted service among the tenants backlogged together: per set of
    two or more tenants backlogged at once, Jain over what each of them received
    while exactly that set was, averaged over the sets by how long each lasted
    (NaN: never two at once). With every tenant backlogged throughout it is Jain
    over the whole window; unlike Jain over only the spans when *all* were, a
    tenant seldom backlogged (its share is served at once) does not shrink the
    window to a few admissions."""
    total = acc = 0.0
    for names, spans in backlogged_sets(intervals).items():
        j = jain_index([service_within(events.get(t, []), spans) / weights[t] for t in names])
        if math.isnan(j):
            continue
        dur = sum(hi - lo for lo, hi in spans)
        total, acc = total + dur, acc + dur * j
    return acc / total if total else math.nan


def jain_of_waits(mean_waits: Iterable[float]) -> float:
    """Jain over the tenants' mean queue waits: every tenant waiting as long as the
    others is 1, however long; none of them waiting at all is equal too (1)."""
    xs = list(mean_waits)
    if xs and not any(xs):
        return 1.0
    return jain_index(xs)
