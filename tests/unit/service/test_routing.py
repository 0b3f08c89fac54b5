"""The pool's routing rule and its approximate prefix index, without I/O."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from service.engines.prefix_index import PrefixIndex, chain
from service.engines.routing import BALANCE_TOKENS, WorkerView, route

B = 16


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_a_shared_prefix_matches_to_the_last_whole_block() -> None:
    index = PrefixIndex([10_000, 10_000])
    system = ids(100)
    index.insert(0, index.chain([*system, *ids(40, 1000)]))
    # Another question after the same system prompt: 100 shared tokens, 6 whole blocks.
    asked = index.chain([*system, *ids(30, 5000)])
    assert index.match(0, asked) == 96
    assert index.match(1, asked) == 0
    # A prompt that differs in its first token shares nothing (keys are whole prefixes).
    assert index.match(0, index.chain([999, *system[1:]])) == 0


def test_the_same_block_after_a_different_prefix_is_not_a_match() -> None:
    a, b = ids(B, 0), ids(B, 100)
    index = PrefixIndex([10_000])
    index.insert(0, index.chain([*a, *b]))
    assert index.match(0, index.chain([*b, *b])) == 0
    assert chain([*a, *b])[1] != chain([*b, *b])[1]


def test_eviction_drops_leaves_before_their_parents_and_least_recent_first() -> None:
    index = PrefixIndex([4 * B])  # four blocks
    old = ids(3 * B)
    index.insert(0, index.chain(old))
    new = ids(2 * B, 500)
    index.insert(0, index.chain(new))  # one block over: the old prompt's leaf goes
    assert index.match(0, index.chain(old)) == 2 * B
    assert index.match(0, index.chain(new)) == 2 * B
    assert index.size(0) == 4 * B


def test_a_worker_that_held_less_than_thought_is_shrunk_least_recent_first() -> None:
    index = PrefixIndex([100 * B])
    first, second = ids(4 * B), ids(4 * B, 900)
    index.insert(0, index.chain(first))
    index.insert(0, index.chain(second))
    index.shrink(0, 2 * B + 1)  # rounds up to whole blocks: three go
    # The least recently used blocks were the first prompt's: its three leaves
    # (leaves are touched before their parents), its root block stays; the recent
    # prompt is intact.
    assert index.match(0, index.chain(first)) == B
    assert index.match(0, index.chain(second)) == 4 * B
    assert index.size(0) == 5 * B
    index.clear(0)
    assert index.size(0) == 0


def test_locality_goes_where_the_prefix_is() -> None:
    workers = [WorkerView(0.1, 0, 0), WorkerView(0.1, 0, 900)]
    assert route(workers, 1000, "locality") == 1
    assert route(workers, 1000, "least_full") == 0  # tie on load: the first


def test_locality_skips_a_worker_busy_prefilling_for_a_short_request() -> None:
    # Worker 0 is in the middle of a 6 000-token prefill; worker 1 has more
    # requests (decoding) but nothing to prefill: the short request starts there.
    workers = [WorkerView(0.2, 6000, 0), WorkerView(0.5, 0, 0)]
    assert route(workers, 50, "locality") == 1
    assert route(workers, 50, "least_full") == 0


def test_locality_balances_load_against_a_cached_prefix() -> None:
    # A short cached prefix is worth less than a nearly full worker's load
    # (BALANCE_TOKENS per full load), more than a lightly loaded one's.
    idle = WorkerView(0.0, 0, 0)
    short = BALANCE_TOKENS // 2
    assert route([WorkerView(0.95, 0, short), idle], 1100, "locality") == 1
    assert route([WorkerView(0.3, 0, short), idle], 1100, "locality") == 0
    # A long one wins even on a nearly full worker (it still has room).
    assert route([WorkerView(0.95, 0, 1000), idle], 1100, "locality") == 0


def test_only_workers_with_room_while_any_has_room() -> None:
    full = WorkerView(1.2, 0, 4000)
    assert route([full, WorkerView(0.9, 3000, 0)], 4000, "locality") == 1
    # None has room: the cheapest still (the engine queues it).
    assert route([full, WorkerView(1.5, 0, 0)], 4000, "locality") == 0


def test_least_full_prefers_the_affinity_worker_within_its_slack() -> None:
    workers = [WorkerView(0.2), WorkerView(0.3)]
    assert route(workers, 10, "least_full", preferred=1, slack=0.1) == 1
    assert route(workers, 10, "least_full", preferred=1, slack=0.05) == 0


views = st.builds(
    WorkerView,
    st.floats(0, 2),
    st.integers(0, 20_000),
    st.integers(0, 8_000),
)


@given(st.lists(views, min_size=1, max_size=6), st.integers(1, 8_000))
def test_locality_picks_the_least_cost_worker_with_room(
    workers: list[WorkerView], prompt: int
) -> None:
    """The stated rule, checked against every worker: no worker with room would
    have started the request sooner (prefill ahead + own uncached + balance)."""
    chosen = route(workers, prompt, "locality")
    room = [w for w in workers if w.load <= 1.0] or workers
    assert workers[chosen] in room

    def cost(w: WorkerView) -> float:
        return w.pending_prefill + max(0, prompt - w.matched) + BALANCE_TOKENS * w.load

    assert all(cost(workers[chosen]) <= cost(w) for w in room)


def test_a_light_tenants_request_goes_where_it_starts_soonest_whatever_the_load() -> None:
    # Worker 0 is nearly empty but prefilling; worker 1 is busier, only decoding.
    workers = [WorkerView(0.1, 300, 0), WorkerView(0.8, 0, 0)]
    assert route(workers, 20, "locality") == 0  # the balance term: 300 < 512 x 0.7
    assert route(workers, 20, "locality", soonest=True) == 1


def test_a_light_request_the_engine_preempts_for_takes_a_full_worker_that_is_not_prefilling() -> (
    None
):
    # Worker 0 has a free slot but 900 prefill tokens queued; worker 1 is full and
    # only decoding. A light request that waits for a slot goes to worker 0; one
    # its engine retracts a running request for goes to worker 1 (it starts at the
    # next step there, not after the 900 tokens).
    workers = [WorkerView(0.9, 900, 0), WorkerView(1.05, 0, 0)]
    assert route(workers, 60, "locality", soonest=True) == 0
    assert route(workers, 60, "locality", soonest=True, preempts=True) == 1
    # A heavy request never counts a full worker as room, preempting or not.
    assert route(workers, 60, "locality", preempts=True) == 0
