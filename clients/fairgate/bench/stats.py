"""Per-request records of a load test and the per-step report built from them.

Definitions (as in LLM-serving benchmarks; all measured by the client):
- TTFT: from sending the request to the first token arriving.
- TPOT: per request, (end-to-end - TTFT) / (output tokens - 1).
- ITL: the gaps between successive token messages of a stream (a message may
  carry several tokens when the server coalesces ready tokens).
- E2E: from sending the request to its final message.
- Goodput: completed requests per second that met every SLO given.
- rejected: the server refused before any token (RESOURCE_EXHAUSTED,
  INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE, UNAUTHENTICATED,
  PERMISSION_DENIED, or UNAVAILABLE with a retry delay); failed: any other
  error or an `error`/`cancelled` finish; unfinished: still running when the
  step's drain limit cut it off.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from fairgate.bench.common import percentile

REJECT_CODES = frozenset(
    {
        "RESOURCE_EXHAUSTED",
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "OUT_OF_RANGE",
        "UNAUTHENTICATED",
        "PERMISSION_DENIED",
    }
)


@dataclass(slots=True)
class RequestRecord:
    tenant: str
    prompt_tokens: int
    max_tokens: int
    sent_s: float
    ttft_s: float | None = None
    e2e_s: float | None = None
    output_tokens: int = 0
    itl_s: list[float] = field(default_factory=list)
    # "ok", "rejected", "failed" or "unfinished".
    outcome: str = "unfinished"
    # "CODE" or "CODE/REASON" for errors; "FINISH_<reason>" for bad finishes.
    error: str = ""
    finish_reason: str = ""

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, r: RequestRecord) -> bool:
        if r.outcome != "ok":
            return False
        if self.ttft_s is not None and (r.ttft_s is None or r.ttft_s > self.ttft_s):
            return False
        tpot = r.tpot_s
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s


def percentile_key(q: float) -> str:
    """50 → "p50", 99.9 → "p99.9" (vLLM's spelling)."""
    return f"p{int(q)}" if q == int(q) else f"p{q:g}"


@dataclass(frozen=True, slots=True)
class Latency:
    """Seconds; NaN when there were no samples. `quantiles`: percentile key
    ("p50", "p99.9") → value, for the percentiles the run asked for."""

    count: int
    mean: float
    p50: float
    p99: float
    max: float
    std: float = math.nan
    quantiles: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Sequence[float], percentiles: Sequence[float] = (50, 99)) -> Latency:
        if not values:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, {percentile_key(q): nan for q in percentiles})
        mean = sum(values) / len(values)
        return cls(
            len(values),
            mean,
            percentile(values, 50),
            percentile(values, 99),
            max(values),
            math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)),
            {percentile_key(q): percentile(values, q) for q in percentiles},
        )

    def to_ms_dict(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {
            "count": self.count,
            "mean_ms": _ms(self.mean),
            "p50_ms": _ms(self.p50),
            "p99_ms": _ms(self.p99),
            "max_ms": _ms(self.max),
        }
        out.update({f"{k}_ms": _ms(v) for k, v in self.quantiles.items()})
        return out

    def vllm_fields(self, metric: str) -> dict[str, float | None]:
        """`vllm bench serve` result names: mean_/median_/std_/p<q>_<metric>_ms."""
        out = {
            f"mean_{metric}_ms": _ms(self.mean),
            f"median_{metric}_ms": _ms(self.p50),
            f"std_{metric}_ms": _ms(self.std),
        }
        out.update({f"{k}_{metric}_ms": _ms(v) for k, v in self.quantiles.items()})
        return out


def _ms(v: float) -> float | None:
    return None if math.isnan(v) else round(v * 1e3, 3)


@dataclass(slots=True)
class TenantService:
    requests: int = 0
    ok: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    share: float = 1.0


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one gets everything."""
    xs = list(values)
    if not xs or not any(xs):
        return math.nan
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


@dataclass(slots=True)
class StepReport:
    mode: str  # "closed" or "open"
    level: float  # concurrency (closed) or arrival rate per s (open)
    elapsed_s: float
    sent: int
    ok: int
    rejected: int
    failed: int
    unfinished: int
    errors: dict[str, int]
    output_tokens: int
    prompt_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    goodput_requests_per_s: float
    slo_met_fraction: float
    ttft: Latency
    tpot: Latency
    itl: Latency
    e2e: Latency
    tenants: dict[str, TenantService]
    jain_index: float

    @property
    def label(self) -> str:
        return f"c={self.level:g}" if self.mode == "closed" else f"{self.level:g}/s"

    @property
    def failure_rate(self) -> float:
        return (self.failed + self.unfinished) / self.sent if self.sent else 0.0

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("ttft", "tpot", "itl", "e2e", "tenants", "jain_index")
        }
        for name in ("ttft", "tpot", "itl", "e2e"):
            d[name] = getattr(self, name).to_ms_dict()
        d["tenants"] = {k: asdict(v) for k, v in self.tenants.items()}
        d["jain_index"] = None if math.isnan(self.jain_index) else round(self.jain_index, 4)
        d["failure_rate"] = round(self.failure_rate, 6)
        # The names `vllm bench serve --save-result` writes (e2el: end-to-end).
        d.update(
            {
                "duration": self.elapsed_s,
                "completed": self.ok,
                "total_input_tokens": self.prompt_tokens,
                "total_output_tokens": self.output_tokens,
                "request_throughput": self.requests_per_s,
                "request_goodput": self.goodput_requests_per_s,
                "output_throughput": self.output_tokens_per_s,
                "total_token_throughput": (self.prompt_tokens + self.output_tokens) / self.elapsed_s
                if self.elapsed_s > 0
                else 0.0,
            }
        )
        for name, metric in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2e", "e2el")):
            d.update(getattr(self, name).vllm_fields(metric))
        return d


def build_step(
    mode: str,
    level: float,
    records: Sequence[RequestRecord],
    elapsed_s: float,
    slo: Slo,
    shares: dict[str, float],
    percentiles: Sequence[float] = (50, 99),
) -> StepReport:
    ok = [r for r in records if r.outcome == "ok"]
    errors: dict[str, int] = {}
    for r in records:
        if r.error:
            errors[r.error] = errors.get(r.error, 0) + 1
    tenants: dict[str, TenantService] = {}
    for r in records:
        t = tenants.setdefault(r.tenant, TenantService(share=shares.get(r.tenant, 1.0)))
        t.requests += 1
        t.ok += r.outcome == "ok"
        t.prompt_tokens += r.prompt_tokens if r.outcome == "ok" else 0
        t.output_tokens += r.output_tokens
    out_tokens = sum(r.output_tokens for r in records)
    good = sum(1 for r in ok if slo.met(r))
    per_s = 1.0 / elapsed_s if elapsed_s > 0 else 0.0
    return StepReport(
        mode=mode,
        level=level,
        elapsed_s=elapsed_s,
        sent=len(records),
        ok=len(ok),
        rejected=sum(1 for r in records if r.outcome == "rejected"),
        failed=sum(1 for r in records if r.outcome == "failed"),
        unfinished=sum(1 for r in records if r.outcome == "unfinished"),
        errors=dict(sorted(errors.items())),
        output_tokens=out_tokens,
        prompt_tokens=sum(r.prompt_tokens for r in ok),
        output_tokens_per_s=out_tokens * per_s,
        requests_per_s=len(ok) * per_s,
        goodput_requests_per_s=good * per_s,
        slo_met_fraction=good / len(ok) if ok else 0.0,
        ttft=Latency.of([r.ttft_s for r in ok if r.ttft_s is not None], percentiles),
        tpot=Latency.of([x for r in ok if (x := r.tpot_s) is not None], percentiles),
        itl=Latency.of([g for r in ok for g in r.itl_s], percentiles),
        e2e=Latency.of([r.e2e_s for r in ok if r.e2e_s is not None], percentiles),
        tenants=dict(sorted(tenants.items())),
        jain_index=jain_index(v.output_tokens / v.share for v in tenants.values()),
    )
