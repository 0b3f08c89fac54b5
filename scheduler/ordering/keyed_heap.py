"""A min-heap of named items whose ranks change: O(log n) set, discard and peek.

Items are ranked by `rules.Rank` (an order key, then two integer tie-breaks).
Updates push a new entry and invalidate the old one lazily (a version per
item); stale entries are skipped when they reach the top and the heap is
rebuilt when they outnumber the live ones, so memory stays O(live items).
"""

from __future__ import annotations

import heapq
import itertools

from scheduler.rules import Rank

# (the rank's three parts, flat, version, item): flat tuples compare faster than
# nested ones. Versions are unique, so comparison never reaches the item.
_Entry = tuple[float, int, int, int, str]


class KeyedHeap:
    def __init__(self) -> None:
        self._heap: list[_Entry] = []
        self._live: dict[str, int] = {}
        self._ranks: dict[str, Rank] = {}
        self._versions = itertools.count()

    def set(self, item: str, rank: Rank) -> None:
        """Insert `item`, or move it to its new rank."""
        if self._ranks.get(item) == rank:
            return
        version = next(self._versions)
        self._live[item] = version
        self._ranks[item] = rank
        heapq.heappush(self._heap, (*rank, version, item))
        if len(self._heap) > 2 * len(self._live) + 32:
            self._compact()

    def discard(self, item: str) -> None:
        if self._live.pop(item, None) is not None:
            del self._ranks[item]

    def rank(self, item: str) -> Rank | None:
        return self._ranks.get(item)

    def peek(self) -> str | None:
        heap = self._heap
        while heap:
            _, _, _, version, item = heap[0]
            if self._live.get(item) == version:
                return item
            heapq.heappop(heap)
        return None

    def up_to(self, key: float) -> list[tuple[Rank, str]]:
        """The live items whose order key (`rank[0]`) is at most `key`, in rank
        order: a walk down the heap from its root that stops below larger keys
        (a stale entry still leads to live ones)."""
        heap, found = self._heap, []
        frontier = [(heap[0], 0)] if heap else []
        while frontier:
            (k, k1, k2, version, item), i = heapq.heappop(frontier)
            if k > key:
                break
            if self._live.get(item) == version:
                found.append(((k, k1, k2), item))
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))
        return found

    def _compact(self) -> None:
        self._heap = [(*r, self._live[i], i) for i, r in self._ranks.items()]
        heapq.heapify(self._heap)

    def __contains__(self, item: object) -> bool:
        return item in self._live

    def __len__(self) -> int:
        return len(self._live)
