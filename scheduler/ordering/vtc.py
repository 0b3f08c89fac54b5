"""Weighted Virtual Token Counter (VTC) fair policy.

From "Fairness in Serving Large Language Models" (Sheng et al., OSDI 2024):
each tenant has a counter of the service it received, in weighted tokens
divided by its weight. Admitting a request charges w_in * prompt_tokens /
weight; every streamed output token charges w_out / weight (the charges and
the lift are stated in `scheduler.rules`). The next request always comes from the
eligible backlogged tenant with the smallest counter — less `light_credit`
for a light tenant (`rules.order_key`: at most `LIGHT_QUEUE` queued; its own
last request must not make it wait behind tenants that have been queued all
along). A tenant that becomes
backlogged is lifted to the smallest counter among the eligible backlogged
(or, when none is, to the counter of the last tenant served), so idling
earns no credit. A tenant paused for its own limits (max_concurrent,
wait-mode buckets) is still backlogged: it keeps its counter and, on resume,
its place (holding is not idling). Ties go to the tenant admitted least
recently, a newly backlogged tenant first, so a newcomer lifted to the
smallest counter goes before the tenant it ties with (which may be held out
of the fair-share reserve).

Guarantee (tested with mixed request shapes): two tenants backlogged over an
interval receive weighted service (per unit weight) within
`rules.vtc_bound` = 2 * max(w_in * L_in, w_out * M) of each other; L_in is
the longest prompt, M the tokens the engine holds; plus `light_credit` when
either may be light.

Locality (`heads_upto`): the dispatcher may admit, instead of the first
tenant's head, the head of another tenant within an allowance of it in this
order (`decision.prefer`); the bound grows by that allowance.

Within a tenant: FIFO, interactive before batch, with the anti-starvation
rule of `TenantQueue` (one batch admission at least every `batch_every_n` + 1).
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler import rules
from scheduler.admission_state import FairCounters
from scheduler.ordering.backlog import Backlog
from scheduler.request import QueuedRequest
from scheduler.rules import vtc_rank

DEFAULT_BATCH_EVERY_N = 4


def _unit_weight(_tenant_id: str) -> float:
    return 1.0


class VtcPolicy:
    name = "vtc"
    fair = True

    def __init__(
        self,
        weight_of: Callable[[str], float] | None = None,
        *,
        w_in: float = rules.W_IN,
        w_out: float = rules.W_OUT,
        w_cached: float | None = None,
        batch_every_n: int | None = DEFAULT_BATCH_EVERY_N,
        light_credit: float = 0.0,
    ) -> None:
        if w_in < 0 or w_out < 0 or w_in + w_out == 0:
            raise ValueError(f"w_in and w_out must be >= 0 and not both 0: {w_in}, {w_out}")
        if light_credit < 0:
            raise ValueError(f"light_credit must be >= 0, got {light_credit}")
        self.weight_of = weight_of or _unit_weight
        self.light_credit = light_credit
        self.w_in = w_in
        self.w_out = w_out
        self.w_cached = rules.cached_weight(w_in, w_cached)
        # Counters, the last-served floor and the tie-break ordinals (admission_state.py).
        self.counters = FairCounters()
        # Its dicts, read on every re-key (never rebound).
        self._values, self._last = self.counters.values, self.counters.last
        self._backlog = Backlog(self._rank, batch_every_n=batch_every_n, light_credit=light_credit)

    def _rank(self, tenant_id: str, head: QueuedRequest, queued: int) -> rules.Rank:
        counter, last = self._values.get(tenant_id, 0.0), self._last.get(tenant_id, 0)
        return vtc_rank(counter, queued, self.light_credit, last, head.seq)

    def counter(self, tenant_id: str) -> float:
        return self.counters.get(tenant_id)

    def _lift(self, tenant_id: str) -> None:
        c = self.counters
        c.lift(tenant_id, (c.get(t) for t in self._backlog.tops()))

    def push(self, req: QueuedRequest) -> None:
        tid = req.tenant_id
        if self._backlog.queued(tid) == 0 and tid not in self._backlog.paused:
            self._lift(tid)
        self._backlog.push(req)

    def peek_next(self) -> QueuedRequest | None:
        return self._backlog.peek()

    def order_key(self, tenant_id: str) -> float:
        rank = self._backlog.rank_of(tenant_id)
        return rank[0] if rank is not None else self.counter(tenant_id)

    def heads_upto(self, key: float) -> list[QueuedRequest]:
        return self._backlog.heads_upto(key)

    def pop_next(self, chosen: QueuedRequest | None = None) -> QueuedRequest | None:
        head = chosen or self._backlog.peek()
        if head is None:
            return None
        tid = head.tenant_id
        charge = rules.admission_charge(
            self.w_in, head.prompt_tokens, self.weight_of(tid), head.charged_cached, self.w_cached
        )
        self.counters.admitted(tid, charge)
        # pop() re-keys the tenant with its new counter.
        popped = self._backlog.pop(tid)
        if popped is not head:
            raise AssertionError("backlog pop disagrees with peek")
        return head

    def remove(self, req: QueuedRequest) -> bool:
        return self._backlog.remove(req)

    def pause(self, tenant_id: str) -> None:
        self._backlog.pause(tenant_id)

    def resume(self, tenant_id: str) -> None:
        if tenant_id not in self._backlog.paused:
            return
        # No lift: held back by its own limits, it never stopped being backlogged.
        self._backlog.resume(tenant_id)

    def on_output_tokens(self, req: QueuedRequest, tokens: int) -> None:
        if tokens <= 0:
            return
        tid = req.tenant_id
        self.counters.charge(tid, rules.output_charge(self.w_out, tokens, self.weight_of(tid)))
        if self._backlog.queued(req.tenant_id):
            self._backlog.refresh(req.tenant_id)

    def on_cached_tokens(self, req: QueuedRequest, reported: int) -> None:
        tid = req.tenant_id
        short = rules.cached_shortfall(
            self.w_in, self.w_cached, req.charged_cached, reported, self.weight_of(tid)
        )
        if short > 0:
            self.counters.charge(tid, short)
            if self._backlog.queued(tid):
                self._backlog.refresh(tid)

    def on_finish(self, req: QueuedRequest) -> None:
        return None

    def forget(self, tenant_id: str) -> bool:
        # An idle tenant is lifted when it returns, so its counter only matters
        # while above the floor (served more than the others): forgiven now.
        if not self._backlog.forget(tenant_id):
            return False
        self.counters.forget(tenant_id)
        return True

    @property
    def backlogged_tenants(self) -> int:
        return self._backlog.eligible_tenants

    def __len__(self) -> int:
        return len(self._backlog)
