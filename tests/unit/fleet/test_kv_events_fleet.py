"""Lever 3 of issue #33 on the virtual fleet: each simulated engine's KV events
(`kv_feed.py`: the simulator's publisher framing, the live follower applying)
give the placement the engine's cache exactly, where the approximate prefix
index guesses. Constructed case: a long decode makes the engine evict a cached
document the index, which counts prompts and not the KV a decode grows into,
still holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fairgate.bench.event_driver import Arrival, Driver
from fairgate.bench.stagger import fleet, prefix_heavy_mix

from scheduler.budget import AdmissionLimits
from scheduler.ordering.policies import make_policy
from service.engines.simulator.core import SimConfig
from service.engines.simulator.hardware import preset
from service.engines.simulator.radix import RadixCache, common_prefix_len

KV_TOKENS = 4096
DOC = tuple(range(1000, 2024))  # 1024 tokens


def cached(tree: RadixCache, ids: tuple[int, ...]) -> int:
    """Whole 16-token blocks of `ids` the engine's tree holds (read without
    touching it: `match_prefix` splits nodes and counts an access)."""
    node, n = tree.root, 0
    while n < len(ids):
        child = node.children.get(ids[n])
        if child is None:
            break
        k = common_prefix_len(child.key, ids, n)
        n += k
        if k < len(child.key):
            break
        node = child
    return n // 16 * 16


def _evicting(kv_events: bool) -> Driver:
    """A (the document) is cached; B's decode grows until the engine evicts A;
    C asks for the document again once B has left."""
    a = Arrival(0.0, "t", 1088, 16, prompt_ids=(*DOC, *range(3000, 3064)))
    # Ends (as a failure: the index never hears its output) after 1200 tokens:
    # 2000 + 1200 of KV beside A's 1103 cached is over the engine's 4096.
    b = Arrival(1.0, "t", 2000, 1500, fail_after_tokens=1200, prompt_ids=tuple(range(5000, 7000)))
    c = Arrival(30.0, "t", 1088, 16, prompt_ids=(*DOC, *range(8000, 8064)))
    sim = SimConfig(cost=preset(), max_running_requests=16, kv_capacity_tokens=KV_TOKENS)
    drv = Driver(
        make_policy("vtc"),
        AdmissionLimits(max_requests=16, max_kv_tokens=KV_TOKENS),
        sim,
        routing="locality",
        kv_events=kv_events,
    )
    drv.run([a, b, c])
    return drv


def test_the_exact_view_follows_an_eviction_the_index_misses() -> None:
    drv = _evicting(kv_events=True)
    a, b, c = drv.calls
    tree, placement = drv.core.kv.tree, drv.placement
    assert placement is not None and all(x.state == "done" for x in drv.calls)
    assert b.output_tokens == 1200
    # Where C was placed, the placement counted what the engine then held: nothing
    # of the document (evicted), so no cached charge to claw back.
    assert c.placed is not None and c.placed.matched == c.cached_tokens == 0
    assert placement.overestimated == 0
    # And now, after every eviction: what the placement counts is the tree's.
    for call in drv.calls:
        keys = placement.prefix_keys(call.prompt_ids)
        assert placement.held(0, keys) == cached(tree, tuple(call.prompt_ids))
    # A's own tail is gone (evicted); the document is back (C computed it again).
    assert cached(tree, tuple(a.prompt_ids)) == len(DOC) < cached(tree, tuple(c.prompt_ids))


def test_without_events_the_index_still_counts_the_evicted_document() -> None:
    """The case above is one the index gets wrong (else it would test nothing)."""
    drv = _evicting(kv_events=False)
    c = drv.calls[2]
    assert drv.placement is not None and drv.placement.exact == [None]
    assert c.placed is not None and c.placed.matched >= len(DOC) and c.cached_tokens == 0
    assert drv.placement.overestimated == 1


def test_the_view_matches_every_engine_on_the_prefix_mix() -> None:
    """Two engines, the prefix-heavy mix: at the end the placement's count of every
    prompt on every engine is that engine's tree. On the way, a prompt sharing a
    prefix with one in flight on its worker counts that prefix held, with the view
    as with the index (the engine reports a prompt only once computed): the first
    tokens that found less cached than counted are those, as many either way
    (18 of 308 here; the view tracks evictions, which this mix does not have)."""
    drv = fleet(prefix_heavy_mix(1, 10.0, 2), 2, None, kv_events=True)
    p = drv.placement
    index = fleet(prefix_heavy_mix(1, 10.0, 2), 2, None, kv_events=False).placement
    assert p is not None and index is not None
    assert p.overestimated == index.overestimated
    prompts = {tuple(c.prompt_ids) for c in drv.calls}
    for i, w in enumerate(drv.workers):
        for ids in prompts:
            assert p.held(i, p.prefix_keys(ids)) == cached(w.core.kv.tree, ids)
    assert all(v is not None and not v.stale for v in p.exact)


def _bench(hash_seed: str, out: Path) -> object:
    args = ["--engines", "2", "--seeds", "1", "--mixes", "prefix", "--seconds", "6"]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    cmd = [sys.executable, "-m", "fairgate.cli.main", "bench", "stagger", *args]
    cmd += ["--levers", "none,kv", "--json", str(out)]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)
    return json.loads(out.read_text())


@pytest.mark.timeout(600)
def test_the_bench_repeats_exactly_for_a_seed(tmp_path: Path) -> None:
    """Two processes (string hashing seeded apart) write the same table."""
    first = _bench("1", tmp_path / "a.json")
    assert first == _bench("2", tmp_path / "b.json")
    assert isinstance(first, dict) and [r["levers"] for r in first["runs"]] == ["none", "kv"]
