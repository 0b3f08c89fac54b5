"""Store failure and recovery for `SharedDispatcher`: the `FailoverController`.

`failure_mode` "open" continues with a local `MemoryStore` (the fallback)
holding this replica's share of the limits (buckets and engine room ÷
`replicas`) and local fairness; "closed" refuses new requests with
StoreUnavailable (UNAVAILABLE) and rejects the queued ones. Either way,
streams in flight continue; their settlements wait in the `Outbox`. When the
store answers again (`probe`, every `retry_s`), the replica reconciles:
replays settlements (idempotent), sends the counter charges it owes,
re-registers every in-flight request's lease, and resumes. Every transition
is logged and counted in `health`.

The controller owns the health, the fallback and the probe's timing; what it
needs of the replica (its in-flight leases, counters, weights, and refusing
what is queued) comes through `ReplicaView`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Protocol

from scheduler.budget import AdmissionLimits
from scheduler.clock import Clock
from scheduler.errors import StoreUnavailable
from scheduler.memory_store import MemoryStore
from scheduler.shared_options import SharedOptions, StoreHealth
from scheduler.shared_outbox import Outbox
from scheduler.store import BucketLimits, Lease, Settlement, Step, StepOutcome, Store

# The dispatcher's logger: operators filter on one name for the whole replica.
log = logging.getLogger("scheduler.shared_dispatcher")


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

    def adopt_in_flight(self) -> None:
        """Reconciled: every in-flight request's lease is in the store now."""
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

    @property
    def mode(self) -> str:
        return self.health.mode

    @property
    def ok(self) -> bool:
        return self.health.mode == "ok"

    def share(self, buckets: BucketLimits) -> BucketLimits:
        return buckets.share(self.options_replicas)

    @property
    def options_replicas(self) -> int:
        return max(1, self._options.replicas)

    def local_limits(self) -> AdmissionLimits:
        """This replica's share of the engine room while failing open."""
        lim, n = self._replica.limits, self.options_replicas
        return AdmissionLimits(max(1, lim.max_requests // n), max(1, lim.max_kv_tokens // n))

    # -- going down ---------------------------------------------------------------
    def failed(self, exc: StoreUnavailable) -> bool:
        """A call to the store failed; True if this replica fails over now."""
        if not self.ok:
            return False
        mode = self._options.failure_mode
        self.health.mode = mode
        self.health.transitions_total += 1
        self.health.last_error = str(exc)
        self.next_probe_s = self._clock.now_s() + self._options.retry_s
        log.warning(
            "shared store unavailable (%s): failing %s (%s)",
            exc,
            mode,
            f"local limits ÷ {self.options_replicas} replicas"
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
        fb = MemoryStore(self._clock, lease_ttl_s=math.inf)
        fb.seed_counters(self._replica.counters())
        renew = self._replica.in_flight_leases()
        weights = self._replica.weights({lease.tenant_id for lease in renew})
        fb.step_now(
            self._options.replica_id, Step(self._replica.limits, renew=renew, weights=weights)
        )
        return fb

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
        self._replica.adopt_in_flight()
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
