"""An SGLang server's capacity as its `/server_info` (and `/model_info`) state
it, and the context window rule the in-process engine (`sglang_inproc.py`,
which reads the numbers from the engine object) shares."""

from __future__ import annotations

from typing import Any

from service.engines.protocol import EngineCapacity
from service.engines.sglang_chunks import DEFAULT_VOCAB_SIZE, UpstreamError, find_key


def capacity_from_server_info(info: dict[str, Any], model_info: dict[str, Any]) -> EngineCapacity:
    """Capacity from SGLang's /server_info (resolved server args + scheduler info)."""
    kv = find_key(info, "max_total_num_tokens")
    if not isinstance(kv, int) or kv <= 0:
        raise UpstreamError("SGLang /server_info has no max_total_num_tokens")
    running = 0
    states = info.get("internal_states")
    if isinstance(states, list):
        running = sum(
            int(s.get("effective_max_running_requests_per_dp") or 0)
            for s in states
            if isinstance(s, dict)
        )
    if running <= 0:
        configured = find_key(info, "max_running_requests")
        running = configured if isinstance(configured, int) and configured > 0 else 256
    limits = (find_key(info, "context_length"), find_key(info, "max_req_input_len"))
    vocab = model_info.get("vocab_size") or find_key(info, "vocab_size")
    return EngineCapacity(
        max_running_requests=running,
        max_total_tokens=kv,
        max_context_tokens=context_window(kv, *limits),
        vocab_size=vocab if isinstance(vocab, int) and vocab > 0 else DEFAULT_VOCAB_SIZE,
    )


def context_window(kv_tokens: int, *limits: object) -> int:
    """The most tokens (prompt + output) one request may take: the smallest of the
    server's `limits` that it states (context_length, max_req_input_len) and its
    KV cache. SGLang refuses a prompt of max_req_input_len tokens or more (an
    abort chunk with 400) and silently caps prompt + max_new_tokens at
    context_length - 2, so max_req_input_len (context_length - 6) is the window
    where both hold."""
    known = [n for n in limits if isinstance(n, int) and n > 0]
    return min(min(known) if known else kv_tokens, kv_tokens)
