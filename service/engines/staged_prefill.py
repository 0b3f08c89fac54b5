"""Staged prefill: a long uncached prompt enters one engine as prefix stages.

SGLang never preempts a chunked prefill under way, so on one engine a short
request waits for every remaining chunk of a long prompt ahead of it. SGLang
takes `max_new_tokens: 0` as prefill only and keeps the prompt in its radix
cache (all of it: tests/sglang/test_staged_prefill.py), so a prompt of P tokens
can go in as stages: the first S tokens, then the first 2S, ..., each
prefill-only, and last the request itself, which finds the stages cached and
prefills only the rest. Between two stages the engine's queue moves: a request
that arrived meanwhile (a light tenant's) starts before the next stage.

Stages go one after another through the same engine (`send`: one worker's
single-request stream, so a pool keeps them all on the worker it picked), each
under the request's id (an abort of the request reaches the stage under way)
and, over HTTP, a fresh rid. A stage that finds less of the prompt cached than
the stages before it put there (evicted in between) ends the staging: the rest
goes in one request, as without staging. So does a stage the engine refuses;
a worker that fails (retryable) fails the request as an unstaged one would, and
an aborted stage ends the request with that abort.

Wide stages (`sheltered_stage_tokens`): where the pool's staggered prefill keeps
another worker on short steps for an active light tenant and none of its
requests waits on this worker (`Placement.sheltered`), a light request goes
there, not behind this prompt: then the next stage may span up to that many
tokens, and the rest goes whole once it fits. Small
stages cost the long prompt a round trip and a step each (a 6 000-token prompt
in 47 stages of 128); wide ones keep the bar where nothing shelters the worker,
and give the long prompt its time back where something does. Asked before each
stage (`EngineRequest.sheltered`), so a worker left unsheltered mid-prompt goes
back to small stages after at most one wide one.

Short prompts first (`short_first`): a prompt short enough to be no long
prefill (`Placement.overtakes`: below the stagger's long mark, and no prompt
placed before it there still computing its prefix) takes the lane between two
stages of a long prompt ahead of it, instead of waiting for all of them (a
900-token conversation turn behind a 6 000-token prompt's 47 stages waits
seconds). Each step still carries one staged prompt's stage at most.

What is charged: the final request's `cached_tokens` include the stages', which
are the tenant's own prefill work; `EngineChunk.staged_tokens` says how many, so
that the fair counter charges them as prompt tokens (generation.py), never at
the cheap cached rate: staging never makes a long prompt cheaper.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

from service.engines.protocol import (
    EngineChunk,
    EngineError,
    EngineRequest,
    FinishKind,
    SamplingOptions,
)

log = logging.getLogger(__name__)

Send = Callable[[EngineRequest], AsyncGenerator[EngineChunk, None]]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StagedPrefill:
    """From which prompt length to stage, and each stage's size, in tokens."""

    min_tokens: int = 0  # 0: off
    stage_tokens: int = 2048
    # fairgate's token ids are the engine's (an exact tokenizer, or token-id
    # prompts only): a text prompt's stages are sent as ids, which must be a
    # prefix of what the engine makes of the text.
    exact_ids: bool = True
    # One staged request at a time per engine (from its first stage to its first
    # token): the engine's prefill steps then carry at most one stage of long
    # prompts, not a chunk filled from every long prompt queued there.
    one_at_a_time: bool = True
    # Stage only a prompt cold where it goes: its part uncached on the worker the
    # pool's placement chose (`EngineRequest.held_tokens`) reaches `min_tokens`, and
    # its stages start above the held part. A long prompt cached there goes whole,
    # in its turn in the lane (`laned`): what the placement counts as held may be
    # the prompt ahead of it in the lane, still being computed. Asked again when its
    # turn comes (`EngineRequest.held_now`): a prefix evicted meanwhile is staged.
    cold_only: bool = True
    # While the worker is sheltered (above): stages of up to this many tokens (0:
    # always `stage_tokens`).
    sheltered_stage_tokens: int = 0
    # A short prompt waiting in the lane goes between a long one's stages (above).
    short_first: bool = False

    def __post_init__(self) -> None:
        if self.min_tokens < 0 or self.stage_tokens < 1 or self.sheltered_stage_tokens < 0:
            raise ValueError(
                "staged prefill: min_tokens >= 0, stage_tokens >= 1, sheltered_stage_tokens >= 0"
            )

    @property
    def enabled(self) -> bool:
        return self.min_tokens > 0

    def laned(self, req: EngineRequest) -> bool:
        """Does `req` go through the engine's lane (`staged`), staged or whole?"""
        if req.prompt_text is not None and not self.exact_ids:
            return False
        return self.in_lane(req.prompt_tokens, req.max_tokens)

    def in_lane(self, prompt_tokens: int, max_tokens: int) -> bool:
        """A prompt this long would be staged were it cold: it takes the lane."""
        return bool(self.ends(prompt_tokens, max_tokens))

    def stage_ends(self, req: EngineRequest) -> list[int]:
        """The stages' lengths for `req` ([]: send it as it is), from what its
        worker holds of it now where the pool can say (`held_now`)."""
        if req.prompt_text is not None and not self.exact_ids:
            return []
        held = req.held_now() if req.held_now is not None else req.held_tokens or 0
        return self.ends(req.prompt_tokens, req.max_tokens, held)

    def ends(self, prompt_tokens: int, max_tokens: int, held_tokens: int = 0) -> list[int]:
        """The stages' lengths for a token-id prompt of `prompt_tokens`, of which the
        worker is thought to hold the first `held_tokens` (read with `cold_only`)."""
        held = min(max(0, held_tokens), prompt_tokens) if self.cold_only else 0
        if not self.enabled or prompt_tokens - held < self.min_tokens or max_tokens == 0:
            return []
        return [e for e in range(self.stage_tokens, prompt_tokens, self.stage_tokens) if e > held]

    def staging(self, req: EngineRequest, page_tokens: int = 1) -> Staging:
        """`req`'s staging as it starts (`stage_ends`), widened while its worker is
        sheltered (`wide`)."""
        return Staging(self.stage_ends(req), page_tokens, req.prompt_tokens, self.stage_tokens)

    def overtakes(self, req: EngineRequest) -> Callable[[], bool] | None:
        """Whether `req` may take the lane between a long prompt's stages, asked as
        the lane turns (`StageLane`); None: it waits its turn."""
        return req.overtakes if self.short_first else None

    def wide(self, sheltered: Callable[[], bool] | None) -> int:
        """How far the next stage may reach (`Staging.next_end`): 0, small stages."""
        if not self.sheltered_stage_tokens or sheltered is None or not sheltered():
            return 0
        return self.sheltered_stage_tokens


