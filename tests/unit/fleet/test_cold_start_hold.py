"""The cold-start hold (issue #33, lever 4) on the virtual fleet: the server's
placement on simulated engines and a fake clock, so every time below is exact.
While both engines are mid-prefill and a light tenant is active, a third cold
long prompt waits unsent until an engine's prefill ends, or for at most the
bound; and the driver starts an idle engine's step when work reaches it."""

from __future__ import annotations

from fairgate.bench.event_driver import Arrival
from fairgate.bench.stagger import CHUNK_TOKENS, fleet, sim_config

from service.engines.stagger import Stagger

ENGINES = 2


def _trace() -> list[Arrival]:
    return [
        Arrival(0.0, "light", 40, 16),  # the light tenant is active from here
        Arrival(0.1, "code", 5000, 16),
        Arrival(0.1, "docs", 5000, 16),
        Arrival(0.2, "conv", 4000, 16),  # both engines mid-prefill: held
    ]


def test_the_third_cold_prompt_waits_for_an_engines_prefill_to_end() -> None:
    st = Stagger(min_tokens=1024, keep_free=False, hold_max_s=30.0)
    drv = fleet(_trace(), ENGINES, st)
    first, second, held = drv.calls[1], drv.calls[2], drv.calls[3]
    assert st.held == 1 and st.held_to_bound == 0
    assert first.sent_s == second.sent_s == 0.1
    ended = min(c.first_token_s or 0.0 for c in (first, second))
    assert held.sent_s == ended  # sent at the first prefill's end, not at 0.2 s
    assert all(c.state == "done" for c in drv.calls)
    assert drv.placement is not None and drv.placement.pending_prefill == [0] * ENGINES


def test_the_bound_sends_a_held_prompt_whatever_the_engines_do() -> None:
    st = Stagger(min_tokens=1024, keep_free=False, hold_max_s=0.25)
    drv = fleet(_trace(), ENGINES, st)
    held = drv.calls[3]
    assert st.held == 1 and st.held_to_bound == 1
    assert held.sent_s == 0.2 + 0.25
    assert all(c.state == "done" for c in drv.calls)


def test_without_the_hold_or_a_light_tenant_nothing_waits() -> None:
    off = fleet(_trace(), ENGINES, None)
    assert all(c.sent_s == c.arrival.at_s for c in off.calls)
    heavy_only = _trace()[1:]
    st = Stagger(min_tokens=1024, keep_free=False, hold_max_s=30.0)
    drv = fleet(heavy_only, ENGINES, st)
    assert st.held == 0 and all(c.sent_s == c.arrival.at_s for c in drv.calls)


def test_an_idle_engine_starts_when_a_request_reaches_it() -> None:
    """A request placed on an idle engine while another is mid-step starts at once
    (its first token after its own step), not when the other engine's step ends."""
    drv = fleet([Arrival(0.0, "code", 6000, 16), Arrival(0.05, "light", 40, 16)], ENGINES, None)
    long_req, light = drv.calls
    assert long_req.worker != light.worker
    chunk_s = sim_config().cost.step_s(CHUNK_TOKENS, 0, 0)
    assert light.first_token_s is not None
    assert light.first_token_s - 0.05 < chunk_s / 4
