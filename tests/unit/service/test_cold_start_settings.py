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
