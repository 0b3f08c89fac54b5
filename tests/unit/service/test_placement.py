"""The one placement (service/engines/placement.py), without I/O: admission's
locality choice carried to routing, its mismatches counted, the per-worker KV
accounting and the request's lifecycle."""

from __future__ import annotations

import pytest

from scheduler import rules
from scheduler.request import Priority, QueuedRequest
from service.engines.engine_request import engine_request
from service.engines.kv_view import CacheView
from service.engines.placement import Placement
from service.engines.protocol import EngineRequest, SamplingOptions
from service.engines.stagger import Stagger
from tests.helpers import WorkerTarget

SLOTS, KV = 4, 10_000


def _target(url: str) -> WorkerTarget:
    return WorkerTarget(url, SLOTS, KV)


def _placement(n: int = 2) -> tuple[Placement, list[WorkerTarget]]:
    targets = [_target(f"w{i}") for i in range(n)]
    return Placement(targets, clock=lambda: 0.0, kv_tokens=[KV] * n), targets


PROMPT = list(range(1, 321))  # 20 blocks


def _admitted(p: Placement, prompt: list[int] = PROMPT, max_tokens: int = 16) -> EngineRequest:
    """A request as admission leaves it: the placement's estimate asked, then built
    for the engine as generation.py builds it."""
    q = QueuedRequest("r", "t", len(prompt), max_tokens, prefix_keys=p.prefix_keys(prompt))
    q.cached_estimate = p.cached_prefix(q)
    return engine_request(q, "r", prompt, SamplingOptions(), None, False)


def _assert_charged_exactly(prompt_tokens: int, charged_cached: int, reported: int) -> None:
    """Admission's charge on `charged_cached` plus the shortfall the engine's report
    charges at the first token is the charge on what the engine had cached."""
    w_in, w_cached = 1.0, 0.1
    admitted = rules.admission_charge(w_in, prompt_tokens, 1.0, charged_cached, w_cached)
    short = rules.cached_shortfall(w_in, w_cached, charged_cached, reported, 1.0)
    exact = rules.admission_charge(w_in, prompt_tokens, 1.0, reported, w_cached)
    assert admitted + short == pytest.approx(exact)


def test_admissions_worker_is_used_where_the_rule_alone_would_go_elsewhere() -> None:
    p, _ = _placement()
    p.index.insert(1, p.prefix_keys(PROMPT))
    req = _admitted(p)
    assert req.cached_on == 1
    # Since admission looked, a long prefill was routed to worker 1: the rule alone
    # now prefers worker 0.
    p.pending_prefill[1] += 5_000
    placed = p.place(req, list(req.prefix_keys), set())
    assert placed is not None and placed.worker == 1 and placed.matched == len(PROMPT)
    s = p.locality
    assert (s.hinted, s.followed, s.overrode, s.mismatched) == (1, 1, 1, 0)
    # Without admission's choice the same request goes to worker 0.
    req.cached_on = None
    other = p.place(req, list(req.prefix_keys), set())
    assert other is not None and other.worker == 0


def test_a_light_request_goes_where_it_starts_soonest_not_to_admissions_worker() -> None:
    """Admission counted the light request's prefix cached on worker 1; a long
    prefill went there since: the light request starts sooner on worker 0, where
    it goes (its prefix charged back at its first token, as any mismatch)."""
    p, _ = _placement()
    p.index.insert(1, p.prefix_keys(PROMPT))
    q = QueuedRequest("r", "t", len(PROMPT), 16, light=True, prefix_keys=p.prefix_keys(PROMPT))
    q.cached_estimate = p.cached_prefix(q)
    req = engine_request(q, "r", PROMPT, SamplingOptions(), None, False)
    assert req.cached_on == 1 and req.light
    p.pending_prefill[1] += 5_000
    placed = p.place(req, list(req.prefix_keys), set())
    assert placed is not None and placed.worker == 0
    s = p.locality
    assert (s.hinted, s.followed, s.sooner, s.mismatched) == (1, 0, 1, 0)
    assert s.missed_tokens == len(PROMPT)
    # Where the hint is also where it starts soonest, it goes there.
    p.pending_prefill[1] -= 5_000
    again = p.place(req, list(req.prefix_keys), set())
    assert again is not None and again.worker == 1 and s.followed == 1


