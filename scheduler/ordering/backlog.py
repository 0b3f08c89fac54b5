"""The queued requests of all tenants, and which eligible tenant goes next.

Shared mechanism of the policies: one `TenantQueue` per tenant, plus a heap
of the eligible backlogged tenants ordered by (policy key, arrival seq of the
tenant's head request). The policy supplies the key (FCFS: the head's
priority class; VTC: the tenant's virtual counter) and calls `refresh` when
it changes. Paused tenants (over quota in wait mode, at max_concurrent) leave
the heap but keep their queue; `resume` puts them back. With a `light_credit`
(VTC), light tenants (`rules.light`) sit in a heap of their own and are
compared at `rules.order_key`, so the credit is applied without re-keying
anyone. Every operation is O(log n) in the number of backlogged tenants.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler import rules
from scheduler.ordering.keyed_heap import KeyedHeap
from scheduler.ordering.tenant_queue import TenantQueue
from scheduler.request import QueuedRequest

KeyFn = Callable[[str, QueuedRequest], float]
# Secondary order among equal keys (default: the head's arrival seq).
TieFn = Callable[[str, QueuedRequest], int]


def _by_arrival(_tenant_id: str, head: QueuedRequest) -> int:
    return head.seq


class Backlog:
    def __init__(
        self,
        key: KeyFn,
        *,
        tiebreak: TieFn = _by_arrival,
        batch_every_n: int | None = None,
        light_credit: float = 0.0,
    ) -> None:
        self._key = key
        self._tiebreak = tiebreak
        self._batch_every_n = batch_every_n
        self._credit = light_credit
        self._queues: dict[str, TenantQueue] = {}
        self._eligible = KeyedHeap()  # every eligible tenant, or the heavy ones
        self._light = KeyedHeap()  # light eligible tenants, when there is a credit
        self.paused: set[str] = set()
        self._len = 0

    def queue(self, tenant_id: str) -> TenantQueue:
        q = self._queues.get(tenant_id)
        if q is None:
            q = self._queues[tenant_id] = TenantQueue(self._batch_every_n)
        return q

    def queued(self, tenant_id: str) -> int:
        q = self._queues.get(tenant_id)
        return len(q) if q is not None else 0

    def refresh(self, tenant_id: str) -> None:
        """Re-key `tenant_id` after its head or its policy key changed."""
        q = self._queues.get(tenant_id)
        head = q.head() if q is not None else None
        self._eligible.discard(tenant_id)
        self._light.discard(tenant_id)
        if q is not None and head is not None and tenant_id not in self.paused:
            heap = self._light if self._credit and rules.light(len(q)) else self._eligible
            heap.set(tenant_id, self._key(tenant_id, head), self._tiebreak(tenant_id, head))

    def _top(self) -> str | None:
        """The eligible tenant first at `rules.order_key` (ties: the tiebreak)."""
        heavy, light = self._eligible.peek(), self._light.peek()
        if light is None or heavy is None:
            return heavy if light is None else light
        hk, lk = self._eligible.key(heavy), self._light.key(light)
        assert hk is not None and lk is not None
        lk_ordered = (rules.order_key(lk[0], self.queued(light), self._credit), lk[1])
        return light if lk_ordered < hk else heavy

    def push(self, req: QueuedRequest) -> None:
        self.queue(req.tenant_id).push(req)
        self._len += 1
        self.refresh(req.tenant_id)

    def remove(self, req: QueuedRequest) -> bool:
        q = self._queues.get(req.tenant_id)
        if q is None or not q.remove(req):
            return False
        self._len -= 1
        self.refresh(req.tenant_id)
        return True

    def peek(self) -> QueuedRequest | None:
        tenant_id = self._top()
        return None if tenant_id is None else self._queues[tenant_id].head()

    def heads_within(self, allowance: float) -> list[QueuedRequest]:
        """The heads of the eligible tenants whose `rules.order_key` is within
        `allowance` of the first's, in fair order (the first first)."""
        first = self._top()
        if first is None:
            return []
        q = self._queues[first]
        head = q.head()
        assert head is not None
        limit = rules.order_key(self._key(first, head), len(q), self._credit) + allowance
        ranked = list(self._eligible.up_to(limit))
        # Light tenants' keys are their counters, their order key is less the
        # credit: a little beyond, then filtered, so rounding leaves none out.
        over = limit + self._credit
        for k, k2, t in self._light.up_to(over + 1e-9 * max(1.0, abs(over))):
            key = rules.order_key(k, self.queued(t), self._credit)
            if key <= limit:
                ranked.append((key, k2, t))
        ranked.sort()
        # The first is `_top`'s (its own tie-breaks), then the others in order.
        heads = [head]
        for _, _, t in ranked:
            h = self._queues[t].head()
            if t != first and h is not None:
                heads.append(h)
        return heads

    def pop(self, tenant_id: str | None = None) -> QueuedRequest | None:
        """Pop the head of the first tenant in fair order, or of `tenant_id`."""
        tenant_id = tenant_id or self._top()
        if tenant_id is None:
            return None
        req = self._queues[tenant_id].pop()
        self._len -= 1
        self.refresh(tenant_id)
        return req

    def pause(self, tenant_id: str) -> None:
        self.paused.add(tenant_id)
        self._eligible.discard(tenant_id)
        self._light.discard(tenant_id)

    def resume(self, tenant_id: str) -> None:
        self.paused.discard(tenant_id)
        self.refresh(tenant_id)

    def forget(self, tenant_id: str) -> bool:
        """Drop an idle tenant's (empty) queue; False while it has requests queued."""
        q = self._queues.get(tenant_id)
        if q is not None and len(q):
            return False
        self._queues.pop(tenant_id, None)
        self.paused.discard(tenant_id)
        self._eligible.discard(tenant_id)
        self._light.discard(tenant_id)
        return True

    def top_tenant(self) -> str | None:
        return self._top()

    def min_key(self) -> float | None:
        """Smallest policy key (no credit) among eligible backlogged tenants."""
        keys = [
            k[0]
            for heap in (self._eligible, self._light)
            if (t := heap.peek()) is not None and (k := heap.key(t)) is not None
        ]
        return min(keys, default=None)

    @property
    def eligible_tenants(self) -> int:
        return len(self._eligible) + len(self._light)

    def __len__(self) -> int:
        return self._len
