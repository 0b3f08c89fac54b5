"""Small helpers for tests: waiting on conditions and checking for leaks."""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `eventually` stays importable without the service (tests/unit/scheduler)
    from service.app import App
    from service.engines.simulator.engine import SimulatedEngine


async def eventually(
    cond: Callable[[], bool] | Callable[[], Awaitable[bool]],
    timeout_s: float = 5.0,
    what: str = "",
) -> None:
    """Poll `cond` (plain or async) until it holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = cond()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await asyncio.sleep(0.01)


@dataclass
class WorkerTarget:
    """A worker as placement sees it (`service.engines.placed.Target`), fixed
    capacity, no I/O: for placement tests."""

    url: str
    slot_count: int
    kv_tokens: int
    healthy: bool = True

    def slots(self) -> int:
        return self.slot_count

    def kv_capacity(self) -> int:
        return self.kv_tokens

    def penalty(self, now_s: float) -> int:
        return 0


def cpu_within(cpu_s: float, wall_s: float) -> bool:
    """A process tree's CPU seconds over `wall_s`, read from /proc, is a reading:
    not NaN, not negative, and no more than every core for the whole time (a
    reading since the process started, or of the wrong process, is more)."""
    return not math.isnan(cpu_s) and 0 <= cpu_s <= wall_s * (os.cpu_count() or 1)


def sim(app: App) -> SimulatedEngine:
    from service.engines.simulator.engine import SimulatedEngine

    assert isinstance(app.engine, SimulatedEngine)
    return app.engine


async def assert_no_leaks(app: App) -> None:
    """Nothing queued or in flight in the gateway, nothing held by the engine."""
    model = app.models.resolve("")
    assert model is not None
    d = model.dispatcher
    await eventually(
        lambda: (d.stats().queued, d.stats().in_flight, sim(app).active_requests) == (0, 0, 0),
        what="gateway and engine to drain",
    )
    assert d.stats().in_flight_kv_tokens == 0
    assert sim(app).core.used_kv == 0