@pytest.mark.parametrize("why", ["unhealthy", "full", "tried"])
def test_a_mismatch_is_counted_with_the_cached_tokens_it_cost(why: str) -> None:
    p, targets = _placement()
    p.index.insert(1, p.prefix_keys(PROMPT))
    req = _admitted(p)
    assert req.cached_on == 1
    tried: set[int] = set()
    if why == "unhealthy":
        targets[1].healthy = False
    elif why == "full":
        p.in_flight[1] = SLOTS
    else:
        tried.add(1)  # failed over from it
    placed = p.place(req, list(req.prefix_keys), tried)
    assert placed is not None and placed.worker == 0 and placed.matched == 0
    s = p.locality
    assert (s.hinted, s.followed, s.mismatched) == (1, 0, 1)
    assert (s.full, s.unavailable) == ((1, 0) if why == "full" else (0, 1))
    # What admission counted as held and the worker used does not hold: bounded by
    # the request's estimate (charged back at its first token: rules.cached_shortfall).
    assert s.missed_tokens == len(PROMPT)
    # Placed where nothing is cached, it claims its whole prompt there.
    assert placed.kv_tokens == rules.kv_tokens(len(PROMPT), req.max_tokens)


def test_nothing_cached_carries_no_worker_and_routing_is_free() -> None:
    p, _ = _placement()
    req = _admitted(p)
    assert req.cached_on is None
    placed = p.place(req, list(req.prefix_keys), set())
    assert placed is not None and p.locality.hinted == 0


def test_without_room_anywhere_the_estimate_is_the_prefix_where_the_rule_places() -> None:
    """No worker has room: the request carries no worker, and the rule places it
    where its prefix is held, so that prefix is what admission charges cached
    (an estimate of none charged it in full, and the engine's report of a hit
    refunds nothing)."""
    p, _ = _placement()
    p.index.insert(1, p.prefix_keys(PROMPT))
    p.in_flight = [SLOTS, SLOTS]  # no worker has a free slot
    q = QueuedRequest("r", "t", len(PROMPT), 16, prefix_keys=p.prefix_keys(PROMPT))
    q.cached_estimate = p.cached_prefix(q)
    # The whole prompt, less the last token the engine always computes.
    assert q.cached_estimate == len(PROMPT) - 1 and q.cached_on is None
    req = engine_request(q, "r", PROMPT, SamplingOptions(), None, False)
    placed = p.place(req, list(req.prefix_keys), set())
    assert placed is not None and placed.worker == 1 and placed.matched == len(PROMPT)
    # Held nowhere, nothing is estimated.
    q2 = QueuedRequest("r2", "t", 64, 16, prefix_keys=p.prefix_keys(list(range(500, 564))))
    assert p.cached_prefix(q2) == 0 and q2.cached_on is None


def test_the_estimate_errs_high_by_the_block_the_index_cannot_see() -> None:
    """The index matches whole blocks; the engine reports a hit to the token, up to
    a block more. The estimate counts that block as held, so the engine's report
    charges the exact shortfall (counters only grow: erring low was never
    refunded)."""
    p, _ = _placement()
    shared = PROMPT[:300]  # 18 whole blocks and 12 tokens of the 19th
    p.index.insert(1, p.prefix_keys(shared))
    prompt = shared + list(range(1000, 1040))
    q = QueuedRequest("r", "t", len(prompt), 16, prefix_keys=p.prefix_keys(prompt))
    block = p.index.block
    estimate = p.cached_prefix(q)
    assert estimate == 18 * block + block - 1 and q.cached_on == 1
    # What the engine reports (300 held) is at most the estimate: admission's
    # charge plus the shortfall charged at the first token is the exact charge.
    _assert_charged_exactly(len(prompt), estimate, 300)


@pytest.mark.parametrize("reported", [0, len(PROMPT) - 1])
def test_with_the_hold_a_prefix_held_off_the_rules_worker_is_charged_cached(
    reported: int,
) -> None:
    """The rule's worker holds none of the prompt (a long prefill ahead there
    outweighs the prefix held elsewhere): its KV and locality's preference count
    nothing cached. With the cold-start hold the prompt may wait and then go
    where its prefix is, and a better hit than charged is never refunded
    (counters only grow), so the charge counts the prefix another worker holds.
    Placed cold, the engine's report charges the rest: either way admission plus
    the shortfall is the exact charge. Without the hold the rule places it at
    once, and the rule's worker's prefix (none) is the charge."""
    p = _hold_placement([0.0])
    p.index.insert(1, p.prefix_keys(PROMPT))
    p.pending_prefill[1] += 50_000
    q = QueuedRequest("r", "t", len(PROMPT), 16, prefix_keys=p.prefix_keys(PROMPT))
    q.cached_estimate = p.cached_prefix(q)
    assert (q.cached_estimate, q.cached_on) == (0, None)
    assert q.kv_tokens == rules.kv_tokens(len(PROMPT), 16)
    assert q.held_anywhere == q.charged_cached == len(PROMPT) - 1
    _assert_charged_exactly(len(PROMPT), q.charged_cached, reported)
    # Held nowhere: nothing is charged cached.
    q2 = QueuedRequest("r2", "t", 64, 16, prefix_keys=p.prefix_keys(list(range(500, 564))))
    assert p.cached_prefix(q2) == 0 and q2.charged_cached == 0
    # No hold: the rule's worker's.
    p.stagger = Stagger()
    assert p.cached_prefix(q) == 0 and q.charged_cached == 0