class Staging:
    """One request's staging as it goes: the next stage, and what each stage found.

    `page_tokens`: the engine's cache granularity (SGLang's page size): a stage
    of k tokens is found again as k rounded down to it. `prompt_tokens` and
    `stage_tokens` (the spacing of `ends`) place a wide stage (`next_end`)."""

    __slots__ = ("computed", "ends", "held", "page_tokens", "prompt_tokens", "start")

    def __init__(
        self, ends: list[int], page_tokens: int = 1, prompt_tokens: int = 0, stage_tokens: int = 0
    ) -> None:
        self.ends = list(reversed(ends))
        self.page_tokens = page_tokens
        self.prompt_tokens = prompt_tokens
        # Where the first stage starts: the end before it on the stages' grid.
        self.start = max(0, ends[0] - stage_tokens) if ends and stage_tokens else 0
        self.held = 0  # prompt tokens the stages left in the engine's cache
        self.computed = 0  # prompt tokens the stages prefilled

    def next_end(self, wide: int = 0) -> int | None:
        """The next stage's length; None: send the request whole. `wide` > 0: the
        stage may reach `wide` tokens past the last one's end, passing over the
        ends within that; the rest goes whole when it fits in it."""
        if wide and self.ends:
            reach = max(self.held, self.start) + wide
            if self.prompt_tokens and self.prompt_tokens <= reach:
                self.ends.clear()
            while len(self.ends) > 1 and self.ends[-2] <= reach:
                self.ends.pop()
        return self.ends[-1] if self.ends else None

    def stage_done(self, cached_tokens: int) -> bool:
        """The next stage found `cached_tokens` of its prefix cached; False when that
        is less than the stages before it left (evicted): no more stages."""
        end = self.ends.pop()
        self.computed += end - cached_tokens
        evicted = cached_tokens < self.held - self.held % self.page_tokens
        self.held = end
        if evicted:
            self.ends.clear()
        return not evicted

    def stop(self) -> None:
        self.ends.clear()

    def staged_tokens(self, cached_tokens: int) -> int:
        """Of the whole request's `cached_tokens`, those its stages prefilled."""
        return min(self.computed, cached_tokens)


