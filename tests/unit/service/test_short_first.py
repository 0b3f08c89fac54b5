"""Short prompts first in a worker's staged-prefill lane (issue #33: what isolating
the light tenant costs the others).

The lane lets one staged prompt prefill at a time per engine, so that each step
carries one stage at most; FIFO, a 700-token conversation turn waits behind
every stage of a 6 000-token prompt ahead of it. With `short_first` a prompt
that is no long prefill (`Placement.overtakes`) takes the lane between two of
those stages; one whose prefix a prompt ahead of it is still computing waits
its turn (it would be planned as if that prefix were held)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

import pytest
from fairgate.bench.event_driver import Arrival
from fairgate.bench.stagger import fleet

from scheduler.request import QueuedRequest
from service.engines.engine_request import engine_request
from service.engines.kv_view import CacheView
from service.engines.placed import Placed
from service.engines.placement import Placement
from service.engines.protocol import EngineChunk, EngineRequest, SamplingOptions
from service.engines.simulator.core import SimConfig
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.hardware import preset
from service.engines.staged_prefill import StagedPrefill, StageLane, StagingStats, staged
from service.engines.stagger import Stagger
from service.settings import Settings, SettingsError
from tests.unit.service.test_stagger_pace import _target

IGNORE_EOS = SamplingOptions(ignore_eos=True)
PLAN = StagedPrefill(min_tokens=256, stage_tokens=128, short_first=True)


def _yes() -> bool:
    return True


def _no() -> bool:
    return False


async def _waiter(
    lane: StageLane, order: list[str], name: str, overtakes: Callable[[], bool] | None
) -> None:
    await lane.acquire(overtakes)
    order.append(name)
    lane.release()


async def test_a_waiter_that_overtakes_goes_first_and_the_holder_resumes_before_the_rest() -> None:
    lane, order = StageLane(), list[str]()
    await lane.acquire(_no)  # a long prompt holds the lane
    waiters = [
        asyncio.create_task(_waiter(lane, order, "long", _no)),
        asyncio.create_task(_waiter(lane, order, "never asked", None)),
        asyncio.create_task(_waiter(lane, order, "short", _yes)),
    ]
    await asyncio.sleep(0)
    assert lane.waiting == 3
    assert lane.overtaken(_no) and lane.overtaken(None)
    assert not lane.overtaken(_yes)  # a holder that overtakes itself: FIFO among those

    async def step_aside() -> None:  # between two of its stages, as `staged` does
        lane.release()
        await lane.acquire(_no, resumed=True)

    await step_aside()  # the short one goes first and hands the lane back to it
    # The two left wait unsent; the one resumed never counted (its stages under way).
    assert order == ["short"] and lane.waiting == 2
    lane.release()
    await asyncio.gather(*waiters)
    assert order == ["short", "long", "never asked"]  # the rest FIFO
    await lane.acquire()  # free again
    lane.release()


async def test_a_cancelled_waiter_leaves_the_lane_and_a_cancelled_turn_is_passed_on() -> None:
    lane, order = StageLane(), list[str]()
    await lane.acquire()
    gone = asyncio.create_task(lane.acquire(_yes))
    after = asyncio.create_task(_waiter(lane, order, "after", None))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    assert lane.waiting == 1 and not lane.overtaken(None)
    # Handed the lane as it is cancelled: it passes it on.
    late = asyncio.create_task(lane.acquire(_yes))
    await asyncio.sleep(0)
    lane.release()  # to `late` (it overtakes)
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late
    await after
    assert order == ["after"] and lane.waiting == 0
    # Cancelled while the lane is handed on to nobody else: the lane is free at
    # once, not held for the turn still leaving the queue.
    await lane.acquire()
    leaving = asyncio.create_task(lane.acquire())
    await asyncio.sleep(0)
    coming = asyncio.create_task(lane.acquire())  # asks before `leaving` has left
    leaving.cancel()
    lane.release()
    await asyncio.wait_for(coming, 1)
    lane.release()


async def _collect(stream: AsyncGenerator[EngineChunk, None]) -> list[EngineChunk]:
    async with aclosing(stream) as chunks:
        return [c async for c in chunks]


@pytest.mark.parametrize("short_first", [True, False])
async def test_a_short_prompt_goes_between_a_long_ones_stages(short_first: bool) -> None:
    """Through `staged` on a simulated engine: a 1 000-token prompt (long) holds the
    lane; a second long one and a 400-token one (short) wait. With the setting the
    short one's stages and prefill go right after the stage under way; the second
    long one still waits for all of the first's."""
    engine = SimulatedEngine(SimConfig(cost=preset()), time_scale=0.0)
    await engine.start()
    sent: list[tuple[str, int]] = []

    async def send(r: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        sent.append((r.request_id, r.prompt_tokens if r.max_tokens == 0 else -r.prompt_tokens))
        async with aclosing(engine._generate_one(r)) as stream:
            async for chunk in stream:
                yield chunk

    def req(rid: str, n: int, first: int, overtakes: Callable[[], bool]) -> EngineRequest:
        return EngineRequest(rid, list(range(first, first + n)), 2, IGNORE_EOS, overtakes=overtakes)

    plan = StagedPrefill(256, 128, short_first=short_first)
    lane, stats = StageLane(), StagingStats()
    try:
        tasks = [
            asyncio.create_task(_collect(staged(send, r, plan, stats, lane=lane)))
            for r in (
                req("a", 1000, 10_000, _no),
                req("b", 600, 20_000, _no),
                req("short", 400, 30_000, _yes),
            )
        ]
        await asyncio.gather(*tasks)
        a = [("a", n) for n in (128, 256, 384, 512, 640, 768, 896, -1000)]
        b = [("b", n) for n in (128, 256, 384, 512, -600)]
        short = [("short", n) for n in (128, 256, 384, -400)]
        if short_first:
            assert sent == [a[0], *short, *a[1:], *b]
            assert stats.yielded == 1
        else:
            assert sent == [*a, *b, *short]
            assert stats.yielded == 0
    finally:
        await engine.aclose()


def _place(p: Placement, n: int, first: int) -> Placed:
    prompt = list(range(first, first + n))
    q = QueuedRequest("r", "t", n, 16, prefix_keys=p.prefix_keys(prompt))
    req = engine_request(q, "r", prompt, SamplingOptions(), None, False)
    return p.place(req, list(q.prefix_keys), set()) or pytest.fail()


def test_the_placement_lets_a_short_prompt_overtake_unless_its_prefix_is_being_computed() -> None:
    p = Placement([_target("w0")], clock=lambda: 5.0)
    p.stagger = Stagger(min_tokens=1024, keep_free=False)
    p.exact[0] = CacheView()  # KV events: a prompt in flight counts as held
    long = _place(p, 6000, 10_000)
    assert not p.overtakes(long)  # a long prefill
    short = _place(p, 700, 50_000)
    assert p.overtakes(short)
    # A prompt on the long one's prefix: short where it goes (the prefix counted
    # held), but that prefix is still being computed ahead of it.
    on_it = _place(p, 6200, 10_000)
    assert on_it.matched >= 5000 and on_it.pending < 1024
    assert not p.overtakes(on_it)
    p.first_token(long, 6000, 0)  # computed
    assert p.overtakes(on_it)
    # Without the stagger's long mark nothing is short.
    assert not Placement([_target("w0")], clock=lambda: 5.0).overtakes(short)


def _arrival(at_s: float, tenant: str, ids: tuple[int, ...]) -> Arrival:
    return Arrival(at_s, tenant, len(ids), 8, prompt_ids=ids)


@pytest.mark.parametrize("short_first", [True, False])
def test_the_virtual_fleet_lets_a_short_prompt_overtake_as_the_pool_does(short_first: bool) -> None:
    """One engine: a 6 000-token cold prompt in stages of 128, a cold 700-token one
    and a 700-token one on the long one's prefix right behind it."""
    long_ids = tuple(range(10_000, 16_000))
    trace = [
        _arrival(0.0, "code", long_ids),
        _arrival(0.05, "conv", tuple(range(50_000, 50_700))),
        _arrival(0.06, "docs", (*long_ids[:5800], *range(70_000, 70_700))),
    ]
    plan = StagedPrefill(256, 128, cold_only=True, short_first=short_first)
    drv = fleet(trace, 1, Stagger(min_tokens=1024, keep_free=False), plan)
    long, short, on_it = drv.calls
    assert all(c.state == "done" for c in drv.calls)
    assert long.first_token_s and short.first_token_s and on_it.first_token_s
    assert (short.first_token_s < long.first_token_s) is short_first
    assert on_it.first_token_s > long.first_token_s  # waited: it shares the long prefix
    assert on_it.cached_tokens >= 5800
    assert drv.fleet is not None and drv.fleet.yielded == (1 if short_first else 0)


def test_short_first_needs_the_lane_and_the_stagger() -> None:
    first = {"staged_prefill_short_first": True}
    with pytest.raises(SettingsError, match="staged_prefill_short_first"):
        Settings().replace(**first)
    with pytest.raises(SettingsError, match="staged_prefill_short_first"):
        Settings().replace(staged_prefill_min_tokens=256, **first)
    stagger = {"staged_prefill_min_tokens": 256, "sglang_stagger_prefill_tokens": 1024}
    with pytest.raises(SettingsError, match="keep staged_prefill_one_at_a_time"):
        Settings().replace(staged_prefill_one_at_a_time=False, **stagger, **first)
    from service.engine_factory import staged_prefill

    assert staged_prefill(Settings().replace(**stagger, **first)).short_first
