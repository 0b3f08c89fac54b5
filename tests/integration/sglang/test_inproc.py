"""The in-process SGLang adapter.

Here it runs against an object with the same async API (`async_generate`,
`tokenizer_manager.abort_request / get_loads`) that produces SGLang's chunk
dicts from the simulator; tests/sglang/test_inproc.py runs it on a real
`sglang.Engine` (CPU).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from types import SimpleNamespace
from typing import Any

import pytest

from service.engines.protocol import EngineRequest, FinishKind, SamplingOptions
from service.engines.sglang_inproc import SglangInprocEngine
from service.engines.simulator.core import SimConfig
from service.engines.simulator.engine import SimulatedEngine
from service.engines.simulator.hardware import preset
from service.engines.simulator.sim_server import SimServer
from tests.helpers import eventually


class _TokenizerManager:
    def __init__(self, sim: SimServer) -> None:
        self.sim = sim
        self.aborted: list[str] = []
        self.context_len = sim.engine.core.max_context

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)
        self.sim.engine.core.abort(rid)

    async def get_loads(self) -> list[dict[str, Any]]:
        core = self.sim.engine.core
        return [
            {
                "num_running_reqs": len(core.running),
                "num_used_tokens": core.used_kv,
                "max_total_num_tokens": core.capacity,
                "max_running_requests": self.sim.engine.config.max_running_requests,
            }
        ]


class _SglangLikeEngine:
    """sglang.Engine's async surface over the simulator (see the module doc)."""

    def __init__(self, sim: SimServer, incremental: bool) -> None:
        self.sim = sim
        self.tokenizer_manager = _TokenizerManager(sim)
        self.rids: list[str] = []
        self.server_args = SimpleNamespace(
            model_path="sim-model",
            served_model_name="sim-model",
            incremental_streaming_output=incremental,
            enable_priority_scheduling=False,
        )

    async def async_generate(self, **kw: Any) -> AsyncGenerator[dict[str, Any], None]:
        self.rids.append(kw["rid"])
        sp = kw["sampling_params"]
        req = EngineRequest(
            request_id=kw["rid"],
            prompt_token_ids=kw.get("input_ids") or self.sim.tokenizer.encode(kw["prompt"]),
            max_tokens=sp["max_new_tokens"],
            sampling=SamplingOptions(seed=sp.get("sampling_seed")),
        )
        return self.sim.chunks(req, incremental=self.server_args.incremental_streaming_output)


@pytest.mark.parametrize("incremental", [False, True])
async def test_inproc_adapter_streams_and_aborts(incremental: bool) -> None:
    sim_engine = SimulatedEngine(SimConfig(cost=preset()), time_scale=0.0)
    sim = SimServer(sim_engine)
    await sim_engine.start()
    fake = _SglangLikeEngine(sim, incremental)
    engine = SglangInprocEngine(lambda: fake)
    await engine.start()
    assert engine.capacity().max_total_tokens == sim_engine.core.capacity
    assert engine.served_model_name == "sim-model"

    reference = SimulatedEngine(SimConfig(cost=preset()), time_scale=0.0)
    await reference.start()
    req = EngineRequest("a", [300, 301], max_tokens=20, sampling=SamplingOptions(seed=5))
    async with aclosing(engine.generate(req)) as s:
        got = [c async for c in s]
    async with aclosing(reference.generate(req)) as s:
        want = [c async for c in s]
    assert "".join(c.text for c in got) == "".join(c.text for c in want)
    assert [t for c in got for t in c.token_ids] == [t for c in want for t in c.token_ids]
    assert got[-1].finish is FinishKind.LENGTH and got[-1].completion_tokens == 20

    # Closing the stream early aborts the request in the engine.
    sim_engine.time_scale = 1.0
    long = EngineRequest("b", [300, 301], max_tokens=2000)
    async with aclosing(engine.generate(long)) as s:
        async for _ in s:
            break
    # By the rid the adapter made up for it: never the client's request id.
    assert fake.tokenizer_manager.aborted == [fake.rids[-1]] and fake.rids[-1] != "b"
    await eventually(lambda: sim_engine.active_requests == 0, what="engine drained")
    assert (await engine.load()).running_requests == 0
    await sim_engine.aclose()
    await reference.aclose()
