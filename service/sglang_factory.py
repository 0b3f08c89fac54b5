"""Builds the SGLang-over-HTTP engine from settings: a pool of its URLs' workers,
of one for one URL, so a one-engine server runs the placement's levers (the
cold-start hold, cold-only staging, KV events) as the virtual fleet measures them."""

from __future__ import annotations

import logging

from service.engines import kv_events
from service.engines.breaker import BreakerPolicy
from service.engines.kv_events import KvEventsFollower
from service.engines.pool import WorkerPool
from service.engines.sglang_chunks import DEFAULT_VOCAB_SIZE
from service.engines.sglang_http import SglangHttpConfig, SglangHttpEngine
from service.engines.staged_prefill import StagedPrefill
from service.engines.stagger import Stagger
from service.settings import Settings

log = logging.getLogger(__name__)


def build_sglang_http(settings: Settings, staged: StagedPrefill) -> WorkerPool:
    """`staged`: staged prefill (engine_factory.staged_prefill), per worker: the pool
    keeps a request's stages on one."""
    urls = [u.strip() for u in settings.sglang_urls.split(",") if u.strip()]
    if not settings.tokenizer_path:
        # SGLang's HTTP API does not say its vocabulary; one id past it kills the server.
        log.warning(
            "FAIRGATE_TOKENIZER_PATH is not set: token-id prompts are checked against "
            "%d ids only, and an out-of-vocabulary id crashes SGLang 0.5.23; point it at "
            "the served model's tokenizer.json",
            DEFAULT_VOCAB_SIZE,
        )
    # With one worker a failed request has nowhere to move: its adapter retries it.
    moves = len(urls) > 1
    if settings.sglang_cold_start_hold_s and not settings.sglang_stagger_prefill_tokens:
        raise SystemExit(
            "FAIRGATE_SGLANG_COLD_START_HOLD_S holds long prompts: set "
            "FAIRGATE_SGLANG_STAGGER_PREFILL_TOKENS, the uncached length from which a prompt "
            "is long"
        )
    if settings.sglang_stagger_pace_tokens and not settings.sglang_cold_start_hold_s:
        raise SystemExit(
            "FAIRGATE_SGLANG_STAGGER_PACE_TOKENS holds short prompts within the cold-start "
            "hold's bound: set FAIRGATE_SGLANG_COLD_START_HOLD_S (and "
            "FAIRGATE_SGLANG_STAGGER_PREFILL_TOKENS)"
        )
    if settings.sglang_stagger_keep_tokens > settings.sglang_stagger_prefill_tokens:
        raise SystemExit(
            "FAIRGATE_SGLANG_STAGGER_KEEP_TOKENS keeps the short-step worker below a prompt "
            "shorter than a long one: set it at most FAIRGATE_SGLANG_STAGGER_PREFILL_TOKENS "
            f"({settings.sglang_stagger_prefill_tokens}; 0 turns the stagger off)"
        )

    def one(url: str) -> SglangHttpEngine:
        return SglangHttpEngine(
            SglangHttpConfig(
                url=url,
                connect_timeout_s=settings.sglang_connect_timeout_s,
                read_timeout_s=settings.sglang_read_timeout_s,
                # Among several, a failed request moves to another worker instead.
                retries=0 if moves else settings.sglang_retries,
                incremental_output=settings.sglang_incremental_output,
                coalesce=settings.stream_coalesce,
                coalesce_window_s=settings.stream_coalesce_window_ms / 1000,
                staged_prefill=staged,
            )
        )

    events = [e.strip() for e in settings.sglang_kv_events.split(",") if e.strip()]
    followers: list[KvEventsFollower | None] = []
    if events:
        kv_events.require()
        if len(events) != len(urls):
            raise SystemExit(
                f"FAIRGATE_SGLANG_KV_EVENTS names {len(events)} endpoints for "
                f"{len(urls)} workers: one per URL, in the same order"
            )
        for e in events:
            pub, _, replay = e.partition(";")
            followers.append(KvEventsFollower(pub, replay_endpoint=replay or None))
    return WorkerPool(
        [one(u) for u in urls],
        health_interval_s=settings.sglang_health_interval_s,
        prefix_affinity_tokens=settings.sglang_prefix_affinity_tokens,
        routing="locality" if settings.sglang_routing == "locality" else "least_full",
        stagger=Stagger(
            min_tokens=settings.sglang_stagger_prefill_tokens,
            keep_tokens=settings.sglang_stagger_keep_tokens,
            light_window_s=settings.sglang_stagger_light_window_s,
            hold_max_s=settings.sglang_cold_start_hold_s,
            min_workers=settings.sglang_stagger_min_workers,
            pace_tokens=settings.sglang_stagger_pace_tokens,
        ),
        breaker=BreakerPolicy(
            consecutive_failures=settings.sglang_eject_after_failures,
            base_ejection_s=settings.sglang_ejection_base_s,
            max_ejection_s=settings.sglang_ejection_max_s,
        ),
        kv_events=followers,
    )
