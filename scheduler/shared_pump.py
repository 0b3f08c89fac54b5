"""The pump of `SharedDispatcher`: one `Step` to the shared store at a time.

An async task (`_run`) sleeps until something is due — a settlement or a
backlog change to send, batched output charges (`flush_s`), a heartbeat
(`heartbeat_s`), a paused tenant's resume time, or a decision once the engine
may have room again (`poll_s` after the store said it was full; at once after
a local arrival or finish) — then sends one step carrying everything pending
and the heads of the eligible local tenants, and applies the outcome. While
the store is down it runs the fail-open decisions or probes instead
(shared_failover.py).

A mixin: `SharedDispatcher` (shared_dispatcher.py) owns the state.
"""

from __future__ import annotations

import logging
import math

from scheduler.errors import StoreUnavailable
from scheduler.shared_failover import SharedFailover
from scheduler.store import Lease, Step, StepOutcome

log = logging.getLogger("scheduler.shared_dispatcher")


class SharedPump(SharedFailover):
    # State owned by SharedDispatcher (besides SharedFailover's).
    decisions_total: int
    max_charge_lag: float
    _offered: set[str]
    _next_flush_s: float
    _contacted: bool
    _closing: bool

    async def _run(self) -> None:
        while not self._closing:
            due_s = self._next_due_s()
            delay_s = due_s - self.clock.now_s()
            if delay_s > 0:
                timer = self.timers.call_at(due_s, self._wake.set) if delay_s < 3600 else None
                await self._wake.wait()
                if timer is not None:
                    timer.cancel()
            self._wake.clear()
            now_s = self.clock.now_s()
            self._local.resume_due(now_s)
            if self.health.mode == "ok":
                await self._shared_tick(now_s)
            else:
                if now_s >= self._next_probe_s:
                    await self._probe()
                if self.health.mode == "open":
                    self._local_tick()

    def _next_due_s(self) -> float:
        p = self._shared
        if self.health.mode != "ok":
            due = self._next_probe_s
            if self.health.mode == "open" and self._local.eligible():
                due = min(due, self._full_until_s)
            return min(due, self._local.next_resume_s())
        if p.settlements or set(self._local.eligible()) != self._announced:
            return -math.inf
        due = self._next_heartbeat_s
        if p.charges:
            due = min(due, self._next_flush_s)
        if self._local.eligible():
            due = min(due, self._full_until_s)
        return min(due, self._local.next_resume_s())

    def _take_pending(self, step: Step) -> Step:
        step.settlements, self._shared.settlements = self._shared.settlements, []
        step.charges, self._shared.charges = self._shared.charges, {}
        return step

    def _build_step(self, now_s: float) -> Step:
        step = self._take_pending(self._new_step(self.budget.limits))
        self.max_charge_lag = max(self.max_charge_lag, *step.charges.values(), 0.0)
        eligible = set(self._local.eligible())
        # A tenant back from a pause for its own limits never stopped being
        # backlogged: it rejoins without a lift (keeps its counter).
        held = self._local.held_back & eligible
        self._local.held_back = (self._local.held_back - eligible) & set(self._local.backlogged())
        step.announce = sorted(eligible - self._announced - held)
        step.withdraw = sorted(self._announced - eligible)
        self._local.held_back |= set(step.withdraw) & set(self._local.backlogged())
        rejoin = eligible - self._announced - set(step.announce)
        if now_s >= self._next_heartbeat_s:
            step.backlogged = sorted((self._announced & eligible) | rejoin)
            step.renew = [
                Lease(e.lease_id, e.req.tenant_id, e.req.kv_tokens)
                for e in self._entries.values()
                if e.started
            ]
        elif rejoin:
            step.backlogged = sorted(rejoin)
        named = {*step.announce, *(step.backlogged or ()), *(x.tenant_id for x in step.renew or ())}
        step.weights = self._weights(named)
        if now_s >= self._full_until_s:
            heads = self._local.heads(self.options.max_candidates)
            step.candidates = [
                self._entries[self._lease_of(h)].candidate(self._entries[self._lease_of(h)].buckets)
                for h in heads
            ]
        return step

    async def _shared_tick(self, now_s: float) -> None:
        step = self._build_step(now_s)
        if step.is_empty():
            return
        previous = set(self._announced)
        rejoined = set(step.backlogged or ()) - self._announced
        self._announced = (self._announced | set(step.announce) | rejoined) - set(step.withdraw)
        self._offered = {c.lease_id for c in step.candidates}
        try:
            out = await self.store.step(self.replica_id, step)
        except StoreUnavailable as exc:
            self._announced = previous
            self._shared.settlements[:0] = step.settlements
            for tenant, delta in step.charges.items():
                self._shared.charge(tenant, delta)
            self._offered = set()
            self._went_down(exc)
            self._after_offer([], step)
            return
        finally:
            self._next_flush_s = math.inf
        self._offered = set()
        if step.renew is not None:
            self._next_heartbeat_s = now_s + self.options.heartbeat_s
        self._apply(step, out, now_s)

    def _apply(self, step: Step, out: StepOutcome, now_s: float) -> None:
        self.decisions_total += bool(step.candidates)
        self._local.mirror.update(out.counters)
        if out.state_lost:
            if self._contacted:
                log.warning("shared state was lost (Redis restarted empty?): re-registering")
            self._next_heartbeat_s = -math.inf
            self._announced = set()
            self._wake.set()
        self._contacted = True
        admitted = [step.candidates[out.admitted].lease_id] if out.admitted is not None else []
        for i, wait_s in out.blocked.items():
            until = now_s + (self.options.poll_s if math.isinf(wait_s) else wait_s)
            self._local.pause(step.candidates[i].tenant_id, until)
        self.reserve_holds_total += len(out.held)
        if out.full or (out.held and out.admitted is None):
            # Held out of the reserve: room or shares change when a request
            # ends (a local finish kicks the pump; others' are polled).
            self._full_until_s = now_s + self.options.poll_s
        self._after_offer(admitted, step)
        if admitted:
            self._wake.set()
