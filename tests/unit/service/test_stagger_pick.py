"""With other replicas placing on the same workers, a long prompt leaves the idle
worker a light request would go to now (`Stagger.kept`'s `pick`): traced live on
two replicas, replica A sent a light request to the least loaded idle worker and,
before A's announcement arrived, replica B sent a cold long prompt to the same
one, which the rule alone picks too (docs/benchmarks.md, session 29)."""

from __future__ import annotations

from scheduler.request import QueuedRequest
from service.engines.engine_request import engine_request
from service.engines.placement import Placement
from service.engines.protocol import EngineRequest, SamplingOptions
from service.engines.stagger import Stagger
from tests.helpers import WorkerTarget

SLOTS, KV = 8, 100_000


def _target(url: str) -> WorkerTarget:
    return WorkerTarget(url, SLOTS, KV)


def _request(prompt: list[int], *, light: bool) -> EngineRequest:
    q = QueuedRequest("r", "t", len(prompt), 16, light=light)
    return engine_request(q, "r", prompt, SamplingOptions(), None, False)


LONG = list(range(1, 3001))


def _replica(replicas: bool) -> Placement:
    """Replica B of four workers: w0 mid-prefill, w1 and w3 busier than w2 (each
    decoding a request), the light tenant active; told of other replicas' prefills
    when `replicas`."""
    p = Placement([_target(f"w{i}") for i in range(4)], clock=lambda: 5.0, routing="locality")
    p.stagger = Stagger(min_tokens=1024, keep_tokens=256, light_seen_s=4.0)
    if replicas:
        p.on_prefill = lambda url, pid, n: None
    p.pending_prefill[0] = 5000
    for i in (0, 1, 3):
        p.in_flight[i] = 1
    return p


def test_a_long_prompt_leaves_the_light_requests_worker_with_other_replicas() -> None:
    alone = _replica(replicas=False)
    light = alone.place(_request(list(range(5000, 5060)), light=True), [], set())
    assert light is not None and light.worker == 2  # idle, least loaded: the pick
    # Alone, a long prompt placed first would go there too: its view is exact, and
    # a light request placed after it sees its prefill.
    first = _replica(replicas=False).place(_request(LONG, light=False), [], set())
    assert first is not None and first.worker == 2
    # With other replicas, one of theirs may be on its way to w2 unannounced.
    b = _replica(replicas=True)
    long_b = b.place(_request(LONG, light=False), [], set())
    assert long_b is not None and long_b.worker in (1, 3) and b.stagger.kept_free == 1
    # Below the worker kept on short steps' mark it may take the pick.
    short = _replica(replicas=True).place(_request(LONG[:200], light=False), [], set())
    assert short is not None and short.worker == 2


def test_the_pick_is_left_only_where_the_prompt_loses_no_cached_prefix() -> None:
    b = _replica(replicas=True)
    keys = b.prefix_keys(LONG)
    b.index.insert(2, keys[:64])  # 1 024 of its tokens held on the pick only
    placed = b.place(_request(LONG, light=False), keys, set())
    assert placed is not None and placed.worker == 2 and b.stagger.kept_free == 0
    # Held as deep on w3 as well: it goes there, the pick left free.
    b = _replica(replicas=True)
    b.index.insert(2, keys[:64])
    b.index.insert(3, keys[:64])
    placed = b.place(_request(LONG, light=False), keys, set())
    assert placed is not None and placed.worker == 3 and b.stagger.kept_free == 1


def test_with_one_worker_on_short_steps_the_rule_is_the_last_free_ones() -> None:
    b = _replica(replicas=True)
    b.pending_prefill[1] = b.pending_prefill[3] = 5000
    placed = b.place(_request(LONG, light=False), [], set())
    assert placed is not None and placed.worker != 2 and b.stagger.kept_free == 1
