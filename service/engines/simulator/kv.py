"""The simulated engine's KV pool and prefix cache, accounted in tokens as SGLang does.

A token in the pool is either a request's own (computed, not yet in the tree)
or the tree's. Tree tokens that a running request locks are protected; the rest
are evictable and count as free room (SGLang admits against available +
evictable and evicts only when it allocates). `used` is SGLang's
`num_used_tokens`: capacity - (available + evictable).

A request's life, as SGLang 0.5.23's scheduler: on admission it matches its
prompt (and output so far, after a retraction) up to the last token, which is
always recomputed, and locks the match; after each prefill chunk its computed
tokens are inserted ("checkpointed") so concurrent requests can share them;
when it finishes or is aborted, prompt + output up to the last token (whose KV
was never computed) is inserted; a retracted request inserts nothing.
The engine reports the first match as `cached_tokens` (core.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from service.engines.simulator.radix import Node, RadixCache


class KvHolder(Protocol):
    """What the pool reads and writes on a request."""

    prompt_ids: list[int]
    output_ids: list[int]
    # Tokens of (prompt + output) materialized in the KV pool, shared ones included.
    in_kv: int
    # Leading tokens of in_kv that are the tree's (locked through `node`).
    tree_len: int
    node: Node | None


class KvPool:
    def __init__(self, capacity: int, *, prefix_cache: bool = True) -> None:
        self.capacity = capacity
        self.prefix_cache = prefix_cache
        self.tree = RadixCache()
        self.private = 0  # request-owned tokens not in the tree

    @property
    def used(self) -> int:
        return self.private + self.tree.protected_size

    @property
    def available(self) -> int:
        """Room for new tokens, evictable cache included."""
        return self.capacity - self.used

    def alloc(self, req: KvHolder, tokens: int) -> None:
        free = self.capacity - self.private - self.tree.total_size
        if tokens > free:
            self.tree.evict(tokens - free)
        self.private += tokens
        req.in_kv += tokens

    @staticmethod
    def _fill(req: KvHolder, n: int) -> Sequence[int]:
        p = len(req.prompt_ids)
        return req.prompt_ids[:n] if n <= p else req.prompt_ids + req.output_ids[: n - p]

    def admit(self, req: KvHolder) -> None:
        """Match and lock the cached prefix: the prefill computes only the rest."""
        assert req.in_kv == 0 and req.node is None
        fill_len = len(req.prompt_ids) + len(req.output_ids)
        matched, node = 0, self.tree.root
        if self.prefix_cache and fill_len > 1:
            matched, node = self.tree.match_prefix(self._fill(req, fill_len - 1))
        self.tree.lock(node)
        req.node, req.tree_len, req.in_kv = node, matched, matched

    def checkpoint(self, req: KvHolder, upto: int | None = None) -> None:
        """Insert the request's computed tokens (up to `upto`) and lock them instead."""
        n = req.in_kv if upto is None else min(upto, req.in_kv)
        if not self.prefix_cache or n <= req.tree_len:
            return
        key = self._fill(req, n)
        _, node = self.tree.insert(key)
        p = len(req.prompt_ids)
        if p < n:
            # SGLang splits at the prompt's end so the output can be evicted alone.
            self.tree.insert(key[:p])
        # Tokens the tree had already are duplicates; the rest move to the tree.
        self.private -= n - req.tree_len
        self.tree.lock(node)
        assert req.node is not None
        self.tree.unlock(req.node)
        req.node, req.tree_len = node, n

    def release(self, req: KvHolder, *, insert: bool) -> None:
        """Free the request's KV; with `insert` the tree keeps what it computed
        (prompt + output, less the last token, whose KV was never computed)."""
        if req.node is None:
            return
        if insert:
            self.checkpoint(req, len(req.prompt_ids) + len(req.output_ids) - 1)
        self.private -= req.in_kv - req.tree_len
        self.tree.unlock(req.node)
        req.node, req.tree_len, req.in_kv = None, 0, 0
