from __future__ import annotations

import asyncio

import pytest

from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import FakeClock, MonotonicClock
from scheduler.errors import DeadlineExpired, QueueTimeout, QuotaExceeded, UnknownTenant
from scheduler.local_admission import LocalDispatcher, local_dispatcher
from scheduler.ordering.fcfs import FcfsPolicy
from scheduler.ordering.rate_limit import RateLimitPolicy
from scheduler.ordering.vtc import VtcPolicy
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas, TenantRegistry
from scheduler.timers import ManualTimers
from tests.unit.scheduler.helpers import Waiter, req


def make(
    *tenants: TenantConfig, max_requests: int = 1, expire_deadlines: bool = False
) -> tuple[LocalDispatcher, FakeClock, ManualTimers]:
    clock = FakeClock()
    timers = ManualTimers(clock)
    reg = TenantRegistry(tenants, template=TenantConfig("x")) if tenants else None
    d = local_dispatcher(
        VtcPolicy(),
        AdmissionBudget(AdmissionLimits(max_requests=max_requests, max_kv_tokens=10_000)),
        clock,
        tenants=reg,
        timers=timers,
        expire_deadlines=expire_deadlines,
    )
    return d, clock, timers


def advance_to_next_timer(clock: FakeClock, timers: ManualTimers) -> None:
    when = timers.next_s()
    assert when is not None, "no wake-up armed"
    clock.set(max(when, clock.now_s()))
    timers.run_due()


def test_admits_in_policy_order_as_room_frees() -> None:
    d, _, _ = make(max_requests=1)
    w = [Waiter() for _ in range(3)]
    rs = [req("a", prompt=100), req("b"), req("a")]
    for r, wt in zip(rs, w, strict=True):
        d.submit(r, wt)
    assert [x.admitted_count for x in w] == [1, 0, 0]
    d.finish(rs[0])
    assert w[1].admitted_count == 1  # b (counter 0) before a's second (100)
    assert d.queued == 1 and d.in_flight == 1
    with pytest.raises(AssertionError):
        d.finish(rs[2])  # never admitted


def test_wait_mode_tenant_is_woken_when_its_bucket_allows() -> None:
    slow = TenantConfig(
        "slow", over_quota="wait", quotas=TenantQuotas(requests_per_s=2, requests_burst=1)
    )
    d, clock, timers = make(slow, max_requests=10)
    w1, w2, w3 = Waiter(), Waiter(), Waiter()
    r1, r2, r3 = req("slow"), req("slow"), req("other")
    d.submit(r1, w1)
    d.submit(r2, w2)
    d.submit(r3, w3)
    assert (w1.admitted_count, w2.admitted_count, w3.admitted_count) == (1, 0, 1)
    assert d.paused_tenants == {"slow": pytest.approx(0.5)}
    assert timers.next_s() == pytest.approx(0.5)
    clock.advance(0.25)
    timers.run_due()
    assert w2.admitted_count == 0
    advance_to_next_timer(clock, timers)
    assert w2.admitted_count == 1 and d.paused_tenants == {}


def test_reject_mode_raises_with_retry_and_leaves_no_trace() -> None:
    cfg = TenantConfig("a", quotas=TenantQuotas(requests_per_s=1, requests_burst=1))
    d, _, _ = make(cfg, max_requests=10)
    d.submit(req("a"), Waiter())
    with pytest.raises(QuotaExceeded) as err:
        d.submit(req("a"), Waiter())
    assert err.value.retry_after_s == pytest.approx(1.0)
    assert d.queued == 0 and d.state.quotas.open_reservations == 1


def test_unknown_tenant_is_refused() -> None:
    clock = FakeClock()
    d = local_dispatcher(
        FcfsPolicy(),
        AdmissionBudget(AdmissionLimits(1, 100)),
        clock,
        tenants=TenantRegistry([TenantConfig("a")]),
        timers=ManualTimers(clock),
    )
    with pytest.raises(UnknownTenant):
        d.submit(req("zz"), Waiter())


def test_max_concurrent_pauses_until_a_finish_without_blocking_others() -> None:
    cfg = TenantConfig("a", quotas=TenantQuotas(max_concurrent=1))
    d, _, timers = make(cfg, max_requests=10)
    a1, a2, b1 = req("a"), req("a"), req("b")
    wa2, wb1 = Waiter(), Waiter()
    d.submit(a1, Waiter())
    d.submit(a2, wa2)
    d.submit(b1, wb1)
    assert wa2.admitted_count == 0 and wb1.admitted_count == 1  # work-conserving
    assert timers.next_s() is None  # resumed by a finish, not a timer
    d.finish(a1)
    assert wa2.admitted_count == 1