def test_a_whole_prompt_reported_a_token_short_is_not_an_eviction() -> None:
    """An engine computes at least a prompt's last token, so a block-aligned prompt
    held whole comes back one token short of the index's match. Taken for an
    eviction, each repeat forgot another prompt's block (session 33)."""
    p, _ = _placement()
    other = list(range(1000, 1032))
    p.index.insert(0, p.prefix_keys(other))
    p.index.insert(0, p.prefix_keys(PROMPT))
    req = _admitted(p)
    placed = p.place(req, list(req.prefix_keys), set())
    assert placed is not None and placed.worker == 0 and placed.matched == len(PROMPT)
    p.first_token(placed, len(PROMPT), cached=len(PROMPT) - 1)
    assert p.overestimated == 0
    assert p.index.match(0, p.prefix_keys(other)) == len(other)
    # One token fewer is an eviction: the least recently used block goes.
    req = _admitted(p)
    placed = p.place(req, list(req.prefix_keys), set())
    assert placed is not None and placed.worker == 0
    p.first_token(placed, len(PROMPT), cached=len(PROMPT) - 2)
    assert p.overestimated == 1
    assert p.index.match(0, p.prefix_keys(other)) < len(other)


def test_a_miss_of_a_prefix_still_being_computed_is_not_an_eviction() -> None:
    """Two requests for one prompt placed together: the second is matched against
    the first's prefix, which the engine computes only with the first, so the
    second may find none of it cached. That is no eviction: the worker's other
    prefixes stay in the index (they were forgotten, then estimated cold)."""
    p, _ = _placement(1)
    other = list(range(1000, 1032))
    p.index.insert(0, p.prefix_keys(other))
    first = _admitted(p)
    a = p.place(first, list(first.prefix_keys), set())
    assert a is not None and a.matched == 0 and a.matched_computing == 0
    second = _admitted(p)
    b = p.place(second, list(second.prefix_keys), set())
    assert b is not None and b.worker == a.worker and b.matched == len(PROMPT)
    assert b.matched_computing == len(PROMPT)
    p.first_token(a, len(PROMPT), cached=0)
    p.first_token(b, len(PROMPT), cached=0)  # computed beside the first, not after it
    assert p.overestimated == 1
    assert p.index.match(a.worker, p.prefix_keys(other)) == len(other)
    # Placed once the prompt is computed, a miss is an eviction.
    third = _admitted(p)
    c = p.place(third, list(third.prefix_keys), set())
    assert c is not None and c.worker == a.worker and c.matched_computing == 0
    p.first_token(c, len(PROMPT), cached=0)
    assert p.overestimated == 2
    assert p.index.match(a.worker, p.prefix_keys(other)) < len(other)


def test_the_claim_is_counted_where_it_is_placed_and_freed_once() -> None:
    p, _ = _placement()
    p.index.insert(0, p.prefix_keys(PROMPT[:160]))  # half the prompt held by worker 0
    req = _admitted(p)
    placed = p.place(req, list(req.prefix_keys), set())
    assert placed is not None and placed.worker == 0 and placed.matched == 160
    uncached = len(PROMPT) - 160
    assert p.in_flight == [1, 0]
    # Only cached (evictable) there, the held half takes KV once the request pins it.
    assert p.kv_in_flight == [rules.kv_tokens(len(PROMPT), 16), 0]
    assert p.pending_prefill == [uncached, 0]
    assert p.index.size(0) == len(PROMPT)  # its prompt is there once prefilled
    p.first_token(placed, len(PROMPT), cached=96)  # it held less than the index thought
    assert p.pending_prefill == [0, 0] and p.index.size(0) == len(PROMPT) - (160 - 96)
    assert (p.cached_tokens_total, p.predicted_cached_total) == (96, 160)
    p.finished(placed, PROMPT, [7, 8, 9])
    p.released(placed)
    p.released(placed)  # a second release (the pool's finally after a failure) is a no-op
    assert p.in_flight == [0, 0] and p.kv_in_flight == [0, 0] and p.pending_prefill == [0, 0]


def test_released_before_the_first_token_returns_its_prefill() -> None:
    p, _ = _placement()
    req = _admitted(p)
    placed = p.place(req, list(req.prefix_keys), set())
    assert placed is not None and p.pending_prefill[placed.worker] == len(PROMPT)
    p.released(placed)
    assert p.pending_prefill == [0, 0] and p.in_flight == [0, 0]


