"""`fairgate bench load`: an asyncio gRPC load generator.

Closed loop: for each concurrency level, that many workers each send a request
and wait for its end, again and again. Open loop: requests arrive at a given
rate with Poisson (cv = 1) or gamma-bursty (cv > 1) gaps, whatever the server
does. Every request is a token-id prompt of an exact length with
`ignore_eos` and `max_tokens`, so output lengths are exact. Tenants are picked
by share and named in the `x-fairgate-tenant` header (plus `authorization:
Bearer` when a tenant has an API key).

Each step is bounded: it stops issuing after `duration_s` and/or `requests`,
lets the requests in flight finish for at most `drain_s`, then cancels the rest
(counted as unfinished).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from fairgate.aio import AsyncClient
from fairgate.bench.http_load import HttpLoad
from fairgate.bench.stats import REJECT_CODES, RequestRecord, Slo, StepReport, build_step
from fairgate.bench.workload import Arrivals, Lengths, Tenant, TenantPicker, prompt_ids
from fairgate.errors import FairgateError
from fairgate.types import Delta, Result

DEFAULT_CONCURRENCY = (10, 50, 100, 300, 500, 1000)


@dataclass(frozen=True, slots=True)
class LoadConfig:
    target: str
    lengths: Lengths
    tenants: Sequence[Tenant] = (Tenant("default"),)
    # Closed loop: concurrency levels. Open loop: arrival rates (requests/s).
    mode: str = "closed"
    levels: Sequence[float] = DEFAULT_CONCURRENCY
    # Gaps' coefficient of variation: 1 Poisson, > 1 burstier (vLLM's
    # --burstiness b is the gamma shape: cv = 1 / sqrt(b)).
    cv: float = 1.0
    duration_s: float | None = 30.0
    requests: int | None = None
    drain_s: float = 60.0
    request_timeout_s: float | None = None
    slo: Slo = field(default_factory=Slo)
    model: str = ""
    channels: int = 4
    seed: int = 0
    # The simulator time scale of the server under test: measured times are
    # divided by it (rates multiplied) so the report is in simulated time.
    # Durations and limits above stay wall-clock.
    time_scale: float = 1.0
    # "grpc", or "http": the OpenAI-compatible API (fairgate/bench/http_load.py).
    protocol: str = "grpc"
    # Latency percentiles reported (and in the JSON as p<q>_<metric>_ms).
    percentiles: Sequence[float] = (50.0, 99.0)

    def __post_init__(self) -> None:
        if self.protocol not in ("grpc", "http"):
            raise ValueError("protocol must be 'grpc' or 'http'")
        if self.mode not in ("closed", "open"):
            raise ValueError("mode must be 'closed' or 'open'")
        if self.duration_s is None and self.requests is None:
            raise ValueError("a step needs a duration and/or a request count")
        if not self.levels or any(x <= 0 for x in self.levels):
            raise ValueError("levels must be > 0")
        if self.time_scale <= 0:
            raise ValueError("time_scale must be > 0 (report times are divided by it)")
        if self.mode == "closed" and any(x != int(x) for x in self.levels):
            raise ValueError("concurrency levels must be whole numbers")
        if not self.percentiles or any(not 0 < q <= 100 for q in self.percentiles):
            raise ValueError("percentiles must be in (0, 100]")

    @property
    def burstiness(self) -> float:
        """vLLM's name for the gamma shape of the arrival gaps (1 = Poisson)."""
        return 1.0 / self.cv**2


@dataclass(slots=True)
class TokenEvent:
    t_s: float  # when the tokens arrived, since the run started
    tenant: str
    tokens: int


@dataclass(slots=True)
class RunReport:
    config: LoadConfig
    steps: list[StepReport] = field(default_factory=list)
    # (step start, step end) in seconds since the run started.
    step_spans_s: list[tuple[float, float]] = field(default_factory=list)
    token_events: list[TokenEvent] = field(default_factory=list)
    records: list[list[RequestRecord]] = field(default_factory=list)


