"""The front door, `async with gate.admitted(req) as ticket`, on both dispatchers:
every way of leaving the block settles exactly once, and the ticket's state says
where the request is. The shared dispatcher runs over a MemoryStore here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from scheduler.budget import AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.errors import QueueTimeout, RequestTooLarge
from scheduler.gate import AdmissionGate, RequestState, Ticket
from scheduler.request import QueuedRequest
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas, TenantRegistry
from scheduler.timers import ManualTimers
from tests.unit.scheduler.gates import GATE_KINDS, Held, open_gate, until, until_quiet
from tests.unit.scheduler.helpers import req

TENANTS = TenantRegistry(
    [
        TenantConfig("t", quotas=TenantQuotas(tokens_per_min=600, tokens_burst=1000)),
        TenantConfig("small", quotas=TenantQuotas(max_prompt_tokens=50)),
        TenantConfig("hasty", quotas=TenantQuotas(max_queue_wait_s=2.0)),
    ]
)


class Env:
    def __init__(self, gate: AdmissionGate, clock: FakeClock, timers: ManualTimers) -> None:
        self.gate, self.clock, self.timers = gate, clock, timers

    def tenant(self, tenant_id: str) -> tuple[int, int, float]:
        """(finished_total, in_flight, charged_tokens) of one tenant."""
        t = self.gate.stats().tenant(tenant_id)
        assert t is not None
        return t.finished_total, t.in_flight, t.charged_tokens


@pytest.fixture(params=GATE_KINDS)
async def env(request: pytest.FixtureRequest) -> AsyncIterator[Env]:
    clock = FakeClock()
    timers = ManualTimers(clock)
    limits = AdmissionLimits(max_requests=1, max_kv_tokens=10_000)
    async with open_gate(request.param, TENANTS, limits, clock, timers) as gate:
        yield Env(gate, clock, timers)


async def test_admit_charge_settle(env: Env) -> None:
    r = req("t", prompt=10, max_tokens=20)
    async with env.gate.admitted(r) as ticket:
        assert ticket.state is RequestState.ADMITTED
        assert env.gate.stats().in_flight == 1
        ticket.charge(0)
        assert ticket.state is RequestState.ADMITTED  # nothing streamed yet
        ticket.charge(3)
        ticket.charge(2)
        assert ticket.state is RequestState.STREAMING and ticket.output_tokens == 5
    assert ticket.state is RequestState.SETTLED
    # Settled once: prompt + 5 output tokens kept, the 15 unused refunded.
    assert env.tenant("t") == (1, 0, 15.0)
    await until_quiet(env.gate)
    await env.gate.refresh_stats()
    t = env.gate.stats().tenant("t")
    assert t is not None and t.token_bucket is not None
    assert t.token_bucket.level == pytest.approx(1000 - 15)
    with pytest.raises(AssertionError):
        ticket.charge(1)  # settled: no more charges


async def test_an_exception_in_the_block_settles_and_propagates(env: Env) -> None:
    r = req("t", prompt=10, max_tokens=20)
    with pytest.raises(ValueError, match="engine broke"):
        async with env.gate.admitted(r) as ticket:
            ticket.charge(4)
            raise ValueError("engine broke")
    assert ticket.state is RequestState.SETTLED
    assert env.tenant("t") == (1, 0, 14.0)
    assert env.gate.stats().in_flight == 0


async def test_cancel_inside_the_block_settles(env: Env) -> None:
    held = Held(env.gate, req("t"))
    await until(lambda: held.state == "admitted", "admitted")
    await held.cancel()
    assert held.state == "settled"
    assert env.tenant("t")[:2] == (1, 0)


async def test_cancel_while_queued_withdraws_it_uncharged(env: Env) -> None:
    first = Held(env.gate, req("t", prompt=10, max_tokens=20))
    await until(lambda: first.state == "admitted", "the first admitted")
    queued = Held(env.gate, req("t", prompt=10, max_tokens=20))
    await until(lambda: env.gate.stats().queued == 1, "the second queued")
    await queued.cancel()
    assert queued.state == "cancelled"
    stats = env.gate.stats()
    assert stats.queued == 0 and stats.in_flight == 1
    # The withdrawn one ended and kept nothing; the first still holds its 30.
    assert env.tenant("t") == (1, 1, 30.0)
    await first.leave()
    assert env.tenant("t") == (2, 0, 10.0)
    assert env.gate.stats().admitted_total == 1


async def test_cancel_in_the_same_tick_as_the_admission(env: Env) -> None:
    """The caller is cancelled after its admission was decided but before it ran
    again: `admit` gives the room back, the ticket is CANCELLED, nothing settles twice."""
    first = env.gate.admitted(req("t"))
    await first.__aenter__()
    second = Held(env.gate, req("t"))
    await until(lambda: env.gate.stats().queued == 1, "the second queued")
    await first.__aexit__(None, None, None)  # synchronous: frees the room
    for _ in range(10_000):  # one loop turn at a time: the shared pump decides
        if env.gate.stats().in_flight:  # (the local dispatcher did already)
            break
        await asyncio.sleep(0)
    assert second.state == "queued"  # admitted, but its task has not run since
    second.task.cancel()
    (outcome,) = await asyncio.gather(second.task, return_exceptions=True)
    assert isinstance(outcome, asyncio.CancelledError)  # not a double finish
    assert second.state == "cancelled"
    stats = env.gate.stats()
    assert stats.in_flight == 0 and stats.in_flight_kv_tokens == 0 and stats.admitted_total == 2
    assert env.tenant("t") == (2, 0, 10.0 + 10.0)  # each kept its prompt only


async def test_leaving_twice_settles_once(env: Env) -> None:
    admission = env.gate.admitted(req("t", prompt=10, max_tokens=20))
    ticket = await admission.__aenter__()
    await admission.__aexit__(None, None, None)
    await admission.__aexit__(None, None, None)
    assert ticket.state is RequestState.SETTLED
    assert env.tenant("t") == (1, 0, 10.0)
    with pytest.raises(AssertionError, match="entered twice"):
        await admission.__aenter__()


async def test_leaving_before_entering_is_a_bug(env: Env) -> None:
    admission = env.gate.admitted(req("t"))
    with pytest.raises(AssertionError, match="before entering"):
        await admission.__aexit__(None, None, None)


async def test_an_abandoned_stream_settles_on_generator_exit(env: Env) -> None:
    async def stream(r: QueuedRequest) -> AsyncIterator[Ticket]:
        async with env.gate.admitted(r) as ticket:
            ticket.charge(1)
            yield ticket
            yield ticket  # never reached: the consumer goes away

    agen = stream(req("t", prompt=10, max_tokens=20))
    ticket = await agen.__anext__()
    assert ticket.state is RequestState.STREAMING
    await agen.aclose()  # GeneratorExit at the yield
    assert ticket.state is RequestState.SETTLED
    assert env.tenant("t") == (1, 0, 11.0)


async def test_refused_at_arrival_is_rejected(env: Env) -> None:
    admission = env.gate.admitted(req("small", prompt=60))
    with pytest.raises(RequestTooLarge):
        async with admission:
            raise AssertionError("never admitted")
    assert admission.ticket is not None and admission.ticket.state is RequestState.REJECTED
    t = env.gate.stats().tenant("small")
    assert (
        t is not None and t.rejected_total == 1 and dict(t.rejections) == {"max_prompt_tokens": 1}
    )
    assert t.finished_total == 0


async def test_out_of_queue_time_is_expired(env: Env) -> None:
    first = Held(env.gate, req("t"))
    await until(lambda: first.state == "admitted", "the first admitted")
    late = Held(env.gate, req("hasty"))
    await until(lambda: env.gate.stats().queued == 1, "queued")
    env.clock.advance(2.0)
    env.timers.run_due()
    (outcome,) = await asyncio.gather(late.task, return_exceptions=True)
    assert isinstance(outcome, QueueTimeout)
    assert late.state == "expired"
    stats = env.gate.stats()
    assert stats.expired_total == 1 and stats.queued == 0
    await first.leave()


def test_illegal_transitions_raise() -> None:
    ticket = Ticket(None, req("t"))  # type: ignore[arg-type]  # never reaches the core
    for bad in (RequestState.SETTLED, RequestState.STREAMING, RequestState.QUEUED):
        with pytest.raises(AssertionError, match="not allowed"):
            ticket._move(bad)
    ticket._move(RequestState.CANCELLED)
    assert ticket.state.final
    with pytest.raises(AssertionError):
        ticket._move(RequestState.ADMITTED)
