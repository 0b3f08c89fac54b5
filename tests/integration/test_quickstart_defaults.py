"""A newcomer's first calls: `fairgate serve` on the embedded defaults (no FAIRGATE_*
variable, only the ports, on loopback port 0 so runs do not collide), then the
official `openai` SDK, streamed and not, on the simulated engine. One server
for the module."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest
from fairgate.sync import Client


@dataclass(frozen=True)
class Served:
    address: str  # gRPC host:port
    base_url: str  # the OpenAI API


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAIRGATE_", "OTEL_"))}
    # Port 0 rather than the default ports; everything else as shipped.
    command = [sys.executable, "-m", "fairgate.cli.main", "serve"]
    command += ["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        line = proc.stdout.readline() if ready else ""
        found = re.search(r"listening on (\S+), OpenAI API on (\S+) ", line)
        assert found, f"no announcement: {line!r}"
        yield Served(found.group(1), found.group(2))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stdout.close()


def _oai(served: Served) -> openai.OpenAI:
    # Any key: a server that issued none takes SDKs' placeholder keys.
    return openai.OpenAI(base_url=served.base_url, api_key="EMPTY", max_retries=0)


def test_openai_sdk_streams_a_chat_completion(served: Served) -> None:
    with _oai(served) as oai:
        (model,) = oai.models.list().data
        stream = oai.chat.completions.create(
            model=model.id,
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Say hello."},
            ],
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    usage = chunks[-1].usage
    assert text.strip() and finish[-1] == "length"
    assert usage is not None and usage.completion_tokens == 12
    # The conversation went through the default (ChatML) template.
    rendered = (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSay hello.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with Client(served.address) as grpc_client:
        assert usage.prompt_tokens == grpc_client.count_tokens(rendered)[0]


def test_openai_sdk_chat_completion_not_streamed(served: Served) -> None:
    with _oai(served) as oai:
        chat = oai.chat.completions.create(
            model="", messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 5


def test_simulated_text_follows_seed_and_temperature(served: Served) -> None:
    def text(**sampling: float) -> str:
        with _oai(served) as oai:
            done = oai.completions.create(model="", prompt="Once", max_tokens=8, **sampling)  # type: ignore[call-overload]
        return str(done.choices[0].text)

    assert text(seed=7) == text(seed=7)
    assert text(seed=7) != text(seed=8)
    assert text(temperature=0) == text(temperature=0)
    assert len({text(temperature=1.0) for _ in range(3)}) == 3
