"""The light tenants' credit (`rules.order_key`) and engine priority.

A light tenant (at most `rules.LIGHT_QUEUE` requests queued) is ordered
`light_credit` ahead of the others, so that its own last request, charged to
its counter, does not make its next one wait for tenants queued all along.
"""

from __future__ import annotations

import itertools

import pytest

from scheduler import rules
from scheduler.ordering.vtc import VtcPolicy
from scheduler.request import QueuedRequest

_ids = itertools.count()


def _req(tenant: str, prompt: int = 100) -> QueuedRequest:
    return QueuedRequest(f"{tenant}-{next(_ids)}", tenant, prompt, 10, seq=next(_ids))


def _light_served_once(credit: float) -> VtcPolicy:
    """heavy: queued all along, served once (counter 100); light: 800 ahead of it
    after one request of its own."""
    p = VtcPolicy(light_credit=credit)
    for _ in range(rules.LIGHT_QUEUE + 2):
        p.push(_req("heavy"))
    p.pop_next()
    p.push(_req("light", prompt=800))  # lifted to 100; newly backlogged goes first
    popped = p.pop_next()
    assert popped is not None and popped.tenant_id == "light"
    assert p.counter("light") == 900 and p.counter("heavy") == 100
    p.push(_req("light"))  # back, with its counter 800 ahead (no lift: above the floor)
    return p


@pytest.mark.parametrize(("credit", "first"), [(0.0, "heavy"), (500.0, "heavy"), (1000.0, "light")])
def test_a_light_tenant_goes_first_only_within_its_credit(credit: float, first: str) -> None:
    head = _light_served_once(credit).peek_next()
    assert head is not None and head.tenant_id == first


def test_a_tenant_with_more_queued_than_light_loses_the_credit() -> None:
    p = _light_served_once(1000.0)
    for _ in range(rules.LIGHT_QUEUE - 1):
        p.push(_req("light"))
    head = p.peek_next()
    assert head is not None and head.tenant_id == "light"  # LIGHT_QUEUE queued: light
    p.push(_req("light"))
    head = p.peek_next()
    assert head is not None and head.tenant_id == "heavy"  # one more: ordered by counter


def test_the_lift_uses_counters_not_the_credit() -> None:
    # A newcomer is lifted to the smallest *counter*: the credit of a light tenant
    # in the backlog must not lower the floor (it would hand newcomers credit too).
    p = _light_served_once(1000.0)
    p.push(_req("new"))
    assert p.counter("new") == 100  # heavy's counter, not light's 900 - 1000


def test_engine_priority_puts_light_tenants_first_and_stays_below_preemption() -> None:
    prios = {
        (batch, light): rules.engine_priority(batch, light)
        for batch in (False, True)
        for light in (False, True)
    }
    assert prios[(True, True)] > prios[(False, False)]  # light batch before heavy interactive
    assert (
        prios[(False, True)] > prios[(True, True)] and prios[(False, False)] > prios[(True, False)]
    )
    assert max(prios.values()) - min(prios.values()) <= 10  # SGLang preempts only above 10
