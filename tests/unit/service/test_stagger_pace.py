"""Pacing (`Stagger.paced_views`, FAIRGATE_SGLANG_STAGGER_PACE_TOKENS): while a light
tenant is active, a short prompt goes only where the short prefill queued stays
within the pace, else waits unsent within the hold's bound, so the light
request's prefill step is not packed with other tenants' short prompts
(docs/benchmarks.md, session 24)."""

from __future__ import annotations

import pytest

from scheduler.request import QueuedRequest
from service.engines.engine_request import engine_request
from service.engines.placement import Placement
from service.engines.protocol import EngineRequest, SamplingOptions
from service.engines.stagger import Stagger
from tests.helpers import WorkerTarget

KV = 100_000


def _target(url: str) -> WorkerTarget:
    return WorkerTarget(url, 16, KV)


def _stagger(**kw: float) -> Stagger:
    args: dict[str, float] = dict(min_tokens=1024, keep_tokens=256, hold_max_s=2.0)
    args.update(kw)
    return Stagger(pace_tokens=128, **args)  # type: ignore[arg-type]


def _placement(now: list[float], n: int = 2, **kw: float) -> Placement:
    p = Placement([_target(f"w{i}") for i in range(n)], clock=lambda: now[0], kv_tokens=[KV] * n)
    p.stagger = _stagger(**kw)
    return p


def _request(p: Placement, prompt: list[int], *, light: bool = False) -> EngineRequest:
    q = QueuedRequest("r", "t", len(prompt), 16, light=light, prefix_keys=p.prefix_keys(prompt))
    return engine_request(q, "r", prompt, SamplingOptions(), None, False)


def _prompt(n: int, first: int = 1) -> list[int]:
    return list(range(first, first + n))


def _light_seen(p: Placement) -> None:
    p.released(p.place(_request(p, _prompt(40), light=True), [], set()) or pytest.fail())


def test_who_is_paced() -> None:
    st = _stagger(light_seen_s=0.0)
    assert st.pacing(100, light=False, now_s=1.0)
    assert not st.pacing(100, light=True, now_s=1.0)  # the light request itself
    assert not st.pacing(256, light=False, now_s=1.0)  # no short prompt (keep_tokens)
    assert not st.pacing(100, light=False, now_s=11.0)  # the light tenant went quiet
    assert not _stagger(light_seen_s=0.0, hold_max_s=0.0).pacing(100, False, 1.0)  # no bound
    off = Stagger(min_tokens=1024, keep_tokens=256, hold_max_s=2.0, light_seen_s=0.0)
    assert not off.pacing(100, light=False, now_s=1.0)  # pace_tokens 0


@pytest.mark.parametrize(
    ("queued", "uncached", "room"),
    [
        (0, 200, True),  # nothing queued: one prompt goes whatever its size below keep
        (0, 300, False),  # cold there (keep_tokens): never sent cold to pace it
        (28, 100, True),  # within the pace with it
        (100, 100, False),  # over it
    ],
)
def test_pace_room(queued: int, uncached: int, room: bool) -> None:
    assert _stagger().pace_room(queued, uncached) is room


def test_short_prompts_spread_within_the_pace_then_wait_for_a_prefill_to_end() -> None:
    now = [0.0]
    p = _placement(now)
    _light_seen(p)
    first = p.place(_request(p, _prompt(100, 1000)), [], set())
    assert first is not None
    second = p.place(_request(p, _prompt(100, 2000)), [], set())
    # 100 + 100 would pass the pace on the first worker: the other one takes it.
    assert second is not None and {first.worker, second.worker} == {0, 1}
    assert [p.queued_short(i) for i in range(2)] == [100, 100]
    third = _request(p, _prompt(100, 3000))
    assert p.hold_until(third, [], 0.0, True) == 2.0  # every worker at the pace: held
    assert p.stagger.paced == 1
    assert p.hold_until(third, [], 0.0, False) == 2.0 and p.stagger.paced == 1
    # The light tenant's own request is never paced, and goes at once.
    assert p.hold_until(_request(p, _prompt(40), light=True), [], 0.0, True) is None
    p.first_token(first, 100, 0)  # its prefill streamed: that worker has room again
    assert p.hold_until(third, [], 0.0, False) is None
    placed = p.place(third, [], set())
    assert placed is not None and placed.worker == first.worker
    assert p.stagger.paced_to_bound == 0


def test_the_holds_bound_lets_a_paced_prompt_go() -> None:
    now = [0.0]
    p = _placement(now)
    _light_seen(p)
    assert p.place(_request(p, _prompt(100, 1000)), [], set()) is not None
    assert p.place(_request(p, _prompt(100, 1500)), [], set()) is not None
    waiting = _request(p, _prompt(100, 2000))
    assert p.hold_until(waiting, [], 0.0, True) == 2.0
    now[0] = 2.0
    assert p.hold_until(waiting, [], 0.0, False) is None
    assert (p.stagger.paced, p.stagger.paced_to_bound) == (1, 1)
    assert p.place(waiting, [], set()) is not None  # placed beyond the pace


def test_a_prompt_short_only_where_its_prefix_is_cached_waits_for_that_worker() -> None:
    now = [0.0]
    p = _placement(now)
    _light_seen(p)
    doc = _prompt(960, 5000)  # a shared document, cached on worker 0 only
    p.index.insert(0, p.prefix_keys(doc))
    busy = p.place(_request(p, _prompt(100, 1000)), [], set())
    assert busy is not None and busy.worker == 0  # the least prefill ahead
    turn = doc + _prompt(80, 9000)  # 80 new tokens on worker 0, 1 040 on worker 1
    keys = p.prefix_keys(turn)
    req = _request(p, turn)
    assert p.hold_until(req, keys, 0.0, True) == 2.0  # not sent cold to worker 1
    p.first_token(busy, 100, 0)
    assert p.hold_until(req, keys, 0.0, False) is None
    placed = p.place(req, keys, set())
    assert placed is not None and placed.worker == 0 and placed.matched >= 960


def test_nothing_is_paced_without_an_active_light_tenant() -> None:
    now = [0.0]
    p = _placement(now, n=1)
    assert p.place(_request(p, _prompt(100, 1000)), [], set()) is not None
    assert p.hold_until(_request(p, _prompt(100, 2000)), [], 0.0, True) is None
    assert p.stagger.paced == 0


def test_a_pool_of_one_paces_nothing() -> None:
    """Nowhere else to go: a paced prompt would only hold its admission slot while
    the engine orders the light request first anyway (session 25)."""
    now = [0.0]
    p = _placement(now, n=1)
    _light_seen(p)
    assert p.place(_request(p, _prompt(100, 1000)), [], set()) is not None
    assert p.queued_short(0) == 100
    assert p.hold_until(_request(p, _prompt(100, 2000)), [], 0.0, True) is None
    assert p.place(_request(p, _prompt(100, 2000)), [], set()) is not None
    assert p.stagger.paced == 0
