"""One tenant's queue: FIFO per priority class, interactive first, batch never starves.

Anti-starvation rule: after `batch_every_n` consecutive interactive
admissions while a batch request was waiting, the next admission is the
oldest batch request. So a backlogged tenant's batch traffic gets at least one
admission in every `batch_every_n + 1`, however much interactive traffic it
sends. `batch_every_n=None` turns the rule off (strict priority, as FCFS).
Removal (cancel, deadline) is lazy: O(1), skipped when it reaches the front.
"""

from __future__ import annotations

import itertools
from collections import deque

from scheduler.request import Priority, QueuedRequest


class TenantQueue:
    __slots__ = ("_batch_every_n", "_by_class", "_head", "_head_stale", "_queued", "_streak")

    def __init__(self, batch_every_n: int | None = None) -> None:
        if batch_every_n is not None and batch_every_n < 1:
            raise ValueError(f"batch_every_n must be >= 1 or None, got {batch_every_n}")
        self._batch_every_n = batch_every_n
        self._by_class: tuple[deque[QueuedRequest], ...] = tuple(deque() for _ in Priority)
        self._queued: set[int] = set()
        # Interactive admissions in a row while batch requests were waiting.
        self._streak = 0
        # head() is asked several times per decision; recompute only after a change.
        self._head: QueuedRequest | None = None
        self._head_stale = False

    def push(self, req: QueuedRequest) -> None:
        self._by_class[req.priority].append(req)
        self._queued.add(id(req))
        self._head_stale = True

    def remove(self, req: QueuedRequest) -> bool:
        if id(req) not in self._queued:
            return False
        self._queued.discard(id(req))
        self._head_stale = True
        return True

    def _front(self, priority: Priority) -> QueuedRequest | None:
        q = self._by_class[priority]
        while q and id(q[0]) not in self._queued:
            q.popleft()
        return q[0] if q else None

    def head(self) -> QueuedRequest | None:
        if self._head_stale:
            self._head = self._compute_head()
            self._head_stale = False
        return self._head

    def _compute_head(self) -> QueuedRequest | None:
        interactive = self._front(Priority.INTERACTIVE)
        batch = self._front(Priority.BATCH)
        if batch is None:
            return interactive
        if interactive is None:
            return batch
        n = self._batch_every_n
        return batch if n is not None and self._streak >= n else interactive

    def upcoming(self, k: int) -> list[QueuedRequest]:
        """The next `k` requests in the order pop() would return them (nothing changes;
        reads at most `k` queued requests of each class past the removed ones)."""
        classes = [
            itertools.islice((r for r in q if id(r) in self._queued), k) for q in self._by_class
        ]
        interactive = next(classes[Priority.INTERACTIVE], None)
        batch = next(classes[Priority.BATCH], None)
        out: list[QueuedRequest] = []
        streak, n = self._streak, self._batch_every_n
        while len(out) < k and (interactive is not None or batch is not None):
            if batch is not None and (interactive is None or (n is not None and streak >= n)):
                out.append(batch)
                batch = next(classes[Priority.BATCH], None)
                streak = 0
            else:
                assert interactive is not None
                out.append(interactive)
                interactive = next(classes[Priority.INTERACTIVE], None)
                streak = streak + 1 if batch is not None else 0
        return out

    def pop(self) -> QueuedRequest | None:
        req = self.head()
        if req is None:
            return None
        self._by_class[req.priority].popleft()
        self._queued.discard(id(req))
        self._head_stale = True
        if req.priority is Priority.INTERACTIVE and self._front(Priority.BATCH) is not None:
            self._streak += 1
        else:
            self._streak = 0
        return req

    def __len__(self) -> int:
        return len(self._queued)
