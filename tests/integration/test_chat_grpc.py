"""Chat messages over gRPC: rendered with the model's template, or INVALID_ARGUMENT."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from fairgate import AsyncClient, FairgateError
from fairgate.errors import from_rpc_error
from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc

from service.app import App
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, sim

TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"


def _chat(*turns: tuple[str, str], max_tokens: int = 4) -> pb.GenerateRequest:
    msgs = pb.ChatMessages(messages=[pb.ChatMessage(role=r, content=c) for r, c in turns])
    return pb.GenerateRequest(messages=msgs, sampling=pb.SamplingParams(max_tokens=max_tokens))


async def _generate(app: App, req: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    async with grpc.aio.insecure_channel(app.address) as ch:
        try:
            return [r async for r in pb_grpc.InferenceServiceStub(ch).Generate(req)]
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None


async def test_messages_render_with_the_template(start_server: StartServer, tmp_path: Path) -> None:
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    app = await start_server(chat_template_path=str(tmp_path / "t.jinja"))
    out = await _generate(app, _chat(("system", "be brief"), ("user", "hello")))
    result = out[-1].result
    assert result.finish_reason == pb.FINISH_REASON_LENGTH
    assert result.usage.completion_tokens == 4
    model = app.models.resolve("")
    assert model is not None
    rendered = "system: be brief\nuser: hello\nassistant:"
    assert result.usage.prompt_tokens == len(model.tokenizer.encode(rendered))
    await assert_no_leaks(app)


@pytest.mark.parametrize(
    ("turns", "field", "with_template"),
    [
        ((), "messages", True),
        ((("", "no role"),), "messages[0].role", False),
    ],
)
async def test_bad_messages_are_invalid_argument(
    start_server: StartServer,
    tmp_path: Path,
    turns: tuple[tuple[str, str], ...],
    field: str,
    with_template: bool,
) -> None:
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    app = await start_server(chat_template_path=str(tmp_path / "t.jinja") if with_template else "")
    with pytest.raises(FairgateError) as err:
        await _generate(app, _chat(*turns))
    exc = err.value
    assert exc.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in [f for f, _ in exc.field_violations]
    assert sim(app).stats.started == 0
    await assert_no_leaks(app)


async def test_the_simulated_model_speaks_chatml_by_default(server: App) -> None:
    # No template configured: fairgate's default (ChatML) renders the turns.
    out = await _generate(server, _chat(("system", "be brief"), ("user", "hello")))
    rendered = (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    model = server.models.resolve("")
    assert model is not None
    assert out[-1].result.usage.prompt_tokens == len(model.tokenizer.encode(rendered))
    assert out[-1].result.usage.completion_tokens == 4


async def test_python_client_sends_messages(start_server: StartServer, tmp_path: Path) -> None:
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    app = await start_server(chat_template_path=str(tmp_path / "t.jinja"))
    async with AsyncClient(app.address) as c:
        done = await c.complete([{"role": "user", "content": "hello"}], max_tokens=3)
        count, _ = await c.count_tokens("user: hello\nassistant:")
    assert done.result.usage.completion_tokens == 3
    assert done.result.usage.prompt_tokens == count
