"""Request validation: proto in, checked domain values out, or every violation at once."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fairgate.v1 import inference_pb2 as pb

from scheduler.request import Priority
from service.chat_template import ChatMessage, ChatTemplateError
from service.engines.protocol import SamplingOptions
from service.errors import FieldViolation, InvalidRequest, UnknownModel
from service.models import ModelRegistry, ServedModel

MAX_STOP_STRINGS = 16
MAX_STOP_BYTES = 256
MAX_REQUEST_ID_CHARS = 128

_PRIORITIES = {
    pb.PRIORITY_CLASS_UNSPECIFIED: Priority.INTERACTIVE,
    pb.PRIORITY_CLASS_INTERACTIVE: Priority.INTERACTIVE,
    pb.PRIORITY_CLASS_BATCH: Priority.BATCH,
}


@dataclass(slots=True)
class GenerateParams:
    model: ServedModel
    prompt_ids: list[int]
    prompt_text: str | None
    max_tokens: int
    sampling: SamplingOptions
    priority: Priority


class _Checker:
    def __init__(self) -> None:
        self.violations: list[FieldViolation] = []

    def fail(self, field: str, description: str) -> None:
        self.violations.append(FieldViolation(field, description))

    def float_in(
        self,
        msg: pb.SamplingParams,
        name: str,
        lo: float,
        hi: float,
        default: float,
        *,
        lo_open: bool = False,
    ) -> float:
        if not msg.HasField(name):  # type: ignore[arg-type]
            return default
        value = float(getattr(msg, name))
        low_ok = value > lo if lo_open else value >= lo
        if math.isnan(value) or not low_ok or value > hi:
            bracket = "(" if lo_open else "["
            self.fail(f"sampling.{name}", f"must be in {bracket}{lo:g}, {hi:g}], got {value:g}")
            return default
        return value


def check_request_id(request_id: str, checker: _Checker) -> None:
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        checker.fail("request_id", f"at most {MAX_REQUEST_ID_CHARS} characters")
    elif request_id and not (request_id.isascii() and request_id.isprintable()):
        checker.fail("request_id", "only printable ASCII characters are allowed")


def _render_chat(msgs: pb.ChatMessages, model: ServedModel, c: _Checker) -> str | None:
    if not msgs.messages:
        c.fail("messages", "at least one message is required")
        return None
    for i, m in enumerate(msgs.messages):
        if not m.role:
            c.fail(f"messages[{i}].role", "a role is required (system, user, assistant, ...)")
    if c.violations:
        return None
    try:
        return model.chat_template.render([ChatMessage(m.role, m.content) for m in msgs.messages])
    except ChatTemplateError as exc:
        c.fail("messages", str(exc))
        return None


def _check_size(size: int, max_request_bytes: int) -> None:
    # Checked first: a huge prompt is not worth tokenizing.
    if size > max_request_bytes:
        limit = f"request is {size} bytes; the limit is {max_request_bytes} bytes"
        raise InvalidRequest([FieldViolation("text", limit)])


def _served_model(models: ModelRegistry, name: str, c: _Checker) -> ServedModel:
    """The model `name` names, or UnknownModel (with the violations found so far)."""
    model = models.resolve(name)
    if model is None:
        c.fail("model", f"unknown model {name!r}; available: {', '.join(models.names())}")
        raise UnknownModel(c.violations)
    return model


def validate_count_tokens(
    req: pb.CountTokensRequest, models: ModelRegistry, max_request_bytes: int
) -> ServedModel:
    """CountTokens: the model to count with, checked as Generate checks it."""
    _check_size(req.ByteSize(), max_request_bytes)
    return _served_model(models, req.model, _Checker())


def validate_generate(
    req: pb.GenerateRequest, models: ModelRegistry, max_request_bytes: int
) -> GenerateParams:
    _check_size(req.ByteSize(), max_request_bytes)
    c = _Checker()
    check_request_id(req.request_id, c)
    model = _served_model(models, req.model, c)

    prompt_text: str | None = None
    prompt_ids: list[int] = []
    which = req.WhichOneof("input")
    if which == "text":
        prompt_text = req.text
        if not req.text.strip():
            c.fail("text", "the prompt is empty")
        else:
            prompt_ids = model.tokenizer.encode(req.text)
    elif which == "token_ids":
        prompt_ids = list(req.token_ids.ids)
        if not prompt_ids:
            c.fail("token_ids.ids", "the prompt is empty")
        for i, tid in enumerate(prompt_ids):
            if tid >= model.vocab_size:
                c.fail(
                    f"token_ids.ids[{i}]",
                    f"token id {tid} is outside the vocabulary (size {model.vocab_size})",
                )
                break
    elif which == "messages":
        prompt_text = _render_chat(req.messages, model, c)
        if prompt_text is not None and not prompt_text.strip():
            c.fail("messages", "the rendered prompt is empty")
        elif prompt_text is not None:
            prompt_ids = model.tokenizer.encode(prompt_text)
    else:
        c.fail("text", "a prompt is required: set text, token_ids or messages")

    if req.priority not in _PRIORITIES:
        c.fail("priority", f"unknown priority class {req.priority}")
    priority = _PRIORITIES.get(req.priority, Priority.INTERACTIVE)

    s = req.sampling
    room = model.max_context_tokens - len(prompt_ids)
    if prompt_ids and room < 1:
        c.fail(
            which or "text",
            f"the prompt has {len(prompt_ids)} tokens; the model's context "
            f"is {model.max_context_tokens} tokens, leaving no room to generate",
        )
    if s.HasField("max_tokens"):
        max_tokens = s.max_tokens
        if max_tokens < 1:
            c.fail("sampling.max_tokens", f"must be >= 1, got {max_tokens}")
        elif max_tokens > model.max_output_tokens:
            c.fail("sampling.max_tokens", f"must be <= {model.max_output_tokens}, got {max_tokens}")
        elif prompt_ids and 1 <= room < max_tokens:
            c.fail(
                "sampling.max_tokens",
                f"prompt ({len(prompt_ids)} tokens) + max_tokens "
                f"({max_tokens}) exceeds the model's context of {model.max_context_tokens} "
                "tokens",
            )
    else:
        max_tokens = max(1, min(model.default_max_tokens, room))

    temperature = c.float_in(s, "temperature", 0.0, 2.0, 1.0)
    top_p = c.float_in(s, "top_p", 0.0, 1.0, 1.0, lo_open=True)
    min_p = c.float_in(s, "min_p", 0.0, 1.0, 0.0)
    frequency_penalty = c.float_in(s, "frequency_penalty", -2.0, 2.0, 0.0)
    presence_penalty = c.float_in(s, "presence_penalty", -2.0, 2.0, 0.0)
    repetition_penalty = c.float_in(s, "repetition_penalty", 0.0, 2.0, 1.0, lo_open=True)
    top_k = -1
    if s.HasField("top_k"):
        top_k = s.top_k
        if top_k == 0 or top_k < -1:
            c.fail("sampling.top_k", f"must be -1 (off) or >= 1, got {top_k}")
    min_tokens = 0
    if s.HasField("min_tokens"):
        min_tokens = s.min_tokens
        if not 0 <= min_tokens <= max_tokens:
            c.fail(
                "sampling.min_tokens", f"must be in [0, max_tokens={max_tokens}], got {min_tokens}"
            )
    if len(s.stop) > MAX_STOP_STRINGS:
        c.fail("sampling.stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(s.stop)}")
    for i, stop in enumerate(s.stop):
        if not stop:
            c.fail(f"sampling.stop[{i}]", "stop strings must not be empty")
        elif len(stop.encode()) > MAX_STOP_BYTES:
            c.fail(f"sampling.stop[{i}]", f"at most {MAX_STOP_BYTES} bytes")
    for i, tid in enumerate(s.stop_token_ids):
        if tid >= model.vocab_size:
            c.fail(f"sampling.stop_token_ids[{i}]", f"token id {tid} is outside the vocabulary")

    if c.violations:
        raise InvalidRequest(c.violations)
    return GenerateParams(
        model=model,
        prompt_ids=prompt_ids,
        prompt_text=prompt_text,
        max_tokens=max_tokens,
        sampling=SamplingOptions(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            stop=tuple(s.stop),
            stop_token_ids=tuple(s.stop_token_ids),
            seed=s.seed if s.HasField("seed") else None,
            ignore_eos=s.ignore_eos,
            min_tokens=min_tokens,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            repetition_penalty=repetition_penalty,
        ),
        priority=priority,
    )
