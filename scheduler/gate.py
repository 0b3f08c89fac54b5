"""The front door of admission, the same for every dispatcher.

    async with gate.admitted(req) as ticket:   # queues; waits; raises SchedulingError
        async for chunk in engine.generate(...):
            ticket.charge(chunk_tokens)         # streamed output tokens
    # leaving the block settles exactly once, however it is left

`AdmissionGate` is what the service sees of `Dispatcher`, over its state in
memory (one replica) or shared by replicas through a store: the front door, limits and
tenants to apply, `stats()` for admin and telemetry, and `aclose()`.
`Admission` is the one implementation of the front door over a gate's
`admit` / `on_output_tokens` / `finish`; `Dispatcher` returns it from
`admitted(req)`.

A request's life is an explicit `RequestState` on its `Ticket`:
QUEUED → ADMITTED → STREAMING → SETTLED, or QUEUED → REJECTED (refused),
EXPIRED (queue time or deadline ran out) or CANCELLED (the caller left while
queued). A cancel that lands in the same tick as the admission is CANCELLED
too: `admit` has then given the room back already (the caller never saw the
admission), so the ticket must not settle again.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterable
from types import TracebackType
from typing import Protocol

from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.errors import DeadlineExpired, QueueTimeout, SchedulingError
from scheduler.gate_stats import GateStats, TenantBuckets
from scheduler.request import QueuedRequest
from scheduler.tenancy.tenants import TenantRegistry


class RequestState(enum.Enum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    STREAMING = "streaming"
    SETTLED = "settled"
    REJECTED = "rejected"
    EXPIRED = "expired"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return not _NEXT[self]


_S = RequestState
_NEXT: dict[RequestState, frozenset[RequestState]] = {
    _S.QUEUED: frozenset({_S.ADMITTED, _S.REJECTED, _S.EXPIRED, _S.CANCELLED}),
    _S.ADMITTED: frozenset({_S.STREAMING, _S.SETTLED}),
    _S.STREAMING: frozenset({_S.STREAMING, _S.SETTLED}),
    _S.SETTLED: frozenset(),
    _S.REJECTED: frozenset(),
    _S.EXPIRED: frozenset(),
    _S.CANCELLED: frozenset(),
}


class AdmissionCore(Protocol):
    """What the front door drives (both dispatchers implement it)."""

    async def admit(self, req: QueuedRequest) -> None:
        """Wait until `req` is admitted, or raise a SchedulingError. Cancelled while
        queued (or in the tick of its admission): withdrawn, nothing left to settle."""
        ...

    def on_output_tokens(self, req: QueuedRequest, tokens: int) -> None: ...

    def on_cached_tokens(self, req: QueuedRequest, reported: int) -> None:
        """The engine had `reported` of the prompt's tokens cached (once, at the
        first token): what admission under-charged is charged now."""
        ...

    def finish(self, req: QueuedRequest) -> None:
        """The admitted request left the engine; exactly once per admission."""
        ...


class TenantsView(Protocol):
    @property
    def tenants(self) -> TenantRegistry: ...


class AdmissionGate(AdmissionCore, Protocol):
    """What the service sees of a dispatcher, whichever runs."""

    @property
    def quotas(self) -> TenantsView:
        """The tenant registry in force (for defaults that depend on the tenant)."""
        ...

    @property
    def budget(self) -> AdmissionBudget:
        """This replica's in-flight room and its limits."""
        ...

    def admitted(self, req: QueuedRequest) -> Admission: ...

    def set_limits(self, limits: AdmissionLimits) -> None: ...

    def set_tenants(self, tenants: TenantRegistry) -> None: ...

    def stats(self, include: Iterable[str] = (), fleet: bool = False) -> GateStats:
        """Live state; `include`: tenants to report even if they have sent nothing;
        `fleet`: per-tenant usage summed over the replicas sharing the store (as of
        the last `refresh_stats`), not this replica's alone."""
        ...

    async def refresh_stats(self) -> None:
        """Fetch what `stats()` reads from a shared store (no-op without one)."""
        ...

    async def tenant_buckets(self, tenant_id: str) -> TenantBuckets:
        """The tenant's (request, token) buckets now, fleet-wide with a shared store
        (read from it, one round trip; the last `stats()` while it is down): what
        the rate-limit headers report."""
        ...

    async def aclose(self) -> None: ...


class Ticket:
    """One request's passage through the gate; `state` is where it is now."""

    __slots__ = ("_core", "_state", "output_tokens", "req")

    def __init__(self, core: AdmissionCore, req: QueuedRequest) -> None:
        self._core = core
        self.req = req
        self._state = RequestState.QUEUED
        self.output_tokens = 0

    @property
    def state(self) -> RequestState:
        return self._state

    def _move(self, to: RequestState) -> None:
        if to not in _NEXT[self._state]:
            raise AssertionError(
                f"request {self.req.request_id!r}: {self._state.value} -> {to.value} is not allowed"
            )
        self._state = to

    def charge(self, tokens: int) -> None:
        """Record `tokens` more streamed output tokens (fair counter, token bucket)."""
        if tokens <= 0:
            return
        if self._state is not RequestState.STREAMING:  # per chunk: skip the table lookup
            self._move(RequestState.STREAMING)
        self.output_tokens += tokens
        self._core.on_output_tokens(self.req, tokens)

    def cached(self, reported: int) -> None:
        """The engine says how many prompt tokens it had cached (call once)."""
        if self._state in (RequestState.ADMITTED, RequestState.STREAMING):
            self._core.on_cached_tokens(self.req, reported)

    def _settle(self) -> None:
        if self._state is RequestState.SETTLED:
            return  # a second exit: settled already
        self._move(RequestState.SETTLED)  # first, so a failing finish is never repeated
        self._core.finish(self.req)


class Admission:
    """The async context manager returned by `gate.admitted(req)`; enter it once."""

    __slots__ = ("_core", "_req", "ticket")

    def __init__(self, core: AdmissionCore, req: QueuedRequest) -> None:
        self._core = core
        self._req = req
        self.ticket: Ticket | None = None

    async def __aenter__(self) -> Ticket:
        if self.ticket is not None:
            raise AssertionError(f"admission of {self._req.request_id!r} entered twice")
        ticket = self.ticket = Ticket(self._core, self._req)
        try:
            await self._core.admit(self._req)
        except asyncio.CancelledError:
            # Withdrawn while queued, or admitted in this very tick and given back
            # by `admit` (the caller never saw it): nothing is left to settle.
            ticket._move(RequestState.CANCELLED)
            raise
        except (QueueTimeout, DeadlineExpired):
            ticket._move(RequestState.EXPIRED)
            raise
        except SchedulingError:
            ticket._move(RequestState.REJECTED)
            raise
        ticket._move(RequestState.ADMITTED)
        # No await between here and the block: once admitted, __aexit__ runs.
        return ticket

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Synchronous inside: safe under GeneratorExit (an abandoned stream).
        if self.ticket is None:
            raise AssertionError(f"admission of {self._req.request_id!r} left before entering")
        self.ticket._settle()
