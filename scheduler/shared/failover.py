"""Store failure and recovery for `SharedAdmission`: the `FailoverController`.

A failed call first makes the store *suspect*: the caller retries after a
short backoff, and only `failover_after_failures` failures in a row, or
failures for `failover_after_s`, fail over — one slow call does not.

`failure_mode` "open" continues with a local `MemoryStore` (the fallback)
and local fairness. It holds this replica's share of the limits: buckets
and KV room ÷ the replicas alive at the last look (`FleetSeen`, at least
`replicas`); engine slots: those it ran when the store went down plus its
share of the slots then free (the others' count from the last step), so the
fleet's sum stays within the engine's limit. Its buckets start from the
levels last seen in the store (its share, less what it took since), not
full: an outage costs a quota at most the steps in flight when it began
(one request per replica). "closed" refuses new requests with
StoreUnavailable (UNAVAILABLE) and rejects the queued ones. Either way,
streams in flight continue; their settlements wait in the `Outbox`. When the
store answers again (`probe`, every `retry_s`), the replica reconciles:
replays settlements (idempotent), sends the counter charges it owes,
re-registers every in-flight request's lease (and releases those that ended
while the probe was away), and resumes. Every transition is logged and
counted in `health`.

The controller owns the health, the fallback and the probe's timing; what it
needs of the replica (its in-flight leases, counters, weights, and refusing
what is queued) comes through `ReplicaView`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable
from typing import Protocol

from scheduler import rules
from scheduler.budget import AdmissionLimits
from scheduler.clock import Clock
from scheduler.errors import StoreUnavailable
from scheduler.quotas import BucketLimits
from scheduler.shared.options import SharedOptions, StoreHealth
from scheduler.shared.outbox import Outbox
from scheduler.state.memory_store import MemoryStore
from scheduler.state.store import (
    FleetObserver,
    FleetSeen,
    Lease,
    Settlement,
    Step,
    StepOutcome,
    Store,
)

# The dispatcher's logger: operators filter on one name for the whole replica.
log = logging.getLogger("scheduler.shared.dispatcher")


class ReplicaView(Protocol):
    """What the controller reads and asks of this replica (the dispatcher)."""

    @property
    def limits(self) -> AdmissionLimits: ...

    def in_flight_leases(self) -> list[Lease]: ...

    def weights(self, tenants: Iterable[str]) -> dict[str, float]: ...

    def counters(self) -> dict[str, float]:
        """The mirror of the fleet's counters."""
        ...

    def refuse_queued(self, exc: StoreUnavailable) -> None:
        """Fail-closed: reject every queued request with `exc`."""
        ...

    def adopt_in_flight(self, renewed: list[Lease]) -> None:
        """Reconciled: the `renewed` leases are in the store now (release those that
        ended meanwhile)."""
        ...

    def bucket_tenants(self) -> list[str]:
        """Tenants whose bucket levels to watch (for a fail-open start)."""
        ...

    def buckets_of(self, tenant_id: str) -> BucketLimits: ...

    def usage(self) -> bytes:
        """This replica's per-tenant usage, published with the heartbeat (fleet_usage.py)."""
        ...


