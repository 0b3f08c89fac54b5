"""Several SGLang workers behind one Engine.

Placement (pick, priority, per-worker KV accounting and the request's
lifecycle: `placement.py`, which the virtual fleet runs too; the rule:
`routing.py`): admission's locality choice while that worker has room; else, with
`locality` (the default), the healthy worker where the request would get its
first token soonest, counting the prefill work routed there that has not
streamed yet and the prompt's prefix the worker is thought to hold
(`prefix_index.py`: what was sent where, corrected by the `cached_tokens` each
worker reports); with `least_full`, the worker that
would be least full with the request. "Full" is a fraction of the worker's own
capacity: the larger of its requests in flight (plus `FAILURE_LOAD` per recent
stream failure, so a worker whose streams die fast does not look idle) over its
slots, and its KV tokens in flight (prompt plus max_tokens, as admission counts
them) over its KV. Admission counts the pool's summed room, so routing by KV as
well keeps a large request off a worker that could not hold it beside its
others while another could, and workers of different sizes fill in proportion.

Ejection (`breaker.py`): a worker whose connection fails or drops is ejected
at once; one whose streams fail otherwise (malformed output, errors) after
`consecutive_failures` in a row. The last healthy worker is never ejected (a
pool of one, the live server on one URL, included): without it the pool would
have no capacity, so admission would queue every request instead of failing
it; it keeps serving, and its errors reach the clients as one engine's do. A
health loop (`GET /health`) ejects workers that stop answering, and
re-admits a worker, with a fresh read of its capacity, only once its
ejection (doubling with each ejection in a row) is over and it answers.
A request that fails before its first token (worker down, queue full) moves
to another healthy worker; one that already streamed tokens fails with
`EngineError` (the servicer ends it with a partial result and UNAVAILABLE).

Capacity is the sum over healthy workers (the context window is the smallest
of all), so the app's admission limits shrink when a worker is ejected and
grow back when it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field

from scheduler.tasks import stop_task
from service.engines.breaker import Breaker, BreakerPolicy
from service.engines.kv_events import KvEventsFollower
from service.engines.placement import Placement
from service.engines.protocol import (
    EngineCapacity,
    EngineChunk,
    EngineError,
    EngineLoad,
    EngineRequest,
)
from service.engines.routing import Routing
from service.engines.sglang_chunks import RequestRefused
from service.engines.sglang_http import SglangHttpEngine, WorkerDown
from service.engines.stagger import Stagger

log = logging.getLogger(__name__)

# Routing: one recent stream failure weighs as much as this many requests in flight.
FAILURE_LOAD = 4


@dataclass(slots=True, eq=False)
class Worker:
    """One SGLang worker as the pool sees it (its load is the placement's)."""

    engine: SglangHttpEngine
    breaker: Breaker
    healthy: bool = False
    failures: int = 0
    last_error: str = ""
    streams_total: int = 0
    stream_failures_total: int = 0
    # (monotonic s, "ejected" | "admitted", ejection length s): recent transitions.
    history: deque[tuple[float, str, float]] = field(default_factory=lambda: deque(maxlen=64))

    @property
    def url(self) -> str:
        return self.engine.url

    def slots(self) -> int:
        return self.engine.capacity().max_running_requests

    def kv_capacity(self) -> int:
        return self.engine.capacity().max_total_tokens

    def penalty(self, now_s: float) -> int:
        """Recent stream failures, as requests in flight (so a worker whose streams
        die fast does not look idle)."""
        return FAILURE_LOAD * self.breaker.penalty(now_s)


class WorkerPool:
    def __init__(
        self,
        engines: list[SglangHttpEngine],
        *,
        health_interval_s: float = 2.0,
        prefix_affinity_tokens: int = 0,
        affinity_slack: int = 2,
        routing: Routing = "locality",
        breaker: BreakerPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        stagger: Stagger | None = None,
        kv_events: Sequence[KvEventsFollower | None] = (),
    ) -> None:
        if not engines:
            raise ValueError("a worker pool needs at least one worker")
        policy = breaker or BreakerPolicy()
        self.clock = clock
        self.workers = [Worker(e, Breaker(policy)) for e in engines]
        # One URL reads as the setting it came from (ListModels, metric labels).
        self.kind = "sglang-http-pool" if len(engines) > 1 else "sglang-http"
        self.health_interval_s = health_interval_s
        self.placement = Placement(
            self.workers,
            routing=routing,
            clock=clock,
            prefix_affinity_tokens=prefix_affinity_tokens,
            affinity_slack=affinity_slack,
            stagger=stagger,
        )
        # Each worker's KV events (`kv_events.py`): its exact cache view for locality.
        self.kv_events = list(kv_events)
        for i, f in enumerate(self.kv_events):
            if f is not None:
                self.placement.exact[i] = f.view
        self.served_model_name = ""
        self.moved_requests = 0
        self._where: dict[str, Worker] = {}
        # Set (and replaced) whenever a worker's prefill ends: held prompts look again.
        self._prefill_ended = asyncio.Event()
        self._holding = 0  # requests in `_hold` now
        self._task: asyncio.Task[None] | None = None
        self._context_tokens = 0
        self._vocab_size = 0

    # -- lifecycle ------------------------------------------------------------
    async def start(self) -> None:
        for f in self.kv_events:
            if f is not None:
                f.start()
        await asyncio.gather(*(self._probe(w) for w in self.workers))
        if not any(w.healthy for w in self.workers):
            errors = "; ".join(f"{w.url}: {w.last_error}" for w in self.workers)
            raise EngineError(f"no SGLang worker is reachable ({errors})", retryable=True)
        if self._task is None and self.health_interval_s > 0:
            self._task = asyncio.create_task(self._health_loop(), name="sglang-pool-health")

    async def aclose(self) -> None:
        await stop_task(self._task)
        self._task = None
        await asyncio.gather(*(f.stop() for f in self.kv_events if f is not None))
        await asyncio.gather(*(w.engine.aclose() for w in self.workers))

    async def _probe(self, w: Worker) -> None:
        """(Re)admit a worker if it answers; read its capacity."""
        try:
            cap = await w.engine.refresh_server_info()
        except EngineError as exc:
            self._eject(w, str(exc))
            return
        # The context window and vocabulary stay those first seen, so validation
        # limits do not move under clients' feet.
        self._context_tokens = min(
            self._context_tokens or cap.max_context_tokens, cap.max_context_tokens
        )
        self._vocab_size = self._vocab_size or cap.vocab_size
        self.served_model_name = self.served_model_name or w.engine.served_model_name
        i = self.workers.index(w)
        self.placement.set_capacity(i, cap.max_total_tokens)
        if not w.healthy:
            self.placement.readmitted(i)
            log.info("SGLang worker %s admitted", w.url)
            now_s = self.clock()
            w.breaker.readmitted(now_s)
            w.history.append((now_s, "admitted", 0.0))
        w.healthy, w.failures, w.last_error = True, 0, ""

    def _eject(self, w: Worker, reason: str) -> None:
        if w.healthy and len(self.healthy_workers) == 1:
            if reason != w.last_error:  # once per cause, not per health check
                log.warning("SGLang worker %s fails but is the last one: %s", w.url, reason)
            w.last_error = reason
            return
        now_s = self.clock()
        # A new ejection, or a failed attempt to re-admit: the next one lasts longer.
        if w.healthy or w.breaker.may_readmit(now_s):
            duration_s = w.breaker.eject(now_s)
            w.history.append((now_s, "ejected", duration_s))
            if w.healthy:
                log.warning("SGLang worker %s ejected for %gs: %s", w.url, duration_s, reason)
        w.healthy = False
        w.failures += 1
        w.last_error = reason

    def _stream_failed(self, w: Worker, exc: EngineError) -> None:
        w.stream_failures_total += 1
        if isinstance(exc, WorkerDown):
            self._eject(w, str(exc))
        elif isinstance(exc, RequestRefused):
            w.breaker.on_success(self.clock())  # the worker answered; the request was bad
        elif w.breaker.on_failure(self.clock()) and w.healthy:
            self._eject(w, f"{w.breaker.failures} stream failures in a row: {exc}")

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self._check(w) for w in self.workers))

    async def _check(self, w: Worker) -> None:
        if not w.healthy:
            if w.breaker.may_readmit(self.clock()) and await w.engine.health():
                await self._probe(w)
        elif not await w.engine.health():
            self._eject(w, "health check failed")

    # -- routing --------------------------------------------------------------
    @property
    def healthy_workers(self) -> list[Worker]:
        return [w for w in self.workers if w.healthy]

    async def generate(self, req: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        placement = self.placement
        tried: set[int] = set()
        last: EngineError | None = None
        keys = list(req.prefix_keys) or placement.prefix_keys(req.prompt_token_ids)
        await self._hold(req, keys)
        while True:
            placed = placement.place(req, keys, tried)
            if placed is None:
                raise last or EngineError("no healthy SGLang worker", retryable=True)
            w = self.workers[placed.worker]
            sent = dataclasses.replace(
                req,
                priority=placed.priority,
                held_tokens=placed.matched,
                held_now=functools.partial(placement.recheck, placed),
                sheltered=functools.partial(placement.sheltered, placed),
                overtakes=functools.partial(placement.overtakes, placed),
            )
            tried.add(placed.worker)
            if last is not None:
                self.moved_requests += 1
            w.streams_total += 1
            self._where[req.request_id] = w
            output: list[int] = []
            started = False
            try:
                async with aclosing(w.engine.generate(sent)) as stream:
                    async for chunk in stream:
                        if not started:
                            started = True
                            placement.first_token(placed, req.prompt_tokens, chunk.cached_tokens)
                            self._prefill_end()
                        if keys:
                            output.extend(chunk.token_ids)
                        if chunk.finish is not None:
                            # Before the last chunk goes out: the consumer stops there
                            # and closes this generator.
                            w.breaker.on_success(self.clock())
                            placement.finished(placed, req.prompt_token_ids, output)
                        yield chunk
                return
            except EngineError as exc:
                self._stream_failed(w, exc)
                if started or not exc.retryable:
                    raise
                last = exc
                log.info("moving %s off %s: %s", req.request_id, w.url, exc)
            finally:
                placement.released(placed)
                self._prefill_end()
                self._where.pop(req.request_id, None)

    async def _hold(self, req: EngineRequest, keys: list[int]) -> None:
        """Cold-start hold (`Placement.hold_until`): wait, unsent, while it says so,
        looking again each time a worker's prefill ends."""
        since_s = self.clock()
        until_s = self.placement.hold_until(req, keys, since_s, True)
        if until_s is None:
            return
        self._holding += 1
        try:
            while until_s is not None:
                ended = self._prefill_ended
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ended.wait(), max(0.0, until_s - self.clock()))
                until_s = self.placement.hold_until(req, keys, since_s, False)
        finally:
            self._holding -= 1

    def unsent(self) -> int:
        """Admitted requests no worker has yet: held (`_hold`: cold, or paced) or
        waiting for a worker's staged-prefill lane (admission may lend their slots
        to a light tenant: fair_light_takes_unsent_slots)."""
        lanes = sum(w.engine.stage_lane.waiting for w in self.workers)
        return self._holding + lanes

    def _prefill_end(self) -> None:
        self._prefill_ended.set()
        self._prefill_ended = asyncio.Event()

    async def abort(self, request_id: str) -> None:
        w = self._where.get(request_id)
        if w is not None:
            await w.engine.abort(request_id)

    # -- capacity and load ----------------------------------------------------
    def capacity(self) -> EngineCapacity:
        caps = [w.engine.capacity() for w in self.healthy_workers]
        return EngineCapacity(
            max_running_requests=sum(c.max_running_requests for c in caps),
            max_total_tokens=sum(c.max_total_tokens for c in caps),
            max_context_tokens=self._context_tokens,
            vocab_size=self._vocab_size,
            # A priority gap preempts on every worker only above the largest threshold.
            preempt_threshold=_common_threshold(c.preempt_threshold for c in caps),
        )

    async def load(self) -> EngineLoad:
        results = await asyncio.gather(
            *(w.engine.load() for w in self.healthy_workers), return_exceptions=True
        )
        loads = [r for r in results if isinstance(r, EngineLoad)]
        return EngineLoad(
            running_requests=sum(x.running_requests for x in loads),
            waiting_requests=sum(x.waiting_requests for x in loads),
            used_kv_tokens=sum(x.used_kv_tokens for x in loads),
        )

    @property
    def in_flight(self) -> int:
        return sum(self.placement.in_flight)


def _common_threshold(thresholds: Iterable[int | None]) -> int | None:
    """The preemption threshold of a pool: None if any worker does not preempt."""
    known = list(thresholds)
    if not known or any(t is None for t in known):
        return None
    return max(t for t in known if t is not None)