@pytest.mark.parametrize("light", [False, True])
@pytest.mark.parametrize("lent", [False, True])
@pytest.mark.parametrize("preempts", [False, True])
def test_engine_request_carries_the_rules_priorities(
    light: bool, lent: bool, preempts: bool
) -> None:
    q = QueuedRequest("r", "t", 300, 16, Priority.BATCH, light=light, lent=lent)
    q.cached_on, q.cached_estimate = 1, 0
    req = engine_request(q, "r", list(range(300)), SamplingOptions(), 10, preempts)
    tiers = 300 if preempts else None
    # Lent room is the engine's to honour only for a light request (a short prompt).
    assert req.priority == rules.engine_priority(True, light, 10, lent and light, tiers)
    lend = rules.lent_slot_priority(True, light, 10 if preempts else None, tiers)
    assert req.preempt_priority == lend
    assert req.light == light
    assert req.cached_on is None  # nothing estimated cached: no worker counted on


@pytest.mark.parametrize("cached", [0, 200])
def test_a_light_tenants_long_prompt_is_no_light_request_for_the_engine(cached: int) -> None:
    """Admission calls a tenant with a short queue light; the engine is told so
    (prefilled first, lent a running request's room) only for a short uncached
    prompt: else a heavy tenant's long prompts, on a fleet with room, took the
    lent priority and the chat request, of the same rank, waited out their
    prefill steps (issue #33)."""
    n = rules.LIGHT_PREFILL_TOKENS + 100
    q = QueuedRequest("r", "t", n, 16, Priority.INTERACTIVE, light=True, lent=True)
    q.cached_estimate = cached
    req = engine_request(q, "r", list(range(n)), SamplingOptions(), 10, True)
    light = n - cached <= rules.LIGHT_PREFILL_TOKENS
    assert req.light is light
    assert req.priority == rules.engine_priority(False, light, 10, light, n)
    assert (req.preempt_priority is not None) is light
    heavy = rules.engine_priority(False, False, 10, prompt_tokens=n)
    assert (req.priority > 10) is light and (req.priority == heavy) is not light


def test_a_light_request_is_lent_a_full_workers_slot_only_where_none_is_free() -> None:
    p, _ = _placement(1)
    req = EngineRequest("r", [1, 2, 3], 4, priority=3, light=True, preempt_priority=9)
    free = p.place(req, [], set())
    assert free is not None and free.priority == 3
    p.in_flight[0] = SLOTS
    full = p.place(req, [], set())
    assert full is not None and full.priority == 9


def _request(prompt_tokens: int, *, light: bool) -> EngineRequest:
    q = QueuedRequest("r", "t", prompt_tokens, 16, light=light)
    return engine_request(q, "r", list(range(1, prompt_tokens + 1)), SamplingOptions(), None, False)


@pytest.mark.parametrize("light_active", [True, False])
def test_staggered_prefill_keeps_the_last_worker_on_short_steps(light_active: bool) -> None:
    """While a light tenant is active a long prompt never takes the last worker
    free of long prefill (the one a light request starts soonest on); with two
    such workers, without a light tenant, or long after its last request, the
    rule alone decides."""
    now = [0.0]
    p = Placement([_target(f"w{i}") for i in range(3)], clock=lambda: now[0])
    p.stagger = Stagger(min_tokens=1024, light_window_s=10.0)
    if light_active:
        p.released(p.place(_request(40, light=True), [], set()) or pytest.fail())
    now[0] = 5.0
    p.pending_prefill[:] = [0, 0, 5000]  # two workers on short steps
    two = p.place(_request(3000, light=False), [], set())
    assert two is not None and two.worker == 0 and p.stagger.kept_free == 0
    p.released(two)
    p.pending_prefill[:] = [0, 5000, 5000]  # one left: the rule alone would take it
    one = p.place(_request(3000, light=False), [], set())
    assert one is not None
    assert (one.worker != 0) is light_active and p.stagger.kept_free == int(light_active)
    if light_active:
        light = p.place(_request(40, light=True), [], set())
        assert light is not None and light.worker == 0
    p.released(one)
    now[0] = 100.0  # the light tenant is gone
    p.pending_prefill[:] = [0, 5000, 5000]
    late = p.place(_request(3000, light=False), [], set())
    assert late is not None and late.worker == 0


