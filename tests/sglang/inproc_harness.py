"""Drives fairgate's in-process adapter on a real `sglang.Engine` (CPU); prints JSON.

Runs in the SGLang CPU venv (`python tests/sglang/inproc_harness.py MODEL`) with
the repository and the `sgl_kernel` stand-in on PYTHONPATH, because sglang and
fairgate's own dependencies do not share one venv. test_inproc.py runs it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from contextlib import aclosing
from typing import Any

from service.engines.protocol import EngineRequest, SamplingOptions
from service.engines.sglang_inproc import SglangInprocEngine


def build(model: str) -> Any:
    import sglang

    return sglang.Engine(
        model_path=model,
        device="cpu",
        attention_backend="torch_native",
        disable_overlap_schedule=True,
        max_total_tokens=16384,
        max_running_requests=16,
        log_level="error",
    )


async def _running(engine: SglangInprocEngine, until: int, timeout_s: float = 15.0) -> int:
    """Running requests once they reach `until`, or when the time is up."""
    for _ in range(int(timeout_s / 0.05)):
        running = (await engine.load()).running_requests
        if running == until:
            break
        await asyncio.sleep(0.05)
    return running


async def run(model: str) -> dict[str, Any]:
    engine = SglangInprocEngine(lambda: build(model))
    await engine.start()
    cap = engine.capacity()
    out: dict[str, Any] = {}
    out["capacity"] = {
        "max_running_requests": cap.max_running_requests,
        "max_total_tokens": cap.max_total_tokens,
        "max_context_tokens": cap.max_context_tokens,
    }
    req = EngineRequest(
        "greedy", [], max_tokens=32, prompt_text="hello", sampling=SamplingOptions(temperature=0)
    )
    async with aclosing(engine.generate(req)) as stream:
        chunks = [c async for c in stream]
    out["greedy"] = {
        "text": "".join(c.text for c in chunks),
        "ids": [t for c in chunks for t in c.token_ids],
        "finish": chunks[-1].finish.value if chunks[-1].finish else None,
        "completion_tokens": chunks[-1].completion_tokens,
        "prompt_tokens": chunks[-1].prompt_tokens,
    }
    # Leaving mid-stream must free the request in SGLang's scheduler.
    long = EngineRequest("long", [], max_tokens=1500, prompt_text="hello")
    long.sampling = SamplingOptions(ignore_eos=True)
    seen = 0
    async with aclosing(engine.generate(long)) as stream:
        async for _ in stream:
            seen += 1
            if seen == 3:  # the load snapshot lags a step or two behind the stream
                out["running_while_streaming"] = await _running(engine, until=1)
                break
    out["running_after_leaving"] = await _running(engine, until=0)
    await engine.aclose()
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(asyncio.run(run(sys.argv[1]))), flush=True)
