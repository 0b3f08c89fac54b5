from __future__ import annotations

import pytest

from scheduler.clock import FakeClock
from scheduler.errors import QuotaExceeded
from scheduler.ordering.fcfs import FcfsPolicy
from scheduler.ordering.keyed_heap import KeyedHeap
from scheduler.ordering.policies import PolicyOptions, make_policy
from scheduler.ordering.rate_limit import RateLimitPolicy
from scheduler.ordering.tenant_queue import TenantQueue
from scheduler.ordering.vtc import VtcPolicy
from scheduler.request import Priority
from tests.unit.scheduler.helpers import req

B = Priority.BATCH
INTER = Priority.INTERACTIVE


def test_keyed_heap_updates_discards_and_compacts() -> None:
    h = KeyedHeap()
    for i in range(100):
        h.set(f"t{i}", (float(100 - i), 0, 0))
    assert h.peek() == "t99"
    for _ in range(500):
        h.set("t99", (1000.0, 0, 0))
        h.set("t99", (0.5, 0, 0))
    assert h.peek() == "t99"
    assert len(h._heap) <= 2 * len(h) + 33  # stale entries are compacted
    h.discard("t99")
    assert h.peek() == "t98"
    assert "t99" not in h and len(h) == 99
    h.set("a", (2.0, 0, 5))
    h.set("b", (2.0, 0, 3))
    h.set("t98", (3.0, 0, 0))
    assert h.peek() == "b"


def test_tenant_queue_fifo_interactive_first_and_batch_every_n() -> None:
    q = TenantQueue(batch_every_n=2)
    batch = [req("t", priority=B) for _ in range(2)]
    inter = [req("t") for _ in range(5)]
    for r in batch + inter:
        q.push(r)
    order = [q.pop() for _ in range(7)]
    assert order == [inter[0], inter[1], batch[0], inter[2], inter[3], batch[1], inter[4]]
    assert q.pop() is None and len(q) == 0


@pytest.mark.parametrize("every_n", [None, 1, 2])
def test_tenant_queue_upcoming_is_the_order_pop_returns(every_n: int | None) -> None:
    q = TenantQueue(batch_every_n=every_n)
    reqs = [req("t", priority=B if k % 3 == 0 else INTER) for k in range(9)]
    for r in reqs:
        q.push(r)
    q.pop()  # a streak under way
    assert q.remove(reqs[4])
    ahead = q.upcoming(5)
    assert len(q) == 7 and q.upcoming(100) == q.upcoming(7)
    assert [q.pop() for _ in range(7)][:5] == ahead


def test_tenant_queue_without_rule_is_strict_priority_and_removal_is_lazy() -> None:
    q = TenantQueue()
    b = req("t", priority=B)
    i1, i2 = req("t"), req("t")
    for r in (b, i1, i2):
        q.push(r)
    assert q.remove(i1) and not q.remove(i1)
    assert len(q) == 2
    assert [q.pop(), q.pop()] == [i2, b]


def test_fcfs_is_global_priority_then_arrival_and_skips_paused() -> None:
    p = FcfsPolicy()
    a1, b1, a2 = req("a", priority=B), req("b"), req("a")
    for r in (a1, b1, a2):
        p.push(r)
    assert p.peek_next() is b1
    p.pause("b")
    assert p.pop_next() is a2
    p.resume("b")
    assert [p.pop_next(), p.pop_next(), p.pop_next()] == [b1, a1, None]
    assert len(p) == 0


def test_rate_limit_rejects_over_rate_with_exact_retry() -> None:
    clock = FakeClock()
    p = RateLimitPolicy(clock, requests_per_s=2.0, burst=2.0)
    p.push(req("a"))
    p.push(req("a"))
    with pytest.raises(QuotaExceeded) as err:
        p.push(req("a"))
    assert err.value.limit == "rate_limit"
    assert err.value.retry_after_s == pytest.approx(0.5)
    p.push(req("b"))  # per tenant
    clock.advance(0.5)
    p.push(req("a"))
    assert len(p) == 4 and p.rejected_total == 1


def test_registry_names_and_default() -> None:
    assert make_policy().name == "vtc"
    for name in ("vtc", "fcfs", "rate-limit"):
        assert make_policy(name, PolicyOptions(clock=FakeClock())).name == name
    with pytest.raises(ValueError, match="available: fcfs, rate-limit, vtc"):
        make_policy("lottery")
    assert isinstance(make_policy("vtc"), VtcPolicy)
