"""The stand-in's introspection answers in SGLang 0.5.23's shapes (`/v1/loads`)."""

from __future__ import annotations

import datetime
import time
from typing import Any

from service.engines.simulator.engine import SimulatedEngine

VERSION = "0.5.23-fairgate-sim"


def loads_body(engine: SimulatedEngine) -> dict[str, Any]:
    """`GET /v1/loads`: one rank, every field SGLang reports (zeros where we have none)."""
    cfg, core = engine.config, engine.core
    waiting = len(core.waiting)
    load = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": len(core.running),
        "num_waiting_reqs": waiting,
        "num_waiting_uncached_tokens": sum(r.prompt_len for r in core.waiting),
        "num_used_tokens": core.used_kv,
        "num_total_tokens": core.used_kv,
        "num_active_tokens": core.used_kv,
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": core.capacity,
        "max_running_requests": cfg.max_running_requests,
        "token_usage": core.used_kv / core.capacity,
        "gen_throughput": 0.0,
        "cache_hit_rate": 0.0,
        "utilization": len(core.running) / cfg.max_running_requests,
        "total_prefill_uncached_tokens": 0,
        "total_prefill_busy_us": 0,
        "decode_moments": [],
        "memory": {
            "weight_gb": cfg.cost.model.weight_bytes / 1e9,
            "kv_cache_gb": core.capacity * cfg.cost.model.kv_bytes_per_token / 1e9,
            "graph_gb": 0.0,
            "token_capacity": core.capacity,
        },
        "disaggregation": {
            "mode": "null",
            "prefill_bootstrap_queue_reqs": 0,
            "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": 0,
            "decode_transfer_queue_reqs": 0,
            "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0,
            "kv_transfer_latency_ms": 0.0,
        },
        "queues": {
            "waiting": waiting,
            "grammar": 0,
            "paused": 0,
            "retracted": 0,
            "prealloc_ready": 0,
        },
    }
    return {
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
        "version": VERSION,
        "accelerator": None,
        "num_accelerators": 1,
        "loads": [load],
    }
