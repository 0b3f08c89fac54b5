"""The OpenAI front in front of the real SGLang server on CPU (../shared/sglang-cpu):
the `openai` SDK streams a chat through fairgate, and SGLang's own
`bench_serving` runs against fairgate's HTTP port with no failures.

Skipped when the SGLang CPU install is absent (`../shared/sglang-cpu/install.sh`).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import aiohttp
import openai
import pytest
from fairgate.bench.sglang_cpu import RealSglang

from service.app import App
from tests.conftest import StartServer
from tests.helpers import eventually

HOME = Path(os.environ.get("SGLANG_CPU_HOME", Path.home() / ".cache" / "fairgate-sglang-cpu"))
MODEL = HOME / "tiny-llama"
PYTHON = HOME / "venv" / "bin" / "python"
# sglang.bench_serving imports `datasets` (for datasets we do not use); the CPU venv
# lacks it, so an import-only stand-in goes on its path (nothing is downloaded).
DATASETS_SHIM = (
    '"""Import-only stand-in."""\n\ndef load_dataset(*a, **k):\n    raise RuntimeError\n'
)


@pytest.fixture(scope="module")
def sglang_url(sglang_a: RealSglang) -> str:
    """The suite's session server (a failed install or start fails, never skips)."""
    if not MODEL.is_dir() or not PYTHON.is_file():
        pytest.fail(f"no SGLang CPU install at {HOME}: did install.sh run?", pytrace=False)
    return sglang_a.url


async def _sglang_app(start_server: StartServer, url: str) -> App:
    return await start_server(
        engine="sglang-http",
        sglang_urls=url,
        tokenizer_path=str(MODEL),
        http_listen="127.0.0.1:0",
        sim_time_scale=1.0,
    )


async def test_openai_sdk_streams_a_chat_through_fairgate_to_sglang(
    start_server: StartServer, sglang_url: str
) -> None:
    app = await _sglang_app(start_server, sglang_url)
    assert app.http is not None
    messages: list[dict[str, str]] = [{"role": "user", "content": "hi"}]
    async with openai.AsyncOpenAI(base_url=app.http.url, api_key="EMPTY") as oai:
        stream = await oai.chat.completions.create(
            model=app.models.default,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
            # The tiny random model may sample its EOS token early.
            extra_body={"ignore_eos": True},
        )
        chunks = [c async for c in stream]
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # SGLang's own chat endpoint renders the same template: the same prompt length.
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{sglang_url}/v1/chat/completions",
            json={"model": "x", "messages": messages, "max_tokens": 1},
        ) as r,
    ):
        direct = await r.json()
    assert usage.prompt_tokens == direct["usage"]["prompt_tokens"]
    model = app.models.resolve("")
    assert model is not None
    d = model.dispatcher
    await eventually(lambda: d.in_flight == 0 and d.queued == 0, what="gateway drained")


async def test_sglang_bench_serving_against_fairgate_http(
    start_server: StartServer, sglang_url: str, tmp_path: Path
) -> None:
    app = await _sglang_app(start_server, sglang_url)
    assert app.http is not None
    shim = tmp_path / "shim" / "datasets"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(DATASETS_SHIM)
    env = {
        **os.environ,
        "PYTHONPATH": str(shim.parent),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    base = app.http.url.removesuffix("/v1")
    cmd = [
        str(PYTHON), "-m", "sglang.bench_serving", "--backend", "sglang-oai-chat",
        "--base-url", base, "--model", app.models.default, "--tokenizer", str(MODEL),
        "--dataset-name", "random-ids", "--random-input-len", "32", "--random-output-len", "16",
        "--random-range-ratio", "1", "--num-prompts", "24", "--max-concurrency", "6",
        "--seed", "1",
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        env=env,
        cwd=tmp_path,  # it writes a results file into the working directory
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out_b, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    out = out_b.decode(errors="replace")
    assert proc.returncode == 0, out[-3000:]
    ok = re.search(r"Successful requests:\s+(\d+)", out)
    assert ok is not None and int(ok.group(1)) == 24, out[-3000:]
    assert "Total generated tokens:                  384" in out, out[-3000:]
    print(out[out.index("=====") :], file=sys.stderr)
