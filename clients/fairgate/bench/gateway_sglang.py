"""`fairgate bench gateway --sglang-cpu`: the fronts of one real SGLang (CPU) side by side.

One real SGLang server (`../shared/sglang-cpu`, tiny random Llama) and, beside
it, fairgate with its own `sglang.Engine` in-process (same flags: 16 running
requests, 16384 KV tokens, torch_native attention). Targets, interleaved as in
gateway.py (the order rotates each repetition):

- `sglang generate` / `sglang chat`: SGLang's own HTTP server, streaming
  `/generate` (token-id prompt) and `/v1/chat/completions`;
- `smg`: smg in front of it (`/generate`);
- `fg-http grpc` / `fg-http chat`: fairgate (engine=sglang-http) in front of it;
- `inproc grpc` / `inproc chat`: fairgate in-process, gRPC and OpenAI fronts.

CPU per streamed token counts the *front* processes only: SGLang's main process
(HTTP server + tokenizer manager) alone, not its scheduler and detokenizer
children, which every variant has the same of; smg's and fairgate-over-HTTP's
whole trees plus SGLang's main process; the in-process fairgate's own process
(its tokenizer manager included) without its SGLang children. The reference for
the ratios is `sglang generate` (its CPU, tok/s and TTFT).

fairgate in-process runs under SGLang's venv Python (`sglang_cpu.inproc_env`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

from fairgate.bench.common import child_server, free_port, rotated
from fairgate.bench.gateway import Target, requests_for, run_cell, warm
from fairgate.bench.gateway_clients import GrpcClient, OpenAiClient, SglangClient
from fairgate.bench.gateway_processes import smg_gateway
from fairgate.bench.gateway_report import Cell
from fairgate.bench.gateway_sglang_report import REFERENCE, print_sglang_cpu
from fairgate.bench.sglang_cpu import (
    CPU_ENGINE_ARGS,
    REPO,
    RealSglang,
    inproc_env,
    install,
    model_dir,
    venv_python,
)

# start.sh's default, which the in-process engine copies (CPU_ENGINE_ARGS has the rest).
MAX_RUNNING = 16
START_TIMEOUT_S = 600.0


@asynccontextmanager
async def real_sglang(max_running: int) -> AsyncIterator[RealSglang]:
    install()
    flags = ("--max-running-requests", str(max_running))
    server = await asyncio.to_thread(RealSglang.start, *flags)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


@asynccontextmanager
async def targets(
    sglang: RealSglang, smg: str | None, variant: dict[str, str], max_running: int
) -> AsyncIterator[list[Target]]:
    """Every front of the comparison; `variant`: extra fairgate settings for both fairgates."""
    main = (sglang.pid,)  # SGLang's main process, without its children
    async with AsyncExitStack() as stack:

        def client(c: SglangClient | GrpcClient | OpenAiClient) -> None:
            stack.push_async_callback(c.aclose)

        out: list[Target] = []
        gen = SglangClient([sglang.url])
        chat = OpenAiClient(sglang.url, chat=True)
        client(gen)
        client(chat)
        out += [Target(REFERENCE, gen, None, solo_pids=main)]
        out += [Target("sglang chat", chat, None, solo_pids=main)]
        if smg is not None:
            url, pid = await stack.enter_async_context(smg_gateway(smg, [sglang.url]))
            s = SglangClient([url])
            client(s)
            out.append(Target("smg", s, pid, solo_pids=main))
        for name, settings, python, env, solo in (
            ("fg-http", {"engine": "sglang-http", "sglang_urls": sglang.url}, "", None, False),
            (
                "inproc",
                {
                    "engine": "sglang",
                    "sglang_model_path": model_dir(),
                    "sglang_engine_args": json.dumps(CPU_ENGINE_ARGS),
                    "sglang_max_running_requests": max_running,
                },
                str(venv_python()),
                inproc_env(),
                True,
            ),
        ):
            http_port = free_port()
            args = {
                **settings,
                "http_listen": f"127.0.0.1:{http_port}",
                # Exact counts and the model's own chat template, as SGLang's server has.
                "tokenizer_path": model_dir(),
                "telemetry": "off",
                **variant,
            }
            server = await stack.enter_async_context(
                child_server(
                    "fairgate.bench.servers",
                    "fairgate",
                    *(f"{k}={v}" for k, v in args.items()),
                    env=env,
                    cwd=str(REPO),
                    python=python,
                    start_timeout_s=START_TIMEOUT_S,
                )
            )
            extra = () if solo else main
            g = GrpcClient(server.address)
            h = OpenAiClient(f"http://127.0.0.1:{http_port}", chat=True)
            client(g)
            client(h)
            out.append(Target(f"{name} grpc", g, server.pid, solo_pids=extra, solo=solo))
            out.append(Target(f"{name} chat", h, server.pid, solo_pids=extra, solo=solo))
        yield out


async def main(
    *,
    levels: Sequence[int],
    reps: int,
    tokens: int,
    waves: int,
    smg_binary: str | None,
    variant: dict[str, str],
    max_running: int = MAX_RUNNING,
) -> None:
    from fairgate.bench.gateway import _uptime
    from fairgate.bench.gateway_processes import find_smg

    smg = None if smg_binary is None else find_smg(smg_binary)
    print(
        f"machine: {_uptime()}, {os.cpu_count()} cores; smg: {smg or 'not installed'}; "
        f"real SGLang on CPU (tiny random Llama), {max_running} running requests"
    )
    cells: list[Cell] = []
    async with (
        real_sglang(max_running) as sglang,
        targets(sglang, smg, variant, max_running) as ts,
    ):
        await warm(ts, tokens)
        for rep in range(reps):
            for c in levels:
                n = requests_for(c, tokens, waves, 0)
                for target in rotated(ts, rep):
                    cells.append(await run_cell(target, c, n, tokens))
                print(f"  sglang-cpu: repetition {rep + 1}/{reps}, c={c} done", flush=True)
    print_sglang_cpu(tokens, reps, cells)
    print(f"machine after: {_uptime()}")
