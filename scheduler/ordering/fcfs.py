"""First come, first served: what the engine does on its own.

Requests are ordered by priority class, then arrival, so interactive traffic
overtakes batch traffic; tenants are ignored except that a paused tenant
(over quota, at max_concurrent) is skipped. Implemented as a merge of
per-tenant FIFO queues keyed by their heads, which is exactly global FCFS.
"""

from __future__ import annotations

from scheduler.ordering.backlog import Backlog
from scheduler.request import QueuedRequest


class FcfsPolicy:
    name = "fcfs"
    fair = False

    def __init__(self) -> None:
        self._backlog = Backlog(lambda _tenant, head, _queued: (float(head.priority), 0, head.seq))

    def push(self, req: QueuedRequest) -> None:
        self._backlog.push(req)

    def peek_next(self) -> QueuedRequest | None:
        return self._backlog.peek()

    def order_key(self, tenant_id: str) -> float:
        rank = self._backlog.rank_of(tenant_id)
        return rank[0] if rank is not None else 0.0

    def heads_upto(self, key: float) -> list[QueuedRequest]:
        return []  # a baseline: arrival order only

    def pop_next(self, chosen: QueuedRequest | None = None) -> QueuedRequest | None:
        return self._backlog.pop(None if chosen is None else chosen.tenant_id)

    def remove(self, req: QueuedRequest) -> bool:
        return self._backlog.remove(req)

    def pause(self, tenant_id: str) -> None:
        self._backlog.pause(tenant_id)

    def resume(self, tenant_id: str) -> None:
        self._backlog.resume(tenant_id)

    def on_output_tokens(self, req: QueuedRequest, tokens: int) -> None:
        return None

    def on_cached_tokens(self, req: QueuedRequest, reported: int) -> None:
        return None

    def on_finish(self, req: QueuedRequest) -> None:
        return None

    def forget(self, tenant_id: str) -> bool:
        return self._backlog.forget(tenant_id)

    def __len__(self) -> int:
        return len(self._backlog)
