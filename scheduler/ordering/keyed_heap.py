"""A min-heap of named items whose keys change: O(log n) set, discard and peek.

Updates push a new entry and invalidate the old one lazily (a version per
item); stale entries are skipped when they reach the top and the heap is
rebuilt when they outnumber the live ones, so memory stays O(live items).
"""

from __future__ import annotations

import heapq
import itertools

# (primary key, secondary key, version, item). Versions are unique, so
# comparison never reaches the item.
_Entry = tuple[float, int, int, str]


class KeyedHeap:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._live: dict[str, int] = {}
        self._keys: dict[str, tuple[float, int]] = {}
        self._versions = itertools.count()

    def set(self, item: str, primary: float, secondary: int = 0) -> None:
        """Insert `item`, or move it to its new key."""
        if self._keys.get(item) == (primary, secondary):
            return
        version = next(self._versions)
        self._live[item] = version
        self._keys[item] = (primary, secondary)
        heapq.heappush(self._heap, (primary, secondary, version, item))
        if len(self._heap) > 2 * len(self._live) + 32:
            self._compact()

    def discard(self, item: str) -> None:
        if self._live.pop(item, None) is not None:
            del self._keys[item]

    def key(self, item: str) -> tuple[float, int] | None:
        return self._keys.get(item)

    def peek(self) -> str | None:
        heap = self._heap
        while heap:
            _, _, version, item = heap[0]
            if self._live.get(item) == version:
                return item
            heapq.heappop(heap)
        return None

    def up_to(self, primary: float) -> list[tuple[float, int, str]]:
        """The live items whose primary key is at most `primary`, in key order:
        a walk down the heap from its root that stops below larger keys (a
        stale entry still leads to live ones)."""
        heap, found = self._heap, []
        frontier = [(heap[0], 0)] if heap else []
        while frontier:
            (k, k2, version, item), i = heapq.heappop(frontier)
            if k > primary:
                break
            if self._live.get(item) == version:
                found.append((k, k2, item))
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return found

    def _compact(self) -> None:
        self._heap = [(k[0], k[1], self._live[i], i) for i, k in self._keys.items()]
        heapq.heapify(self._heap)

    def __contains__(self, item: object) -> bool:
        return item in self._live

    def __len__(self) -> int:
        return len(self._live)
