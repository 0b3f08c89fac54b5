"""The simulator's prefix cache, as SGLang 0.5.23 behaves (tests/sglang checks the
same cases against the real server): matches stop one token short of the prompt,
prompt + output less its last token is cached at the finish, the prompt as soon as
its prefill ends, locked prefixes survive a flood, the rest is evicted LRU."""

from __future__ import annotations

import random

from service.engines.protocol import SamplingOptions
from service.engines.simulator.core import SimConfig, SimCore, SimRequest
from service.engines.simulator.hardware import preset

GREEDY = SamplingOptions(temperature=0.0, ignore_eos=True)
_rng = random.Random(5)


def _ids(n: int) -> list[int]:
    return [_rng.randrange(256, 32000) for _ in range(n)]


def _core(**kw: object) -> SimCore:
    return SimCore(SimConfig(cost=preset(), **kw))  # type: ignore[arg-type]


def _serve(core: SimCore, prompt: list[int], max_new: int = 4, rid: str = "") -> SimRequest:
    """Run one request to its end; returns it (cached_tokens, output_ids)."""
    req = core.make_request(rid or f"r{_rng.random()}", prompt, max_new, GREEDY)
    core.add(req)
    while not core.idle:
        core.step()
    return req


def test_same_prompt_twice_caches_all_but_the_last_token() -> None:
    core = _core()
    prompt = _ids(200)
    assert _serve(core, prompt).cached_tokens == 0
    again = core.make_request("again", prompt, 4, GREEDY)
    core.add(again)
    first = core.step()
    assert again.cached_tokens == 199 and first.prefill_tokens == 1
    assert _serve(core, [42]).cached_tokens == 0  # a one-token prompt never matches
    assert _serve(core, [42]).cached_tokens == 0


def test_shared_prefix_and_strict_prefix() -> None:
    core = _core()
    a = _ids(200)
    _serve(core, a)
    assert _serve(core, a[:150] + _ids(50)).cached_tokens == 150
    assert _serve(core, a[:100]).cached_tokens == 99
    assert _serve(core, a + _ids(20)).cached_tokens == 200


def test_finish_caches_prompt_and_output_but_the_last_token() -> None:
    core = _core()
    prompt = _ids(100)
    out = _serve(core, prompt, max_new=10).output_ids
    assert _serve(core, prompt + out + _ids(5)).cached_tokens == 109


def test_prefill_cost_counts_only_uncached_tokens() -> None:
    core = _core(chunked_prefill_size=8192)
    prompt = _ids(4000)
    cold = core.make_request("cold", prompt, 1, GREEDY)
    core.add(cold)
    cold_s = core.step().duration_s
    warm = core.make_request("warm", prompt, 1, GREEDY)
    core.add(warm)
    warm_step = core.step()
    assert warm_step.prefill_tokens == 1 and warm_step.duration_s < cold_s / 5


def test_a_running_request_shares_its_prompt_and_keeps_it_through_a_flood() -> None:
    core = _core(kv_capacity_tokens=4096)
    prompt = _ids(1000)
    long = core.make_request("long", prompt, 3000, GREEDY)
    core.add(long)
    while long.generated == 0:
        core.step()
    # Distinct prompts worth 3x the KV capacity pass while `long` decodes.
    for i in range(12):
        _serve_beside(core, _ids(1000), f"flood{i}")
    assert long.generated < 3000 and long.preemptions == 0
    twin = core.make_request("twin", prompt, 4, GREEDY)
    core.add(twin)
    core.step()
    assert twin.cached_tokens == 999  # locked by `long`: never evicted
    assert core.kv.tree.total_size <= core.capacity


def _serve_beside(core: SimCore, prompt: list[int], rid: str) -> None:
    req = core.make_request(rid, prompt, 2, GREEDY)
    core.add(req)
    while req.node is not None or req.generated < 2:
        core.step()


def test_an_evicting_flood_drops_unreferenced_prefixes() -> None:
    core = _core(kv_capacity_tokens=16384)
    e = _ids(1000)
    _serve(core, e)
    assert _serve(core, e).cached_tokens == 999
    for _ in range(24):  # 24 x ~1000 tokens > 16384: the flood evicts e (LRU)
        _serve(core, _ids(1000), max_new=2)
    assert core.used_kv == 0 and 0 < core.kv.tree.evictable_size <= 16384
    assert _serve(core, e).cached_tokens == 0


def test_cache_off_matches_nothing() -> None:
    core = _core(prefix_cache=False)
    prompt = _ids(100)
    _serve(core, prompt)
    assert _serve(core, prompt).cached_tokens == 0
    assert core.kv.tree.total_size == 0


def test_retraction_keeps_the_first_cached_count_and_frees_its_kv() -> None:
    core = _core(kv_capacity_tokens=3000, new_token_ratio=0.0)
    shared = _ids(500)
    _serve(core, shared + _ids(10))
    reqs = [core.make_request(f"r{i}", shared + _ids(100), 1500, GREEDY) for i in range(3)]
    for r in reqs:
        core.add(r)
    while not core.idle:
        core.step()
    assert core.preemptions > 0
    assert [r.cached_tokens for r in reqs] == [500, 500, 500]
    assert core.used_kv == 0 and core.kv.private == 0


def test_kv_accounting_holds_under_mixed_shared_traffic() -> None:
    rng = random.Random(11)
    core = _core(kv_capacity_tokens=6000, chunked_prefill_size=512)
    systems = [_ids(rng.randrange(50, 800)) for _ in range(4)]
    for i in range(300):
        if rng.random() < 0.3:
            prompt = _ids(rng.randrange(1, 1500))
        else:
            prompt = rng.choice(systems) + _ids(rng.randrange(0, 400))
        core.add(core.make_request(f"r{i}", prompt, rng.randrange(1, 300), GREEDY))
        for _ in range(rng.randrange(0, 4)):
            core.step()
            kv = core.kv
            assert kv.private >= 0 and kv.private + kv.tree.total_size <= core.capacity
            assert core.used_kv == kv.private + kv.tree.protected_size
        if rng.random() < 0.05 and core.running:
            core.abort(rng.choice(core.running).rid)
    while not core.idle:
        core.step()
    assert core.used_kv == 0 and core.kv.tree.protected_size == 0
