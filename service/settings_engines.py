"""The engines' settings: the simulator, SGLang (a pool over HTTP, or in-process)
and staged prefill.

A group of `Settings` (service/settings.py), declared apart; its fields follow
the serving settings in the operators' table and the serve flags.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel

from service.engines.routing import ROUTINGS
from service.engines.stagger import MIN_WORKERS as STAGGER_MIN_WORKERS
from service.settings_errors import OneOf
from service.settings_field import setting as _s


class EngineSettings(BaseModel):
    # -- simulator ------------------------------------------------------------------
    sim_gpu: str = _s("rtx-4090", "Simulator GPU preset (`fairgate plan` lists them).")
    sim_model: str = _s("llama-3.1-8b-int4", "Simulator model preset.")
    sim_time_scale: float = _s(
        1.0, "Simulator speed: 1 = real time, 0.1 = ten times faster, 0 = no delays.", ge=0
    )
    sim_seed: int = _s(0, "Simulator random seed.")
    sim_max_running_requests: int = _s(256, "Simulator's running-request slots.", ge=1)
    sim_chunked_prefill_tokens: int = _s(2048, "Simulator's prefill chunk, in tokens.", ge=1)
    sim_mean_output_tokens: float = _s(
        0.0,
        "Simulator's mean output length: it ends at EOS with chance 1/N a token (0: runs to max).",
        ge=0,
    )
    sim_kv_capacity_tokens: int = _s(
        0, "Override the preset's KV capacity in tokens (0: the preset's).", ge=0
    )
    sim_priority_scheduling: bool = _s(
        False, "Like SGLang's --enable-priority-scheduling: engine priorities order prefills."
    )
    sim_disable_priority_preemption: bool = _s(
        False,
        "Like SGLang's --disable-priority-preemption (else a priority gap above 10 preempts).",
    )
    # -- SGLang -----------------------------------------------------------------------
    sglang_urls: str = _s(
        "",
        "engine=sglang-http: comma-separated base URLs, a worker pool (one URL: a pool of one).",
    )
    sglang_connect_timeout_s: float = _s(5.0, "Connect timeout to an SGLang server.", gt=0)
    sglang_read_timeout_s: float = _s(
        60.0, "Longest silence on a stream (also the wait for the first token).", gt=0
    )
    sglang_retries: int = _s(
        1, "Retries on the same worker before the first token (single worker only).", ge=0
    )
    sglang_incremental_output: bool = _s(
        False,
        "The server runs --incremental-streaming-output (its /server_info wins when it says).",
    )
    sglang_health_interval_s: float = _s(
        2.0, "How often each SGLang worker's health is read.", gt=0
    )
    sglang_eject_after_failures: int = _s(
        3, "Pool circuit breaker: stream failures in a row that eject a worker.", ge=1
    )
    sglang_ejection_base_s: float = _s(
        5.0, "First ejection's length (doubles with each in a row, up to the max).", gt=0
    )
    sglang_ejection_max_s: float = _s(300.0, "Longest ejection.", gt=0)
    sglang_routing: Annotated[str, OneOf(ROUTINGS)] = _s(
        "locality",
        "Pool: locality (the worker where the first token comes soonest: prefill ahead "
        "of it, the prompt prefix it holds, its load) or least_full.",
    )
    sglang_prefix_affinity_tokens: int = _s(
        0,
        "Pool, routing=least_full: prefer the worker a prompt's first N tokens hash to "
        "(0: least load only).",
        ge=0,
    )
    sglang_stagger_prefill_tokens: int = _s(
        0,
        "Pool, routing=locality: staggered prefill; while a light tenant is active, a "
        "prompt of at least N tokens never takes the last worker free of long prefill, "
        "so a light request finds one on short steps; fair_isolation auto then keeps the "
        "reserve (0: off; 1024 measured: docs/benchmarks.md).",
        ge=0,
    )
    sglang_stagger_keep_tokens: int = _s(
        0,
        "Pool, staggered prefill: the worker kept on short steps takes only prompts that "
        "leave its prefill below this many uncached tokens (0: sglang_stagger_prefill_tokens; "
        "at most that; 256 measured on pools of four: docs/benchmarks.md).",
        ge=0,
    )
    sglang_stagger_light_window_s: float = _s(
        10.0,
        "Pool, staggered prefill: a light tenant is active this long after its last request.",
        gt=0,
    )
    sglang_cold_start_hold_s: float = _s(
        0.0,
        "Pool, with staggered prefill: while every worker is mid-prefill and a light tenant "
        "is active, a prompt with at least sglang_stagger_prefill_tokens uncached tokens "
        "waits, unsent, until a worker's prefill ends, for at most this long; so does a "
        "long prompt that would take the last worker free of long prefill because no other "
        "worker's KV holds it (0: off; measured: docs/benchmarks.md).",
        ge=0,
        le=60,
    )
    sglang_stagger_pace_tokens: int = _s(
        0,
        "Pool, with the cold-start hold: while a light tenant is active, a short prompt "
        "(uncached below sglang_stagger_keep_tokens where it goes) goes only to a worker "
        "whose short prefill queued, not streamed, stays within this many tokens with it "
        "(or has none), else waits unsent within sglang_cold_start_hold_s: the light "
        "request's step is not packed with other tenants' short prompts; only where a "
        "prompt has two workers or more to go to (0: off; 128 measured: "
        "docs/benchmarks.md).",
        ge=0,
    )
    sglang_stagger_min_workers: int = _s(
        STAGGER_MIN_WORKERS,
        "Pool, staggered prefill: keeps a worker free of long prefill only while at least "
        "this many workers are healthy (on two, keeping one free cost 0.71x the tokens/s "
        "on the prefix mix, and staged prefill alone met the bar: docs/benchmarks.md).",
        ge=2,
    )
    sglang_kv_events: str = _s(
        "",
        "Pool: each worker's SGLang KV events (its --kv-events-config zmq endpoint, "
        "e.g. tcp://host:5557, optionally ;REPLAY: its replay_endpoint), comma-separated in "
        "the order of sglang_urls; empty: off. Locality then uses the exact cache "
        "each worker reports instead of the guessed prefix index (the fallback "
        "after a gap in the events). Needs the kv-events extra.",
    )
    # engine=sglang (in-process, one GPU): the sglang.Engine's server flags that matter.
    sglang_model_path: str = _s(
        "", "engine=sglang (in-process): the model path or Hugging Face id (--model-path)."
    )
    sglang_tokenizer_path: str = _s(
        "", "engine=sglang: the tokenizer's path or id (--tokenizer-path; empty: the model's)."
    )
    sglang_context_length: int = _s(
        0, "engine=sglang: the model's context length (--context-length; 0: its config's).", ge=0
    )
    sglang_mem_fraction: float = _s(
        0.0,
        "engine=sglang: GPU memory share for weights and KV cache (--mem-fraction-static; "
        "0: SGLang's choice).",
        ge=0,
        lt=1,
    )
    sglang_chunked_prefill_size: int = _s(
        0,
        "engine=sglang: prefill chunk in tokens (--chunked-prefill-size; 0: SGLang's, -1: off).",
        ge=-1,
    )
    sglang_max_running_requests: int = _s(
        0, "engine=sglang: running-request slots (--max-running-requests; 0: SGLang's).", ge=0
    )
    sglang_priority_scheduling: bool = _s(
        False, "engine=sglang: engine priorities order prefills (--enable-priority-scheduling)."
    )
    sglang_engine_args: str = _s(
        "",
        "engine=sglang: further sglang.Engine keywords as a JSON object "
        '(e.g. {"device": "cpu"}); a key may not repeat a setting above.',
    )
    capacity_refresh_s: float = _s(
        2.0, "How often admission limits are re-read from the engine's capacity.", gt=0
    )
    staged_prefill_min_tokens: int = _s(
        0,
        "Staged prefill (simulator, sglang-http): a prompt of at least this many tokens "
        "enters its engine as prefill-only prefix stages, so that short requests start "
        "between them (0: off).",
        ge=0,
    )
    staged_prefill_stage_tokens: int = _s(
        2048,
        "Staged prefill: tokens added by each stage (the engine's prefill chunk or less).",
        ge=1,
    )
    staged_prefill_sheltered_stage_tokens: int = _s(
        0,
        "Staged prefill: while the light tenant is active and staggered prefill keeps another "
        "worker on short steps (three workers or more), on a worker neither on short steps "
        "itself nor with a light request waiting, a stage may add up to this many tokens, and "
        "the rest goes whole once it fits: fewer round trips for the long prompt where no "
        "light request lands (0: every stage staged_prefill_stage_tokens).",
        ge=0,
    )
    staged_prefill_short_first: bool = _s(
        False,
        "Staged prefill: a prompt waiting for its worker's lane whose uncached part is below "
        "sglang_stagger_prefill_tokens (and whose prefix no prompt ahead of it there is still "
        "computing) goes between a longer prompt's stages instead of after all of them.",
    )
    staged_prefill_one_at_a_time: bool = _s(
        True,
        "Staged prefill: one staged prompt at a time per engine, from its first stage to its "
        "first token (a prefill step then carries one stage, not one from each long prompt).",
    )
    staged_prefill_cold_only: bool = _s(
        True,
        "Staged prefill: stage only a prompt whose part uncached on the worker the pool "
        "chose reaches the length to stage, from above the part held there; a long prompt "
        "cached there goes whole, in its turn among the engine's staged prompts (one URL: "
        "a pool of one).",
    )