class FailoverController:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        options: SharedOptions,
        outbox: Outbox,
        replica: ReplicaView,
    ) -> None:
        self._store = store
        self._clock = clock
        self._options = options
        self._outbox = outbox
        self._replica = replica
        self.health = StoreHealth()
        # Fail-open: the local store deciding while the shared one is down.
        self.fallback: MemoryStore | None = None
        self.next_probe_s = math.inf
        # Failed calls in a row while "ok" (suspect), and when the streak began.
        self._failures = 0
        self._failing_since_s = math.inf
        self._last_failure_s = -math.inf
        # The fleet as last seen (replicas alive, bucket levels) and when.
        self.seen: FleetSeen | None = None
        self._seen_at_s = 0.0
        self._observing: asyncio.Task[None] | None = None
        # What this replica took from the store's buckets, net of refunds, in all, and
        # as of the last look's start: the difference is not in the levels seen.
        self._taken: dict[tuple[str, str], float] = {}
        self._taken_at_look: dict[tuple[str, str], float] = {}
        # The other replicas' in-flight requests at the last step; this one's at failover.
        self._others_in_flight: int | None = None
        self._own_in_flight = 0

    @property
    def mode(self) -> str:
        return self.health.mode

    @property
    def ok(self) -> bool:
        return self.health.mode == "ok"

    @property
    def divisor(self) -> int:
        """Replicas sharing the limits while failing open: those alive at the last look,
        at least `replicas` (set it to the fleet's minimum size)."""
        seen = self.seen.replicas if self.seen is not None else 0
        return max(1, self._options.replicas, seen)

    def share(self, buckets: BucketLimits) -> BucketLimits:
        return buckets.share(self.divisor)

    def local_limits(self) -> AdmissionLimits | None:
        """This replica's room while failing open (None: none at all). Requests: what it
        ran when the store went down plus its share of the room then free (the other
        replicas' count from the last step), so that the fleet's sum stays within the
        engine's limit; KV tokens: its share (a step reports no fleet-wide KV)."""
        lim, n = self._replica.limits, self.divisor
        if self._others_in_flight is None:
            requests = lim.max_requests // n
        else:
            free = max(0, lim.max_requests - self._others_in_flight - self._own_in_flight)
            requests = self._own_in_flight + free // n
        if requests < 1:
            return None
        return AdmissionLimits(requests, max(1, lim.max_kv_tokens // n))

    def saw(self, out: StepOutcome) -> None:
        """A step answered (and was applied): the other replicas' in-flight count then."""
        self._others_in_flight = max(0, out.in_flight - len(self._replica.in_flight_leases()))

    # -- watching the fleet --------------------------------------------------------
    def observe_soon(self) -> None:
        """Look at the fleet (live replicas, bucket levels) in the background."""
        if not isinstance(self._store, FleetObserver):
            return
        if self._observing is not None and not self._observing.done():
            return
        self._observing = asyncio.create_task(self._observe(self._store))

    async def _observe(self, store: FleetObserver) -> None:
        ttl_s = 3 * self._options.heartbeat_s
        taken = dict(self._taken)
        try:
            seen = await store.observe(
                self._options.replica_id,
                ttl_s,
                self._replica.bucket_tenants(),
                self._replica.usage(),
            )
        except StoreUnavailable:
            return  # the pump's own calls judge the store's health
        self.seen, self._seen_at_s, self._taken_at_look = seen, self._clock.now_s(), taken

    def took(self, tenant_id: str, requests: float, tokens: float) -> None:
        """This replica took from (negative: gave back to) the store's buckets."""
        for kind, x in (("r", requests), ("t", tokens)):
            if x:
                key = (tenant_id, kind)
                self._taken[key] = self._taken.get(key, 0.0) + x

    def forget(self, tenant_id: str) -> None:
        """Drop what this replica took of an idle tenant's buckets, once the last
        look saw all of it in the levels (else it still matters when failing open)."""
        for key in [(tenant_id, "r"), (tenant_id, "t")]:
            if self._taken.get(key, 0.0) == self._taken_at_look.get(key, 0.0):
                self._taken.pop(key, None)
                self._taken_at_look.pop(key, None)

    async def aclose(self) -> None:
        if self._observing is not None:
            self._observing.cancel()
            await asyncio.gather(self._observing, return_exceptions=True)

    # -- going down ---------------------------------------------------------------
    @property
    def suspect(self) -> bool:
        return self._failures > 0

    def backoff_s(self) -> float:
        """How long to wait before retrying while suspect (doubling, at most `retry_s`)."""
        return min(self._options.retry_s, self._options.poll_s * 2.0**self._failures)

    def succeeded(self) -> None:
        """A call to the store answered: the streak of failures is over."""
        if self._failures:
            log.info("shared store answers again after %d failed calls", self._failures)
        self._failures = 0
        self._failing_since_s = math.inf
        self._last_failure_s = -math.inf

    def failed(self, exc: StoreUnavailable, started_s: float) -> bool:
        """A call to the store, sent at `started_s`, failed; True if this replica fails
        over now. Calls already in flight when the last failure was counted add no
        news (arrivals reserving during one slow moment are one failure, not many)."""
        if not self.ok:
            return False
        now_s = self._clock.now_s()
        if started_s >= self._last_failure_s:
            self._failures += 1
            self._last_failure_s = now_s
        self._failing_since_s = min(self._failing_since_s, now_s)
        self.health.last_error = str(exc)
        o = self._options
        if (
            self._failures < o.failover_after_failures
            and now_s - self._failing_since_s < o.failover_after_s
        ):
            log.info("shared store call failed (%s): retrying (%d in a row)", exc, self._failures)
            return False
        self._failures = 0
        self._failing_since_s = math.inf
        self._last_failure_s = -math.inf
        mode = self._options.failure_mode
        self.health.mode = mode
        self.health.transitions_total += 1
        self.health.last_error = str(exc)
        self.next_probe_s = self._clock.now_s() + self._options.retry_s
        log.warning(
            "shared store unavailable (%s): failing %s (%s)",
            exc,
            mode,
            f"local limits ÷ {self.divisor} replicas"
            if mode == "open"
            else "new requests get UNAVAILABLE",
        )
        if mode == "open":
            self.fallback = self._open_fallback()
        else:
            self._replica.refuse_queued(
                StoreUnavailable("the shared state store became unreachable while queued")
            )
        return True

    def _open_fallback(self) -> MemoryStore:
        self._own_in_flight = len(self._replica.in_flight_leases())
        fb = MemoryStore(self._clock, lease_ttl_s=math.inf)
        fb.seed_counters(self._replica.counters())
        fb.seed_levels(self._start_levels())
        renew = self._replica.in_flight_leases()
        weights = self._replica.weights({lease.tenant_id for lease in renew})
        fb.step_now(
            self._options.replica_id, Step(self._replica.limits, renew=renew, weights=weights)
        )
        return fb

    def _start_levels(self) -> dict[tuple[str, str], float]:
        """This replica's share of each bucket's level last seen (refilled to now; a
        bucket not seen, or never looked at, was full), less what this replica took
        since (debt allowed): the fleet's sum is the level the store would have."""
        seen = self.seen.levels if self.seen is not None else {}
        since_s = self._clock.now_s() - self._seen_at_s
        levels: dict[tuple[str, str], float] = {}
        for tenant, kind in {*seen, *self._taken}:
            b = self._replica.buckets_of(tenant)
            rate, burst = (
                (b.requests_per_s, b.requests_burst)
                if kind == "r"
                else (b.tokens_per_s, b.tokens_burst)
            )
            if rate is None or burst is None:
                continue
            last = seen.get((tenant, kind))
            level = (
                burst
                if last is None
                else rules.bucket_level(last.level, 0.0, last.age_s + since_s, rate, burst)
            )
            key = (tenant, kind)
            mine = self._taken.get(key, 0.0) - self._taken_at_look.get(key, 0.0)
            levels[key] = level / self.divisor - mine
        return levels

    # -- while down ---------------------------------------------------------------
    def settle_locally(self, s: Settlement) -> None:
        if self.fallback is not None:
            self.fallback.step_now(
                self._options.replica_id, Step(self._replica.limits, settlements=[s])
            )

    def charge_locally(self, tenant_id: str, delta: float) -> None:
        if self.fallback is not None:
            counters = self.fallback.counters
            counters[tenant_id] = counters.get(tenant_id, 0.0) + delta

    # -- coming back --------------------------------------------------------------
    async def probe(self) -> StepOutcome | None:
        """Try the store; if it answers, reconcile and return its outcome (else None)."""
        self.next_probe_s = self._clock.now_s() + self._options.retry_s
        step = self._outbox.take_into(self._options.step(self._replica.limits))
        step.renew = self._replica.in_flight_leases()
        step.weights = self._replica.weights({lease.tenant_id for lease in step.renew})
        step.backlogged = []
        try:
            out = await self._store.step(self._options.replica_id, step)
        except StoreUnavailable:
            self._outbox.requeue(step)
            return None
        self._replica.adopt_in_flight(step.renew)
        was = self.health.mode
        self.health.mode = "ok"
        self.health.transitions_total += 1
        self.health.reconciled_settlements += out.settled
        self.health.reconciled_leases += len(step.renew)
        self.fallback = None
        self.next_probe_s = math.inf
        log.warning(
            "shared store back after failing %s: reconciled %d settlements, %d leases",
            was,
            out.settled,
            len(step.renew),
        )
        return out
