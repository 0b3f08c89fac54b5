"""Wide stages where the worker is sheltered (issue #33: the long mix's tokens/s).

A long prompt goes in small stages so that a light request that lands on its
worker waits for one small step; where the stagger keeps another worker on
short steps for the light tenant (`Stagger.shelters`), the light request goes
there, and the prompt's stages may be wide (`StagedPrefill.sheltered_stage_tokens`),
asked before each stage."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

import pytest

from scheduler.request import QueuedRequest
from service.engines.engine_request import engine_request
from service.engines.placed import Placed
from service.engines.placement import SHELTER_GRACE_S, Placement
from service.engines.protocol import EngineChunk, EngineRequest, SamplingOptions
from service.engines.simulator.core import SimConfig
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.hardware import preset
from service.engines.staged_prefill import StagedPrefill, Staging, StagingStats, staged
from service.engines.stagger import Stagger
from tests.unit.service.test_stagger_pace import _target

IGNORE_EOS = SamplingOptions(ignore_eos=True)
PLAN = StagedPrefill(min_tokens=256, stage_tokens=128, sheltered_stage_tokens=2048)


def _staging(prompt: int, held: int = 0) -> Staging:
    return Staging(PLAN.ends(prompt, 4, held), 1, prompt, PLAN.stage_tokens)


def _walk(staging: Staging, wides: list[int]) -> list[int | None]:
    """The stage ends, each asked with the next width, each found fully cached."""
    out: list[int | None] = []
    for wide in wides:
        end = staging.next_end(wide)
        out.append(end)
        if end is None:
            break
        staging.stage_done(staging.held)
    return out


def test_a_wide_stage_reaches_past_the_small_ends_and_the_rest_goes_whole() -> None:
    assert _walk(_staging(6000), [2048, 2048, 2048]) == [2048, 4096, None]
    # Small stages, as without the setting.
    assert _walk(_staging(6000), [0, 0, 0]) == [128, 256, 384]
    # Sheltered, then not: back to the small stages from where it stands.
    assert _walk(_staging(6000), [2048, 0, 0, 2048]) == [2048, 2176, 2304, 4352]
    # Not sheltered, then sheltered with the rest within reach: whole.
    assert _walk(_staging(1000), [0, 2048]) == [128, None]


def test_a_wide_stage_starts_where_the_held_part_ends() -> None:
    # 600 held where it goes: the stages start above it on their grid (640, ...).
    staging = _staging(6000, held=600)
    assert staging.next_end(0) == 640
    assert _staging(6000, held=600).next_end(2048) == 512 + 2048
    # A width below one stage is one stage.
    assert _staging(6000).next_end(100) == 128


def test_wide_is_asked_only_with_the_setting_and_a_sheltered_worker() -> None:
    assert PLAN.wide(None) == 0
    assert PLAN.wide(lambda: False) == 0
    assert PLAN.wide(lambda: True) == 2048
    assert StagedPrefill(256, 128).wide(lambda: True) == 0
    with pytest.raises(ValueError):
        StagedPrefill(256, 128, sheltered_stage_tokens=-1)


async def _collect(stream: AsyncGenerator[EngineChunk, None]) -> list[EngineChunk]:
    async with aclosing(stream) as chunks:
        return [c async for c in chunks]


async def test_each_stage_asks_whether_the_worker_is_sheltered() -> None:
    engine = SimulatedEngine(SimConfig(cost=preset()), time_scale=0.0)
    await engine.start()
    sent: list[int] = []
    answers = iter([True, False, True, True])

    async def send(r: EngineRequest) -> AsyncGenerator[EngineChunk, None]:
        sent.append(r.prompt_tokens if r.max_tokens == 0 else -r.prompt_tokens)
        async with aclosing(engine._generate_one(r)) as stream:
            async for chunk in stream:
                yield chunk

    try:
        req = EngineRequest(
            "long", list(range(300, 6300)), 4, IGNORE_EOS, sheltered=lambda: next(answers)
        )
        stats = StagingStats()
        chunks = await _collect(staged(send, req, PLAN, stats))
        # Wide to 2048, small to 2176, wide to 2176 + 2048, then the rest (6000 within
        # 4224 + 2048) whole: four asks, three stages, two of them wide.
        assert sent == [2048, 2176, 4224, -6000]
        assert (stats.stages, stats.wide_stages) == (3, 2)
        assert (chunks[-1].cached_tokens, chunks[-1].staged_tokens) == (4224, 4224)
    finally:
        await engine.aclose()


def _stagger(light_seen_s: float = 4.0, **kw: object) -> Stagger:
    return Stagger(min_tokens=1024, keep_tokens=256, light_seen_s=light_seen_s, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("pending", "healthy", "sheltered"),
    [
        ([6000, 0, 4000, 4000], [True] * 4, True),  # w1 on short steps
        ([6000, 900, 4000, 4000], [True] * 4, True),  # below the long mark
        ([6000, 1100, 4000, 4000], [True] * 4, False),  # every other mid-prefill
        ([0, 4000, 4000, 4000], [True] * 4, False),  # only itself short
        ([900, 0, 4000, 4000], [True] * 4, False),  # itself short too: a light one may come
        ([6000, 0, 4000, 4000], [True, False, True, True], False),  # w1 unhealthy
        ([6000, 0, 4000], [True, True, True], True),  # three: the rule applies
        ([6000, 0], [True, True], False),  # two: nothing keeps w1 short
    ],
)
def test_a_worker_is_sheltered_where_the_stagger_keeps_another_short(
    pending: list[int], healthy: list[bool], sheltered: bool
) -> None:
    assert _stagger().shelters(0, pending, healthy, 5.0) is sheltered


def test_nothing_shelters_while_the_light_tenant_is_quiet_or_without_a_stagger() -> None:
    one_short = [6000, 0, 4000, 4000]
    assert not _stagger(light_seen_s=-100.0).shelters(0, one_short, [True] * 4, 5.0)
    assert not Stagger().shelters(0, [6000, 0, 0, 0], [True] * 4, 5.0)
    kept_off = _stagger(keep_free=False)
    assert not kept_off.shelters(0, [6000, 0, 4000, 4000], [True] * 4, 5.0)


def _place(p: Placement, n: int, first: int, *, light: bool = False) -> Placed:
    prompt = list(range(first, first + n))
    q = QueuedRequest("r", "t", n, 16, light=light, prefix_keys=p.prefix_keys(prompt))
    req = engine_request(q, "r", prompt, SamplingOptions(), None, False)
    return p.place(req, list(q.prefix_keys), set()) or pytest.fail()


def test_the_placement_shelters_a_long_prompt_until_a_light_request_waits_beside_it() -> None:
    """Four workers: a long prompt on one, the light tenant active. While another
    worker is on short steps the long prompt is sheltered; a light request placed
    on its own worker (all others mid-prefill) ends that until it streams."""
    targets = [_target(f"w{i}") for i in range(4)]
    p = Placement(targets, clock=lambda: 5.0)
    p.stagger = _stagger()
    long = _place(p, 6000, 10_000)
    assert p.sheltered(long)  # three workers on short steps
    others = [_place(p, 6000, 20_000 + 10_000 * k) for k in range(2)]
    assert sorted(q.worker for q in [long, *others]) == [0, 1, 2]
    assert p.sheltered(long)  # w3, the last one on short steps, kept so
    targets[3].healthy = False
    assert not p.sheltered(long)  # every other healthy worker mid-prefill
    p.first_token(others[0], 6000, 0)  # one streams: on short steps again
    assert p.sheltered(long)
    light = _place(p, 40, 90_000, light=True)
    assert light.worker == others[0].worker  # where it starts soonest
    assert p.sheltered(long)
    # A light request waiting on the long prompt's worker: not sheltered.
    here = Placed(long.worker, 0, 0, 0, 0, light_waiting=True)
    p._placed[long.worker].add(here)
    assert not p.sheltered(long)
    p._prefilled(here)  # it streamed
    assert p.sheltered(long)


def test_a_light_request_another_replica_placed_there_is_heard() -> None:
    """Two replicas over the same four workers: one's light request (announced
    whatever its length) ends the other's shelter on that worker until it streams."""
    targets = {r: [_target(f"w{i}") for i in range(4)] for r in "ab"}
    now = [5.0]
    a, b = (Placement(targets[r], clock=lambda: now[0]) for r in "ab")
    for me, other in ((a, b), (b, a)):
        me.stagger = _stagger()
        me.on_prefill = lambda url, pid, n, other=other: other.learn_prefill(url, f"r:{pid}", n)
    long = _place(a, 6000, 10_000)
    now[0] += 2 * SHELTER_GRACE_S  # heard by b by now (`SHELTER_GRACE_S`)
    assert a.sheltered(long)
    elsewhere = _place(b, 40, 90_000, light=True)
    assert elsewhere.worker != long.worker  # where it starts soonest: not behind 6000
    assert a.sheltered(long)
    b.first_token(elsewhere, 40, 0)
    # As b sees it, only the long prompt's worker is healthy: its light request goes there.
    for i, t in enumerate(targets["b"]):
        t.healthy = i == long.worker
    light = _place(b, 40, 91_000, light=True)
    assert light.worker == long.worker
    assert not a.sheltered(long)
    b.first_token(light, 40, 0)  # it streams: its end is announced
    assert a.sheltered(long)


def test_with_other_replicas_a_prompt_is_sheltered_only_after_a_grace() -> None:
    """Another replica may have placed a light request on the same worker just
    before it heard of this prompt (traced live, session 28): while the replicas
    share prefills, no wide stage until `SHELTER_GRACE_S` after placing; alone,
    at once."""
    now = [5.0]
    alone = Placement([_target(f"w{i}") for i in range(4)], clock=lambda: now[0])
    shared = Placement([_target(f"w{i}") for i in range(4)], clock=lambda: now[0])
    heard: list[str] = []
    shared.on_prefill = lambda url, pid, n: heard.append(pid)
    for p in (alone, shared):
        p.stagger = _stagger()
    mine, theirs = _place(alone, 6000, 10_000), _place(shared, 6000, 10_000)
    assert heard  # announced to the other replicas
    assert alone.sheltered(mine)
    now[0] += SHELTER_GRACE_S / 2
    assert not shared.sheltered(theirs)
    now[0] += SHELTER_GRACE_S
    assert shared.sheltered(theirs)
