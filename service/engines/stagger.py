"""Isolation across engines while a light tenant is active (issue #33, levers 1
and 4), without I/O: the rules `Placement` applies to a long uncached prompt,
and the pace it keeps short prompts to.

SGLang never preempts a chunked prefill under way, so a light request that lands
on an engine in the middle of a long prompt waits for its remaining chunks. The
rules keep a worker on short steps for the light tenant:

- **keep one free** (`kept`, lever 1): a long prompt never takes the last
  worker free of long prefill (no long prefill routed there and not streamed).
  Where every worker is mid-prefill there is nothing to keep. With other
  replicas, where several are free it also leaves the one a light request
  would go to now (`kept`'s `pick`).
- **cold-start hold** (`hold_until_s`, lever 4): where every worker *is*
  mid-prefill, a cold long prompt is not started anywhere (which would keep
  them all mid-prefill for another prompt's worth of chunks): it waits, before
  it is sent, until a worker's prefill ends (then the rules above place it), the
  light tenant goes quiet, or it has waited `hold_max_s` — the bound that keeps
  batch traffic from starving. With the hold on, so does a long prompt that
  would take the last free worker because no other worker's KV holds it
  (`room_hold_until_s`): until a request ends elsewhere, within the same bound.
  Traced live (long mix, four workers), that exception was how the last free
  worker was lost 26 times of 29, and the light tenant's slowest first tokens
  came when no worker was free (docs/benchmarks.md, session 20). A held prompt
  is already admitted (its slot and KV counted), so the hold delays only the
  prompts themselves, never the fair queue behind them.
- **paced short prompts** (`pace_tokens`, with the hold on): SGLang packs
  every waiting request into a prefill step, so the light request's first step
  carries whatever short prompts other tenants queued at its engine. While the
  light tenant is active, a short prompt (uncached below `keep()` where it goes,
  not light) goes only to a worker whose short prefill queued there (placed by
  this replica, not streamed) stays within `pace_tokens` with it, or has none;
  where no worker has room it waits unsent, as the hold does (until a worker's
  prefill ends, the light tenant goes quiet, or `hold_max_s`). Never to a worker
  where it would be cold: a prompt short only where its prefix is cached waits
  for that worker. Traced on the virtual fleet (docs/benchmarks.md, session 24):
  the light request's slowest first tokens came in steps packed with 130 tokens
  of other tenants' short prompts (336 traced live, session 23). Only with two
  workers or more to choose from: with one, a paced prompt has nowhere else to
  go, and waiting unsent it holds its admission slot while the engine orders the
  light request first anyway (virtual fleet, one engine, prefix mix, six seeds:
  0.48 of the bar paced, 0.26 not; the slowest light requests waited in
  admission with every slot counted, 7-10 of them prompts waiting unsent;
  docs/benchmarks.md, session 25).

Keeping one free applies only while at least `min_workers` workers are healthy
(default 3): keeping one of two off long prefill takes half the pool's prefill
from the long prompts, and on two workers staged prefill alone meets the bar
(docs/benchmarks.md, session 18: live, prefix mix, the levers with it at 0.71x
the tokens/s of none, the stages alone at 1.10x, median of three seeds). The
hold has no such floor: a pool of one holds too.

A prompt is long when its uncached tokens (the prompt less the longest prefix a
worker holds) reach `min_tokens`; a light tenant is active for `light_window_s`
after its last short request was placed, by this replica or (`heard`) another.
The worker kept on short steps takes less than that: only prompts that leave
its prefill under `keep_tokens` (`keep`, default `min_tokens`). A prompt below
`min_tokens` is no long prefill, yet at 1 000 tokens it is a 180 ms step
beside which the light request waits (the long mix's 200-1 500-token
conversations; docs/benchmarks.md, the session-16 section on the kept
worker's threshold).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from service.engines.routing import WorkerView

# The fewest healthy workers keeping one free applies on (see above).
MIN_WORKERS = 3


@dataclass(slots=True)
class Stagger:
    """`min_tokens`: an uncached prompt this long is a long prefill (0: both rules
    off); `keep_tokens`: the worker kept on short steps takes only prompts that
    leave its prefill below this (0: `min_tokens`); `keep_free`: lever 1 on;
    `hold_max_s`: lever 4's bound (0: no hold); `min_workers`: the fewest healthy
    workers lever 1 applies on; `pace_tokens`: the most short prefill queued on a
    worker while the light tenant is active (0: not paced; needs the hold)."""

    min_tokens: int = 0
    keep_tokens: int = 0
    light_window_s: float = 10.0
    keep_free: bool = True
    hold_max_s: float = 0.0
    min_workers: int = MIN_WORKERS
    pace_tokens: int = 0
    light_seen_s: float = float("-inf")
    # Long prompts kept off the last worker on short steps, and those let onto it
    # because no other worker's KV held them (`kept`'s `fits`).
    kept_free: int = 0
    kept_given_up: int = 0
    # Cold long prompts held (once each), and those the bound released.
    held: int = 0
    held_to_bound: int = 0
    # Short prompts paced (held once each), and those the bound released.
    paced: int = 0
    paced_to_bound: int = 0

    @property
    def holds(self) -> bool:
        """Lever 4 is on: a prompt may wait unsent and be placed later, on
        another worker than the one routing picked at admission."""
        return bool(self.min_tokens and self.hold_max_s)

    def saw(self, prompt_tokens: int, light: bool, now_s: float) -> bool:
        """A request is being placed: a light tenant's short one marks it active (its
        long prompts, as every tenant's first ones, are long prefills like any other).
        True: it did."""
        if light and self.min_tokens and prompt_tokens < self.min_tokens:
            self.light_seen_s = now_s
            return True
        return False

    def heard(self, now_s: float) -> None:
        """Another replica placed a light tenant's short request (about) now."""
        self.light_seen_s = max(self.light_seen_s, now_s)

    def light_active(self, now_s: float) -> bool:
        return now_s - self.light_seen_s <= self.light_window_s

    def keep(self) -> int:
        """The worker kept on short steps stays below this much prefill."""
        return self.keep_tokens or self.min_tokens

    def enough(self, healthy: Sequence[bool]) -> bool:
        """Are there workers enough (`min_workers`) to keep one free?"""
        return sum(healthy) >= self.min_workers

    def short(self, pending_prefill_tokens: int) -> bool:
        """A worker with this much prefill routed and not streamed is on short steps."""
        return pending_prefill_tokens < self.min_tokens

    def shelters(
        self, worker: int, pending: Sequence[int], healthy: Sequence[bool], now_s: float
    ) -> bool:
        """Is a light request kept off `worker` now, so that a long prompt there may
        go in wide stages (`StagedPrefill.sheltered_stage_tokens`)? While the light
        tenant is active, this worker is not on short steps but another healthy one
        is, and `kept` holds one so (enough workers): a light request goes where it
        starts soonest (`route`), which is there, not behind this worker's long
        prefill. Not on
        fewer workers: nothing keeps the other one short, and a long prompt may
        take it next (virtual fleet, two engines, stages of 256 and 512: the bar
        lost; docs/benchmarks.md, session 26). Sheltered there by the other worker
        while it is short, or while it is not on wide stages itself, the light
        request has one worker left to go to: at load 1 the median reached the bar
        or passed it, for 0.5-1 % of the tokens/s (session 34). Nor while the
        light tenant is quiet: its next request would find every worker mid-stage,
        and wide stages there cost the bar on the virtual fleet (session 27)."""
        if not (self.min_tokens and self.keep_free and self.light_active(now_s)):
            return False
        # On short steps itself (a prompt below the long mark staged there), it is
        # where a light request may go next (traced live, session 27).
        if not self.enough(healthy) or self.short(pending[worker]):
            return False
        return any(
            ok and i != worker and self.short(p)
            for i, (p, ok) in enumerate(zip(pending, healthy, strict=True))
        )

    def kept(
        self,
        prompt_tokens: int,
        views: list[tuple[int, WorkerView]],
        pending: Sequence[int],
        healthy: Sequence[bool],
        now_s: float,
        fits: Callable[[int, WorkerView], bool] | None = None,
        pick: Callable[[], int | None] | None = None,
    ) -> list[tuple[int, WorkerView]]:
        """The views a prompt of `prompt_tokens` may take: while the light tenant is
        active, all but the last worker on short steps, unless the prompt's part
        uncached there keeps that worker's prefill below `keep()`, or
        (`fits(i, view)`: worker i's KV holds the prompt beside what is in flight
        there; asked only where the rule applies) no other worker holds it: parked
        on a full one it waits in that engine's queue while its KV fills
        admission's budget, and the light tenant waits behind it in fairgate's
        queue (docs/benchmarks.md, "Long mix on two workers: traced"). That last
        case is what `room_hold_until_s` holds, where the hold is on.

        `pick` (given with other replicas placing on the same workers): the worker
        a light request would go to now (`route`'s soonest; asked only where
        several workers are on short steps). With several on
        short steps the prompt leaves that one too, where another on short steps
        takes it with as much of its prefix cached and room for its KV: another
        replica's light request may be on its way there, not yet announced, and
        both rules alone pick the same idle worker (traced live, two replicas,
        docs/benchmarks.md, session 29)."""
        left, given_up = self._kept(prompt_tokens, views, pending, healthy, now_s, fits, pick)
        self.kept_given_up += given_up
        if len(left) < len(views):
            self.kept_free += 1
        return left

    def _kept(
        self,
        prompt_tokens: int,
        views: list[tuple[int, WorkerView]],
        pending: Sequence[int],
        healthy: Sequence[bool],
        now_s: float,
        fits: Callable[[int, WorkerView], bool] | None,
        pick: Callable[[], int | None] | None = None,
    ) -> tuple[list[tuple[int, WorkerView]], bool]:
        """`kept`'s views, and whether the last free worker was let go for want of
        KV elsewhere (no counting)."""
        keep = self.keep()
        if not (self.min_tokens and self.keep_free) or prompt_tokens < keep:
            return views, False
        if not self.light_active(now_s) or not self.enough(healthy):
            return views, False
        free = [i for i, ok in enumerate(healthy) if ok and self.short(pending[i])]
        if len(free) > 1 and pick is not None and (light := pick()) in free:
            return self._off_pick(prompt_tokens, views, pending, free, light, fits), False
        if len(free) != 1:
            return views, False
        last = free[0]
        left = [
            (i, v) for i, v in views if i != last or pending[i] + prompt_tokens - v.matched < keep
        ]
        if fits is not None and not any(fits(i, v) for i, v in left if i != last):
            return views, len(left) < len(views)
        return (left or views), False

    def _off_pick(
        self,
        prompt_tokens: int,
        views: list[tuple[int, WorkerView]],
        pending: Sequence[int],
        free: list[int],
        pick: int,
        fits: Callable[[int, WorkerView], bool] | None,
    ) -> list[tuple[int, WorkerView]]:
        """`kept` with several workers on short steps: the views without the light
        request's `pick`, where another on short steps takes the prompt as cached
        and with room; else all of them (nothing is held for it)."""
        there = next((v for i, v in views if i == pick), None)
        if there is None or pending[pick] + prompt_tokens - there.matched < self.keep():
            return views
        left = [(i, v) for i, v in views if i != pick]
        if any(
            i in free and v.matched >= there.matched and (fits is None or fits(i, v))
            for i, v in left
        ):
            return left
        return views

    def room_hold_until_s(
        self,
        prompt_tokens: int,
        views: list[tuple[int, WorkerView]],
        pending: Sequence[int],
        healthy: Sequence[bool],
        now_s: float,
        fits: Callable[[int, WorkerView], bool],
        since_s: float,
        first: bool,
    ) -> float | None:
        """With the hold on: until when a prompt that `kept` would let onto the last
        free worker, for want of KV elsewhere, waits unsent instead (the KV held
        elsewhere frees as requests end; the last free worker stays on short steps
        for the light tenant), at most `hold_max_s` from `since_s`; None: place it
        now. Counted in `held` / `held_to_bound` as the cold-start hold."""
        if not self.hold_max_s:
            return None
        _, given_up = self._kept(prompt_tokens, views, pending, healthy, now_s, fits)
        if not given_up:
            return None
        return self._held_until_s(now_s, since_s, first)

    def hold_until_s(
        self,
        uncached_tokens: int,
        pending: Sequence[int],
        healthy: Sequence[bool],
        now_s: float,
        since_s: float,
        first: bool,
    ) -> float | None:
        """Until when a prompt of `uncached_tokens` (the least any worker leaves
        uncached), waiting since `since_s`, is held; None: place it now. Asked
        again whenever a worker's prefill ends and at the time returned (`first`:
        the first time it is asked, counted in `held` if it is held)."""
        if not (self.min_tokens and self.hold_max_s) or uncached_tokens < self.min_tokens:
            return None
        if not self.light_active(now_s):
            return None
        live = [p for p, ok in zip(pending, healthy, strict=True) if ok]
        if not live or any(self.short(p) for p in live):
            return None
        return self._held_until_s(now_s, since_s, first)

    def paced_views(
        self,
        prompt_tokens: int,
        light: bool,
        views: list[tuple[int, WorkerView]],
        queued_short: Callable[[int], int],
        now_s: float,
    ) -> list[tuple[int, WorkerView]] | None:
        """Pacing (see above): None, the prompt is not paced; else the views it may go
        to ([]: none has room now). `queued_short(i)`: worker i's short prefill
        queued (`Placement.queued_short`)."""
        if len(views) < 2:  # nowhere else to go: waiting would only hold its slot
            return None
        uncached = prompt_tokens - max(v.matched for _, v in views)
        if not self.pacing(uncached, light, now_s):
            return None
        return [
            (i, v) for i, v in views if self.pace_room(queued_short(i), prompt_tokens - v.matched)
        ]

    def pacing(self, uncached_tokens: int, light: bool, now_s: float) -> bool:
        """Is a prompt leaving `uncached_tokens` where it goes best paced: short, not
        light, the light tenant active, the hold on (its bound)?"""
        return bool(
            self.pace_tokens
            and self.hold_max_s
            and not light
            and uncached_tokens < self.keep()
            and self.light_active(now_s)
        )

    def pace_room(self, queued_short_tokens: int, uncached_tokens: int) -> bool:
        """May a paced prompt leaving `uncached_tokens` on a worker go there, beside
        `queued_short_tokens` of short prefill queued there? Not where it is cold."""
        if uncached_tokens >= self.keep():
            return False
        return queued_short_tokens == 0 or queued_short_tokens + uncached_tokens <= self.pace_tokens

    def pace_until_s(self, now_s: float, since_s: float, first: bool) -> float | None:
        """Until when a paced prompt with no worker to go to waits (as the hold:
        `_until_s`); counted in `paced` / `paced_to_bound`."""
        until_s = self._until_s(now_s, since_s)
        if until_s is None:
            self.paced_to_bound += 1
        elif first:
            self.paced += 1
        return until_s

    def _held_until_s(self, now_s: float, since_s: float, first: bool) -> float | None:
        """`_until_s`, counted in `held` / `held_to_bound`."""
        until_s = self._until_s(now_s, since_s)
        if until_s is None:
            self.held_to_bound += 1
        elif first:
            self.held += 1
        return until_s

    def _until_s(self, now_s: float, since_s: float) -> float | None:
        """Held until the bound (`hold_max_s` from `since_s`) or the light tenant's
        window end, whichever is first; None: the bound is past."""
        until_s = since_s + self.hold_max_s
        if now_s >= until_s:
            return None
        return min(until_s, self.light_seen_s + self.light_window_s)
