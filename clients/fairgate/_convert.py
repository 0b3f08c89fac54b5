"""Client-side conversion between plain Python values and the v1 protos."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from fairgate.types import Completion, Delta, ModelInfo, Result, Timings, Usage
from fairgate.v1 import inference_pb2 as pb

PRIORITIES = {
    "interactive": pb.PRIORITY_CLASS_INTERACTIVE,
    "batch": pb.PRIORITY_CLASS_BATCH,
    "": pb.PRIORITY_CLASS_UNSPECIFIED,
}
FINISH_NAMES = {
    pb.FINISH_REASON_UNSPECIFIED: "unspecified",
    pb.FINISH_REASON_STOP: "stop",
    pb.FINISH_REASON_LENGTH: "length",
    pb.FINISH_REASON_CANCELLED: "cancelled",
    pb.FINISH_REASON_ERROR: "error",
}


# A text, token ids, or chat messages ({"role": ..., "content": ...}) that the
# server renders with the model's chat template.
Prompt = str | Sequence[int] | Sequence[Mapping[str, str]]


def build_request(
    prompt: Prompt,
    *,
    model: str = "",
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    stop: Sequence[str] = (),
    seed: int | None = None,
    ignore_eos: bool = False,
    priority: str = "",
    request_id: str = "",
    return_token_ids: bool = False,
) -> pb.GenerateRequest:
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {sorted(p for p in PRIORITIES if p)}")
    req = pb.GenerateRequest(
        model=model,
        request_id=request_id,
        priority=PRIORITIES[priority],
        return_token_ids=return_token_ids,
    )
    if isinstance(prompt, str):
        req.text = prompt
    elif prompt and isinstance(prompt[0], Mapping):
        messages = cast("Sequence[Mapping[str, str]]", prompt)
        req.messages.messages.extend(
            pb.ChatMessage(role=m["role"], content=m.get("content", "")) for m in messages
        )
    else:
        req.token_ids.ids.extend(cast("Sequence[int]", prompt))
    s = req.sampling
    if max_tokens is not None:
        s.max_tokens = max_tokens
    if temperature is not None:
        s.temperature = temperature
    if top_p is not None:
        s.top_p = top_p
    if top_k is not None:
        s.top_k = top_k
    if seed is not None:
        s.seed = seed
    s.stop.extend(stop)
    s.ignore_eos = ignore_eos
    return req


def convert_response(resp: pb.GenerateResponse) -> Delta | Result:
    if resp.HasField("delta"):
        d = resp.delta
        return Delta(text=d.text, index=d.index, token_ids=tuple(d.token_ids))
    r = resp.result
    t = r.timings
    return Result(
        request_id=r.request_id,
        model=r.model,
        finish_reason=FINISH_NAMES.get(r.finish_reason, "unspecified"),
        stop_matched=r.stop_matched,
        usage=Usage(
            prompt_tokens=r.usage.prompt_tokens,
            completion_tokens=r.usage.completion_tokens,
            cached_tokens=r.usage.cached_tokens,
            total_tokens=r.usage.total_tokens,
        ),
        timings=Timings(
            queue_wait_s=t.queue_wait.ToNanoseconds() / 1e9,
            time_to_first_token_s=(
                t.time_to_first_token.ToNanoseconds() / 1e9
                if t.HasField("time_to_first_token")
                else None
            ),
            total_s=t.total.ToNanoseconds() / 1e9,
        ),
        message=r.message,
    )


def convert_model(m: pb.ModelInfo) -> ModelInfo:
    return ModelInfo(
        name=m.name,
        max_context_tokens=m.max_context_tokens,
        max_output_tokens=m.max_output_tokens,
        engine=m.engine,
        exact_token_counts=m.exact_token_counts,
        vocab_size=m.vocab_size,
        is_default=m.is_default,
    )


def call_metadata(tenant: str | None, api_key: str | None) -> tuple[tuple[str, str], ...]:
    md: list[tuple[str, str]] = []
    if api_key:
        md.append(("authorization", f"Bearer {api_key}"))
    if tenant:
        md.append(("x-fairgate-tenant", tenant))
    return tuple(md)


class CompletionBuilder:
    """Accumulates a Generate stream into a Completion (shared by both clients)."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._ids: list[int] = []
        self._result: Result | None = None

    def add(self, ev: Delta | Result) -> None:
        if isinstance(ev, Delta):
            self._parts.append(ev.text)
            self._ids.extend(ev.token_ids)
        else:
            self._result = ev

    def build(self) -> Completion:
        if self._result is None:
            raise RuntimeError("stream ended without a result")
        return Completion(
            text="".join(self._parts), result=self._result, token_ids=tuple(self._ids)
        )
