"""The admission state in memory: one Python model of it, used by both paths.

What the one decision (`decision.py`) reads and writes besides the queues:
the tenants' fair counters with the last-served floor and the tie-break
ordinals (`FairCounters`), what is in flight on the engine, in all and per
tenant (`InFlight`), and the tenants that still count as active for the
fair-share reserve after they left (`ActiveWindow`). The in-process
dispatcher keeps them in its policy (`VtcPolicy`), its budget
(`AdmissionBudget`) and its reserve (`FairShareReserve`); `MemoryStore` (the
fail-open fallback and the differential twin of the Redis STEP script) keeps
the same classes for the fleet it models. The Lua script keeps them in Redis
hashes, held to these by the store differential.

No rule here: each update is the one in `scheduler.rules` (lift, floor, charges,
activity window).
"""

from __future__ import annotations

from collections.abc import Iterable, KeysView, Mapping

from scheduler import rules


class FairCounters:
    """Each tenant's VTC counter (weighted service received), the counter of the
    last tenant served (the floor when nobody is backlogged), and the admission
    ordinals that break ties (`rules.vtc_rank`: least recently admitted first)."""

    __slots__ = ("admissions", "floor", "last", "values")

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.floor = 0.0
        self.admissions = 0
        # Tenant -> its last admission's ordinal (absent: newly backlogged, first).
        self.last: dict[str, int] = {}

    def get(self, tenant_id: str) -> float:
        return self.values.get(tenant_id, 0.0)

    def last_admitted(self, tenant_id: str) -> int:
        return self.last.get(tenant_id, 0)

    def lift(self, tenant_id: str, eligible: Iterable[float]) -> float:
        """`tenant_id` becomes backlogged: lifted to the smallest of the `eligible`
        backlogged tenants' counters (or the last-served floor), first among the
        tenants it ties with."""
        floor = rules.lift_floor(eligible, self.floor)
        counter = self.values[tenant_id] = rules.lifted(self.values.get(tenant_id, 0.0), floor)
        self.last.pop(tenant_id, None)
        return counter

    def admitted(self, tenant_id: str, charge: float) -> float:
        """One of its requests was admitted, its prompt charged: the new counter."""
        counter = self.values.get(tenant_id, 0.0)
        self.floor = rules.served_floor(self.floor, counter)
        counter = self.values[tenant_id] = counter + charge
        self.admissions += 1
        self.last[tenant_id] = self.admissions
        return counter

    def charge(self, tenant_id: str, delta: float) -> float:
        """A charge after admission (output tokens, a cached-token shortfall)."""
        counter = self.values[tenant_id] = self.values.get(tenant_id, 0.0) + delta
        return counter

    def forget(self, tenant_id: str) -> None:
        """An idle tenant: lifted when it returns, so nothing of it needs keeping."""
        self.values.pop(tenant_id, None)
        self.last.pop(tenant_id, None)

    def seed(self, counters: Mapping[str, float]) -> None:
        """Start from known counters (the fail-open fallback takes the store's)."""
        self.values.update(counters)
        if counters:
            self.floor = max(self.floor, *counters.values())


class InFlight:
    """Requests on the engine and the KV tokens they may occupy, in all and per
    tenant (the engine's room, a tenant's max_concurrent, the reserve's loads)."""

    __slots__ = ("_tenants", "kv_tokens", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.kv_tokens = 0
        # Tenant -> [requests, KV tokens]; a tenant with nothing in flight is absent.
        self._tenants: dict[str, list[int]] = {}

    def open(self, tenant_id: str, kv_tokens: int) -> None:
        self.requests += 1
        self.kv_tokens += kv_tokens
        t = self._tenants.get(tenant_id)
        if t is None:
            self._tenants[tenant_id] = [1, kv_tokens]
        else:
            t[0] += 1
            t[1] += kv_tokens

    def release(self, tenant_id: str, kv_tokens: int) -> None:
        t = self._tenants.get(tenant_id)
        if t is None or t[1] < kv_tokens:
            raise AssertionError(f"released twice: {tenant_id!r} has no such request in flight")
        self.requests -= 1
        self.kv_tokens -= kv_tokens
        t[0] -= 1
        t[1] -= kv_tokens
        if t[0] <= 0:
            del self._tenants[tenant_id]

    def of(self, tenant_id: str) -> tuple[int, int]:
        """(requests, KV tokens) `tenant_id` has in flight."""
        t = self._tenants.get(tenant_id)
        return (t[0], t[1]) if t is not None else (0, 0)

    def requests_of(self, tenant_id: str) -> int:
        t = self._tenants.get(tenant_id)
        return t[0] if t is not None else 0

    def __contains__(self, tenant_id: object) -> bool:
        return tenant_id in self._tenants

    def tenants(self) -> KeysView[str]:
        """The tenants with something in flight (a live view)."""
        return self._tenants.keys()


class ActiveWindow:
    """Tenants that left (nothing queued, nothing in flight) within the reserve's
    window: still active for it (`rules.active_until`; a light tenant between two
    of its requests is one to keep room for)."""

    __slots__ = ("_until",)

    def __init__(self) -> None:
        self._until: dict[str, float] = {}

    def left(self, tenant_id: str, now_s: float, window_s: float) -> None:
        if window_s > 0:
            self._until[tenant_id] = rules.active_until(now_s, window_s)

    def back(self, tenant_id: str) -> None:
        """Active again (queued), or forgotten."""
        self._until.pop(tenant_id, None)

    def prune(self, now_s: float) -> None:
        for t in [
            t for t, until_s in self._until.items() if not rules.still_active(until_s, now_s)
        ]:
            del self._until[t]

    def next_end_s(self, now_s: float) -> float | None:
        """When the next tenant still active at `now_s` stops being so (None: none)."""
        ends = [u for u in self._until.values() if rules.still_active(u, now_s)]
        return min(ends) if ends else None

    def active(self, now_s: float) -> list[str]:
        """The tenants still active at `now_s`."""
        if self._until:
            self.prune(now_s)
        return list(self._until)

    def __bool__(self) -> bool:
        return bool(self._until)
