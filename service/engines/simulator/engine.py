"""The simulated engine: `SimCore` driven in (scaled) real time on asyncio.

A first-class engine, not a mock: it batches continuously, holds a KV budget,
queues FCFS, preempts, aborts, and paces its steps by the roofline cost model
times `time_scale` (1.0 real time, 0.1 ten times faster, 0 as fast as the
host allows).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from scheduler.tasks import stop_task
from service.engines.protocol import (
    EngineCapacity,
    EngineChunk,
    EngineError,
    EngineLoad,
    EngineRequest,
    FinishKind,
)
from service.engines.simulator.core import NO_TOKEN, Emission, QueueFull, SimConfig, SimCore
from service.engines.staged_prefill import StagedPrefill, StageLane, StagingStats, staged


class _Channel:
    """Single-consumer mailbox: the stepping loop appends, the stream drains."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: list[Emission] = []
        self.waiter: asyncio.Future[None] | None = None

    def put(self, item: Emission) -> None:
        self.items.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def drain(self) -> list[Emission]:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        items, self.items = self.items, []
        return items


@dataclass(slots=True)
class SimStats:
    started: int = 0
    finished: int = 0
    aborted: int = 0
    rejected: int = 0
    steps: int = 0
    virtual_time_s: float = 0.0


class SimulatedEngine:
    kind = "simulator"

    def __init__(
        self,
        config: SimConfig,
        *,
        time_scale: float = 1.0,
        coalesce: bool = True,
        staged_prefill: StagedPrefill | None = None,
    ) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        self.config = config
        self.time_scale = time_scale
        # Merge tokens that are ready together into one chunk (one gRPC message)
        # instead of one chunk per token; never waits for more tokens.
        self.coalesce = coalesce
        self.core = SimCore(config)
        # Long prompts in prefix stages, prefill-only (staged_prefill.py).
        self.staged_prefill = staged_prefill or StagedPrefill()
        self.staging = StagingStats()
        self.stage_lane = StageLane()
        self.stats = SimStats()
        self._channels: dict[str, _Channel] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="simulator-steps")

    async def aclose(self) -> None:
        self._closed = True
        self._wake.set()
        await stop_task(self._task)
        self._task = None
        for rid in list(self._channels):
            await self.abort(rid)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self._closed:
            if self.core.idle:
                self._wake.clear()
                await self._wake.wait()
                next_at = loop.time()
                continue
            result = self.core.step()
            self.stats.steps += 1
            self.stats.virtual_time_s += result.duration_s
            # Pace on an absolute schedule so scheduling jitter does not accumulate.
            next_at = max(next_at + result.duration_s * self.time_scale, loop.time())
            delay = next_at - loop.time()
            await asyncio.sleep(delay if delay > 0 else 0)
            for em in result.emissions:
                ch = self._channels.get(em.rid)
                if ch is not None:
                    ch.put(em)

    # -- engine protocol ------------------------------------------------------
    def capacity(self) -> EngineCapacity:
        return self.config.engine_capacity()

    async def load(self) -> EngineLoad:
        return EngineLoad(
            running_requests=len(self.core.running),
            waiting_requests=len(self.core.waiting),
            used_kv_tokens=self.core.used_kv,
        )

    @property
    def active_requests(self) -> int:
        """Requests the engine still holds (waiting or running)."""
        return len(self.core.waiting) + len(self.core.running)

    async def abort(self, request_id: str) -> None:
        if self.core.abort(request_id):
            self.stats.aborted += 1
        ch = self._channels.get(request_id)
        if ch is not None:
            ch.put(
                Emission(
                    rid=request_id,
                    token_id=NO_TOKEN,
                    text="",
                    generated=-1,
                    finish=FinishKind.ABORT,
                )
            )

    def generate(self, req: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        plan = self.staged_prefill
        if plan.laned(req):
            lane = self.stage_lane if plan.one_at_a_time else None
            return staged(self._generate_one, req, plan, self.staging, lane=lane)
        return self._generate_one(req)

    async def _generate_one(self, req: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        if self._closed:
            raise EngineError("engine is shut down", retryable=True)
        sreq = self.core.make_request(
            req.request_id, req.prompt_token_ids, req.max_tokens, req.sampling, req.priority
        )
        try:
            self.core.add(sreq)
        except QueueFull as exc:
            self.stats.rejected += 1
            raise EngineError(str(exc), retryable=True) from exc
        ch = _Channel()
        self._channels[req.request_id] = ch
        self.stats.started += 1
        self._wake.set()
        done = False

        def empty(generated: int) -> EngineChunk:
            return EngineChunk(
                text="",
                token_ids=[],
                completion_tokens=generated,
                prompt_tokens=sreq.prompt_len,
                cached_tokens=sreq.cached_tokens,
            )

        try:
            while not done:
                ems = await ch.drain()
                chunk = empty(sreq.generated)
                for em in ems:
                    if em.finish is FinishKind.ABORT:
                        chunk.finish, chunk.message = FinishKind.ABORT, "aborted by the engine"
                        done = True
                        break
                    chunk.text += em.text
                    if em.token_id != NO_TOKEN:  # else the end of a prefill-only request
                        chunk.token_ids.append(em.token_id)
                    chunk.completion_tokens = em.generated
                    chunk.retractions = sreq.preemptions
                    if em.finish is not None:
                        chunk.finish, chunk.stop_matched = em.finish, em.stop_matched
                        done = True
                        self.stats.finished += 1
                        break
                    if not self.coalesce:
                        yield chunk
                        chunk = empty(em.generated)
                if chunk.token_ids or chunk.finish is not None:
                    yield chunk
        finally:
            self._channels.pop(req.request_id, None)
            if not done and self.core.abort(req.request_id):
                # The consumer went away (cancel, deadline): free the engine.
                self.stats.aborted += 1
