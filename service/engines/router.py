"""Routing across a pool's workers, without I/O: which worker, and what it holds.

`Router` is the bookkeeping both the live pool (`pool.py`, SGLang workers over
HTTP) and the virtual fleet (`fairgate.bench.event_driver`, simulator cores on a
fake clock) route with, so the two cannot drift: the prefix index
(`prefix_index.py`), the prefill routed to each worker that has not streamed
yet, the rule (`routing.route`), the correction by the `cached_tokens` a worker
reports, the finished sequence (SGLang caches it), and the replicas' share
(`on_routed` / `learn`, `prefix_share.py`). The targets say how full they are
and whether they are healthy; the router never waits on them.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import Protocol

from scheduler import rules
from scheduler.request import QueuedRequest
from service.engines.kv_view import CacheView
from service.engines.prefix_index import PrefixIndex
from service.engines.routing import Routing, WorkerView, route


class Target(Protocol):
    """A worker as routing needs it."""

    @property
    def url(self) -> str: ...

    @property
    def healthy(self) -> bool: ...

    def load(self, now_s: float, kv_tokens: int = 0, requests: int = 0) -> float:
        """How full it would be with `requests` more of `kv_tokens` in all (1.0: full)."""
        ...

    def slots(self) -> int:
        """Its running-request slots."""
        ...


class Router:
    def __init__(
        self,
        targets: Sequence[Target],
        *,
        routing: Routing = "locality",
        clock: Callable[[], float],
        prefix_affinity_tokens: int = 0,
        affinity_slack: int = 2,
        kv_tokens: Sequence[int] | None = None,
    ) -> None:
        self.targets = targets
        self.routing: Routing = routing
        self.clock = clock
        self.prefix_affinity_tokens = prefix_affinity_tokens
        self.affinity_slack = affinity_slack
        # Sized by each worker's KV (`set_capacity` once it is read).
        self.index = PrefixIndex(kv_tokens or [1 for _ in targets])
        # Per worker, the exact view from its KV events (`kv_events.py`), which
        # locality uses instead of the index while it is not stale; None: off.
        self.exact: list[CacheView | None] = [None for _ in targets]
        # Per worker, the deepest keys of prompts sent there whose prefill has not
        # streamed: the engine stores (and reports) a prompt only once computed, but
        # a request with its prefix routed there meanwhile shares the computation.
        self._computing: list[dict[int, int]] = [{} for _ in targets]
        # Uncached prompt tokens routed to each worker that have not streamed yet.
        self.pending_prefill = [0 for _ in targets]
        # Prompt tokens the workers reported cached, and those the index expected.
        self.cached_tokens_total = 0
        self.predicted_cached_total = 0
        self.overestimated = 0
        # Replicas: each sequence routed (worker URL, its deepest prefix key) goes to
        # the others (prefix_share.py), whose routes come back through `learn`.
        self.on_routed: Callable[[str, int], None] | None = None

    # -- what admission asks ----------------------------------------------------
    def prefix_keys(self, prompt_token_ids: Sequence[int]) -> list[int]:
        """The keys locality matches a prompt by ([] with least_full)."""
        return self.index.chain(prompt_token_ids) if self.routing == "locality" else []

    def cached_prefix(self, req: QueuedRequest) -> int:
        """For locality-aware admission (`scheduler.request.Locality`): the most of
        the queued request's prompt that a healthy worker with room for it is
        thought to hold."""
        now_s, best = self.clock(), 0
        for i, t in enumerate(self.targets):
            matched = self.held(i, req.prefix_keys)
            kv = rules.kv_tokens(req.prompt_tokens - matched, req.max_tokens)
            if matched > best and t.healthy and t.load(now_s, kv, 1) <= 1.0:
                best = matched
        return best

    def held(self, i: int, keys: Sequence[int]) -> int:
        """Tokens of the prefix `keys` worker `i` holds: from its KV events while
        they are followed without a gap, else as the index guesses."""
        view = self.exact[i]
        if view is None or view.stale:
            return self.index.match(i, keys)
        held, computing = view.match(keys), self._computing[i]
        if computing and not computing.keys().isdisjoint(keys):
            deepest = max(n for n, k in enumerate(keys) if k in computing)
            held = max(held, (deepest + 1) * self.index.block)
        return held

    # -- one request --------------------------------------------------------------
    def pick(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        keys: list[int],
        tried: set[int],
        soonest: bool = False,
        preempts: bool = False,
    ) -> tuple[int, int] | None:
        """The worker for a request not yet tried (its index), and the prefix it is
        thought to hold; None: no healthy worker left. `soonest`: a light
        tenant's; `preempts`: it may take a full worker's slot (`routing.route`,
        `priority_on`)."""
        candidates = [i for i, t in enumerate(self.targets) if t.healthy and i not in tried]
        if not candidates:
            return None
        now_s = self.clock()
        prompt_tokens = len(prompt_token_ids)
        local = self.routing == "locality"
        views = []
        for i in candidates:
            matched = self.held(i, keys) if local else 0
            # A held prefix is shared: the request adds only the rest to its KV.
            kv = rules.kv_tokens(prompt_tokens - matched, max_tokens)
            load = self.targets[i].load(now_s, kv, 1)
            views.append(WorkerView(load, self.pending_prefill[i], matched))
        preferred, slack = None, 0.0
        n = self.prefix_affinity_tokens
        if n and prompt_tokens >= n:
            preferred = zlib.crc32(repr(list(prompt_token_ids[:n])).encode()) % len(candidates)
            # Within `affinity_slack` requests of the best (in the preferred one's slots).
            slack = self.affinity_slack / max(1, self.targets[candidates[preferred]].slots())
        j = route(
            views,
            prompt_tokens,
            self.routing,
            preferred=preferred,
            slack=slack,
            soonest=soonest,
            preempts=preempts,
        )
        return candidates[j], views[j].matched

    def priority_on(self, i: int, priority: int, preempt_priority: int | None) -> int:
        """The priority a request goes to worker `i` with: `preempt_priority` (a
        light request's, its engine retracts a running request for it) only
        where no slot is free; elsewhere it starts without retracting anyone."""
        if preempt_priority is None or self.targets[i].load(self.clock(), 0, 1) <= 1.0:
            return priority
        return preempt_priority

    def sent(self, i: int, keys: list[int], prompt_tokens: int, matched: int) -> int:
        """The request went to worker `i`: the prefill it adds there (returned, for
        `streamed` / `released`). Its prompt is there once prefilled; the next
        request with this prefix routed here before then still finds it cached or
        being computed."""
        pending = prompt_tokens - matched
        self.pending_prefill[i] += pending
        self._routed(i, keys)
        if keys:
            computing = self._computing[i]
            computing[keys[-1]] = computing.get(keys[-1], 0) + 1
        return pending

    def streamed(
        self,
        i: int,
        pending: int,
        matched: int,
        prompt_tokens: int,
        cached: int,
        keys: Sequence[int] = (),
    ) -> None:
        """Its first chunk: its prefill is done; the worker says how much of the
        prompt it had cached. Fewer tokens than the index matched means it evicted
        more than the index did (or restarted)."""
        self.pending_prefill[i] -= pending
        self._computed(i, keys)
        reported = min(max(0, cached), prompt_tokens)
        self.cached_tokens_total += reported
        self.predicted_cached_total += matched
        if reported < matched:
            self.overestimated += 1  # routed for a prefix the worker no longer held
            self.index.shrink(i, matched - reported)

    def released(self, i: int, pending: int, keys: Sequence[int] = ()) -> None:
        """It left worker `i` before its first chunk (`pending`: what `sent` added;
        `keys`: its prefix keys, () once `streamed` was told)."""
        self.pending_prefill[i] -= pending
        self._computed(i, keys)

    def _computed(self, i: int, keys: Sequence[int]) -> None:
        if keys:
            computing, k = self._computing[i], keys[-1]
            if computing.get(k, 0) > 1:
                computing[k] -= 1
            else:
                computing.pop(k, None)

    def finished(
        self, i: int, prompt_token_ids: Sequence[int], keys: list[int], output: Sequence[int]
    ) -> None:
        """Worker `i` finished it: SGLang caches the whole sequence, which a
        conversation's next turn re-sends (`keys`: the prompt's, extended)."""
        if self.routing == "locality":
            self._routed(i, self.index.chain([*prompt_token_ids, *output], keys))

    def _routed(self, i: int, keys: list[int]) -> None:
        self.index.insert(i, keys)
        if keys and self.on_routed is not None:
            self.on_routed(self.targets[i].url, keys[-1])

    # -- workers --------------------------------------------------------------------
    def learn(self, url: str, key: int) -> None:
        """Another replica routed a sequence with this deepest key to `url`."""
        for i, t in enumerate(self.targets):
            if t.url == url:
                self.index.insert(i, [key])
                return

    def set_capacity(self, i: int, kv_tokens: int) -> None:
        self.index.set_capacity(i, kv_tokens)

    def readmitted(self, i: int) -> None:
        """Back after an ejection: it may have restarted with an empty cache."""
        self.index.clear(i)
