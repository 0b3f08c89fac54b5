"""SGLang's chunk dicts → `EngineChunk`s; shared by the HTTP and in-process adapters.

SGLang streams `{"text", "output_ids", "meta_info"}` dicts whose `text` and
`output_ids` are cumulative unless the server runs with
`--incremental-streaming-output`. `ChunkDecoder` turns either form into the
new text and token ids since the previous chunk, maps `meta_info` onto usage
and a finish reason, and rejects malformed chunks with a clear `EngineError`.

Stop strings: SGLang trims a matched stop string from the final text but may
have streamed its first characters before it knew; the decoder holds back the
last `len(longest stop) - 1` characters until the stream ends, so a stop
string is never partly sent to the client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from service.engines.protocol import EngineChunk, EngineError, EngineRequest, FinishKind

log = logging.getLogger(__name__)


class UpstreamError(EngineError):
    """The upstream engine answered with an error, malformed data, or a refusal."""


class RequestRefused(UpstreamError):
    """The engine refused this request (HTTP 4xx, an error object): not a worker fault."""


def _int(meta: dict[str, Any], key: str, default: int | None = None) -> int:
    value = meta.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        if default is not None and value is None:
            return default
        raise UpstreamError(f"malformed SGLang chunk: meta_info.{key} is {value!r}")
    return value


class ChunkDecoder:
    def __init__(self, req: EngineRequest, *, incremental: bool) -> None:
        self.req = req
        self.incremental = incremental
        self.upstream_text = ""  # all text the engine sent, reassembled
        self.upstream_id_count = 0  # token ids the engine sent
        self.emitted_chars = 0
        self.completion_tokens = 0
        self.finished = False
        self._hold = max((len(s) for s in req.sampling.stop), default=1) - 1

    def decode(self, data: Any) -> EngineChunk:
        """One parsed chunk in, the new output out. Raises EngineError."""
        if not isinstance(data, dict):
            raise UpstreamError(f"malformed SGLang chunk: expected an object, got {data!r:.200}")
        if "error" in data:
            err = data["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise RequestRefused(f"SGLang rejected the request: {msg}", retryable=False)
        meta = data.get("meta_info")
        text = data.get("text", "")
        ids = data.get("output_ids", [])
        if not isinstance(meta, dict) or not isinstance(text, str) or not isinstance(ids, list):
            raise UpstreamError(
                f"malformed SGLang chunk (text/output_ids/meta_info): {data!r:.200}"
            )
        finish = self._finish(meta.get("finish_reason"))
        # Per token: a plain int takes no call; anything else goes through _int's checks.
        get = meta.get
        completion = get("completion_tokens")
        if type(completion) is not int:
            completion = _int(meta, "completion_tokens")
        prompt = get("prompt_tokens")
        if type(prompt) is not int:
            prompt = _int(meta, "prompt_tokens")
        cached = get("cached_tokens")
        if type(cached) is not int:
            cached = _int(meta, "cached_tokens", 0)
        retractions = get("num_retractions")
        if type(retractions) is not int:
            retractions = _int(meta, "num_retractions", 0)
        if self.incremental:
            self.upstream_text += text
            new_ids = ids  # parsed for this chunk alone: no copy needed
        else:
            # SGLang trims a matched stop string from the final cumulative text.
            trimmed = finish is not None and self.upstream_text.startswith(text)
            if not text.startswith(self.upstream_text) and not trimmed:
                raise UpstreamError("malformed SGLang stream: cumulative text went backwards")
            self.upstream_text = text
            new_ids = ids[self.upstream_id_count :]
        self.upstream_id_count += len(new_ids)
        for t in new_ids:  # usually one id: a plain loop is the cheapest check
            if type(t) is not int:
                raise UpstreamError("malformed SGLang chunk: output_ids must be integers")
        if completion < self.completion_tokens:
            raise UpstreamError("malformed SGLang stream: completion_tokens went backwards")
        self.completion_tokens = completion
        # Text safe to send: everything up to the hold-back margin, all of it at the end.
        end = (
            len(self.upstream_text) if finish is not None else len(self.upstream_text) - self._hold
        )
        new_text = ""
        if end > self.emitted_chars:
            new_text = self.upstream_text[self.emitted_chars : end]
            self.emitted_chars = end
        chunk = EngineChunk(
            text=new_text,
            token_ids=new_ids,
            completion_tokens=completion,
            prompt_tokens=prompt,
            cached_tokens=cached,
            retractions=retractions,
        )
        if finish is not None:
            self.finished = True
            chunk.finish, chunk.stop_matched, chunk.message = finish
        return chunk

    def _finish(self, reason: Any) -> tuple[FinishKind, str, str] | None:
        if reason is None:
            return None
        if not isinstance(reason, dict) or not isinstance(reason.get("type"), str):
            raise UpstreamError(f"malformed SGLang finish_reason: {reason!r:.200}")
        kind = reason["type"]
        if kind == "stop":
            matched = reason.get("matched")
            if isinstance(matched, str):
                return FinishKind.STOP, matched, ""
            # A token id: report it only when the client asked for it (else it is EOS).
            if isinstance(matched, int) and matched in self.req.sampling.stop_token_ids:
                return FinishKind.STOP, str(matched), ""
            return FinishKind.STOP, "", ""
        if kind == "length":
            return FinishKind.LENGTH, "", ""
        if kind == "abort":
            message = str(reason.get("message") or "aborted by SGLang")
            status = reason.get("status_code")
            if isinstance(status, int) and status >= 400 and self.completion_tokens == 0:
                # Refused before any token (queue full: 503; invalid: 400): nothing was
                # streamed, so a 5xx may be retried elsewhere.
                raise UpstreamError(
                    f"SGLang aborted the request ({status}): {message}", retryable=status >= 500
                )
            return FinishKind.ABORT, "", message
        raise UpstreamError(f"unknown SGLang finish_reason type {kind!r}")


def merge_chunks(first: EngineChunk, then: EngineChunk) -> EngineChunk:
    """`then` appended to `first` (in place): one chunk for both."""
    first.text += then.text
    first.token_ids.extend(then.token_ids)
    first.completion_tokens = then.completion_tokens
    first.prompt_tokens = then.prompt_tokens
    first.cached_tokens = then.cached_tokens
    first.retractions = then.retractions
    first.finish, first.stop_matched, first.message = then.finish, then.stop_matched, then.message
    return first


def sampling_params(req: EngineRequest) -> dict[str, Any]:
    """EngineRequest → SGLang `sampling_params` (only non-default fields)."""
    s = req.sampling
    params: dict[str, Any] = {
        "max_new_tokens": req.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
    }
    if s.min_p:
        params["min_p"] = s.min_p
    if s.stop:
        params["stop"] = list(s.stop)
    if s.stop_token_ids:
        params["stop_token_ids"] = list(s.stop_token_ids)
    if s.seed is not None:
        params["sampling_seed"] = s.seed
    if s.ignore_eos:
        params["ignore_eos"] = True
    if s.min_tokens:
        params["min_new_tokens"] = s.min_tokens
    if s.frequency_penalty:
        params["frequency_penalty"] = s.frequency_penalty
    if s.presence_penalty:
        params["presence_penalty"] = s.presence_penalty
    if s.repetition_penalty != 1.0:
        params["repetition_penalty"] = s.repetition_penalty
    return params


def generate_args(
    req: EngineRequest, rid: str, send_priority: bool, text_key: str
) -> dict[str, Any]:
    """What SGLang's generate gets for one attempt of `req` (the HTTP `/generate`
    body, `Engine.async_generate`'s keywords): streamed, under `rid`; the prompt
    as the client sent it (text: SGLang's tokenizer is the exact one; named
    `text_key`, "text" over HTTP, "prompt" in process); a priority only where
    the server schedules by it (`priority_options`)."""
    args: dict[str, Any] = {"rid": rid, "sampling_params": sampling_params(req), "stream": True}
    if req.prompt_text is not None:
        args[text_key] = req.prompt_text
    else:
        args["input_ids"] = req.prompt_token_ids
    if send_priority:
        args["priority"] = req.priority
    return args


# The vocabulary assumed when a server (or an in-process engine) does not say.
DEFAULT_VOCAB_SIZE = 32000

# SGLang's --priority-scheduling-preemption-threshold when a server omits it.
SGLANG_PREEMPTION_THRESHOLD = 10


def priority_options(get: Callable[[str], Any]) -> tuple[bool, int | None]:
    """(send priorities?, preemption threshold or None) from SGLang's server args.

    Priorities go only to a server that schedules by them (to one that does not
    they may abort the request) and only where larger means sooner: with
    --schedule-low-priority-values-first fairgate's numbers would do the opposite
    (and a flood's request would preempt a light tenant's), so none are sent."""
    if get("enable_priority_scheduling") is not True:
        return False, None
    if get("schedule_low_priority_values_first") is True:
        log.warning(
            "SGLang runs --schedule-low-priority-values-first: fairgate sends no priorities"
        )
        return False, None
    if get("disable_priority_preemption") is True:
        return True, None
    threshold = get("priority_scheduling_preemption_threshold")
    return True, threshold if isinstance(threshold, int) else SGLANG_PREEMPTION_THRESHOLD


def served_model(get: Callable[[str], Any]) -> str:
    """The model name a server answers to, from its server args (its path when it
    was given no name)."""
    return str(get("served_model_name") or get("model_path") or "")


def incremental_output(get: Callable[[str], Any]) -> bool | None:
    """Whether the server streams only each chunk's new tokens (None: it does not
    say, and the caller keeps its default)."""
    inc = get("incremental_streaming_output")
    return inc if isinstance(inc, bool) else None


def find_key(info: dict[str, Any], key: str) -> Any:
    """A server-info field, at the top level or one nested record down."""
    if key in info:
        return info[key]
    for value in info.values():
        if isinstance(value, dict) and key in value:
            return value[key]
    return None
