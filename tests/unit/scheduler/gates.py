"""Both dispatchers behind the one front door, for tests that must hold for either."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.dispatcher import Dispatcher
from scheduler.gate import Admission, AdmissionGate
from scheduler.local_admission import local_dispatcher
from scheduler.ordering.vtc import VtcPolicy
from scheduler.request import QueuedRequest
from scheduler.shared.admission import (
    SharedAdmission,
    SharedOptions,
    shared_dispatcher,
)
from scheduler.state.memory_store import MemoryStore
from scheduler.state.store import Store
from scheduler.tenancy.tenants import TenantRegistry
from scheduler.timers import ManualTimers

GATE_KINDS = ["local", "shared"]


@asynccontextmanager
async def open_gate(
    kind: str,
    registry: TenantRegistry,
    limits: AdmissionLimits,
    clock: FakeClock,
    timers: ManualTimers,
    store: Store | None = None,
) -> AsyncIterator[AdmissionGate]:
    """`local`: the dispatcher in memory; `shared`: over `store` (default: a
    MemoryStore on the same fake clock). Timers fire only when the test runs them."""
    if kind == "local":
        policy = VtcPolicy(registry.weight_of)
        yield local_dispatcher(
            policy, AdmissionBudget(limits), clock, tenants=registry, timers=timers
        )
        return
    shared = shared_dispatcher(
        store or MemoryStore(clock, lease_ttl_s=3600, backlog_ttl_s=3600),
        limits,
        clock,
        SharedOptions("r1"),
        tenants=registry,
        timers=timers,
    )
    await shared.start()
    try:
        yield shared
    finally:
        await shared.aclose()


def quiet(gate: AdmissionGate) -> bool:
    """Nothing left for a shared gate's pump to tell the store (always so for local)."""
    if not isinstance(gate, Dispatcher) or not isinstance(gate.state, SharedAdmission):
        return True
    return gate.state.told_everything


async def until(cond: Callable[[], bool], what: str, max_loops: int = 5_000) -> None:
    """Let the pump run (a Redis step is real I/O) until `cond` holds."""
    for _ in range(max_loops):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


async def until_quiet(gate: AdmissionGate) -> None:
    await until(lambda: quiet(gate), "the pump has told the store everything")


class Held:
    """A request that enters the gate and stays in its block until released."""

    def __init__(self, gate: AdmissionGate, req: QueuedRequest) -> None:
        self.req = req
        self.admission: Admission = gate.admitted(req)
        self._leave = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with self.admission:
            await self._leave.wait()

    @property
    def state(self) -> str:
        t = self.admission.ticket
        return t.state.value if t is not None else "new"

    def charge(self, tokens: int) -> None:
        assert self.admission.ticket is not None
        self.admission.ticket.charge(tokens)

    async def leave(self) -> None:
        self._leave.set()
        await self.task

    async def cancel(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
