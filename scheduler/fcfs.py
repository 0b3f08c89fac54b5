"""First come, first served: what the engine does on its own.

Requests are ordered by priority class, then arrival, so interactive traffic
overtakes batch traffic; tenants are ignored.
"""

from __future__ import annotations

import heapq

from scheduler.request import QueuedRequest


class FcfsPolicy:
    name = "fcfs"

    def __init__(self) -> None:
        # Heap of (priority, seq, request); removed entries are skipped lazily.
        self._heap: list[tuple[int, int, QueuedRequest]] = []
        self._queued: set[int] = set()

    def push(self, req: QueuedRequest) -> None:
        heapq.heappush(self._heap, (int(req.priority), req.seq, req))
        self._queued.add(id(req))

    def _prune(self) -> None:
        while self._heap and id(self._heap[0][2]) not in self._queued:
            heapq.heappop(self._heap)

    def peek_next(self) -> QueuedRequest | None:
        self._prune()
        return self._heap[0][2] if self._heap else None

    def pop_next(self) -> QueuedRequest | None:
        self._prune()
        if not self._heap:
            return None
        req = heapq.heappop(self._heap)[2]
        self._queued.discard(id(req))
        return req

    def remove(self, req: QueuedRequest) -> bool:
        if id(req) not in self._queued:
            return False
        self._queued.discard(id(req))
        return True

    def on_output_tokens(self, req: QueuedRequest, tokens: int) -> None:
        return None

    def on_finish(self, req: QueuedRequest) -> None:
        return None

    def __len__(self) -> int:
        return len(self._queued)
