"""What a fairness run's records show: per-tenant service, TTFT and rejections,
the worst weighted gap over the VTC bound, Jain's index and throughput
(`analyse`, shared by `bench fairness` and `bench fleet`)."""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Protocol

from fairgate.bench.common import percentile
from fairgate.bench.fairness_metrics import (
    RequestRecord,
    backlog_intervals,
    common_intervals,
    jain_backlogged,
    max_weighted_gap,
    service_events,
)
from fairgate.bench.fairness_scenarios import M_TOKENS, Arrival
from scheduler.rules import W_IN, W_OUT, vtc_bound
from service.settings import Settings


@dataclass
class RunResult:
    label: str
    replicas: int
    records: list[RequestRecord]
    window_s: float
    per_tenant: dict[str, dict[str, float]] = field(default_factory=dict)
    gap_over_bound: float = math.nan
    jain: float = math.nan
    all_backlogged_s: float = 0.0
    output_tokens_per_s: float = 0.0
    # w_in * prompt + w_out * output tokens served per second: shape-neutral,
    # where output tokens/s favours a policy that serves more long outputs.
    weighted_service_per_s: float = 0.0
    # Prompt tokens prefilled plus output tokens per second: the engine's work,
    # whatever the mix of shapes a policy serves.
    tokens_per_s: float = 0.0
    # The other tenants' (not the victim's) TTFT and end-to-end latency, medians over
    # their requests (censored at the window's end): what isolation costs them.
    heavy_ttft_p50_s: float = math.nan
    heavy_e2e_p50_s: float = math.nan

    def trace_digest(self) -> str:
        """What was actually sent, in order: identical across policies of one scenario."""
        h = hashlib.sha256()
        for r in self.records:
            h.update(f"{r.tenant},{r.prompt_tokens},{r.max_tokens};".encode())
        return h.hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "requests": len(self.records),
            "trace_digest": self.trace_digest(),
            "jain": self.jain,
            "gap_over_bound": self.gap_over_bound,
            "all_backlogged_s": self.all_backlogged_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "weighted_service_per_s": self.weighted_service_per_s,
            "tokens_per_s": self.tokens_per_s,
            "heavy_ttft_p50_s": self.heavy_ttft_p50_s,
            "heavy_e2e_p50_s": self.heavy_e2e_p50_s,
            "tenants": self.per_tenant,
        }


def bound_for(trace: list[Arrival]) -> float:
    """The VTC bound for the longest prompt actually sent (single replica)."""
    longest = max((a.prompt_tokens for a in trace), default=1)
    # Any tenant may be light at times (a short queue): the light credit counts.
    return vtc_bound(W_IN, W_OUT, longest, M_TOKENS, Settings().fair_light_credit)


class Weighted(Protocol):
    """What `analyse` reads of a scenario (fairness or fleet)."""

    @property
    def weights(self) -> dict[str, float]: ...
    @property
    def victim(self) -> str: ...


def analyse(
    sc: Weighted,
    records: list[RequestRecord],
    window_s: float,
    bound: float,
    label: str,
    n: int,
    w_cached: float | None = None,
) -> RunResult:
    """`w_cached`: charge the prompt tokens the engine reported cached at that weight
    (None: every prompt token at W_IN)."""
    res = RunResult(label, n, records, window_s)
    events = service_events(records, W_IN, W_OUT, window_s, w_cached)
    tenants = [t for t in sc.weights if any(r.tenant == t for r in records)]
    intervals = {t: backlog_intervals(records, t, window_s) for t in tenants}
    gaps = [
        max_weighted_gap(events, intervals, sc.weights, f, g)
        for i, f in enumerate(tenants)
        for g in tenants[i + 1 :]
    ]
    if gaps:
        res.gap_over_bound = max(gaps) / bound
    # Jain over weighted service among the tenants backlogged together: the victim
    # (a light tenant, backlogged only now and then by design) is left out, as it is
    # not meant to take its share; the gap still covers every pair.
    heavy = [t for t in tenants if t != sc.victim]
    together = common_intervals([intervals[t] for t in heavy])
    res.all_backlogged_s = sum(hi - lo for lo, hi in together)
    res.jain = jain_backlogged(events, {t: intervals[t] for t in heavy}, sc.weights)
    total_out = total_prefilled = 0
    for t in tenants:
        mine = [r for r in records if r.tenant == t]
        out_tokens = sum(n for r in mine for tt, n in r.token_times if tt <= window_s)
        total_out += out_tokens
        total_prefilled += sum(
            r.prompt_tokens
            for r in mine
            if r.first_token_s is not None and r.first_token_s <= window_s
        )
        # Requests never served in the window count with a censored TTFT (a lower bound).
        ttfts = [
            r.ttft_s if r.ttft_s is not None else window_s - r.sent_s
            for r in mine
            if not (r.rejected or r.failed)
        ]
        # fairgate's queue wait (the part of the TTFT before admission; smg: none
        # to read, its records admit at the first token). The server says it at
        # the stream's end: a request still streaming at the window's end is left
        # out (admitted, its wait unknown), one never started is censored.
        waits = [
            (r.admitted_s if r.admitted_s is not None else window_s) - r.sent_s
            for r in mine
            if not (r.rejected or r.failed)
            and (r.admitted_s is not None or r.first_token_s is None)
        ]
        res.per_tenant[t] = {
            "sent": len(mine),
            "rejected": sum(1 for r in mine if r.rejected),
            "failed": sum(1 for r in mine if r.failed),
            "output_tokens": out_tokens,
            "weighted_service": sum(v for _, v in events.get(t, [])) / sc.weights[t],
            "ttft_p50_s": percentile(ttfts, 50),
            "ttft_p99_s": percentile(ttfts, 99),
            "queue_wait_p99_s": percentile(waits, 99),
            "queue_wait_mean_s": statistics.fmean(waits) if waits else math.nan,
        }
    others = [r for r in records if r.tenant != sc.victim and not (r.rejected or r.failed)]
    if others:
        res.heavy_ttft_p50_s = percentile(
            [r.ttft_s if r.ttft_s is not None else window_s - r.sent_s for r in others], 50
        )
        res.heavy_e2e_p50_s = percentile(
            [(r.done_s if r.done_s is not None else window_s) - r.sent_s for r in others], 50
        )
    res.output_tokens_per_s = total_out / window_s
    res.tokens_per_s = (total_out + total_prefilled) / window_s
    res.weighted_service_per_s = sum(v for ev in events.values() for _, v in ev) / window_s
    return res