def test_staggered_prefill_keeps_no_worker_free_on_fewer_than_min_workers() -> None:
    """Keeping one of two workers off long prefill costs the pool half its prefill
    for the long prompts (0.71x the tokens/s, measured): below
    `min_workers` healthy workers (3 by default) a long prompt goes where the
    rule alone sends it, and from a third one on it is kept again."""
    targets = [_target(f"w{i}") for i in range(3)]
    p = Placement(targets, clock=lambda: 5.0)
    p.stagger = Stagger(min_tokens=1024, light_window_s=10.0)
    assert p.stagger.min_workers == 3
    p.stagger.light_seen_s = 4.0  # a light tenant is active
    targets[2].healthy = False
    p.pending_prefill[:] = [0, 5000, 0]  # w0 the last healthy worker on short steps
    two = p.place(_request(3000, light=False), [], set())
    assert two is not None and two.worker == 0 and p.stagger.kept_free == 0
    p.released(two)
    targets[2].healthy = True
    p.pending_prefill[:] = [0, 5000, 5000]
    three = p.place(_request(3000, light=False), [], set())
    assert three is not None and three.worker != 0 and p.stagger.kept_free == 1


def test_two_replicas_stagger_with_each_others_prefills() -> None:
    """Replica B counts the long prefill replica A routed (as the prefix share
    carries it): B keeps its light tenant's worker free and sends the light
    request where no prefill runs, until A's first token says the prefill is
    over; an announcement whose end never arrives stops counting after the TTL."""
    now = [0.0]
    a = Placement([_target(f"w{i}") for i in range(2)], clock=lambda: now[0])
    b = Placement([_target(f"w{i}") for i in range(2)], clock=lambda: now[0])
    sent: list[tuple[str, str, int]] = []
    a.on_prefill = lambda url, pid, n: sent.append((url, pid, n))
    for p in (a, b):
        p.stagger = Stagger(min_tokens=1024, light_window_s=10.0, min_workers=2)
        p.released(p.place(_request(40, light=True), [], set()) or pytest.fail())
    long_a = a.place(_request(3000, light=False), [], set())
    # Both idle: A's long prompt leaves w0, where a light request goes next
    # (`Stagger.kept`'s pick, with other replicas).
    assert long_a is not None and long_a.worker == 1 and a.stagger.kept_free == 1
    pid_a = long_a.prefill_id
    # A's light request was announced as it was placed and as it ended (`sheltered`).
    assert sent[:2] == [("w0", "light-1", 40), ("w0", "light-1", 0)]
    del sent[:2]
    assert sent == [("w1", pid_a, 3000)]
    for url, pid, n in sent:
        b.learn_prefill(url, f"a:{pid}", n)
    assert (b.prefill_pending(1), b.pending_prefill[1]) == (3000, 0)
    # Without A's prefill, B's long prompt would take w0 (the rule's tie; B is
    # told of no other replica's prefills); with it, w0 is the last worker on
    # short steps and is kept for the light tenant.
    long_b = b.place(_request(3000, light=False), [], set())
    assert long_b is not None and long_b.worker == 1 and b.stagger.kept_free == 1
    b.released(long_b)
    light = b.place(_request(40, light=True), [], set())
    assert light is not None and light.worker == 0
    b.released(light)
    a.first_token(long_a, 3000, 0)
    assert sent[-1] == ("w1", pid_a, 0)
    b.learn_prefill("w1", f"a:{pid_a}", 0)
    assert b.prefill_pending(1) == 0
    a.released(long_a)
    assert len(sent) == 2  # its end is announced once
    # A lost end: counted for the TTL only.
    b.learn_prefill("w0", "a:99", 5000)
    now[0] += b.remote_prefill_ttl_s - 1
    assert b.prefill_pending(0) == 5000
    now[0] += 1
    assert b.prefill_pending(0) == 0 and b.remote_prefill == [{}, {}]


def _hold_placement(now: list[float], light_window_s: float = 10.0) -> Placement:
    p = Placement([_target(f"w{i}") for i in range(2)], clock=lambda: now[0], kv_tokens=[KV] * 2)
    p.stagger = Stagger(min_tokens=1024, light_window_s=light_window_s, hold_max_s=2.0)
    return p


def _light_seen(p: Placement) -> None:
    p.released(p.place(_request(40, light=True), [], set()) or pytest.fail())


def test_a_cold_long_prompt_is_held_while_every_worker_is_mid_prefill_until_the_bound() -> None:
    """Cold start (lever 4): every worker mid-prefill and a light tenant active, a
    cold long prompt waits unsent; its bound (hold_max_s) lets it go whatever the
    workers do, so batch traffic never starves."""
    now = [0.0]
    p = _hold_placement(now)
    _light_seen(p)
    now[0] = 1.0
    p.pending_prefill[:] = [3000, 5000]
    cold = _request(3000, light=False)
    assert p.hold_until(cold, [], 1.0, True) == 3.0  # since + hold_max_s
    assert p.stagger.held == 1
    now[0] = 2.5  # still all mid-prefill: still held, counted once
    assert p.hold_until(cold, [], 1.0, False) == 3.0 and p.stagger.held == 1
    now[0] = 3.0
    assert p.hold_until(cold, [], 1.0, False) is None
    assert p.stagger.held_to_bound == 1
    # A short prompt, or a light tenant's, is never held.
    now[0] = 3.5
    assert p.hold_until(_request(500, light=False), [], 3.5, True) is None