class LoadRunner:
    def __init__(
        self, config: LoadConfig, progress: Callable[[str, int, int, float], None] | None = None
    ) -> None:
        self.config = config
        self.progress = progress
        self.report = RunReport(config)
        self._rng = random.Random(config.seed)
        self._lengths = config.lengths.sampler(config.seed + 1)
        self._pick = TenantPicker(config.tenants, random.Random(config.seed + 2))
        self._channels: list[grpc.aio.Channel] = []
        self._clients: list[dict[str, AsyncClient]] = []
        self._t0 = 0.0
        self._vocab_size = 32000
        self._http: HttpLoad | None = None

    async def run(self) -> RunReport:
        cfg = self.config
        if cfg.protocol == "http":
            return await self._run_http()
        for _ in range(max(1, cfg.channels)):
            # A local subchannel pool gives each channel its own connection.
            ch = grpc.aio.insecure_channel(
                cfg.target,
                options=[("grpc.use_local_subchannel_pool", 1)],
            )
            self._channels.append(ch)
            self._clients.append(
                {
                    t.name: AsyncClient(cfg.target, tenant=t.name, api_key=t.api_key, channel=ch)
                    for t in cfg.tenants
                }
            )
        try:
            models = await asyncio.gather(
                *(next(iter(c.values())).list_models() for c in self._clients)
            )
            for m in models[0]:
                if m.name == cfg.model or (not cfg.model and m.is_default):
                    self._vocab_size = m.vocab_size or self._vocab_size
            self._t0 = time.perf_counter()
            for level in cfg.levels:
                await self._step(level)
        finally:
            for ch in self._channels:
                await ch.close()
        return self.report

    async def _run_http(self) -> RunReport:
        cfg = self.config
        self._http = HttpLoad(cfg.target, cfg.tenants, cfg.model, cfg.request_timeout_s)
        try:
            self._vocab_size = await self._http.start() or self._vocab_size
            self._t0 = time.perf_counter()
            for level in cfg.levels:
                await self._step(level)
        finally:
            await self._http.aclose()
        return self.report

    def _now(self) -> float:
        """Seconds since the run started, in the report's (simulated) time."""
        return (time.perf_counter() - self._t0) / self.config.time_scale

    def _stream(self, record: RequestRecord, lane: int) -> AsyncIterator[Delta | Result]:
        """The transport: token deltas, then one Result; errors as FairgateError.

        gRPC through the Python client; another protocol is another
        implementation of this method (same events, same errors)."""
        client = self._clients[lane % len(self._clients)][record.tenant]
        prompt = prompt_ids(record.prompt_tokens, self._rng, self._vocab_size)
        return client.generate(
            prompt,
            model=self.config.model,
            max_tokens=record.max_tokens,
            ignore_eos=True,
            timeout_s=self.config.request_timeout_s,
        )

    async def _one(self, record: RequestRecord, lane: int) -> None:
        if self._http is not None:
            await self._one_http(record)
            return

        start = time.perf_counter()
        k = 1.0 / self.config.time_scale
        last: float | None = None
        # (arrival time since the run started, index of the delta's first token)
        arrivals: list[tuple[float, int]] = []
        try:
            async for ev in self._stream(record, lane):
                now = time.perf_counter()
                if isinstance(ev, Delta):
                    if last is None:
                        record.ttft_s = (now - start) * k
                    else:
                        record.itl_s.append((now - last) * k)
                    last = now
                    arrivals.append((self._now(), ev.index))
                    continue
                # The final Result: its usage is the exact token count.
                record.output_tokens = ev.usage.completion_tokens
                record.e2e_s = (now - start) * k
                record.finish_reason = ev.finish_reason
                if ev.finish_reason in ("length", "stop"):
                    record.outcome = "ok"
                else:
                    record.outcome = "failed"
                    record.error = f"FINISH_{ev.finish_reason.upper()}"
        except FairgateError as exc:
            code = exc.code.name
            record.error = f"{code}/{exc.reason}" if exc.reason else code
            shed = code == "UNAVAILABLE" and exc.retry_after_s is not None
            no_tokens = last is None and not record.output_tokens
            record.outcome = (
                "rejected" if no_tokens and (code in REJECT_CODES or shed) else "failed"
            )
        except asyncio.CancelledError:
            record.outcome, record.error = "unfinished", "DRAIN_LIMIT"
            raise
        finally:
            self._count_tokens(record, arrivals)

    async def _one_http(self, record: RequestRecord) -> None:
        """The OpenAI API (fairgate/bench/http_load.py): it fills in the record and
        reports tokens as they arrive."""
        assert self._http is not None
        prompt = prompt_ids(record.prompt_tokens, self._rng, self._vocab_size)
        events = self.report.token_events
        try:
            await self._http.one(
                record,
                prompt,
                self.config.time_scale,
                lambda n: events.append(TokenEvent(self._now(), record.tenant, n)),
            )
        except asyncio.CancelledError:
            record.outcome, record.error = "unfinished", "DRAIN_LIMIT"
            raise

    def _count_tokens(self, record: RequestRecord, arrivals: list[tuple[float, int]]) -> None:
        """Tokens at the time they arrived (a delta holds the tokens up to the
        next delta's index; the last one, up to the final count)."""
        if not arrivals:
            return
        # Without a final count (the stream failed), the last delta counts one.
        end = max(record.output_tokens, arrivals[-1][1] + 1)
        events = self.report.token_events
        for (t_s, index), (_, following) in zip(arrivals, [*arrivals[1:], (0.0, end)], strict=True):
            if following > index:
                events.append(TokenEvent(t_s, record.tenant, following - index))

    async def _step(self, level: float) -> None:
        cfg = self.config
        records: list[RequestRecord] = []
        tasks: set[asyncio.Task[None]] = set()
        step_start = self._now()
        deadline = (
            step_start + cfg.duration_s / cfg.time_scale if cfg.duration_s is not None else None
        )
        label = f"c={level:g}" if cfg.mode == "closed" else f"{level:g} req/s"

        def issue(lane: int) -> asyncio.Task[None]:
            prompt_n, out_n = self._lengths()
            rec = RequestRecord(
                tenant=self._pick().name,
                prompt_tokens=prompt_n,
                max_tokens=out_n,
                sent_s=self._now(),
            )
            records.append(rec)
            task = asyncio.create_task(self._one(rec, lane))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            return task

        def may_issue() -> bool:
            if cfg.requests is not None and len(records) >= cfg.requests:
                return False
            return deadline is None or self._now() < deadline

        async def closed_worker(lane: int) -> None:
            while may_issue():
                await issue(lane)

        async def open_arrivals() -> None:
            # Arrival times are in the report's time, like the rate.
            horizon = cfg.duration_s / cfg.time_scale if cfg.duration_s else float("inf")
            times = Arrivals(level, cfg.cv).times_s(self._rng, horizon, cfg.requests)
            for i, at_s in enumerate(times):
                delay = (step_start + at_s - self._now()) * cfg.time_scale
                if delay > 0:
                    await asyncio.sleep(delay)
                issue(i)

        def done_requests() -> int:
            return sum(1 for r in records if r.outcome != "unfinished")

        async def ticker() -> None:
            while True:
                if self.progress is not None:
                    if deadline is not None:
                        frac = min(1.0, (self._now() - step_start) / (deadline - step_start))
                    else:
                        frac = len(records) / max(1, cfg.requests or 1)
                    self.progress(label, done_requests(), len(records), frac)
                await asyncio.sleep(0.2)

        hard_stop = deadline + cfg.drain_s / cfg.time_scale if deadline is not None else None

        def remaining_s() -> float | None:
            return (
                None if hard_stop is None else max(0.0, (hard_stop - self._now()) * cfg.time_scale)
            )

        tick = asyncio.create_task(ticker())
        driver: asyncio.Future[Any]
        if cfg.mode == "closed":
            driver = asyncio.gather(*(closed_worker(i) for i in range(int(level))))
        else:
            driver = asyncio.ensure_future(open_arrivals())
        try:
            await asyncio.wait({driver}, timeout=remaining_s())
            # Issuing is over: let what is in flight finish, then cut it off.
            if tasks:
                limit_s = remaining_s() if hard_stop is not None else cfg.drain_s
                _, pending = await asyncio.wait(set(tasks), timeout=limit_s)
                for task in pending:
                    task.cancel()
                if pending:
                    await asyncio.wait(pending)
        finally:
            for fut in (driver, tick):
                fut.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await fut
        step_end = self._now()
        if self.progress is not None:
            self.progress(label, done_requests(), len(records), 1.0)
        shares = {t.name: t.share for t in cfg.tenants}
        self.report.steps.append(
            build_step(
                cfg.mode,
                level,
                records,
                step_end - step_start,
                cfg.slo,
                shares,
                cfg.percentiles,
            )
        )
        self.report.step_spans_s.append((step_start, step_end))
        self.report.records.append(records)


async def run_load(
    config: LoadConfig, progress: Callable[[str, int, int, float], None] | None = None
) -> RunReport:
    return await LoadRunner(config, progress).run()
