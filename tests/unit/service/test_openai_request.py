"""OpenAI bodies → GenerateRequest: the OpenAI shapes, named in every error."""

from __future__ import annotations

from typing import Any

import pytest
from fairgate.v1 import inference_pb2 as pb

from service.errors import InvalidRequest
from service.openai_request import to_generate_request


def convert(body: Any, *, chat: bool = False, priority_header: str = "") -> Any:
    return to_generate_request(body, chat=chat, request_id="r", priority_header=priority_header)


def fields_of(body: Any, *, chat: bool = False) -> list[str]:
    with pytest.raises(InvalidRequest) as err:
        convert(body, chat=chat)
    return [v.field for v in err.value.violations]


@pytest.mark.parametrize(
    ("prompt", "text", "ids"),
    [("hi", "hi", []), ([5, 6], "", [5, 6]), (["hi"], "hi", []), ([[7, 8]], "", [7, 8])],
)
def test_prompt_forms(prompt: Any, text: str, ids: list[int]) -> None:
    req = convert({"prompt": prompt}).request
    assert req.text == text and list(req.token_ids.ids) == ids


def test_sampling_and_options() -> None:
    out = convert(
        {
            "model": "m",
            "prompt": "hi",
            "max_tokens": 5,
            "max_completion_tokens": 7,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
            "seed": 9,
            "stop": "END",
            "stop_token_ids": [2],
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        priority_header="batch",
    )
    req: pb.GenerateRequest = out.request
    s = req.sampling
    assert (req.model, req.request_id, req.priority) == ("m", "r", pb.PRIORITY_CLASS_BATCH)
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.seed) == (7, 0.0, 0.5, 3, 9)
    assert s.HasField("temperature")  # 0 is greedy, not "unset"
    assert list(s.stop) == ["END"] and list(s.stop_token_ids) == [2] and s.ignore_eos
    assert out.stream and out.include_usage and not out.chat


def test_chat_messages_with_text_parts() -> None:
    req = convert(
        {
            "messages": [
                {"role": "system", "content": None},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ]
        },
        chat=True,
    ).request
    assert [(m.role, m.content) for m in req.messages.messages] == [("system", ""), ("user", "ab")]


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"prompt": ["a", "b"]}, ["prompt"]),
        ({"prompt": 3}, ["prompt"]),
        ({"prompt": "x", "temperature": "hot"}, ["temperature"]),
        ({"prompt": "x", "max_tokens": True}, ["max_tokens"]),
        ({"prompt": "x", "max_tokens": 0}, ["max_tokens"]),
        ({"prompt": "x", "n": 3, "logprobs": 2, "echo": True}, ["n", "logprobs", "echo"]),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, ["stream_options"]),
        ({"prompt": "x", "stop": [1]}, ["stop"]),
        ({"prompt": "x", "seed": -1}, ["seed"]),
        ({"prompt": "x", "priority": "vip"}, ["priority"]),
        ({"prompt": "x", "response_format": {"type": "json_object"}}, ["response_format"]),
        ([1, 2], ["body"]),
    ],
)
def test_errors_name_the_openai_parameter(body: Any, fields: list[str]) -> None:
    assert fields_of(body) == fields


def test_chat_errors() -> None:
    assert fields_of({"messages": "hi"}, chat=True) == ["messages"]
    assert fields_of({"messages": [{"content": "no role"}]}, chat=True) == ["messages[0].role"]
    bad_part = {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}
    assert fields_of(bad_part, chat=True) == ["messages[0].content[0]"]
    assert fields_of(
        {"messages": [{"role": "user", "content": "x"}], "tools": [{}]}, chat=True
    ) == ["tools"]
