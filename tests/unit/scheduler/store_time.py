"""Time passing for a `Store` under test, without a sleep as the oracle.

`MemoryStore` reads the injected clock: the test moves a `FakeClock`, so what
depends on time (a lease's or a backlog entry's expiry, a bucket's refill)
happens exactly when the test says, and the test asserts the instant. Redis
reads its own clock (TIME in the scripts), which no test can move: there the
test waits for the state transition itself, polling with a deadline (running
out fails the test). The instants are the memory store's to prove; the
differential test holds the two stores to the same decisions.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from scheduler.clock import FakeClock
from scheduler.state.memory_store import MemoryStore
from scheduler.state.store import Store
from tests.helpers import eventually

# The fake clock's step: a power of two, so that sums of steps are exact.
STEP_S = 1 / 64


class StoreTime:
    def __init__(self, store: Store) -> None:
        clock = store.clock if isinstance(store, MemoryStore) else None
        # None: the store reads a clock the test cannot move (Redis).
        self.fake = clock if isinstance(clock, FakeClock) else None

    async def until(
        self, cond: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 5.0
    ) -> float:
        """Let time pass until `cond()` holds; the seconds that passed (on the fake
        clock: the first multiple of STEP_S at which it held)."""
        if self.fake is None:
            start_s = time.monotonic()
            await eventually(cond, timeout_s, what)
            return time.monotonic() - start_s
        start_s = self.fake.now_s()
        for _ in range(round(timeout_s / STEP_S)):
            if await cond():
                return self.fake.now_s() - start_s
            self.fake.advance(STEP_S)
        raise AssertionError(f"not within {timeout_s} s of the fake clock: {what}")