def test_a_held_prompt_goes_once_a_workers_prefill_ends() -> None:
    now = [0.0]
    p = _hold_placement(now)
    p.stagger.keep_free = False  # (staggering keeps the second long prompt off worker 1)
    _light_seen(p)
    long_req = _request(3000, light=False)
    first = p.place(long_req, [], set())
    assert first is not None
    other = p.place(_request(3000, light=False), [], set())
    assert other is not None and {first.worker, other.worker} == {0, 1}
    now[0] = 0.5
    cold = _request(3000, light=False)
    assert p.hold_until(cold, [], 0.5, True) == 2.5
    p.first_token(first, 3000, 0)  # that worker's prefill streamed: it is short again
    assert p.hold_until(cold, [], 0.5, False) is None
    assert p.stagger.held == 1 and p.stagger.held_to_bound == 0


def test_nothing_is_held_without_an_active_light_tenant() -> None:
    now = [0.0]
    p = _hold_placement(now, light_window_s=5.0)
    p.pending_prefill[:] = [3000, 5000]
    cold = _request(3000, light=False)
    assert p.hold_until(cold, [], 0.0, True) is None  # never seen
    _light_seen(p)
    now[0] = 4.0
    # Held until the light tenant goes quiet (seen at 0 s, window 5 s), before the bound.
    assert p.hold_until(cold, [], 4.0, True) == 5.0
    now[0] = 5.5
    assert p.hold_until(cold, [], 4.0, False) is None
    assert p.stagger.held_to_bound == 0
    p.stagger.hold_max_s = 0.0  # off
    _light_seen(p)
    assert p.hold_until(cold, [], 5.5, True) is None


def test_a_prompt_whose_prefix_the_soonest_worker_holds_is_not_cold() -> None:
    now = [0.0]
    p = _hold_placement(now)
    _light_seen(p)
    prompt = list(range(1, 3001))
    keys = p.prefix_keys(prompt)
    p.index.insert(0, keys)
    p.pending_prefill[:] = [3000, 5000]
    q = QueuedRequest("r", "t", len(prompt), 16, prefix_keys=keys)
    req = engine_request(q, "r", prompt, SamplingOptions(), None, False)
    assert p.hold_until(req, keys, 0.0, True) is None
    p.index.clear(0)
    assert p.hold_until(req, keys, 0.0, True) == 2.0


def test_two_replicas_route_by_each_others_requests_in_flight() -> None:
    """Replica B weighs the requests replica A has in flight on each worker (as the
    prefix share carries them): A filled w0, so B's requests go to w1 where its own
    counts alone would tie; the load ends when A's requests leave, or after the
    TTL when A falls silent."""
    now = [0.0]
    a = Placement([_target(f"w{i}") for i in range(2)], clock=lambda: now[0])
    b = Placement([_target(f"w{i}") for i in range(2)], clock=lambda: now[0])
    a.on_load = lambda url, n, kv, quiet: b.learn_load(url, "a", n, kv, quiet)
    on_a = [a.place(_request(100, light=False), [], {1}) or pytest.fail() for _ in range(SLOTS)]
    assert [p.worker for p in on_a] == [0] * SLOTS
    assert b.load(0, now[0]) == pytest.approx(1.0) and b.load(1, now[0]) == 0.0
    assert b.in_flight == [0, 0]  # B's own counts are untouched
    for _ in range(2):
        placed = b.place(_request(100, light=False), [], set())
        assert placed is not None and placed.worker == 1
    for p in on_a:
        a.released(p)
    assert b.load(0, now[0]) == 0.0 and b.remote_load.by_worker[0] == {"a": (0, 0, 0, 5.0)}
    # A silent replica's last load counts for the TTL only.
    b.learn_load("w0", "a", 3, 300)
    now[0] += b.remote_load.ttl_s - 1
    assert b.load(0, now[0]) == pytest.approx(3 / SLOTS)
    now[0] += 1
    assert b.load(0, now[0]) == 0.0 and b.remote_load.by_worker[0] == {}
    b.learn_load("nowhere", "a", 3, 300)  # an unknown worker is ignored
    assert b.remote_load.by_worker == [{}, {}]