@dataclass(slots=True)
class StagingStats:
    """Counters an engine keeps over its staged requests."""

    staged_requests: int = 0
    stages: int = 0
    # Stages sent widened (the worker sheltered: `StagedPrefill.sheltered_stage_tokens`).
    wide_stages: int = 0
    # Stagings ended early: a stage found its predecessors evicted, or was refused.
    evicted: int = 0
    refused: int = 0
    # Times a staged prompt let a short one take the lane between its stages.
    yielded: int = 0


@dataclass(slots=True, eq=False)
class _Turn:
    """A request waiting for the lane: `overtakes` (None: never) asked as it turns."""

    ready: asyncio.Future[None]
    overtakes: Callable[[], bool] | None


class StageLane:
    """An engine's lane for staged requests (`StagedPrefill.one_at_a_time`): held
    by one staged request from its first stage to its first token, FIFO, except
    that a waiting request that `overtakes` goes first, and takes it between two
    stages of one that does not (`overtaken`: the holder steps aside)."""

    __slots__ = ("_held", "_queue", "waiting")

    def __init__(self) -> None:
        self._held = False
        self._queue: list[_Turn] = []
        # Requests waiting for their first turn, unsent (admission may lend their slots).
        self.waiting = 0

    async def acquire(
        self, overtakes: Callable[[], bool] | None = None, *, resumed: bool = False
    ) -> None:
        """Wait for the lane. `resumed`: a holder that stepped aside, first in line
        again (its stages under way, so not unsent)."""
        if not self._held:  # free: `release` hands it to a live waiter, if any
            self._held = True
            return
        turn = _Turn(asyncio.get_running_loop().create_future(), overtakes)
        self._queue.insert(0 if resumed else len(self._queue), turn)
        self.waiting += not resumed
        try:
            await turn.ready
        except asyncio.CancelledError:
            if turn in self._queue:
                self._queue.remove(turn)
            elif not turn.ready.cancelled():  # handed the lane as it was cancelled
                self.release()
            raise
        finally:
            self.waiting -= not resumed

    def release(self) -> None:
        """Hand the lane on (`next_turn`; not to one cancelled that has yet to
        leave the queue)."""
        live = [t for t in self._queue if not t.ready.done()]
        nxt = next_turn(live, lambda t: _overtakes(t.overtakes))
        if nxt is None:
            self._held = False
            return
        self._queue.remove(nxt)
        nxt.ready.set_result(None)

    def overtaken(self, overtakes: Callable[[], bool] | None) -> bool:
        """Does a waiter take the lane before the holder's next stage? Only one
        that overtakes, and never a holder that overtakes itself (FIFO among those)."""
        waiting = (t for t in self._queue if not t.ready.done())
        return steps_aside(_overtakes(overtakes), (_overtakes(t.overtakes) for t in waiting))