def test_max_queue_wait_rejects_the_queued_request() -> None:
    cfg = TenantConfig("a", quotas=TenantQuotas(max_queue_wait_s=2.0))
    d, clock, timers = make(cfg, max_requests=1)
    hog, late = req("a"), req("a")
    d.submit(hog, Waiter())
    w = Waiter()
    d.submit(late, w)
    advance_to_next_timer(clock, timers)
    assert len(w.errors) == 1 and isinstance(w.errors[0], QueueTimeout)
    assert "waited 2.000 s" in str(w.errors[0]) and w.errors[0].limit == "max_queue_wait_s"
    assert d.queued == 0 and d.state.quotas.open_reservations == 1
    d.finish(hog)
    assert d.state.quotas.open_reservations == 0 and d.expired_total == 1


def test_deadline_expiry_is_opt_in() -> None:
    d, clock, timers = make(max_requests=1, expire_deadlines=True)
    d.submit(req("a"), Waiter())
    w = Waiter()
    d.submit(req("a", deadline_s=1.5), w)
    advance_to_next_timer(clock, timers)
    assert isinstance(w.errors[0], DeadlineExpired)
    d2, _, timers2 = make(max_requests=1)
    d2.submit(req("a"), Waiter())
    d2.submit(req("a", deadline_s=1.5), Waiter())
    assert timers2.next_s() is None


def test_gone_caller_is_dropped_uncharged_at_admission_time() -> None:
    cfg = TenantConfig("a", quotas=TenantQuotas(tokens_per_min=6000))
    d, _, _ = make(cfg, max_requests=1)
    hog, gone = req("a"), req("a", prompt=7, max_tokens=3)
    d.submit(hog, Waiter())
    w = Waiter()
    d.submit(gone, w)
    w.gone = True
    d.finish(hog)
    assert w.admitted_count == 0 and d.queued == 0 and d.in_flight == 0
    usage = d.state.quotas.usage("a")
    # No output: all of max_tokens was refunded.
    assert usage is not None and usage.charged_tokens == hog.prompt_tokens


def test_policy_rejection_refunds_the_reservation() -> None:
    clock = FakeClock()
    d = local_dispatcher(
        RateLimitPolicy(clock, requests_per_s=1, burst=1),
        AdmissionBudget(AdmissionLimits(1, 100)),
        clock,
        tenants=TenantRegistry([], template=TenantConfig("x", quotas=TenantQuotas(max_queued=5))),
        timers=ManualTimers(clock),
    )
    d.submit(req("a"), Waiter())
    with pytest.raises(QuotaExceeded):
        d.submit(req("a"), Waiter())
    usage = d.state.quotas.usage("a")
    assert usage is not None and usage.queued == 0 and usage.open_reservations == 1


def test_set_limits_pumps_and_budget_gates_kv_tokens() -> None:
    d, _, _ = make(max_requests=1)
    rs = [req("a", prompt=50, max_tokens=50) for _ in range(3)]
    for r in rs:
        d.submit(r, Waiter())
    assert d.in_flight == 1
    d.set_limits(AdmissionLimits(max_requests=10, max_kv_tokens=200))
    assert d.in_flight == 2 and d.queued == 1


async def test_admit_cancel_while_queued_charges_nothing() -> None:
    d = local_dispatcher(VtcPolicy(), AdmissionBudget(AdmissionLimits(1, 1000)), MonotonicClock())
    hog = req("a")
    await d.admit(hog)
    queued = req("b", prompt=99)
    task = asyncio.create_task(d.admit(queued))
    await asyncio.sleep(0)
    assert d.queued == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert d.queued == 0
    assert isinstance(d.state.policy, VtcPolicy) and d.state.policy.counter("b") == 0
    d.finish(hog)
    assert d.in_flight == 0 and d.state.quotas.open_reservations == 0


async def test_admit_cancelled_in_the_tick_it_was_admitted_gives_room_back() -> None:
    d = local_dispatcher(VtcPolicy(), AdmissionBudget(AdmissionLimits(1, 1000)), MonotonicClock())
    hog = req("a")
    await d.admit(hog)
    task = asyncio.create_task(d.admit(req("b")))
    await asyncio.sleep(0)
    d.finish(hog)  # admits b: its future is resolved...
    task.cancel()  # ...but its task is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await task
    assert d.in_flight == 0 and d.queued == 0 and d.state.quotas.open_reservations == 0


