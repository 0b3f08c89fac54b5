"""The whole gRPC service in front of the real SGLang server: client → fairgate → SGLang."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from fairgate import AsyncClient, Delta, FairgateError
from fairgate.bench.sglang_cpu import RealSglang

from service.app import App
from tests.conftest import StartServer
from tests.helpers import eventually
from tests.sglang.helpers import (
    assert_sglang_idle,
    pick_stop,
    post_json,
    reference,
    wait_running,
)

PROMPT = "The quick brown fox"


def settings(*servers: RealSglang, tokenizer: str = "", **overrides: Any) -> dict[str, Any]:
    return {
        "engine": "sglang-http",
        "sglang_urls": ",".join(s.url for s in servers),
        "tokenizer_path": tokenizer,
        "capacity_refresh_s": 0.2,
        **overrides,
    }


async def assert_drained(app: App, *servers: RealSglang) -> None:
    """Nothing queued or admitted in fairgate, no stream in the adapter, none in SGLang."""
    model = app.models.resolve("")
    assert model is not None
    d = model.dispatcher
    engine: Any = app.engine
    await eventually(
        lambda: d.queued == 0 and d.in_flight == 0 and engine.in_flight == 0,
        what="fairgate to drain",
    )
    assert d.budget.engine.kv_tokens == 0
    await assert_sglang_idle(*(s.url for s in servers))


@pytest.mark.parametrize("which", ["cumulative", "incremental"])
async def test_completion_matches_sglang_with_exact_prompt_counts(
    start_server: StartServer,
    sglang_a: RealSglang,
    sglang_b: RealSglang,
    tiny_tokenizer: str,
    which: str,
) -> None:
    server = sglang_a if which == "cumulative" else sglang_b
    app = await start_server(**settings(server, tokenizer=tiny_tokenizer))
    want = await reference(server.url, PROMPT, 40)
    async with AsyncClient(app.address) as c:
        got = await c.complete(PROMPT, max_tokens=40, temperature=0.0, return_token_ids=True)
        count, exact = await c.count_tokens(PROMPT)
        (model,) = await c.list_models()
    assert got.text == want["text"] and list(got.token_ids) == want["output_ids"]
    assert got.result.finish_reason == "length"
    sglang_prompt = want["meta_info"]["prompt_tokens"]
    assert exact and count == sglang_prompt == got.result.usage.prompt_tokens
    assert got.result.usage.completion_tokens == 40
    assert model.engine == "sglang-http" and model.max_context_tokens == 2042
    # The tokenizer's vocabulary bounds token-id prompts (the engine cannot say it).
    assert model.vocab_size == 474
    await assert_drained(app, server)


async def test_stop_string_through_the_service(
    start_server: StartServer, sglang_a: RealSglang, tiny_tokenizer: str
) -> None:
    app = await start_server(**settings(sglang_a, tokenizer=tiny_tokenizer))
    probe = await reference(sglang_a.url, PROMPT, 30)
    stop = pick_stop(probe["text"])
    want = await reference(sglang_a.url, PROMPT, 30, stop=[stop])
    async with AsyncClient(app.address) as c:
        deltas = []
        async for ev in c.generate(PROMPT, max_tokens=30, temperature=0.0, stop=[stop]):
            if isinstance(ev, Delta):
                deltas.append(ev.text)
            else:
                result = ev
    assert "".join(deltas) == want["text"] and stop not in "".join(deltas)
    assert result.finish_reason == "stop" and result.stop_matched == stop
    await assert_drained(app, sglang_a)


async def test_cancel_mid_stream_leaves_nothing_running(
    start_server: StartServer, sglang_a: RealSglang
) -> None:
    app = await start_server(**settings(sglang_a))
    async with AsyncClient(app.address) as c:
        stream = c.generate(PROMPT, max_tokens=1500, ignore_eos=True)
        seen = 0
        async for ev in stream:
            seen += isinstance(ev, Delta)
            if seen == 3:
                await wait_running(sglang_a.url, 1)
                break
        await stream.aclose()
    await assert_drained(app, sglang_a)


async def test_deadline_mid_stream_leaves_nothing_running(
    start_server: StartServer, sglang_a: RealSglang
) -> None:
    app = await start_server(**settings(sglang_a))
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete(PROMPT, max_tokens=2000, ignore_eos=True, timeout_s=1.0)
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    await assert_drained(app, sglang_a)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"temperature": -1.0}, "sampling.temperature"),
        ({"max_tokens": 2042}, "sampling.max_tokens"),  # prompt + 2042 > the window
        ({"top_k": 0}, "sampling.top_k"),
    ],
)
@pytest.mark.parametrize("streaming", [True, False], ids=["stream", "unary-collect"])
async def test_invalid_parameters_never_reach_sglang(
    start_server: StartServer,
    sglang_a: RealSglang,
    tiny_tokenizer: str,
    options: dict[str, Any],
    field: str,
    streaming: bool,
) -> None:
    app = await start_server(**settings(sglang_a, tokenizer=tiny_tokenizer))
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            if streaming:
                async for _ in c.generate(PROMPT, **options):
                    pass
            else:
                await c.complete(PROMPT, **options)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in str(err.value)
    await assert_drained(app, sglang_a)


async def test_out_of_vocabulary_token_ids_are_refused_not_sent(
    start_server: StartServer, sglang_a: RealSglang, tiny_tokenizer: str
) -> None:
    # One token id past the embedding table kills SGLang's scheduler (IndexError,
    # the whole server exits): fairgate must refuse it with the tokenizer's vocabulary.
    app = await start_server(**settings(sglang_a, tokenizer=tiny_tokenizer))
    async with AsyncClient(app.address) as c:
        with pytest.raises(FairgateError) as err:
            await c.complete([5, 474], max_tokens=4)
        assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "outside the vocabulary" in str(err.value)
        ok = await c.complete([5, 473], max_tokens=4, ignore_eos=True)
    assert ok.result.finish_reason == "length" and ok.result.usage.prompt_tokens == 2
    assert sglang_a.pid <= 0 or sglang_a.alive
    await assert_drained(app, sglang_a)


async def test_context_window_is_where_sglang_serves_in_full(
    start_server: StartServer, sglang_a: RealSglang, tiny_tokenizer: str
) -> None:
    # SGLang 0.5.23 with a 2048-token model: a prompt of 2042 (max_req_input_len)
    # tokens or more is an abort with 400, and prompt + max_new_tokens is silently
    # capped at 2046. fairgate's window is 2042, so whatever it admits runs in full.
    app = await start_server(**settings(sglang_a, tokenizer=tiny_tokenizer))
    async with AsyncClient(app.address) as c:
        (model,) = await c.list_models()
        assert model.max_context_tokens == 2042
        ok = await c.complete([5] * 2041, max_tokens=1, ignore_eos=True)
        assert ok.result.usage.completion_tokens == 1
        ok = await c.complete([5] * 2000, max_tokens=42, ignore_eos=True)
        assert ok.result.usage.completion_tokens == 42
        for prompt, max_tokens in (([5] * 2042, 1), ([5] * 2000, 43)):
            with pytest.raises(FairgateError) as err:
                await c.complete(prompt, max_tokens=max_tokens)
            assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    await assert_drained(app, sglang_a)


async def test_a_reused_request_id_is_not_aborted_by_sglang(
    start_server: StartServer, sglang_a: RealSglang
) -> None:
    # SGLang schedules an abort of a stream's rid 2 s after the stream ends
    # (tokenizer_manager.create_abort_task); a new request under the same rid in
    # that window would be aborted. fairgate never sends the client's id as rid.
    app = await start_server(**settings(sglang_a))
    async with AsyncClient(app.address) as c:
        first = await c.complete(PROMPT, max_tokens=4, ignore_eos=True, request_id="same-id")
        again = await c.complete(PROMPT, max_tokens=1000, ignore_eos=True, request_id="same-id")
    assert first.result.finish_reason == again.result.finish_reason == "length"
    assert again.result.usage.completion_tokens == 1000
    await assert_drained(app, sglang_a)


async def test_abort_inside_sglang_ends_the_stream_as_cancelled(
    start_server: StartServer, sglang_a: RealSglang
) -> None:
    # An operator aborting everything in SGLang: the client keeps what streamed.
    app = await start_server(**settings(sglang_a))
    async with AsyncClient(app.address) as c:
        deltas, result = 0, None
        async for ev in c.generate(PROMPT, max_tokens=1500, ignore_eos=True):
            if isinstance(ev, Delta):
                deltas += 1
                if deltas == 3:
                    status, _ = await post_json(
                        sglang_a.url + "/abort_request", {"abort_all": True}
                    )
                    assert status == 200
            else:
                result = ev
    # fairgate names an engine-side abort "cancelled", with SGLang's message.
    assert result is not None and result.finish_reason == "cancelled"
    assert result.message == "Aborted"
    assert deltas <= result.usage.completion_tokens < 1500
    await assert_drained(app, sglang_a)
