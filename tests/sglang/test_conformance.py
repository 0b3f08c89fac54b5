"""Wire conformance: the same requests to `fairgate sim-server` and to the real SGLang
server, compared by shape (status, content type, keys, JSON types, event order).

Values (text, ids, timings) differ by design: the stand-in's model is not the
tiny Llama. What the stand-in does not do at all is listed in docs/sglang.md.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from fairgate.bench.sglang_cpu import RealSglang

from tests.helpers import eventually
from tests.sglang.wire import Answer, call, shape
from tests.sglang_helpers import StartSim

Case = Callable[[aiohttp.ClientSession, str], Awaitable[Answer]]
GREEDY = {"temperature": 0.0}


def gen(sampling: dict[str, Any], stream: bool = False, **extra: Any) -> Case:
    body = {"text": "hello", "sampling_params": sampling, "stream": stream, **extra}

    async def run(s: aiohttp.ClientSession, url: str) -> Answer:
        return await call(s, "POST", url + "/generate", body=body)

    return run


def get(path: str) -> Case:
    async def run(s: aiohttp.ClientSession, url: str) -> Answer:
        return await call(s, "GET", url + path)

    return run


async def _probe(s: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    answer = await gen({"max_new_tokens": 16, **GREEDY})(s, url)
    assert answer.status == 200, answer
    body: dict[str, Any] = answer.body
    return body


def stop_string() -> Case:
    async def run(s: aiohttp.ClientSession, url: str) -> Answer:
        text = (await _probe(s, url))["text"]
        stop = next(w for w in text.split(" ")[1:] if w.strip())
        return await gen({"max_new_tokens": 16, "stop": [stop], **GREEDY})(s, url)

    return run


def stop_token() -> Case:
    async def run(s: aiohttp.ClientSession, url: str) -> Answer:
        ids = (await _probe(s, url))["output_ids"]
        return await gen({"max_new_tokens": 16, "stop_token_ids": [ids[3]], **GREEDY})(s, url)

    return run


def too_long(stream: bool) -> Case:
    async def run(s: aiohttp.ClientSession, url: str) -> Answer:
        models = await call(s, "GET", url + "/v1/models")
        context = models.body["data"][0]["max_model_len"]
        body = {"input_ids": [5] * (context + 50), "sampling_params": {"max_new_tokens": 4}}
        return await call(s, "POST", url + "/generate", body={**body, "stream": stream})

    return run


def at_input_limit(stream: bool) -> Case:
    """A prompt of max_req_input_len tokens: under the context, over what SGLang takes."""

    async def run(s: aiohttp.ClientSession, url: str) -> Answer:
        info = await call(s, "GET", url + "/server_info")
        n = info.body["max_req_input_len"]
        body = {"input_ids": [5] * n, "sampling_params": {"max_new_tokens": 1}, "stream": stream}
        return await call(s, "POST", url + "/generate", body=body)

    return run


def aborted(stream: bool) -> Case:
    async def run(s: aiohttp.ClientSession, url: str) -> Answer:
        rid = f"conf-abort-{stream}"
        body = {
            "rid": rid,
            "text": "hello",
            "sampling_params": {"max_new_tokens": 1500, "ignore_eos": True},
            "stream": stream,
        }
        task = asyncio.create_task(call(s, "POST", url + "/generate", body=body))
        for _ in range(200):  # until SGLang runs it
            loads = await call(s, "GET", url + "/v1/loads")
            if loads.body["loads"][0].get("num_running_reqs"):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        reply = await call(s, "POST", url + "/abort_request", body={"rid": rid})
        assert (reply.status, reply.body) == (200, ""), reply
        return await task

    return run


def post(path: str, body: Any = None, raw: bytes | None = None) -> Case:
    async def run(s: aiohttp.ClientSession, url: str) -> Answer:
        return await call(s, "POST", url + path, body=body, raw=raw)

    return run


CASES: dict[str, Case] = {
    "stream-cumulative": gen({"max_new_tokens": 6, **GREEDY}, stream=True),
    "stream-with-rid": gen({"max_new_tokens": 3, **GREEDY}, stream=True, rid="conf-rid-1"),
    "non-stream-length": gen({"max_new_tokens": 16, **GREEDY}),
    "stop-string": stop_string(),
    "stop-token-id": stop_token(),
    "max-new-tokens-0": gen({"max_new_tokens": 0, **GREEDY}),
    "bad-max-new-tokens": gen({"max_new_tokens": -1}),
    "bad-max-new-tokens-stream": gen({"max_new_tokens": -1}, stream=True),
    "bad-temperature": gen({"max_new_tokens": 4, "temperature": -1}),
    "bad-top-p": gen({"max_new_tokens": 4, "top_p": 0}),
    "bad-top-k": gen({"max_new_tokens": 4, "top_k": 0}),
    "no-prompt": post("/generate", body={"sampling_params": {"max_new_tokens": 4}}),
    "invalid-json": post("/generate", raw=b'{"text": "hello",'),
    "too-long": too_long(stream=False),
    "too-long-stream": too_long(stream=True),
    "at-input-limit": at_input_limit(stream=False),
    "at-input-limit-stream": at_input_limit(stream=True),
    "abort-stream": aborted(stream=True),
    "abort-non-stream": aborted(stream=False),
    "abort-unknown-rid": post("/abort_request", body={"rid": "does-not-exist"}),
    "health": get("/health"),
    "health-generate": get("/health_generate"),
    "v1-models": get("/v1/models"),
    "v1-loads": get("/v1/loads"),
    "v1-server-info": get("/v1/server_info"),
}


SAME_MESSAGE = {"bad-max-new-tokens", "bad-temperature", "bad-top-p", "bad-top-k", "no-prompt"}


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in SGLang" for k in a.keys() - b.keys()]
        out += [f"{path}.{k}: only in the stand-in" for k in b.keys() - a.keys()]
        for k in a.keys() & b.keys():
            out += _diff(a[k], b[k], f"{path}.{k}")
        return out
    if a == "null":
        return []  # SGLang leaves it unset here (e.g. decode_moments before any decode)
    if isinstance(a, list) and isinstance(b, list) and not (a and b):
        return []  # an empty list fits a list of anything
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _diff(x, y, f"{path}[{i}]")
        ]
    return [] if a == b else [f"{path}: SGLang {a!r} vs stand-in {b!r}"]


@pytest.mark.parametrize("case", list(CASES))
async def test_same_shape_as_sglang(sglang_a: RealSglang, start_sim: StartSim, case: str) -> None:
    stand_in = await start_sim(time_scale=1.0, kv_capacity_tokens=16384)
    async with aiohttp.ClientSession() as s:
        real = await CASES[case](s, sglang_a.url)
        sim = await CASES[case](s, stand_in.url)
    differences = _diff(real.shape(), sim.shape())
    assert not differences, "\n".join([case, *differences, json.dumps(real.body)[:1500]])
    if case in SAME_MESSAGE:
        assert sim.body == real.body  # SGLang's own words


async def test_server_info_keys_the_stand_in_has_are_sglangs(
    sglang_a: RealSglang, start_sim: StartSim
) -> None:
    stand_in = await start_sim()
    async with aiohttp.ClientSession() as s:
        real = await call(s, "GET", sglang_a.url + "/server_info")
        sim = await call(s, "GET", stand_in.url + "/server_info")
        real_model = await call(s, "GET", sglang_a.url + "/model_info")
        sim_model = await call(s, "GET", stand_in.url + "/model_info")
    assert real.status == sim.status == 200
    # SGLang's answer has ~556 keys (every server arg); the stand-in has the ones
    # a client reads, each with SGLang's type (null where SGLang leaves it unset).
    assert _subset(shape(real.body), shape(sim.body)) == []
    assert _subset(shape(real_model.body), shape(sim_model.body)) == []


def _subset(real: Any, sim: Any, path: str = "") -> list[str]:
    """Where the stand-in's shape is not part of SGLang's."""
    if isinstance(real, dict) and isinstance(sim, dict):
        out = [f"{path}.{k}: not in SGLang" for k in sim.keys() - real.keys()]
        return out + [
            d for k in sim.keys() & real.keys() for d in _subset(real[k], sim[k], f"{path}.{k}")
        ]
    if isinstance(real, list) and isinstance(sim, list):
        return _subset(real[0], sim[0], f"{path}[0]") if real and sim else []
    return [] if "null" in (real, sim) or real == sim else [f"{path}: {real!r} vs {sim!r}"]


# -- the prefix cache: the same story told to both, cached_tokens compared ----------


async def _cached(
    s: aiohttp.ClientSession, url: str, ids: list[int], n: int = 4
) -> tuple[int, list[int]]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}
    answer = await call(s, "POST", url + "/generate", body=body)
    assert answer.status == 200, answer
    meta = answer.body["meta_info"]
    assert meta["prompt_tokens"] == len(ids)
    return meta["cached_tokens"], answer.body["output_ids"]


async def _cached_while_decoding(s: aiohttp.ClientSession, url: str, ids: list[int]) -> int:
    """The same prompt again while its first request decodes (after its prefill)."""
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 400, "ignore_eos": True},
        "stream": True,
    }
    async with s.post(url + "/generate", json=body) as first:
        async for line in first.content:
            if line.startswith(b"data: {"):  # first token: the prompt is prefilled
                break
        twin, _ = await _cached(s, url, ids)
        await first.read()
    return twin


async def _flush(s: aiohttp.ClientSession, url: str) -> None:
    async def flushed() -> bool:  # refused while another test's request still runs
        return (await call(s, "POST", url + "/flush_cache")).status == 200

    await eventually(flushed, timeout_s=30, what="an idle server to flush its cache")


async def prefix_story(s: aiohttp.ClientSession, url: str) -> dict[str, int]:
    """cached_tokens along a fixed story; ids below the tiny model's 474."""
    rng = random.Random(23)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 400) for _ in range(n)]

    await _flush(s, url)
    seen: dict[str, int] = {}
    a = ids(200)
    seen["first"] = (await _cached(s, url, a))[0]
    seen["same again"] = (await _cached(s, url, a))[0]
    seen["first 150 shared"] = (await _cached(s, url, a[:150] + ids(50)))[0]
    seen["a strict prefix (100)"] = (await _cached(s, url, a[:100]))[0]
    seen["20 longer"] = (await _cached(s, url, a + ids(20)))[0]
    c = ids(100)
    _, out = await _cached(s, url, c, n=10)
    seen["prompt + 10 output + 5"] = (await _cached(s, url, c + out + ids(5)))[0]
    one = ids(1)
    await _cached(s, url, one)
    seen["one token again"] = (await _cached(s, url, one))[0]
    seen["twin while decoding"] = await _cached_while_decoding(s, url, ids(100))
    e = ids(1000)
    await _cached(s, url, e)
    seen["1000 again"] = (await _cached(s, url, e))[0]
    for _ in range(24):  # 24 x 1002 tokens: past the 16384 KV tokens of both
        await _cached(s, url, ids(1000), n=2)
    seen["1000 after a flood"] = (await _cached(s, url, e))[0]
    return seen


async def test_prefix_cache_counts_as_sglang(sglang_a: RealSglang, start_sim: StartSim) -> None:
    stand_in = await start_sim(time_scale=1.0, kv_capacity_tokens=16384)
    async with aiohttp.ClientSession() as s:
        real = await prefix_story(s, sglang_a.url)
        sim = await prefix_story(s, stand_in.url)
    assert sim == real
    # SGLang's rules: a match stops one token short of the prompt (its logits are
    # recomputed); a finished request leaves prompt + output less the last token;
    # a running one shares its prompt; an unreferenced prefix is evicted LRU.
    assert real == {
        "first": 0,
        "same again": 199,
        "first 150 shared": 150,
        "a strict prefix (100)": 99,
        "20 longer": 200,
        "prompt + 10 output + 5": 109,
        "one token again": 0,
        "twin while decoding": 99,
        "1000 again": 999,
        "1000 after a flood": 0,
    }
