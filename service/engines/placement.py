"""Placement across a pool's workers, without I/O: the one sequence both the
live pool (`pool.py`, SGLang workers over HTTP) and the virtual fleet
(`fairgate.bench.sim_fleet`, simulator cores on a fake clock) run, so the
fleet's numbers describe the server's placement.

Per request: the worker (`place`), the priority the engine gets there (a light
request may be lent a full worker's slot), the KV claim (the prompt less the
prefix thought held there, plus the output) and its lifecycle (`first_token`
corrects the prefix index with the reported `cached_tokens`, `finished`,
`released`). Per worker: the prefix index, the prefill not streamed yet
(`prefill_pending`, the other replicas' too) and what the replicas share
(`on_*` out, `learn*` in; `prefix_share.py`). The clock is injected; the
targets are never waited on.

Admission's locality estimate (`cached_prefix`, `QueuedRequest.cached_estimate`)
is the placement's own choice at that moment: the worker routing would pick for
the request, and the prefix it holds there; where that worker has room the
request carries it (`QueuedRequest.cached_on`) and `place` uses it unless it
became unhealthy or full, counting each time it cannot (`LocalityStats`). The
charge counts the longest prefix any worker holds where the cold-start hold may
place a prompt later (`QueuedRequest.held_anywhere`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from scheduler import rules
from scheduler.request import QueuedRequest
from service.engines.kv_view import CacheView
from service.engines.placed import LocalityStats, Placed, Target
from service.engines.prefix_index import PrefixIndex
from service.engines.protocol import EngineRequest
from service.engines.remote_load import RemoteLoads
from service.engines.routing import Routing, WorkerView, affinity, fullness, route
from service.engines.stagger import Stagger

# How long another replica's prefill counts when its end never arrives (that
# replica died, or the stream dropped the entry): far longer than a prefill
# waits and runs, short enough that a lost one does not steer routing for long.
REMOTE_PREFILL_TTL_S = 30.0
# Shorter prefills are not announced to the other replicas: they take a few
# milliseconds of a step, not worth two stream entries per request.
SHARED_PREFILL_MIN_TOKENS = 512
# A light request's prefill, announced whatever its length, is marked so
# (`sheltered`: a wide stage must not share its prefill step).
LIGHT_PREFILL = "light-"
# With other replicas, a prompt is not sheltered until this long after it was
# placed: a light request another replica placed on the same worker just before
# it heard of the prompt is announced within a round trip of the replicas'
# stream. Traced live (two replicas, long mix): a 1 481-token prompt placed 2 ms
# after the other replica's light request on the then free worker got a wide
# first stage, and the light request waited for it (docs/benchmarks.md, session 28).
SHELTER_GRACE_S = 0.1


class Placement:
    def __init__(
        self,
        targets: Sequence[Target],
        *,
        routing: Routing = "locality",
        clock: Callable[[], float],
        prefix_affinity_tokens: int = 0,
        affinity_slack: int = 2,
        kv_tokens: Sequence[int] | None = None,
        stagger: Stagger | None = None,
    ) -> None:
        self.targets = targets
        self.stagger = stagger or Stagger()
        self.routing: Routing = routing
        self.clock = clock
        self.prefix_affinity_tokens = prefix_affinity_tokens
        self.affinity_slack = affinity_slack
        n = len(targets)
        # Sized by each worker's KV (`set_capacity` once it is read).
        self.index = PrefixIndex(kv_tokens or [1] * n)
        # Per worker, the exact view from its KV events (`kv_events.py`), which
        # locality uses instead of the index while it is not stale; None: off.
        self.exact: list[CacheView | None] = [None] * n
        # Per worker, every key of the prompts placed there whose prefill has not
        # streamed (how many such prompts carry it): the engine stores (and reports)
        # a prompt only once computed, but a request placed there meanwhile with any
        # prefix of it (a shared document, not only the whole prompt) shares the
        # computation.
        self._computing: list[dict[int, int]] = [{} for _ in range(n)]
        # Per worker, every key of the prompts in flight there (how many carry it):
        # their blocks take KV once, whoever brought them (`adds_kv`).
        self._pinned: list[dict[int, int]] = [{} for _ in range(n)]
        # Per worker, the requests in flight there, in placement order (`seq`).
        self._placed: list[set[Placed]] = [set() for _ in range(n)]
        self._seq = itertools.count()
        # First tokens that found less cached than the placement counted on; and
        # prompts found colder before their prefill started (`recheck`).
        self.overestimated = 0
        self.evicted_before_prefill = 0
        # Per worker: requests placed there, their KV claims, and their uncached
        # prompt tokens that have not streamed yet.
        self.in_flight = [0] * n
        self.kv_in_flight = [0] * n
        self.pending_prefill = [0] * n
        # Prompt tokens the workers reported cached, and those the index expected.
        self.cached_tokens_total = 0
        self.predicted_cached_total = 0
        self.locality = LocalityStats()
        # Replicas: each sequence routed (worker URL, its deepest prefix key) goes to
        # the others (prefix_share.py), whose routes come back through `learn`.
        self.on_routed: Callable[[str, int], None] | None = None
        # Replicas: each prefill routed (worker URL, an id, its uncached tokens; 0 when
        # it is over) goes to the others, whose prefills come back through
        # `learn_prefill`, per worker: id -> (tokens, counted until).
        self.on_prefill: Callable[[str, str, int], None] | None = None
        self.remote_prefill: list[dict[str, tuple[int, float]]] = [{} for _ in range(n)]
        self.remote_prefill_ttl_s = REMOTE_PREFILL_TTL_S
        self._prefills = itertools.count(1)
        # Replicas: this replica's requests and KV in flight on a worker, and its quiet
        # prefill there (`quiet_prefill`), whenever they change (worker URL,
        # requests, KV tokens, prefill tokens) go to the others, whose loads come
        # back through `learn_load` (remote_load.py).
        self.on_load: Callable[[str, int, int, int], None] | None = None
        self.remote_load = RemoteLoads(n)
        # Replicas: this replica placed a light tenant's short request (the stagger's
        # light tenant is active); the others' come back through `learn_light`.
        self.on_light: Callable[[], None] | None = None

    # -- load -----------------------------------------------------------------------
    def load(self, i: int, now_s: float, kv_tokens: int = 0, requests: int = 0) -> float:
        """How full worker `i` would be with `requests` more of `kv_tokens` in all,
        as a fraction of its own capacity (1.0: full)."""
        t = self.targets[i]
        remote_requests, remote_kv = self.remote_load.of(i, now_s)
        busy = self.in_flight[i] + remote_requests + t.penalty(now_s)
        kv_busy = self.kv_in_flight[i] + remote_kv
        return fullness(busy, kv_busy, t.slots(), t.kv_capacity(), requests, kv_tokens)

    # -- what admission asks ----------------------------------------------------------
    def prefill_pending(self, i: int) -> int:
        """Uncached prompt tokens routed to worker `i` that have not streamed yet:
        this replica's, and the other replicas' still counted (`learn_prefill`, and
        their quiet prefill, `learn_load`)."""
        remote = self.remote_prefill[i]
        now_s = self.clock()
        quiet = self.remote_load.prefill(i, now_s)
        if not remote:
            return self.pending_prefill[i] + quiet
        for pid in [pid for pid, (_, until_s) in remote.items() if until_s <= now_s]:
            del remote[pid]
        return self.pending_prefill[i] + quiet + sum(n for n, _ in remote.values())

    def prefix_keys(self, prompt_token_ids: Sequence[int]) -> list[int]:
        """The keys locality matches a prompt by ([] with least_full)."""
        return self.index.chain(prompt_token_ids) if self.routing == "locality" else []

    def cached_prefix(self, req: QueuedRequest) -> int:
        """For locality-aware admission (`scheduler.request.Locality`): the prefix
        of the queued request's prompt held by the worker the placement would pick
        for it now (its KV at admission, locality's preference); if that worker has
        room, it goes with the request (`cached_on`) to `place`. With the cold-start
        hold on, sets with it the longest prefix any worker holds (`held_anywhere`):
        the larger of the two is charged at `vtc_w_cached`
        (`QueuedRequest.charged_cached`) and the engine's
        report at the first token charges any shortfall, but nothing refunds a
        better hit (counters only grow), so an estimate that errs low overcharges
        for good (docs/benchmarks.md, sessions 31-32):
        - Where no worker has room the rule still picks (the least cost among them
          all), and the prefix held there is the estimate, not none.
        - The index matches whole blocks; the engine reports its hit to the token,
          up to a block more (a shared prompt's tail short of a block), so both
          count that block as held and the shortfall makes them exact. Erring low
          by 12-15 tokens a request overcharged `sys` 9-10 k weighted tokens per
          unit weight per 40 s (live, four workers, prefix mix), a drift past any
          bound.
        - With the hold, a prompt the rule's worker holds none of may still go
          where its prefix is (held until a prefill ends, `fg-shelter-512`: 17-72
          of `rag`'s documents a run, overcharged 24-102 k per unit weight when
          charged in full), so the charge counts the longest prefix held
          anywhere. Placed cold after all, it is charged short until its first
          token: without the hold every prompt is placed at once by the rule,
          and that window only skewed the order (virtual fleet, two engines, no
          levers: Jain over service 0.967 to 0.932). Its KV and locality's
          preference stay the rule's worker's: the longest prefix elsewhere, used
          for them too, over-admitted cold prompts and cost `fg-locality` 43 %
          of its tokens/s."""
        candidates = self._candidates(set())
        views = self._views(candidates, req.prompt_tokens, req.max_tokens, req.prefix_keys)
        req.cached_on = None
        held = max((v.matched for _, v in views), default=0) if self.stagger.holds else 0
        req.held_anywhere = self._counted(held, req)
        if not views:
            return 0
        i, view = views[route([v for _, v in views], req.prompt_tokens, self.routing)]
        if view.matched <= 0:
            return 0
        if view.load <= 1.0:
            req.cached_on = i
        return self._counted(view.matched, req)

    def _counted(self, matched: int, req: QueuedRequest) -> int:
        """A matched prefix as cached tokens: the partial block the index cannot see
        counted as held (`_cacheable`)."""
        if matched <= 0:
            return 0
        return _cacheable(matched + self.index.block - 1, req.prompt_tokens)

    # -- one request ---------------------------------------------------------------------
    def place(self, req: EngineRequest, keys: list[int], tried: set[int]) -> Placed | None:
        """Where `req` goes among the healthy workers not yet `tried`, its priority
        there, and its claim on that worker (counted until `released`); None: no
        healthy worker left. Admission's worker (`req.cached_on`) while it has
        room; else the rule (`routing.route`): a light request (`req.light`) where
        it starts soonest, one its engine preempts for may take a full worker."""
        candidates = self._candidates(tried)
        if not candidates:
            return None
        views = self._views(candidates, req.prompt_tokens, req.max_tokens, keys)
        views = self._staggered(req, keys, views)
        candidates = [i for i, _ in views]
        # Prefix affinity: within `affinity_slack` requests (in its slots) of the least full.
        preferred = affinity(req.prompt_token_ids, len(candidates), self.prefix_affinity_tokens)
        slots = self.targets[candidates[preferred]].slots() if preferred is not None else 1
        slack = self.affinity_slack / max(1, slots) if preferred is not None else 0.0
        j = route(
            [v for _, v in views],
            req.prompt_tokens,
            self.routing,
            preferred=preferred,
            slack=slack,
            soonest=req.light,
            preempts=req.preempt_priority is not None,
        )
        i, view = views[j]
        if req.cached_on is not None:
            i, view = self._follow(req.cached_on, views, keys, i, view, req.light)
        priority = self.priority_on(i, req.priority, req.preempt_priority)
        pending = req.prompt_tokens - view.matched
        self.in_flight[i] += 1
        kv = self.adds_kv(i, keys, req.prompt_tokens, req.max_tokens)
        self.pending_prefill[i] += pending
        placed = Placed(
            i,
            priority,
            view.matched,
            kv,
            pending,
            keys,
            seq=next(self._seq),
            light_waiting=req.light,
            placed_s=self.clock(),
        )
        self._placed[i].add(placed)
        self._pin(placed, req.prompt_tokens, req.max_tokens)
        self._routed(i, keys)
        self._announce(placed)
        self._loaded(i)  # after `_announce`: an announced prefill is not quiet
        if keys:
            computing = self._computing[i]
            placed.matched_computing = min(view.matched, self._computing_prefix(i, keys))
            for k in keys:
                computing[k] = computing.get(k, 0) + 1
            placed.computing = True
        return placed

    # -- KV in flight ------------------------------------------------------------------
    def adds_kv(self, i: int, keys: Sequence[int], prompt_tokens: int, max_tokens: int) -> int:
        """KV a request would add on worker `i`: its prompt and output, less the
        prefix that requests in flight there pin (the engine shares it). A prefix
        only cached there is not less: evictable, it takes KV once a request pins it
        (counting it free left the engine full where the placement saw room)."""
        pinned, n = self._pinned[i], 0
        while n < len(keys) and keys[n] in pinned:
            n += 1
        return rules.kv_tokens(prompt_tokens - n * self.index.block, max_tokens)

    def _pin(self, p: Placed, prompt_tokens: int, max_tokens: int) -> None:
        """Count `p`'s claim (`p.kv_tokens`) on its worker and pin its keys: their
        blocks stay counted until the last request carrying them leaves, the rest
        (`p.own_kv`) until `p` does."""
        pinned = self._pinned[p.worker]
        for k in p.keys:
            pinned[k] = pinned.get(k, 0) + 1
        self.kv_in_flight[p.worker] += p.kv_tokens
        p.own_kv = rules.kv_tokens(prompt_tokens - len(p.keys) * self.index.block, max_tokens)

    def _unpin(self, p: Placed) -> None:
        pinned, freed = self._pinned[p.worker], 0
        for k in p.keys:
            if pinned[k] > 1:
                pinned[k] -= 1
            else:
                del pinned[k]
                freed += self.index.block
        self.kv_in_flight[p.worker] -= p.own_kv + freed

    def held(self, i: int, keys: Sequence[int]) -> int:
        """Tokens of the prefix `keys` worker `i` holds: from its KV events while
        they are followed without a gap, else as the index guesses."""
        view = self.exact[i]
        if view is None or view.stale:
            return self.index.match(i, keys)
        return max(view.match(keys), self._computing_prefix(i, keys))

    def _computing_prefix(self, i: int, keys: Sequence[int]) -> int:
        """Tokens of the prefix `keys` that requests placed on worker `i` are still
        computing (a prompt's keys are chained: a key in flight carries all before it)."""
        computing, n = self._computing[i], 0
        while n < len(keys) and keys[n] in computing:
            n += 1
        return n * self.index.block

    def recheck(self, p: Placed) -> int:
        """What `p`'s worker holds of its prompt now (its cache, and prompts placed
        before it still being computed there): asked as its prefill is about to
        start (its turn in the worker's staged-prefill lane), the prefix it was
        placed for may have been evicted while it waited.
        Only an exact view (KV events) can say so: without one, `p.matched`. What
        is no longer held counts as its pending prefill there (its KV counted
        whole already: `adds_kv`)."""
        i, keys = p.worker, p.keys
        view = self.exact[i]
        if p.released or view is None or view.stale:
            return p.matched
        # As `held`, a prompt still being computed there counts, but only one placed
        # before it (ahead in the lane, or prefilling): one placed after it on the
        # same document computes nothing before it does.
        ahead = max(
            (_shared(q.keys, keys) for q in self._placed[i] if q.computing and q.seq < p.seq),
            default=0,
        )
        now = min(p.matched, max(view.match(keys), ahead * self.index.block))
        if now < p.matched:
            gone, p.matched = p.matched - now, now
            self.evicted_before_prefill += 1
            p.pending += gone
            self.pending_prefill[i] += gone
            self._announce(p)
            self._loaded(i)
        return now

    def sheltered(self, p: Placed) -> bool:
        """Is a light request kept off `p`'s worker now (`Stagger.shelters`), and
        none waiting there for its first token, this replica's or another's as
        announced (a wide stage would share its prefill step): `p`'s stages may
        be wide (staged_prefill.py). Not within `SHELTER_GRACE_S` of its placing
        while other replicas hear of it: one of theirs may not be announced yet."""
        if any(q.light_waiting for q in self._placed[p.worker]):
            return False
        if self.on_prefill is not None and self.clock() - p.placed_s < SHELTER_GRACE_S:
            return False
        pending = self._all_pending()  # drops the other replicas' expired prefills
        remote = self.remote_prefill[p.worker]
        if any(pid.partition(":")[2].startswith(LIGHT_PREFILL) for pid in remote):
            return False
        healthy = [t.healthy for t in self.targets]
        return self.stagger.shelters(p.worker, pending, healthy, self.clock())

    def overtakes(self, p: Placed) -> bool:
        """May `p` take its worker's staged-prefill lane between a long prompt's
        stages (`StagedPrefill.short_first`)? Its uncached part is no long prefill
        (`Stagger.short`), and no prompt placed before it there, still computing,
        shares its prefix (which `recheck` would count as held before it is)."""
        if not self.stagger.short(p.pending) or not self.stagger.min_tokens:
            return False
        return not any(
            _shared(q.keys, p.keys) for q in self._placed[p.worker] if q.computing and q.seq < p.seq
        )

    def _announce(self, p: Placed) -> None:
        """Tell the other replicas of `p`'s prefill, long enough to weigh (again if
        it grew), or a light request's of any length (`sheltered`: a light request
        waits there)."""
        light = p.light_waiting
        if self.on_prefill is None or (p.pending < self._shared_prefill_tokens() and not light):
            return
        mark = LIGHT_PREFILL if light else ""
        p.prefill_id = p.prefill_id or mark + str(next(self._prefills))
        tokens = max(p.pending, 1) if light else p.pending  # 0 would say it is over
        self.on_prefill(self.targets[p.worker].url, p.prefill_id, tokens)

    def _computed(self, p: Placed) -> None:
        """`p`'s prompt is computed (or it left): it no longer counts as held there."""
        if not p.computing:
            return
        p.computing = False
        computing = self._computing[p.worker]
        for k in p.keys:
            if computing.get(k, 0) > 1:
                computing[k] -= 1
            else:
                computing.pop(k, None)

    def priority_on(self, i: int, priority: int, preempt_priority: int | None) -> int:
        """The priority a request goes to worker `i` with: `preempt_priority` (a
        light request's, its engine retracts a running request for it) only
        where no slot is free; elsewhere it starts without retracting anyone."""
        if preempt_priority is None or self.load(i, self.clock(), 0, 1) <= 1.0:
            return priority
        return preempt_priority

    def first_token(self, p: Placed, prompt_tokens: int, cached: int) -> None:
        """Its first chunk: its prefill is done; the worker says how much of the
        prompt it had cached. Fewer tokens than the index matched means it
        evicted more than the index did (or restarted), except a miss within the
        prefix another request was still computing there when this one was placed
        (the engine may not have held it yet). A whole prompt matched comes back
        a token short (an engine computes at least the last one): not an
        eviction either. Taken for one, every repeat of a block-aligned prompt
        forgot another prompt's block; that tenant, then thought cold, was
        passed over by locality for the whole allowance (a wait-mode quota
        tenant lost seconds of its bucket: test_replicas.py, session 33)."""
        self._prefilled(p)
        self._loaded(p.worker)
        reported = min(max(0, cached), prompt_tokens)
        predicted = _cacheable(p.matched, prompt_tokens)
        self.cached_tokens_total += reported
        self.predicted_cached_total += predicted
        if reported < predicted:
            self.overestimated += 1  # placed for a prefix the worker did not hold
            if reported >= p.matched_computing:
                # Beyond what was still being computed: evicted. A miss within it
                # says nothing of the rest (the engine matches a prefix).
                self.index.shrink(p.worker, predicted - reported)

    def finished(self, p: Placed, prompt_token_ids: Sequence[int], output: Sequence[int]) -> None:
        """The worker finished it: SGLang caches the whole sequence, which a
        conversation's next turn re-sends."""
        if self.routing == "locality":
            self._routed(p.worker, self.index.chain([*prompt_token_ids, *output], p.keys))

    def released(self, p: Placed) -> None:
        """It left the worker (finished, failed, aborted): its claim is freed once."""
        if p.released:
            return
        p.released = True
        i = p.worker
        self.in_flight[i] -= 1
        self._placed[i].discard(p)
        self._unpin(p)
        self._loaded(i)
        self._prefilled(p)

    def _loaded(self, i: int) -> None:
        """This replica's load on worker `i` changed: the others weigh it too."""
        if self.on_load is not None:
            url, quiet = self.targets[i].url, self.quiet_prefill(i)
            self.on_load(url, self.in_flight[i], self.kv_in_flight[i], quiet)

    def quiet_prefill(self, i: int) -> int:
        """This replica's prefill on worker `i` not announced one by one (`_announce`:
        short), not streamed: the other replicas weigh it as their own, in routing
        and pacing (remote_load.py). Only with staggered prefill on (0 without):
        the isolation levers need it, and without them locality routing weighing
        it served the other tenants later (virtual fleet, two replicas, prefix mix:
        their TTFT p50 294 → 524 ms on two engines; docs/benchmarks.md, session 29),
        and every change of it wakes the prefix share's sender."""
        if not self.stagger.min_tokens:
            return 0
        return sum(q.pending for q in self._placed[i] if not q.prefill_id)

    def _shared_prefill_tokens(self) -> int:
        """The shortest prefill announced to the other replicas: one the stagger
        counts as long, and any of `SHARED_PREFILL_MIN_TOKENS` (a light request's
        routing weighs them)."""
        return min(SHARED_PREFILL_MIN_TOKENS, self.stagger.min_tokens or SHARED_PREFILL_MIN_TOKENS)

    def _prefilled(self, p: Placed) -> None:
        """`p`'s prefill is over (its first token, or it left): it no longer counts."""
        self.pending_prefill[p.worker] -= p.pending
        p.pending = 0
        p.light_waiting = False
        self._computed(p)
        if p.prefill_id and self.on_prefill is not None:
            self.on_prefill(self.targets[p.worker].url, p.prefill_id, 0)
        p.prefill_id = ""

    # -- internals ---------------------------------------------------------------------
    def _candidates(self, tried: set[int]) -> list[int]:
        return [i for i, t in enumerate(self.targets) if t.healthy and i not in tried]

    def _views(
        self, candidates: list[int], prompt_tokens: int, max_tokens: int, keys: Sequence[int]
    ) -> list[tuple[int, WorkerView]]:
        now_s, local = self.clock(), self.routing == "locality"
        views = []
        for i in candidates:
            matched = self.held(i, keys) if local else 0
            load = self.load(i, now_s, self.adds_kv(i, keys, prompt_tokens, max_tokens), 1)
            views.append((i, WorkerView(load, self.prefill_pending(i), matched)))
        return views

    def _follow(
        self,
        hint: int,
        views: list[tuple[int, WorkerView]],
        keys: Sequence[int],
        i: int,
        view: WorkerView,
        light: bool = False,
    ) -> tuple[int, WorkerView]:
        """Admission's worker `hint` if it can take the request now; else the rule's
        (`i`), the mismatch counted. A `light` request goes where the rule says it
        starts soonest (its cached prefix weighed there): the hint may be a worker a
        long prefill was routed to since admission looked."""
        s = self.locality
        s.hinted += 1
        if i == hint:
            s.followed += 1
            return i, view
        there = next((v for k, v in views if k == hint), None)
        if light and there is not None:
            s.sooner += 1
        elif there is not None and there.load <= 1.0:
            s.followed += 1
            s.overrode += 1
            return hint, there
        elif there is None:
            s.unavailable += 1
        else:
            s.full += 1
        held = self.held(hint, keys) if there is None else there.matched
        s.missed_tokens += max(0, held - view.matched)
        return i, view

    def _staggered(
        self, req: EngineRequest, keys: Sequence[int], views: list[tuple[int, WorkerView]]
    ) -> list[tuple[int, WorkerView]]:
        """Staggered prefill (`stagger.py`, lever 1): while a light tenant is active a
        long prompt never takes the last worker on short steps, so a light request
        always has one whose next step ends soon (`route(soonest)` finds it); and a
        paced short prompt goes where the short prefill queued stays within the pace."""
        now_s = self.clock()
        if self.stagger.saw(req.prompt_tokens, req.light, now_s) and self.on_light is not None:
            self.on_light()
        healthy = [t.healthy for t in self.targets]
        pending = self._all_pending()
        fits = self._fits(req, keys, now_s)
        # With other replicas: where a light request would go now (`Stagger.kept`).
        pick = (lambda: self._light_pick(pending, now_s)) if self.on_prefill is not None else None
        views = self.stagger.kept(req.prompt_tokens, views, pending, healthy, now_s, fits, pick)
        paced = self.stagger.paced_views(
            req.prompt_tokens, req.light, views, self.queued_short, now_s
        )
        return paced or views  # none with room: the hold's bound let it go

    def _light_pick(self, pending: Sequence[int], now_s: float) -> int | None:
        """The worker a light request would go to now (`route`'s soonest, a short
        prompt cold everywhere), as another replica placing one works it out."""
        candidates = self._candidates(set())
        if not candidates:
            return None
        views = [WorkerView(self.load(i, now_s, 0, 1), pending[i]) for i in candidates]
        return candidates[route(views, 1, self.routing, soonest=True)]

    def queued_short(self, i: int) -> int:
        """Short prefill queued on worker `i` (pacing, `stagger.py`): the uncached
        prompt tokens not streamed of this replica's requests there that leave less
        than the stagger's `keep()`, and the other replicas' quiet prefill there
        (their short prompts, mostly: remote_load.py)."""
        keep = self.stagger.keep()
        own = sum(q.pending for q in self._placed[i] if q.pending < keep)
        return own + self.remote_load.prefill(i, self.clock())

    def _fits(
        self, req: EngineRequest, keys: Sequence[int], now_s: float
    ) -> Callable[[int, WorkerView], bool]:
        def fits(i: int, v: WorkerView) -> bool:
            """Worker i's KV holds the prompt beside what is in flight there."""
            kv = self.adds_kv(i, keys, req.prompt_tokens, req.max_tokens)
            kv_busy = self.kv_in_flight[i] + self.remote_load.of(i, now_s)[1]
            return kv_busy + kv <= self.targets[i].kv_capacity()

        return fits

    def hold_until(
        self, req: EngineRequest, keys: Sequence[int], since_s: float, first: bool
    ) -> float | None:
        """Cold-start hold (`stagger.py`, lever 4), asked before `place`: the clock
        time until which `req` waits unsent (every worker mid-prefill, the light
        tenant active, the prompt cold and long; or the prompt would take the last
        worker free of long prefill for want of KV on the others; or, paced, a
        short prompt finds no worker with room), or None: place it now.
        `since_s`: when it was first asked (`first`: this is that time). Ask again
        once a worker's prefill ends (`first_token`, `released`) or at the time
        returned."""
        st, now_s = self.stagger, self.clock()
        if not st.holds:
            return None
        healthy = [t.healthy for t in self.targets]
        views = self._views(self._candidates(set()), req.prompt_tokens, req.max_tokens, keys)
        if not views:
            return None
        paced = st.paced_views(req.prompt_tokens, req.light, views, self.queued_short, now_s)
        if paced is not None:  # a short prompt: paced, never held as a long one
            return None if paced else st.pace_until_s(now_s, since_s, first)
        # Cold where it would go: the worker its first token comes soonest on (what
        # `route` weighs first): the least prefill ahead of it plus its own there.
        _, soonest = min(views, key=lambda iv: iv[1].pending_prefill - iv[1].matched)
        uncached = req.prompt_tokens - soonest.matched
        pending = self._all_pending()
        until_s = st.hold_until_s(uncached, pending, healthy, now_s, since_s, first)
        if until_s is not None:
            return until_s
        # Or the last free worker would be let go for want of KV elsewhere (`kept`).
        fits = self._fits(req, keys, now_s)
        return st.room_hold_until_s(
            req.prompt_tokens, views, pending, healthy, now_s, fits, since_s, first
        )

    def _all_pending(self) -> list[int]:
        """Every worker's `prefill_pending` (this replica's and the others')."""
        return [self.prefill_pending(i) for i in range(len(self.targets))]

    def _routed(self, i: int, keys: list[int]) -> None:
        self.index.insert(i, keys)
        if keys and self.on_routed is not None:
            self.on_routed(self.targets[i].url, keys[-1])

    # -- workers -------------------------------------------------------------------------
    def learn(self, url: str, key: int) -> None:
        """Another replica routed a sequence with this deepest key to `url`."""
        for i, t in enumerate(self.targets):
            if t.url == url:
                self.index.insert(i, [key])
                return

    def learn_prefill(self, url: str, prefill_id: str, tokens: int) -> None:
        """Another replica routed a prefill of `tokens` to `url` (0: it is over)."""
        for i, t in enumerate(self.targets):
            if t.url == url:
                if tokens > 0:
                    until_s = self.clock() + self.remote_prefill_ttl_s
                    self.remote_prefill[i][prefill_id] = (tokens, until_s)
                else:
                    self.remote_prefill[i].pop(prefill_id, None)
                return

    def learn_light(self) -> None:
        """Another replica placed a light tenant's short request: the light tenant is
        active here too (staggered prefill and the hold keep a worker for it)."""
        self.stagger.heard(self.clock())

    def learn_load(
        self, url: str, replica: str, requests: int, kv_tokens: int, prefill: int = 0
    ) -> None:
        """Replica `replica` has `requests` of `kv_tokens` in flight on `url`, and
        `prefill` tokens of quiet prefill there (`quiet_prefill`)."""
        for i, t in enumerate(self.targets):
            if t.url == url:
                self.remote_load.learn(i, replica, requests, kv_tokens, prefill, self.clock())
                return

    def set_capacity(self, i: int, kv_tokens: int) -> None:
        self.index.set_capacity(i, kv_tokens)

    def readmitted(self, i: int) -> None:
        """Back after an ejection: it may have restarted with an empty cache."""
        self.index.clear(i)


def _cacheable(tokens: int, prompt_tokens: int) -> int:
    """At most what an engine can report cached of a prompt: all but its last token,
    which it always computes."""
    return min(tokens, max(0, prompt_tokens - 1))


def _shared(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading prefix keys two prompts share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
