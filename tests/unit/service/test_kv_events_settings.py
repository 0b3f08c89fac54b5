"""`sglang_kv_events`: one follower per worker, or a clear start-up error."""

from __future__ import annotations

import pytest

from service.engines.pool import WorkerPool
from service.engines.staged_prefill import StagedPrefill
from service.settings import Settings
from service.sglang_factory import build_sglang_http

URLS = "http://127.0.0.1:1,http://127.0.0.1:2"


def test_one_endpoint_per_worker_makes_a_follower_with_its_replay_socket() -> None:
    pool = build_sglang_http(
        Settings(
            sglang_urls=URLS,
            sglang_kv_events="tcp://127.0.0.1:5557;tcp://127.0.0.1:5558,tcp://127.0.0.1:6557",
        ),
        StagedPrefill(),
    )
    assert isinstance(pool, WorkerPool)
    ends = [(f.endpoint, f.replay_endpoint) for f in pool.kv_events if f is not None]
    assert ends == [
        ("tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558"),
        ("tcp://127.0.0.1:6557", None),
    ]
    assert pool.placement.exact == [f.view for f in pool.kv_events if f is not None]


def test_a_count_that_does_not_match_the_workers_stops_the_start() -> None:
    with pytest.raises(SystemExit, match="names 1 endpoints for 2 workers"):
        settings = Settings(sglang_urls=URLS, sglang_kv_events="tcp://127.0.0.1:5557")
        build_sglang_http(settings, StagedPrefill())
