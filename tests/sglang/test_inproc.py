"""The in-process adapter (`FAIRGATE_ENGINE=sglang`) on a real `sglang.Engine`, on CPU.

sglang lives in its own venv (the CPU install), fairgate's test dependencies in
ours, so `inproc_harness.py` drives the adapter in the SGLang venv and reports
JSON; this test checks it against the HTTP server's answer for the same model.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from fairgate.bench.sglang_cpu import REPO, RealSglang, cache_home, scripts_dir, venv_python

from tests.sglang.helpers import reference


async def test_inproc_adapter_on_a_real_sglang_engine(sglang_a: RealSglang) -> None:
    env = {
        **os.environ,
        "SGLANG_USE_CPU_ENGINE": "1",
        "OMP_NUM_THREADS": "1",
        # sgl_kernel's CPU stand-in first, then this repository's packages.
        "PYTHONPATH": f"{scripts_dir()}:{REPO}",
    }
    harness = Path(__file__).with_name("inproc_harness.py")
    model = cache_home() / "tiny-llama"
    proc = await asyncio.create_subprocess_exec(
        str(venv_python()),
        str(harness),
        str(model),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=REPO,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=600)
    lines = [ln for ln in stdout.decode().splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, stderr.decode()[-4000:]
    got = json.loads(lines[-1][len("RESULT ") :])
    assert got["capacity"] == {
        "max_running_requests": 16,
        "max_total_tokens": 16384,
        "max_context_tokens": 2042,
    }
    want = await reference(sglang_a.url, "hello", 32)
    greedy = got["greedy"]
    assert (greedy["text"], greedy["ids"]) == (want["text"], want["output_ids"])
    assert greedy["finish"] == "length" and greedy["completion_tokens"] == 32
    assert greedy["prompt_tokens"] == want["meta_info"]["prompt_tokens"]
    # Leaving the stream aborted the request in SGLang's scheduler.
    assert (got["running_while_streaming"], got["running_after_leaving"]) == (1, 0)
