"""The simulator's prefix cache: a radix tree over token ids, as SGLang's RadixCache.

Semantics follow SGLang 0.5.23 (`sglang/srt/mem_cache/radix_cache.py`, page
size 1, LRU policy): edges hold runs of token ids and split where a match or an
insert ends inside one; a request locks the node its cached prefix ends at
(every node up to the root gets a lock ref), and locked tokens are *protected*;
unlocked tokens are *evictable* and count as free room for admission; eviction
drops the least recently used unlocked leaves, then parents that become leaves.
The tree holds no KV, only its size in tokens: the engine does the accounting.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol

# Prefix comparison goes block by block with C-speed slice equality first.
_BLOCK = 64


def common_prefix_len(a: Sequence[int], b: Sequence[int], start_b: int = 0) -> int:
    """How many leading items of `a` equal `b[start_b:]` (lists compare fastest)."""
    n = min(len(a), len(b) - start_b)
    i = 0
    while i < n:
        j = min(i + _BLOCK, n)
        if a[i:j] == b[start_b + i : start_b + j]:
            i = j
            continue
        while i < j and a[i] == b[start_b + i]:
            i += 1
        if i < j:
            return i
    return n


class Node:
    __slots__ = ("children", "id", "key", "last_access", "lock_ref", "parent")

    def __init__(self, key: list[int], parent: Node | None, node_id: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.lock_ref = 0
        self.last_access = 0
        self.id = node_id


class CacheObserver(Protocol):
    """Told of each node the tree stores and evicts (the KV events publisher)."""

    def stored(self, node: Node) -> None: ...

    def removed(self, node: Node) -> None: ...

    def cleared(self) -> None: ...


class RadixCache:
    def __init__(self, observer: CacheObserver | None = None) -> None:
        self.observer = observer
        self._ids = 0
        self.root = self._node([], None)
        self.root.lock_ref = 1  # never evicted, never counted
        self.evictable_size = 0
        self.protected_size = 0
        self._evictable_leaves: set[Node] = set()
        self._tick = 0  # logical LRU clock: deterministic, unlike SGLang's monotonic time

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    def _node(self, key: list[int], parent: Node | None) -> Node:
        self._ids += 1
        return Node(key, parent, self._ids)

    def _touch(self, node: Node) -> None:
        node.last_access = self._tick

    # -- lookups --------------------------------------------------------------
    def match_prefix(self, key: Sequence[int]) -> tuple[int, Node]:
        """The longest cached prefix of `key`: its length and the node it ends at
        (a node is split when the match ends inside it)."""
        self._tick += 1
        node, matched = self.root, 0
        self._touch(node)
        while matched < len(key):
            child = node.children.get(key[matched])
            if child is None:
                break
            self._touch(child)
            n = common_prefix_len(child.key, key, matched)
            matched += n
            if n < len(child.key):
                node = self._split(child, n)
                break
            node = child
        return matched, node

    def insert(self, key: Sequence[int]) -> tuple[int, Node]:
        """Cache `key`; returns how many of its leading tokens were cached
        already (their copies are the caller's to free) and the node it ends at."""
        done, node = self.match_prefix(key)
        if done == len(key):
            return done, node
        new = self._node(list(key[done:]), node)
        self._touch(new)
        node.children[key[done]] = new
        if self.observer is not None:
            self.observer.stored(new)
        self.evictable_size += len(new.key)
        self._update_leaf(node)
        self._update_leaf(new)
        return done, new

    def _split(self, child: Node, at: int) -> Node:
        """Put a new node holding child.key[:at] between child and its parent."""
        parent = child.parent
        assert parent is not None
        head = self._node(child.key[:at], parent)
        head.lock_ref = child.lock_ref
        head.last_access = child.last_access
        child.key = child.key[at:]
        child.parent = head
        head.children[child.key[0]] = child
        parent.children[head.key[0]] = head
        return head

    # -- locks ----------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """A request uses the prefix ending at `node`: protect it from eviction."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            self._update_leaf(node)
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            self._update_leaf(node)
            assert node.parent is not None
            node = node.parent

    # -- eviction -------------------------------------------------------------
    def _update_leaf(self, node: Node) -> None:
        if node.lock_ref == 0 and not node.children:
            self._evictable_leaves.add(node)
        else:
            self._evictable_leaves.discard(node)

    def evict(self, num_tokens: int) -> int:
        """Drop least recently used unlocked leaves until `num_tokens` are freed
        (or nothing is left to drop); the tokens freed."""
        heap = [(n.last_access, n.id, n) for n in self._evictable_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            if self.observer is not None:
                self.observer.removed(leaf)
            del parent.children[leaf.key[0]]
            self._evictable_leaves.discard(leaf)
            self.evictable_size -= len(leaf.key)
            freed += len(leaf.key)
            self._update_leaf(parent)
            if parent in self._evictable_leaves:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed
