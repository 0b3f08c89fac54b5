"""The queued requests of all tenants, and which eligible tenant goes next.

Shared mechanism of the policies: one `TenantQueue` per tenant, plus a heap
of the eligible backlogged tenants ordered by the policy's `rules.Rank` of
each (FCFS: the head's priority class, then its arrival; VTC: `rules.vtc_rank`,
its counter less any light credit, then the tie-break). The policy calls
`refresh` when a tenant's rank changes. Paused tenants (over quota in wait
mode, at max_concurrent) leave the heap but keep their queue; `resume` puts
them back. With a `light_credit` (VTC), light tenants (`rules.light`) sit in a
heap of their own, so that the first of each heap is also the smallest
counter of its kind (`tops`: the floor for lifts). Every operation is
O(log n) in the number of backlogged tenants.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler import rules
from scheduler.decision import in_fair_order
from scheduler.ordering.keyed_heap import KeyedHeap
from scheduler.ordering.tenant_queue import TenantQueue
from scheduler.request import QueuedRequest
from scheduler.rules import Rank

# A tenant's rank, from its id, its head request and how many it has queued.
RankFn = Callable[[str, QueuedRequest, int], Rank]


class Backlog:
    def __init__(
        self,
        rank: RankFn,
        *,
        batch_every_n: int | None = None,
        light_credit: float = 0.0,
    ) -> None:
        self._rank = rank
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
            n = len(q)
            heap = self._light if self._credit and rules.light(n) else self._eligible
            heap.set(tenant_id, self._rank(tenant_id, head, n))

    def _top(self) -> str | None:
        """The eligible tenant first in rank."""
        heavy, light = self._eligible.peek(), self._light.peek()
        if light is None or heavy is None:
            return heavy if light is None else light
        light_rank, heavy_rank = self._light.rank(light), self._eligible.rank(heavy)
        assert light_rank is not None and heavy_rank is not None
        return light if light_rank < heavy_rank else heavy

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

    def heads_upto(self, key: float) -> list[QueuedRequest]:
        """The heads of the eligible tenants whose order key (their rank's first
        part) is at most `key`, in rank order (`decision.in_fair_order`)."""
        heads: list[tuple[Rank, QueuedRequest]] = []
        for rank, t in self._eligible.up_to(key) + self._light.up_to(key):
            head = self._queues[t].head()
            assert head is not None  # eligible: it has a head
            heads.append((rank, head))
        return in_fair_order(heads, key)

    def rank_of(self, tenant_id: str) -> Rank | None:
        """An eligible tenant's rank (None: not eligible)."""
        return self._eligible.rank(tenant_id) or self._light.rank(tenant_id)

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

    def tops(self) -> list[str]:
        """The first eligible tenant of each heap (heavy, light): between them,
        the smallest counter under VTC (every rank in a heap is its counter less
        the same credit)."""
        return [t for heap in (self._eligible, self._light) if (t := heap.peek()) is not None]

    @property
    def eligible_tenants(self) -> int:
        return len(self._eligible) + len(self._light)

    def __len__(self) -> int:
        return self._len