async def test_admit_raises_queue_timeout_with_real_timers() -> None:
    reg = TenantRegistry([TenantConfig("a", quotas=TenantQuotas(max_queue_wait_s=0.02))])
    d = local_dispatcher(
        FcfsPolicy(), AdmissionBudget(AdmissionLimits(1, 1000)), MonotonicClock(), tenants=reg
    )
    hog = req("a")
    await d.admit(hog)
    with pytest.raises(QueueTimeout):
        await asyncio.wait_for(d.admit(req("a")), timeout=2.0)
    d.finish(hog)
    assert d.state.quotas.open_reservations == 0


def test_stale_expiry_wakeups_do_not_pile_up() -> None:
    cfg = TenantConfig("a", quotas=TenantQuotas(max_queue_wait_s=3600.0))
    d, _, _ = make(cfg, max_requests=1)
    for _ in range(1000):
        r = req("a")
        d.submit(r, Waiter())  # admitted at once; its expiry wake-up goes stale
        d.finish(r)
    assert len(d._wakeups) <= 2 * 1 + 64 + 1


def test_output_charges_can_admit_a_request_waiting_behind_an_oversized_head() -> None:
    # Found by the property tests: a tie at arrival puts c behind a's head,
    # which is too big for the free KV; a's output tokens then raise its
    # counter above c's, and c (which fits) must be admitted at once, not at
    # the next arrival or finish.
    clock = FakeClock()
    d = local_dispatcher(
        VtcPolicy(),
        AdmissionBudget(AdmissionLimits(max_requests=3, max_kv_tokens=200)),
        clock,
        timers=ManualTimers(clock),
    )
    running, w_running = req("a", prompt=50, max_tokens=50), Waiter()
    d.submit(running, w_running)
    earlier = req("c", prompt=1, max_tokens=1)
    d.submit(earlier, Waiter())  # c was admitted after a: a wins ties from now on
    d.finish(earlier)
    big, w_big = req("a", prompt=100, max_tokens=100), Waiter()
    d.submit(big, w_big)  # 100 + 200 > 200: waits
    small, w_small = req("c", prompt=1, max_tokens=1), Waiter()
    d.submit(small, w_small)  # lifted to a's counter; a, served less recently, goes first
    assert (w_big.admitted_count, w_small.admitted_count) == (0, 0)
    d.on_output_tokens(running, 10)
    assert w_small.admitted_count == 1 and w_big.admitted_count == 0


def test_idle_unconfigured_tenants_are_forgotten_configured_ones_kept() -> None:
    # Issue #14: in open mode every caller-chosen tenant id left state behind
    # (queues, counters, usage records) forever.
    clock = FakeClock()
    quota = TenantQuotas(tokens_per_min=60.0, tokens_burst=600.0)  # refills 1 token/s
    reg = TenantRegistry([TenantConfig("known")], template=TenantConfig("x", quotas=quota))
    d = local_dispatcher(
        VtcPolicy(),
        AdmissionBudget(AdmissionLimits(max_requests=4, max_kv_tokens=10_000)),
        clock,
        tenants=reg,
        timers=ManualTimers(clock),
        idle_ttl_s=60.0,
    )
    for tid in ["known", *(f"t{i}" for i in range(500))]:
        r = req(tid, prompt=100, max_tokens=10)
        d.submit(r, Waiter())
        d.on_output_tokens(r, 10)
        d.finish(r)  # 110 tokens drained: full again after 110 s
    assert len(d.state.quotas.usages()) == 501

    def arrival() -> None:  # the sweep runs at an arrival (a configured tenant's here)
        r = req("known", prompt=1, max_tokens=1)
        d.submit(r, Waiter())
        d.finish(r)

    clock.advance(61.0)
    arrival()
    assert d.forgotten_total == 0  # idle long enough, but a drained bucket is kept
    clock.advance(60.0)
    arrival()
    assert d.forgotten_total == 500
    assert [u.config.tenant_id for u in d.state.quotas.usages()] == ["known"]
    policy = d.state.policy
    assert isinstance(policy, VtcPolicy)
    assert set(policy.counters.values) == {"known"} and set(policy._backlog._queues) <= {"known"}
    # A forgotten tenant that returns starts afresh, with full buckets.
    w = Waiter()
    d.submit(req("t7", prompt=10, max_tokens=10), w)
    assert w.admitted_count == 1
