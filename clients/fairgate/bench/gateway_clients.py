"""The three ways `fairgate bench gateway` streams one request, each as cheaply
as the protocol allows (the load generator shares the machine with the gateway):

- `sglang`: SGLang's native `POST /generate` SSE, straight to a worker (direct)
  or through a gateway that proxies it (smg);
- `grpc`: fairgate's `Generate` through the generated stub;
- `openai`: `POST /v1/completions` with `stream: true` (fairgate's HTTP front).

Each returns a `Sample`: time to the first streamed message, the gaps between
streamed messages (inter-token latency as `vllm bench serve` counts it: a
message may carry several tokens), output tokens (the engine's final count),
and whether it finished normally. The first
message is taken as the first token: all three send one only once output exists.
fairgate's gRPC result also says what the gateway measured itself (its TTFT
from the handler's start, and the wait in its fair queue), so the benchmark can
tell time spent before fairgate's handler ran (gRPC accepting the call) from
time in its queue.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from itertools import cycle

import aiohttp
import grpc

from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc

PROMPT_IDS = [300 + i for i in range(16)]


@dataclass(slots=True)
class Sample:
    ttft_s: float
    tokens: int
    ok: bool
    error: str = ""
    # fairgate gRPC only (else NaN): its own TTFT (handler start to first token
    # out) and fair-queue wait, from the result's timings.
    gateway_ttft_s: float = math.nan
    queue_wait_s: float = math.nan
    # Gaps between consecutive streamed messages (s).
    itl_s: list[float] = field(default_factory=list)


Caller = Callable[[int], Awaitable[Sample]]


class _Gaps:
    """The times between consecutive streamed messages of one request."""

    __slots__ = ("_last_s", "gaps_s")

    def __init__(self) -> None:
        self._last_s = math.nan
        self.gaps_s: list[float] = []

    def message(self) -> float:
        """A message arrived: record the gap since the previous one; return now."""
        now_s = time.perf_counter()
        if self._last_s == self._last_s:  # not NaN: not the first
            self.gaps_s.append(now_s - self._last_s)
        self._last_s = now_s
        return now_s


def _failed(start_s: float, error: str) -> Sample:
    return Sample(time.perf_counter() - start_s, 0, False, error)


class SglangClient:
    """Round-robin over `urls` (several workers direct, or one gateway)."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._urls = cycle([u.rstrip("/") + "/generate" for u in urls])
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=120),
        )

    async def __call__(self, tokens: int) -> Sample:
        body = {
            "input_ids": PROMPT_IDS,
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
            "stream": True,
        }
        start = time.perf_counter()
        first: float | None = None
        last = b""
        gaps = _Gaps()
        try:
            async with self._session.post(next(self._urls), json=body) as r:
                if r.status != 200:
                    return _failed(start, f"HTTP_{r.status}")
                async for line in r.content:
                    if not line.startswith(b"data:"):
                        continue
                    if line.startswith(b"data: [DONE]"):
                        break
                    now = gaps.message()
                    if first is None:
                        first = now
                    last = line
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _failed(start, type(exc).__name__)
        if first is None:
            return _failed(start, "NO_OUTPUT")
        meta = json.loads(last[5:])["meta_info"]
        finish = (meta.get("finish_reason") or {}).get("type")
        ok = finish == "length"
        return Sample(first - start, int(meta["completion_tokens"]), ok, "", itl_s=gaps.gaps_s)

    async def aclose(self) -> None:
        await self._session.close()


class GrpcClient:
    """Calls round-robin over `channels` channels, each its own connection (several
    server processes sharing a port split connections, not calls)."""

    def __init__(self, address: str, channels: int = 1) -> None:
        options = [("grpc.use_local_subchannel_pool", 1)] if channels > 1 else []
        self._channels = [
            grpc.aio.insecure_channel(address, options=options) for _ in range(channels)
        ]
        self._stubs = cycle([pb_grpc.InferenceServiceStub(ch) for ch in self._channels])

    async def __call__(self, tokens: int) -> Sample:
        request = pb.GenerateRequest(
            token_ids=pb.TokenIds(ids=PROMPT_IDS),
            sampling=pb.SamplingParams(max_tokens=tokens, ignore_eos=True),
        )
        start = time.perf_counter()
        first: float | None = None
        result: pb.GenerateResult | None = None
        gaps = _Gaps()
        try:
            async for resp in next(self._stubs).Generate(request):
                if resp.HasField("delta"):
                    now = gaps.message()
                    if first is None:
                        first = now
                if resp.HasField("result"):
                    result = resp.result
        except grpc.RpcError as exc:
            return _failed(start, exc.code().name)
        if first is None or result is None:
            return _failed(start, "NO_RESULT")
        ok = result.finish_reason == pb.FINISH_REASON_LENGTH
        t = result.timings
        gateway_ttft_s = (
            t.time_to_first_token.ToTimedelta().total_seconds()
            if t.HasField("time_to_first_token")
            else math.nan
        )
        return Sample(
            first - start,
            result.usage.completion_tokens,
            ok,
            "",
            gateway_ttft_s,
            t.queue_wait.ToTimedelta().total_seconds(),
            gaps.gaps_s,
        )

    async def aclose(self) -> None:
        for channel in self._channels:
            await channel.close()


# The chat prompt (`chat=True`): a few words, rendered by the server's chat template.
CHAT_PROMPT = "Tell me a long story about a fox and a dog."


class OpenAiClient:
    """`/v1/completions` with the token-id prompt, or `/v1/chat/completions` (`chat`)."""

    def __init__(self, url: str, chat: bool = False) -> None:
        self._chat = chat
        path = "/v1/chat/completions" if chat else "/v1/completions"
        self._url = url.rstrip("/") + path
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_read=120),
        )

    async def __call__(self, tokens: int) -> Sample:
        prompt: dict[str, object] = (
            {"messages": [{"role": "user", "content": CHAT_PROMPT}]}
            if self._chat
            else {"prompt": PROMPT_IDS}
        )
        body = {
            **prompt,
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = time.perf_counter()
        first: float | None = None
        usage = b""
        gaps = _Gaps()
        try:
            async with self._session.post(self._url, json=body) as r:
                if r.status != 200:
                    return _failed(start, f"HTTP_{r.status}")
                async for line in r.content:
                    if not line.startswith(b"data: {"):
                        continue
                    if b'"usage":{' in line:
                        usage = line
                        if b'"choices":[]' in line:
                            continue  # the usage-only chunk carries no token
                    if b'"content":""' in line or b'"role":"assistant","content":null' in line:
                        continue  # a chat stream's opening role-only chunk
                    now = gaps.message()
                    if first is None:
                        first = now
        except (aiohttp.ClientError, TimeoutError) as exc:
            return _failed(start, type(exc).__name__)
        if first is None or not usage:
            return _failed(start, "NO_USAGE")
        tokens_out = int(json.loads(usage[6:])["usage"]["completion_tokens"])
        return Sample(first - start, tokens_out, tokens_out == tokens, "", itl_s=gaps.gaps_s)

    async def aclose(self) -> None:
        await self._session.close()
