"""An approximate index of what each worker's prefix cache holds.

SGLang keeps finished and running sequences in a radix tree and skips the
prefill of a prompt's longest cached prefix. A router cannot see that tree, so,
like smg's approximate tree, it remembers what it sent where: the prompt (and,
once a request ends, prompt plus output, as SGLang inserts them) in blocks of
`block` tokens, each block keyed by a hash of everything before it and itself,
so a key stands for a whole prefix. Each worker's keys are kept in LRU order up
to its KV capacity in blocks; a prefix's blocks are touched leaf first, so the
leaves go before their parents, as in SGLang's eviction.

The index is a guess and is corrected by the engine: when a worker reports
fewer `cached_tokens` than the index matched, it evicted more than the index
did (running requests hold KV too) or restarted, so the index forgets as many of
its least recently used tokens (the prompt just sent is the most recent: it is
being cached now); a worker that comes back after an ejection starts empty.

With replicas, each one's routes reach the others (`prefix_share.py`) as the
deepest key of each routed sequence, so a conversation's next turn finds its
worker whichever replica it reaches.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16


def chain(
    token_ids: Sequence[int], block: int = BLOCK_TOKENS, known: Sequence[int] = ()
) -> list[int]:
    """The keys of the prompt's whole blocks: key i stands for tokens [0, (i+1)*block).
    `known`: the keys of a prefix of `token_ids` already computed (not again)."""
    keys = list(known)
    h = keys[-1] if keys else 0
    for start in range(len(keys) * block, len(token_ids) - block + 1, block):
        h = next_key(h, token_ids[start : start + block])
        keys.append(h)
    return keys


def next_key(parent_key: int, block_tokens: Sequence[int]) -> int:
    """The key of a block: its parent prefix's key (0 at the root) and its tokens."""
    return hash((parent_key, tuple(block_tokens)))


class PrefixIndex:
    """Per worker, the prefix blocks it was sent, most recently used last."""

    def __init__(self, capacity_tokens: Sequence[int], block: int = BLOCK_TOKENS) -> None:
        self.block = block
        self._cached: list[OrderedDict[int, None]] = [OrderedDict() for _ in capacity_tokens]
        self._capacity = [max(1, c // block) for c in capacity_tokens]

    def set_capacity(self, worker: int, tokens: int) -> None:
        self._capacity[worker] = max(1, tokens // self.block)
        self._evict(worker)

    def chain(self, token_ids: Sequence[int], known: Sequence[int] = ()) -> list[int]:
        return chain(token_ids, self.block, known)

    def match(self, worker: int, keys: Sequence[int]) -> int:
        """Tokens of the prefix `keys` stands for that `worker` is thought to hold:
        up to its deepest key there (a key stands for its whole prefix, so one
        learned from another replica, `prefix_share.py`, counts alone)."""
        cached = self._cached[worker]
        if cached.keys().isdisjoint(keys):  # a cold prompt: one pass in C
            return 0
        for i in range(len(keys) - 1, -1, -1):
            if keys[i] in cached:
                return (i + 1) * self.block
        return 0

    def insert(self, worker: int, keys: Sequence[int]) -> None:
        """`worker` now holds the prefix `keys` (leaf first, so leaves go first)."""
        cached = self._cached[worker]
        for k in reversed(keys):
            cached[k] = None
            cached.move_to_end(k)
        self._evict(worker)

    def shrink(self, worker: int, tokens: int) -> None:
        """The worker held `tokens` fewer of a prefix than the index thought: it
        evicted more than the index did (its running requests take KV too), or
        restarted. Forget that many of its least recently used tokens."""
        cached = self._cached[worker]
        for _ in range(min(len(cached), -(-max(0, tokens) // self.block))):
            cached.popitem(last=False)

    def clear(self, worker: int) -> None:
        self._cached[worker].clear()

    def size(self, worker: int) -> int:
        """Tokens the index thinks the worker holds."""
        return len(self._cached[worker]) * self.block

    def _evict(self, worker: int) -> None:
        cached, cap = self._cached[worker], self._capacity[worker]
        while len(cached) > cap:
            cached.popitem(last=False)
