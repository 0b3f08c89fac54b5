"""An exact view of one worker's prefix cache, built from SGLang's KV events.

SGLang (`--kv-events-config`) publishes what its radix cache stores and evicts:
`BlockStored` (one page of `page_size` tokens per block hash, consecutive pages
of a radix node merged into one event, each linked to its parent page by
`parent_block_hash`, None under the root), `BlockRemoved` (the hashes of an
evicted node's pages) and `AllBlocksCleared` (the cache was flushed). A block's
hash stands for its whole prefix, as fairgate's keys do, but over pages of the
engine's size and with SGLang's hash function. So the view follows each
engine block's chain of tokens and re-keys it the way `prefix_index.py` keys a
prompt (blocks of 16 tokens, each key over everything before it): a fairgate key
is held while the engine block that completed its 16th token is held.

The view is exact only while it saw every event from the engine's start (or its
last clear). A block whose parent it never saw means it missed events: it turns
`stale` and the router falls back to the approximate index for that worker
(`kv_events.py` decides; this module only reports).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import takewhile
from typing import Final

from service.engines.prefix_index import BLOCK_TOKENS, next_key

# Where fairgate's chain stands after an engine block: the last whole 16-token key
# (0: none yet), the tokens since it, and the keys it completed. A plain tuple of
# ints and int tuples, not a class: the collector stops tracking such tuples, and a
# view holds one per engine page (60 000 in a four-worker bench gateway, each one
# walked by every full collection while every stream waits).
_Block = tuple[int, tuple[int, ...], tuple[int, ...]]
_LAST: Final = 0
_TAIL: Final = 1
_KEYS: Final = 2
_ROOT: _Block = (0, (), ())

# At most this many matches remembered; past it, all are forgotten.
_MEMO_MAX = 4096


class CacheView:
    """The prefixes one engine's cache holds, as fairgate keys."""

    def __init__(self, block: int = BLOCK_TOKENS) -> None:
        self.block = block
        self.stale = False
        self._blocks: dict[int, _Block] = {}
        # A key can be completed by more than one engine block (a LoRA namespace
        # hashes the same tokens apart), so it is held while any of them is.
        self._held: dict[int, int] = {}
        # Each prompt's match since the view last changed, by its deepest key (which
        # stands for the whole prefix): admission asks the same queued heads again at
        # every streamed chunk, and a long prompt's keys take hundreds of lookups.
        self._memo: dict[int, int] = {}

    def stored(
        self,
        block_hashes: Sequence[int],
        parent_block_hash: int | None,
        token_ids: Sequence[int],
        block_size: int,
    ) -> None:
        """Pages `block_hashes` (each `block_size` tokens of `token_ids`, in order)
        now follow the page `parent_block_hash` (None: the root)."""
        parent = _ROOT if parent_block_hash is None else self._blocks.get(parent_block_hash)
        if parent is None or block_size <= 0:
            self.stale = True  # a missed store: the chain cannot be followed
            return
        for n, h in enumerate(block_hashes):
            page = token_ids[n * block_size : (n + 1) * block_size]
            if h in self._blocks:  # stored again (a re-insert): already counted
                parent = self._blocks[h]
                continue
            parent = self._extend(parent, page)
            self._blocks[h] = parent
            self._memo.clear()
            for k in parent[_KEYS]:
                self._held[k] = self._held.get(k, 0) + 1

    def removed(self, block_hashes: Sequence[int]) -> None:
        for h in block_hashes:
            b = self._blocks.pop(h, None)
            if b is None:
                continue  # stored before the view started: nothing counted
            self._memo.clear()
            for k in b[_KEYS]:
                left = self._held[k] - 1
                if left:
                    self._held[k] = left
                else:
                    del self._held[k]

    def cleared(self) -> None:
        """The engine flushed its cache: empty, and exact again from here."""
        self._blocks.clear()
        self._held.clear()
        self._memo.clear()
        self.stale = False

    def match(self, keys: Sequence[int]) -> int:
        """Tokens of the prefix `keys` stands for that the engine holds: its
        leading keys held without a gap (an engine evicts leaves, so a held
        key under an evicted one would be a view out of step, and not counted)."""
        if not keys:
            return 0
        memo = self._memo
        if (n := memo.get(keys[-1])) is not None:
            return n
        # A cold prompt stops at its first key.
        n = len(list(takewhile(self._held.__contains__, keys))) * self.block
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[keys[-1]] = n
        return n

    def size(self) -> int:
        """Distinct tokens of whole fairgate blocks the engine holds."""
        return len(self._held) * self.block

    def _extend(self, parent: _Block, page: Sequence[int]) -> _Block:
        tail, h, keys = [*parent[_TAIL], *page], parent[_LAST], []
        while len(tail) >= self.block:
            h = next_key(h, tail[: self.block])
            keys.append(h)
            tail = tail[self.block :]
        return (h, tuple(tail), tuple(keys))