def _overtakes(overtakes: Callable[[], bool] | None) -> bool:
    return overtakes is not None and overtakes()


def next_turn(waiting: Sequence[T], overtakes: Callable[[T], bool]) -> T | None:
    """Whose turn in a lane is next: the first waiter that overtakes, else the
    first (the pool's `StageLane` and the virtual fleet's lanes)."""
    return next((t for t in waiting if overtakes(t)), waiting[0] if waiting else None)


def steps_aside(holder_overtakes: bool, waiters_overtake: Iterable[bool]) -> bool:
    """Does a lane's holder step aside between two stages? Only for a waiter that
    overtakes, and never when it overtakes itself (FIFO among those)."""
    return not holder_overtakes and any(waiters_overtake)


async def staged(
    send: Send,
    req: EngineRequest,
    plan: StagedPrefill,
    stats: StagingStats,
    page_tokens: int = 1,
    lane: StageLane | None = None,
) -> AsyncGenerator[EngineChunk, None]:
    """`req` through `send` in the prefix stages `plan` gives it (none: it goes
    whole), then whole; with a `lane`, only once it holds it, until its first
    token. The stages are planned once the lane is held: a prefix the placement
    counted cached may have been evicted while the request waited for it
    (`StagedPrefill.stage_ends`, `held_now`), and is then staged, not sent whole.
    Each stage is widened while the worker is sheltered (`req.sheltered`); after
    each, a short prompt waiting for the lane may take it first (`short_first`)."""
    held = False
    try:
        overtakes = plan.overtakes(req)
        if lane is not None:
            await lane.acquire(overtakes)
            held = True
        staging = plan.staging(req, page_tokens)
        stats.staged_requests += bool(staging.ends)
        while (end := staging.next_end(wide := plan.wide(req.sheltered))) is not None:
            stage = dataclasses.replace(
                req,
                prompt_token_ids=req.prompt_token_ids[:end],
                prompt_text=None,
                max_tokens=0,
                sampling=SamplingOptions(),
                prefix_keys=(),
            )
            try:
                last = await _run(send, stage)
            except EngineError as exc:
                if exc.retryable:
                    raise  # the worker failed: as an unstaged request would
                stats.refused += 1
                staging.stop()
                log.info("staged prefill of %s: stage refused, sent whole: %s", req.request_id, exc)
                break
            stats.stages += 1
            stats.wide_stages += bool(wide)
            if last.finish is FinishKind.ABORT:
                # Aborted (by fairgate's abort of the request, or by the engine): so is it.
                last.prompt_tokens = req.prompt_tokens
                yield last
                return
            if not staging.stage_done(last.cached_tokens):
                stats.evicted += 1
                log.info(
                    "staged prefill of %s: stages evicted, the rest sent whole", req.request_id
                )
            if lane is not None and lane.overtaken(overtakes):  # a short prompt goes first
                stats.yielded += 1
                held = False
                lane.release()
                await lane.acquire(overtakes, resumed=True)
                held = True
        whole = dataclasses.replace(req, prompt_text=None) if staging.held else req
        async with aclosing(send(whole)) as stream:
            async for chunk in stream:
                if held and lane is not None:  # its prefill is done: the next one's turn
                    held = False
                    lane.release()
                chunk.staged_tokens = staging.staged_tokens(chunk.cached_tokens)
                yield chunk
    finally:
        if held and lane is not None:
            lane.release()


async def _run(send: Send, stage: EngineRequest) -> EngineChunk:
    """One prefill-only stage to its end: its last chunk."""
    last: EngineChunk | None = None
    async with aclosing(send(stage)) as stream:
        async for chunk in stream:
            last = chunk
    if last is None or last.finish is None:
        raise EngineError("a prefill stage ended without a finish reason")
    return last
