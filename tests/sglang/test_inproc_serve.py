"""`fairgate serve --engine sglang` as an operator runs it: the real `sglang.Engine`
(CPU) inside the fairgate process, in SGLang's venv (`inproc_env`).

Start-up failures end `serve` with one line and a non-zero exit; a SIGTERM drains,
stops SGLang's scheduler and detokenizer processes and exits 0, leaving no orphan.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fairgate import AsyncClient
from fairgate.bench.procstat import descendants
from fairgate.bench.sglang_cpu import CPU_ENGINE_ARGS, REPO, inproc_env, model_dir, venv_python

START_TIMEOUT_S = 600.0
LISTENING = re.compile(r"fairgate listening on (\S+) ")


def serve_args(model: str, *extra: str) -> list[str]:
    return [
        str(venv_python()),
        "-m",
        "fairgate.cli.main",
        "serve",
        "--engine=sglang",
        f"--sglang-model-path={model}",
        f"--sglang-engine-args={json.dumps(CPU_ENGINE_ARGS)}",
        "--listen=127.0.0.1:0",
        "--http-listen=",
        "--metrics-listen=",
        *extra,
    ]


@asynccontextmanager
async def serving(*args: str) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """`fairgate serve` in SGLang's venv until it announces its address; killed if left."""
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=inproc_env(),
        cwd=REPO,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while True:
                line = (await proc.stdout.readline()).decode()
                assert line, "serve exited before listening:\n" + "".join(seen[-40:])
                seen.append(line)
                found = LISTENING.search(line)
                if found:
                    break
        yield proc, found.group(1)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone but not yet reaped
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


async def test_serve_in_process_streams_and_stops_sglang_children_on_sigterm() -> None:
    async with serving(*serve_args(str(model_dir()), "--sglang-max-running-requests=8")) as (
        proc,
        address,
    ):
        children = [p for p in descendants(proc.pid) if p != proc.pid]
        # SGLang's scheduler and detokenizer run as child processes of fairgate's.
        assert len(children) >= 2, children
        async with AsyncClient(address) as client:
            got = await client.complete("hello", max_tokens=12, ignore_eos=True)
            (model,) = await client.list_models()
            # The engine's model folder gives the exact tokenizer (no tokenizer_path set).
            _, exact = await client.count_tokens("hello")
        assert got.result.finish_reason == "length"
        assert got.result.usage.completion_tokens == 12
        assert model.engine == "sglang" and exact and model.vocab_size == 474
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout is not None
        rest = (await asyncio.wait_for(proc.stdout.read(), timeout=120)).decode()
        assert await proc.wait() == 0, rest[-3000:]
        # fairgate's drain ran (SGLang's own SIGTERM handler would have exited instead).
        assert "shutting down, draining" in rest, rest[-3000:]
    assert [p for p in children if alive(p)] == []


async def _failed_serve(model_path: str, timeout_s: float) -> tuple[int | None, list[str]]:
    """`serve` on `model_path` until it exits: its exit status and stderr lines."""
    proc = await asyncio.create_subprocess_exec(
        *serve_args(model_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=inproc_env(),
        cwd=REPO,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=timeout_s)
    return proc.returncode, err.decode().strip().splitlines()


async def test_a_bad_model_path_ends_serve_with_one_line_and_exit_2() -> None:
    returncode, lines = await _failed_serve("/nonexistent/model", 300)
    assert returncode == 2
    assert lines[-1].startswith("error: '/nonexistent/model' does not exist"), lines[-5:]
    assert "--sglang-model-path / FAIRGATE_SGLANG_MODEL_PATH" in lines[-1]
    assert not any(line.startswith("Traceback") for line in lines)


async def test_a_model_sglang_cannot_load_ends_serve_with_one_line(tmp_path: object) -> None:
    """A folder that exists but holds no model: SGLang itself refuses it."""
    returncode, lines = await _failed_serve(str(tmp_path), 600)
    assert returncode != 0 and lines[-1].startswith("error: "), lines[-20:]
    assert "SGLang refused the model" in lines[-1]
    assert "--sglang-model-path / FAIRGATE_SGLANG_MODEL_PATH" in lines[-1]
    assert not any(line.startswith("Traceback") for line in lines), lines[-20:]
