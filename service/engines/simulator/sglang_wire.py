"""SGLang's native /generate wire format, as the stand-in reads and writes it.

Checked against SGLang 0.5.23 (tests/sglang/test_conformance.py sends the same
requests to both): request fields (`text` | `input_ids`, `sampling_params`,
`rid`, `priority`, `stream`), SGLang's validation messages, `finish_reason`
and `meta_info` shapes, SSE `data:` lines and error objects.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

from service.engines.protocol import EngineRequest, FinishKind, SamplingOptions
from service.tokenizer import ApproxTokenizer

# SGLang: max_req_input_len = min(context, kv) - 1 - 5.
INPUT_MARGIN_TOKENS = 6


class InvalidRequest(ValueError):
    """A body SGLang refuses: HTTP 400 (non-stream) or an error event (stream).

    `by_scheduler`: refused by SGLang's scheduler rather than its tokenizer
    manager, which a stream sees as an abort chunk carrying status 400."""

    def __init__(self, message: str, *, by_scheduler: bool = False) -> None:
        super().__init__(message)
        self.by_scheduler = by_scheduler


def _number(sp: dict[str, Any], key: str, default: float) -> float:
    value = sp.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"invalid type: {type(value).__name__} for {key}")
    return float(value)


def _check_sampling(sp: dict[str, Any], max_new: int) -> None:
    """SGLang's SamplingParams.verify messages (values as the client wrote them)."""
    if max_new < 0:
        raise InvalidRequest(f"max_new_tokens must be at least 0, got {sp['max_new_tokens']}.")
    temperature = _number(sp, "temperature", 1.0)
    if temperature < 0 or not math.isfinite(temperature):
        raise InvalidRequest(
            f"temperature must be a non-negative finite number, got {sp['temperature']}."
        )
    top_p = _number(sp, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {sp['top_p']}.")
    top_k = sp.get("top_k", -1)
    if not isinstance(top_k, int) or top_k == 0 or top_k < -1:
        raise InvalidRequest(f"top_k must be -1 (disable) or at least 1, got {top_k}.")


def parse_generate(
    body: Any, tokenizer: ApproxTokenizer, max_context: int
) -> tuple[EngineRequest, bool]:
    """A `/generate` body as an EngineRequest and its `stream` flag; InvalidRequest if bad.

    As SGLang: a prompt must be shorter than the context, prompt + max_new_tokens
    must fit it, a prompt of max_context - 6 tokens or more is refused by the
    scheduler, and max_new_tokens is silently capped at max_context - 2 - prompt."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list) or (ids and isinstance(ids[0], list)):
        raise InvalidRequest("batch requests are not supported by the stand-in")
    if text is None and ids is None:
        raise InvalidRequest("Either text, input_ids or input_embeds should be provided.")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise InvalidRequest("input_ids must be a list of integers")
        prompt_ids = list(ids)
    else:
        if not isinstance(text, str):
            raise InvalidRequest("text must be a string")
        prompt_ids = tokenizer.encode(text)
    if not prompt_ids:
        # SGLang 0.5.23's scheduler crashes on this; the stand-in refuses it.
        raise InvalidRequest("The input is empty.")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise InvalidRequest("sampling_params must be an object")
    try:
        max_new = int(sp.get("max_new_tokens", 128))
        _check_sampling(sp, max_new)
        stop = sp.get("stop") or ()
        sampling = SamplingOptions(
            temperature=float(sp.get("temperature", 1.0)),
            top_p=float(sp.get("top_p", 1.0)),
            top_k=int(sp.get("top_k", -1)),
            min_p=float(sp.get("min_p", 0.0)),
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            stop_token_ids=tuple(int(t) for t in sp.get("stop_token_ids") or ()),
            seed=None if sp.get("sampling_seed") is None else int(sp["sampling_seed"]),
            ignore_eos=bool(sp.get("ignore_eos", False)),
            min_tokens=int(sp.get("min_new_tokens", 0)),
            frequency_penalty=float(sp.get("frequency_penalty", 0.0)),
            presence_penalty=float(sp.get("presence_penalty", 0.0)),
            repetition_penalty=float(sp.get("repetition_penalty", 1.0)),
        )
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InvalidRequest):
            raise
        raise InvalidRequest(f"invalid sampling_params: {exc}") from exc
    n = len(prompt_ids)
    if n >= max_context:
        raise InvalidRequest(
            f"The input ({n} tokens) is longer than the model's context length "
            f"({max_context} tokens)."
        )
    if n + max_new > max_context:
        raise InvalidRequest(
            f"Requested token count exceeds the model's maximum context length of "
            f"{max_context} tokens. You requested a total of {n + max_new} tokens: {n} "
            f"tokens from the input messages and {max_new} tokens for the completion. "
            "Please reduce the number of tokens in the input messages or the completion "
            "to fit within the limit."
        )
    max_input = max_context - INPUT_MARGIN_TOKENS
    if n >= max_input:
        raise InvalidRequest(
            f"Input length ({n} tokens) exceeds the maximum allowed length ({max_input} "
            "tokens). Use a shorter input or enable --allow-auto-truncate.",
            by_scheduler=True,
        )
    priority = body.get("priority")
    rid = body.get("rid") or uuid.uuid4().hex
    if not isinstance(rid, str):
        raise InvalidRequest("rid must be a string")
    req = EngineRequest(
        request_id=rid,
        prompt_token_ids=prompt_ids,
        max_tokens=max(0, min(max_new, max_context - 2 - n)),
        sampling=sampling,
        prompt_text=text,
        priority=int(priority) if isinstance(priority, int) else 0,
    )
    return req, bool(body.get("stream", False))


def finish_reason(kind: FinishKind, matched: str, req: EngineRequest) -> dict[str, Any]:
    if kind is FinishKind.STOP:
        if matched and matched in req.sampling.stop:
            return {"type": "stop", "matched": matched}
        # A stop token id, or EOS (id 0 in the simulator's vocabulary).
        return {"type": "stop", "matched": int(matched) if matched.isdigit() else 0}
    if kind is FinishKind.LENGTH:
        return {"type": "length", "length": req.max_tokens}
    return abort_reason("Aborted")


def abort_reason(
    message: str, status_code: int | None = None, err_type: str | None = None
) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": status_code, "err_type": err_type}


def meta_info(rid: str, prompt_tokens: int) -> dict[str, Any]:
    """The `meta_info` keys SGLang sends on every chunk, in its order."""
    return {
        "id": rid,
        "finish_reason": None,
        "prompt_tokens": prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "reasoning_tokens": 0,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "cached_tokens_details": None,
        "dp_rank": None,
    }


def finish_meta(meta: dict[str, Any], started_s: float) -> None:
    """What only the last chunk (or a non-stream body) carries."""
    meta["weight_versions"] = [{"version": "default", "start": 0, "end": meta["completion_tokens"]}]
    meta["e2e_latency"] = time.monotonic() - started_s


def sent_now(meta: dict[str, Any]) -> None:
    """Only the first chunk (and a non-stream body) carries this."""
    meta["response_sent_to_client_ts"] = time.time()


def sse_data(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def error_object(code: int, message: str) -> dict[str, Any]:
    """The error event of a stream (non-stream errors carry only the message)."""
    return {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}


def json_error(message: str) -> dict[str, Any]:
    """A malformed body: SGLang answers in the OpenAI error shape."""
    return {
        "object": "error",
        "message": message,
        "type": "Bad Request",
        "param": None,
        "code": 400,
    }