def test_a_replica_keeps_a_worker_for_the_light_tenant_another_replica_placed() -> None:
    """Replica B has placed no light request; replica A has, and says so (the
    prefix share carries it): B's long prompts keep the last worker on short steps
    too, and stop once the light tenant's window has passed."""
    now = [0.0]
    a = Placement([_target(f"w{i}") for i in range(2)], clock=lambda: now[0])
    b = Placement([_target(f"w{i}") for i in range(2)], clock=lambda: now[0])
    a.on_light = b.learn_light
    for p in (a, b):
        p.stagger = Stagger(min_tokens=1024, light_window_s=10.0, min_workers=2)
    a.released(a.place(_request(3000, light=False), [], set()) or pytest.fail())
    assert not b.stagger.light_active(now[0])  # a long request marks nothing
    a.released(a.place(_request(40, light=True), [], set()) or pytest.fail())
    assert b.stagger.light_active(now[0])
    b.pending_prefill[0] = 3000  # w0 mid-prefill: w1 is the last on short steps
    long_b = b.place(_request(3000, light=False), [], set())
    assert long_b is not None and long_b.worker == 0 and b.stagger.kept_free == 1
    now[0] += 10.5
    late = b.place(_request(3000, light=False), [], set())
    assert late is not None and late.worker == 1 and b.stagger.kept_free == 1


def test_with_the_exact_view_a_prompt_in_flight_counts_every_prefix_of_it_held() -> None:
    """KV events report a prompt only once computed. Until then the placement counts
    what is in flight on the worker: a second prompt sharing only the first's
    document (its shallower blocks) finds it held there, not only a prompt sharing
    the whole of it; nothing is left counted once both have left."""
    p, _ = _placement(1)
    p.exact[0] = CacheView()
    doc = PROMPT[:160]  # 10 blocks
    first = _admitted(p, [*doc, *range(1000, 1160)])
    placed = p.place(first, list(first.prefix_keys), set())
    assert placed is not None
    second_keys = p.prefix_keys([*doc, *range(2000, 2160)])
    assert p.held(0, second_keys) == len(doc)
    assert p.held(0, list(first.prefix_keys)) == len(first.prefix_keys) * p.index.block
    # A second prompt on the same document in flight, then each leaves.
    second = _admitted(p, [*doc, *range(2000, 2160)])
    placed2 = p.place(second, list(second.prefix_keys), set())
    assert placed2 is not None
    p.first_token(placed, first.prompt_tokens, 0)
    assert p.held(0, second_keys) == len(second.prefix_keys) * p.index.block
    p.released(placed)
    p.released(placed2)
    assert p.held(0, second_keys) == 0
    assert p._computing == [{}]


def test_a_prefix_evicted_before_its_prefill_counts_as_pending_prefill_again() -> None:
    """Placed for a prefix the worker held, a request waits (in the worker's
    staged-prefill lane); the engine evicts part of the prefix meanwhile. `recheck`
    says what is held now (its own claim on the keys left out), and the rest counts
    as pending prefill and KV there, so a light request is not routed to a worker
    about to prefill it; nothing is left counted once it leaves."""
    p, _ = _placement(1)
    view = p.exact[0] = CacheView()
    doc = PROMPT  # 20 blocks
    view.stored(list(range(1, 21)), None, doc, view.block)
    req = _admitted(p, [*doc, *range(1000, 1160)])
    placed = p.place(req, list(req.prefix_keys), set())
    assert placed is not None and placed.matched == len(doc)
    pending, kv = p.pending_prefill[0], p.kv_in_flight[0]
    assert p.recheck(placed) == len(doc)  # still held: nothing changes
    assert (p.pending_prefill[0], p.kv_in_flight[0]) == (pending, kv)
    view.removed(list(range(11, 21)))  # its last 10 blocks evicted while it waited
    assert p.recheck(placed) == 160 and placed.matched == 160
    # Its KV was counted whole (the cached prefix pinned by it); its prefill grows.
    assert (p.pending_prefill[0], p.kv_in_flight[0]) == (pending + 160, kv)
    assert p.evicted_before_prefill == 1
    p.first_token(placed, req.prompt_tokens, 160)
    assert p.overestimated == 0  # the placement knew by then
    p.released(placed)
    assert (p.pending_prefill, p.kv_in_flight, p._computing) == ([0], [0], [{}])


def test_without_an_exact_view_recheck_keeps_what_placement_counted() -> None:
    """The approximate index cannot tell an eviction (and counts the request's own
    keys, routed there): the placement's count stands."""
    p, _ = _placement(1)
    first = _admitted(p)
    p.released(p.place(first, list(first.prefix_keys), set()) or pytest.fail())
    again = _admitted(p)
    placed = p.place(again, list(again.prefix_keys), set())
    assert placed is not None and placed.matched > 0
    assert p.recheck(placed) == placed.matched and p.evicted_before_prefill == 0


