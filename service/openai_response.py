"""OpenAI response bodies and SSE chunks for one generation.

A streamed chunk differs from the previous one only in its text, so each
stream renders the constant parts once and per chunk encodes only the text
(the HTTP front's cost per token is what decides how many GPUs one process
can front).
"""

from __future__ import annotations

import json
import time
from typing import Any

from service.engines.protocol import FinishKind
from service.generation import Outcome

FINISH_REASONS = {
    FinishKind.STOP: "stop",
    FinishKind.LENGTH: "length",
    # SGLang's name for a request the engine aborted after some output.
    FinishKind.ABORT: "abort",
    FinishKind.ERROR: "error",
}
DONE = b"data: [DONE]\n\n"


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def usage(o: Outcome) -> dict[str, Any]:
    return {
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
    }


class ResponseWriter:
    """The bodies of one chat (`chat=True`) or text completion."""

    def __init__(self, *, chat: bool, request_id: str, model: str, include_usage: bool) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + request_id
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        obj = "chat.completion.chunk" if chat else "text_completion"
        usage_null = ',"usage":null' if include_usage else ""
        head = (
            f'data: {{"id":{_dumps(self.id)},"object":"{obj}","created":{self.created},'
            f'"model":{_dumps(model)},"choices":[{{"index":0,'
        )
        self._head = head
        self._usage_null = usage_null
        if chat:
            self._text_head = (head + '"delta":{"content":').encode()
            self._text_tail = (
                '},"logprobs":null,"finish_reason":null}]' + usage_null + "}\n\n"
            ).encode()
        else:
            self._text_head = (head + '"text":').encode()
            self._text_tail = (
                ',"logprobs":null,"finish_reason":null}]' + usage_null + "}\n\n"
            ).encode()

    def first_chunk(self) -> bytes | None:
        """Chat streams open with the assistant's role (OpenAI, vLLM, SGLang all do)."""
        if not self.chat:
            return None
        return (
            self._head
            + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
            + self._usage_null
            + "}\n\n"
        ).encode()

    def text_chunk(self, text: str) -> bytes:
        return self._text_head + _dumps(text).encode() + self._text_tail

    def final_chunks(self, o: Outcome) -> bytes:
        finish = _dumps(FINISH_REASONS[o.finish])
        body = '"delta":{}' if self.chat else '"text":""'
        out = (
            f'{self._head}{body},"logprobs":null,"finish_reason":{finish}}}]'
            f"{self._usage_null}}}\n\n"
        )
        if self.include_usage:
            out += (
                f'data: {{"id":{_dumps(self.id)},"object":'
                f'"{"chat.completion.chunk" if self.chat else "text_completion"}",'
                f'"created":{self.created},"model":{_dumps(self.model)},"choices":[],'
                f'"usage":{_dumps(usage(o))}}}\n\n'
            )
        return out.encode() + DONE

    def complete(self, text: str, o: Outcome) -> dict[str, Any]:
        """The non-streamed body."""
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = FINISH_REASONS[o.finish]
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(o),
        }


def error_event(body: dict[str, Any]) -> bytes:
    """A failure after the stream started (the status line is already sent)."""
    return b"data: " + _dumps(body).encode() + b"\n\n" + DONE
