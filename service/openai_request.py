"""OpenAI request bodies → the gRPC API's GenerateRequest.

The HTTP front converts a body into the same `GenerateRequest` a gRPC client
would send, so service/validation.py checks both (ranges, context, stop
strings, the chat template) with one set of rules. This module checks only
what is specific to the OpenAI shape (JSON types, `n`, unsupported options)
and names the OpenAI parameter in every error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fairgate.v1 import inference_pb2 as pb

from service.errors import FieldViolation, InvalidRequest

PRIORITY_HEADER = "x-fairgate-priority"
_PRIORITIES = {
    "interactive": pb.PRIORITY_CLASS_INTERACTIVE,
    "batch": pb.PRIORITY_CLASS_BATCH,
}
# Options we accept only at their default (we cannot honour anything else).
_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "logit_bias": (None, {}),
}
_FLOAT_PARAMS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "repetition_penalty": "repetition_penalty",
}
_INT_PARAMS = {"top_k": "top_k", "min_tokens": "min_tokens"}


@dataclass(slots=True)
class OpenAIRequest:
    """A converted body: what to generate, and how to answer."""

    request: pb.GenerateRequest
    chat: bool
    stream: bool
    include_usage: bool


def param_name(path: str) -> str:
    """The OpenAI parameter for a GenerateRequest field path (for errors)."""
    if path.startswith("sampling."):
        path = path.removeprefix("sampling.")
        return "stop" if path.startswith("stop[") else path
    if path == "text" or path.startswith("token_ids"):
        return "prompt"
    if path == "request_id":
        return "x-request-id"
    return path


class _Reader:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.violations: list[FieldViolation] = []

    def fail(self, name: str, description: str) -> None:
        self.violations.append(FieldViolation(name, description))

    def number(self, name: str) -> float | None:
        v = self.body.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            self.fail(name, f"must be a number, got {v!r}")
            return None
        return float(v)

    def integer(self, name: str) -> int | None:
        v = self.body.get(name)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(name, f"must be an integer, got {v!r}")
            return None
        return v

    def boolean(self, name: str) -> bool:
        v = self.body.get(name, False)
        if v is None:
            return False
        if not isinstance(v, bool):
            self.fail(name, f"must be true or false, got {v!r}")
            return False
        return v

    def string(self, name: str) -> str:
        v = self.body.get(name)
        if v is None:
            return ""
        if not isinstance(v, str):
            self.fail(name, f"must be a string, got {v!r}")
            return ""
        return v


def _content(r: _Reader, i: int, content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                texts.append(part["text"])
                continue
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            r.fail(f"messages[{i}].content[{j}]", f"only text content is supported, got {kind!r}")
        return "".join(texts)
    r.fail(f"messages[{i}].content", "must be a string or a list of content parts")
    return ""


def _messages(r: _Reader, req: pb.GenerateRequest) -> None:
    raw = r.body.get("messages")
    if not isinstance(raw, list) or not raw:
        r.fail("messages", "a non-empty list of messages is required")
        return
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            r.fail(f"messages[{i}]", "must be an object with role and content")
            continue
        role = m.get("role")
        if not isinstance(role, str) or not role:
            r.fail(f"messages[{i}].role", "a role is required (system, user, assistant, ...)")
            continue
        content = _content(r, i, m.get("content"))
        req.messages.messages.append(pb.ChatMessage(role=role, content=content))


def _prompt(r: _Reader, req: pb.GenerateRequest) -> None:
    raw = r.body.get("prompt")
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
        raw = raw[0]  # a batch of one
    if isinstance(raw, str):
        req.text = raw
    elif isinstance(raw, list) and raw and all(isinstance(t, int) and t >= 0 for t in raw):
        req.token_ids.ids.extend(raw)
    elif isinstance(raw, list) and len(raw) > 1:
        r.fail("prompt", "one prompt per request (send several requests for a batch)")
    else:
        r.fail("prompt", "a string or a list of token ids is required")


def _stop(r: _Reader, sampling: pb.SamplingParams) -> None:
    stop = r.body.get("stop")
    if stop is None:
        return
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        r.fail("stop", "must be a string or a list of strings")
        return
    sampling.stop.extend(stops)


def to_generate_request(
    body: Any, *, chat: bool, request_id: str, priority_header: str
) -> OpenAIRequest:
    """Raises InvalidRequest naming the OpenAI parameters at fault."""
    if not isinstance(body, dict):
        raise InvalidRequest([FieldViolation("body", "must be a JSON object")])
    r = _Reader(body)
    req = pb.GenerateRequest(model=r.string("model"), request_id=request_id)
    if chat:
        _messages(r, req)
    else:
        _prompt(r, req)
    for name, allowed in _DEFAULT_ONLY.items():
        if body.get(name) not in allowed:
            r.fail(name, f"only {allowed[-1]!r} is supported")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        r.fail("response_format", "only {'type': 'text'} is supported")
    s = req.sampling
    # The newer name wins (OpenAI deprecated max_tokens for chat).
    name = "max_tokens"
    if body.get("max_completion_tokens") is not None:
        name = "max_completion_tokens"
    max_tokens = r.integer(name)
    if max_tokens is not None:
        if not 1 <= max_tokens < 2**31:
            r.fail(name, f"must be >= 1, got {max_tokens}")
        else:
            s.max_tokens = max_tokens
    for param, proto_name in _FLOAT_PARAMS.items():
        value = r.number(param)
        if value is not None:
            setattr(s, proto_name, value)
    for param, proto_name in _INT_PARAMS.items():
        iv = r.integer(param)
        if iv is not None:
            if abs(iv) >= 2**31:
                r.fail(param, "out of range")
            else:
                setattr(s, proto_name, iv)
    seed = r.integer("seed")
    if seed is not None:
        if not 0 <= seed < 2**64:
            r.fail("seed", f"must be in [0, 2^64), got {seed}")
        else:
            s.seed = seed
    _stop(r, s)
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None:
        if isinstance(stop_ids, list) and all(
            isinstance(t, int) and 0 <= t < 2**32 for t in stop_ids
        ):
            s.stop_token_ids.extend(stop_ids)
        else:
            r.fail("stop_token_ids", "must be a list of token ids")
    s.ignore_eos = r.boolean("ignore_eos")
    r.string("user")  # accepted (the tenant comes from the API key, never from here)
    priority = r.string("priority") or priority_header
    if priority:
        if priority not in _PRIORITIES:
            r.fail("priority", f"must be one of {', '.join(_PRIORITIES)}, got {priority!r}")
        else:
            req.priority = _PRIORITIES[priority]
    stream = r.boolean("stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict) or not isinstance(
            options.get("include_usage", False), bool
        ):
            r.fail("stream_options", "must be an object like {'include_usage': true}")
        elif not stream:
            r.fail("stream_options", "only allowed when stream is true")
        else:
            include_usage = bool(options.get("include_usage", False))
    if r.violations:
        raise InvalidRequest(r.violations)
    return OpenAIRequest(req, chat=chat, stream=stream, include_usage=include_usage)
