"""`sglang_cold_start_hold_s`: the pool's hold with stagger's threshold, or a clear
start-up error without one."""

from __future__ import annotations

import pytest

from service.engines.pool import WorkerPool
from service.engines.staged_prefill import StagedPrefill
from service.settings import Settings
from service.sglang_factory import build_sglang_http

URLS = "http://127.0.0.1:1,http://127.0.0.1:2"


def test_the_hold_reaches_the_pools_placement() -> None:
    settings = Settings(
        sglang_urls=URLS, sglang_stagger_prefill_tokens=1024, sglang_cold_start_hold_s=2.5
    )
    pool = build_sglang_http(settings, StagedPrefill())
    assert isinstance(pool, WorkerPool)
    st = pool.placement.stagger
    assert (st.min_tokens, st.hold_max_s, st.keep_free) == (1024, 2.5, True)


def test_a_hold_without_the_length_of_a_long_prompt_stops_the_start() -> None:
    with pytest.raises(SystemExit, match="set FAIRGATE_SGLANG_STAGGER_PREFILL_TOKENS"):
        build_sglang_http(Settings(sglang_urls=URLS, sglang_cold_start_hold_s=2.0), StagedPrefill())


def test_one_url_is_a_pool_of_one_that_holds_and_retries_itself() -> None:
    settings = Settings(
        sglang_urls="http://127.0.0.1:1",
        sglang_stagger_prefill_tokens=1024,
        sglang_cold_start_hold_s=2.5,
        sglang_retries=3,
    )
    pool = build_sglang_http(settings, StagedPrefill())
    assert len(pool.workers) == 1 and pool.kind == "sglang-http"
    assert pool.placement.stagger.hold_max_s == 2.5
    # Nowhere to move a failed request: the worker's adapter retries it.
    assert pool.workers[0].engine.config.retries == 3
    two = build_sglang_http(settings.replace(sglang_urls=URLS), StagedPrefill())
    assert two.kind == "sglang-http-pool"
    assert [w.engine.config.retries for w in two.workers] == [0, 0]


def test_the_keep_threshold_reaches_the_stagger_and_is_at_most_a_long_prompt() -> None:
    settings = Settings(
        sglang_urls=URLS, sglang_stagger_prefill_tokens=1024, sglang_stagger_keep_tokens=256
    )
    pool = build_sglang_http(settings, StagedPrefill())
    st = pool.placement.stagger
    assert (st.min_tokens, st.keep_tokens, st.keep()) == (1024, 256, 256)
    assert st.min_workers == 3  # keeps no worker free on a pool of two
    on_two = build_sglang_http(settings.replace(sglang_stagger_min_workers=2), StagedPrefill())
    assert on_two.placement.stagger.min_workers == 2
    default = build_sglang_http(settings.replace(sglang_stagger_keep_tokens=0), StagedPrefill())
    assert default.placement.stagger.keep() == 1024
    with pytest.raises(SystemExit, match="at most FAIRGATE_SGLANG_STAGGER_PREFILL_TOKENS"):
        build_sglang_http(settings.replace(sglang_stagger_keep_tokens=2048), StagedPrefill())


def test_pacing_reaches_the_stagger_and_needs_the_holds_bound() -> None:
    settings = Settings(
        sglang_urls=URLS,
        sglang_stagger_prefill_tokens=1024,
        sglang_cold_start_hold_s=2.0,
        sglang_stagger_pace_tokens=128,
    )
    pool = build_sglang_http(settings, StagedPrefill())
    assert pool.placement.stagger.pace_tokens == 128
    with pytest.raises(SystemExit, match="set FAIRGATE_SGLANG_COLD_START_HOLD_S"):
        build_sglang_http(settings.replace(sglang_cold_start_hold_s=0.0), StagedPrefill())
