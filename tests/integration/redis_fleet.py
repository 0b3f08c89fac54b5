"""A fleet of `SharedDispatcher` replicas on one real Redis, under a steady load,
for the fault tests: each replica has its own client (its own connection pool)
and its own clients looping requests through `admitted()`. What the invariants
need is recorded: the engine's peak concurrency across the fleet, every
outcome with its time, the tokens each tenant was granted."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

from scheduler.budget import AdmissionLimits
from scheduler.clock import MonotonicClock
from scheduler.errors import SchedulingError, StoreUnavailable
from scheduler.request import QueuedRequest
from scheduler.shared.admission import (
    SharedOptions,
    shared_dispatcher,
)
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import StoreSnapshot
from scheduler.tenancy.tenants import TenantRegistry
from tests.helpers import eventually

DOMAIN = "faults"
LIMIT = 6  # the engine's room, fleet-wide, in the tests that check it


@dataclass
class Engine:
    """The engine the fleet admits into: how many requests run at once, at most."""

    running: int = 0
    peak: int = 0

    def enter(self) -> None:
        self.running += 1
        self.peak = max(self.peak, self.running)

    def leave(self) -> None:
        self.running -= 1


@dataclass
class Record:
    # (monotonic s, replica index, outcome): "done", "unavailable", a limit name
    outcomes: list[tuple[float, int, str]] = field(default_factory=list)
    granted_tokens: Counter[str] = field(default_factory=Counter)

    def count(self, outcome: str, *, after_s: float = -1.0) -> int:
        return sum(1 for t, _, o in self.outcomes if o == outcome and t > after_s)


class Fleet:
    def __init__(
        self,
        url: str,
        n: int,
        limits: AdmissionLimits,
        tenants: TenantRegistry | None = None,
        *,
        timeout_s: float = 0.3,
        **options: object,
    ) -> None:
        self.url = url
        self.engine = Engine()
        self.record = Record()
        options.setdefault("replicas", n)
        self.replicas = [
            shared_dispatcher(
                RedisStore.from_url(
                    url, timeout_s=timeout_s, domain=DOMAIN, lease_ttl_s=10.0, backlog_ttl_s=1.0
                ),
                limits,
                MonotonicClock(),
                SharedOptions(
                    f"r{i}",
                    poll_s=0.005,
                    heartbeat_s=0.2,
                    retry_s=0.1,
                    **options,  # type: ignore[arg-type]
                ),
                tenants=tenants,
            )
            for i in range(n)
        ]
        self._ids = itertools.count()
        self._stop = asyncio.Event()
        self._clients: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for d in self.replicas:
            await d.start()

    async def one(self, i: int, tenant: str, kv: int, hold_s: float) -> str:
        d = self.replicas[i]
        req = QueuedRequest(f"q{next(self._ids)}", tenant, kv // 2, kv - kv // 2)
        try:
            async with d.admitted(req) as ticket:
                self.engine.enter()
                self.record.granted_tokens[tenant] += req.kv_tokens
                try:
                    await asyncio.sleep(hold_s)
                    ticket.charge(req.max_tokens)  # all it reserved: no refund
                finally:
                    self.engine.leave()
            outcome = "done"
        except StoreUnavailable:
            outcome = "unavailable"
        except SchedulingError as exc:
            outcome = getattr(exc, "limit", type(exc).__name__)
        self.record.outcomes.append((time.monotonic(), i, outcome))
        return outcome

    def load(
        self, per_replica: int, tenant: str = "t", kv: int = 100, hold_s: float = 0.03
    ) -> None:
        """Clients that send requests back to back until `stop_load`."""

        async def client(i: int) -> None:
            while not self._stop.is_set():
                if await self.one(i, tenant, kv, hold_s) != "done":
                    await asyncio.sleep(0.01)  # refused: a client's retry delay

        for i in range(len(self.replicas)):
            self._clients += [asyncio.create_task(client(i)) for _ in range(per_replica)]

    async def stop_load(self, grace_s: float = 1.0) -> None:
        """Stop the clients: those still waiting after `grace_s` (queued behind a quota)
        leave, as a caller that gives up does."""
        self._stop.set()
        _, waiting = await asyncio.wait(self._clients, timeout=grace_s)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*self._clients, return_exceptions=True)
        self._clients = []
        self._stop = asyncio.Event()

    def modes(self) -> list[str]:
        return [d.state.health.mode for d in self.replicas]

    def transitions(self) -> list[int]:
        return [d.state.health.transitions_total for d in self.replicas]

    async def aclose(self) -> None:
        if self._clients:
            await self.stop_load()
        for d in self.replicas:
            await d.aclose()

    async def snapshot(self) -> StoreSnapshot:
        store = RedisStore.from_url(self.url, domain=DOMAIN)
        try:
            return await store.snapshot()
        finally:
            await store.aclose()


async def assert_nothing_left(fleet: Fleet) -> None:
    """Every settlement reached Redis: no lease, no in-flight count, no reservation."""
    for d in fleet.replicas:
        await eventually(lambda d=d: d.state.pending_settlements == 0, what="settlements sent")  # type: ignore[misc]
        assert d.state.quotas.open_reservations == 0 and d.in_flight == 0 and d.queued == 0
    await eventually(lambda: fleet.engine.running == 0, what="engine idle")
    snap = await fleet.snapshot()
    assert snap.in_flight == 0 and snap.leases == set() and snap.concurrency == {}
