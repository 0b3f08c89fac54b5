"""SGLang's native /generate wire format, as the stand-in reads and writes it.

Field names and messages follow SGLang 0.5 (see the team's sglang-notes):
the request body (`text` | `input_ids`, `sampling_params`, `rid`, `priority`,
`stream`), `finish_reason` shapes, SSE `data:` lines and error objects.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from service.engines.protocol import EngineRequest, FinishKind, SamplingOptions
from service.tokenizer import ApproxTokenizer


class InvalidRequest(ValueError):
    """The body is not a request SGLang would accept (HTTP 400 / an error chunk)."""


def parse_generate(
    body: Any, tokenizer: ApproxTokenizer, max_context: int
) -> tuple[EngineRequest, bool]:
    """A `/generate` body as an EngineRequest and its `stream` flag; InvalidRequest if bad."""
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list) or (ids and isinstance(ids[0], list)):
        raise InvalidRequest("batch requests are not supported by the stand-in")
    if text is None and ids is None:
        raise InvalidRequest("Either text or input_ids should be provided.")
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise InvalidRequest("input_ids must be a list of integers")
        prompt_ids = list(ids)
    else:
        if not isinstance(text, str):
            raise InvalidRequest("text must be a string")
        prompt_ids = tokenizer.encode(text)
    if not prompt_ids:
        raise InvalidRequest("The input is empty.")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise InvalidRequest("sampling_params must be an object")
    try:
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
        max_new = int(sp.get("max_new_tokens", 128))
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"invalid sampling_params: {exc}") from exc
    if sampling.temperature < 0 or not 0 < sampling.top_p <= 1 or max_new < 0:
        raise InvalidRequest("temperature must be >= 0, top_p in (0, 1], max_new_tokens >= 0")
    if sampling.top_k == 0 or sampling.top_k < -1:
        raise InvalidRequest("top_k must be -1 (disabled) or at least 1")
    context = max_context
    if len(prompt_ids) >= context:
        raise InvalidRequest(
            f"The input ({len(prompt_ids)} tokens) is longer than the model's context "
            f"length ({context} tokens)."
        )
    if len(prompt_ids) + max_new > context:
        raise InvalidRequest(
            f"Requested token count exceeds the model's maximum context length of "
            f"{context} tokens. You requested a total of {len(prompt_ids) + max_new} tokens"
        )
    priority = body.get("priority")
    rid = body.get("rid") or uuid.uuid4().hex
    if not isinstance(rid, str):
        raise InvalidRequest("rid must be a string")
    req = EngineRequest(
        request_id=rid,
        prompt_token_ids=prompt_ids,
        max_tokens=max_new,
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
    return {"type": "abort", "message": f"Abort request {req.request_id}", "status_code": None}


def sse_data(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def error_object(code: int, message: str) -> dict[str, Any]:
    return {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}