def test_a_prefix_in_flight_takes_kv_once_until_the_last_request_on_it_leaves() -> None:
    """Two requests on one document: the second adds only its own part, and the
    document's blocks stay counted while either is in flight, whichever leaves
    first (the engine keeps a shared prefix while any request uses it)."""
    p, _ = _placement(1)
    doc = PROMPT[:160]
    a = _admitted(p, [*doc, *range(1000, 1160)])
    b = _admitted(p, [*doc, *range(2000, 2160)])
    pa = p.place(a, list(a.prefix_keys), set())
    assert pa is not None and pa.kv_tokens == rules.kv_tokens(320, 16)
    assert p.adds_kv(0, list(b.prefix_keys), 320, 16) == rules.kv_tokens(160, 16)
    pb = p.place(b, list(b.prefix_keys), set())
    assert pb is not None and pb.kv_tokens == rules.kv_tokens(160, 16)
    both = p.kv_in_flight[0]
    assert both == 160 + 2 * rules.kv_tokens(160, 16)
    p.released(pa)  # the one that brought the document leaves first
    assert p.kv_in_flight[0] == 160 + rules.kv_tokens(160, 16)
    p.released(pb)
    assert p.kv_in_flight == [0]


def test_recheck_counts_a_prompt_computed_ahead_of_it_not_one_placed_after() -> None:
    """Two requests on one document, placed where it was held; it is evicted while
    they wait. The first one's turn: nothing ahead of it computes the document (the
    second, placed after it, waits behind it), so it is cold. The second one's: the
    first, still being computed ahead of it, carries the document."""
    p, _ = _placement(1)
    view = p.exact[0] = CacheView()
    doc = PROMPT
    view.stored(list(range(1, 21)), None, doc, view.block)
    a = _admitted(p, [*doc, *range(1000, 1160)])
    b = _admitted(p, [*doc, *range(2000, 2160)])
    pa = p.place(a, list(a.prefix_keys), set())
    pb = p.place(b, list(b.prefix_keys), set())
    assert pa is not None and pb is not None and pa.matched == pb.matched == len(doc)
    view.removed(list(range(1, 21)))
    assert p.recheck(pa) == 0
    assert p.recheck(pb) == len(doc)
    p.first_token(pa, a.prompt_tokens, 0)  # its prefill is done: no longer computing
    view.stored(list(range(1, 21)), None, doc, view.block)  # its KV events say so
    assert p.recheck(pb) == len(doc)


def test_two_replicas_weigh_each_others_quiet_prefill_in_routing_and_pacing() -> None:
    """The short prompts a replica does not announce one by one (its quiet prefill)
    reach the others with its load: a light request another replica places goes
    where none waits, and its pacing counts them as its own; a prefill announced
    one by one is not counted twice, and the quiet prefill ends at the first token."""
    now = [0.0]
    a = Placement([_target(f"w{i}") for i in range(2)], clock=lambda: now[0])
    b = Placement([_target(f"w{i}") for i in range(2)], clock=lambda: now[0])
    loads: list[tuple[str, int]] = []

    def heard(url: str, n: int, kv: int, quiet: int) -> None:
        loads.append((url, quiet))
        b.learn_load(url, "a", n, kv, quiet)

    a.on_load = heard
    a.on_prefill = lambda url, pid, n: b.learn_prefill(url, f"a:{pid}", n)
    for p in (a, b):
        p.stagger = Stagger(min_tokens=1024, keep_tokens=256, hold_max_s=2.0, pace_tokens=128)
    short = a.place(_request(100, light=False), [], {1})
    assert short is not None and short.worker == 0 and a.quiet_prefill(0) == 100
    assert loads[-1] == ("w0", 100)
    assert (b.prefill_pending(0), b.queued_short(0)) == (100, 100)
    light = b.place(_request(40, light=True), [], set())
    assert light is not None and light.worker == 1  # not where A's short prompt waits
    long_a = a.place(_request(3000, light=False), [], {1})
    assert long_a is not None and long_a.prefill_id  # announced: not quiet
    assert loads[-1] == ("w0", 100) and b.prefill_pending(0) == 3100
    a.first_token(short, 100, 0)
    assert loads[-1] == ("w0", 0) and b.queued_short(0) == 0 and b.prefill_pending(0) == 3000
    # A silent replica's quiet prefill counts for the load's TTL only.
    b.learn_load("w1", "a", 1, 100, 90)
    now[0] += b.remote_load.ttl_s
    assert b.queued_short(1) == b.prefill_pending(1) == 40  # its own light request
    # Without staggered prefill a replica sends none (locality routing alone).
    alone = Placement([_target("w0")], clock=lambda: now[0])
    assert alone.place(_request(100, light=False), [], set()) is not None
    assert alone.quiet_prefill(0) == 0
