"""Shutdown in front of SGLang (the stand-in): cut streams are aborted with
`/abort_request` and end with a final CANCELLED result; an engine that ignores
the abort (a stalled stream) cannot hold the shutdown up."""

from __future__ import annotations

import asyncio

from fairgate import AsyncClient, Delta, FairgateError, Result

from tests.conftest import StartServer
from tests.sglang_helpers import StartSim, assert_no_sglang_leaks, sglang_settings


async def test_cut_stream_is_aborted_in_sglang_and_ends_with_a_result(
    start_server: StartServer, start_sim: StartSim
) -> None:
    worker = await start_sim(time_scale=1.0)
    app = await start_server(**sglang_settings(worker))
    async with AsyncClient(app.address) as c:
        stream = c.generate("a long answer", max_tokens=5000, ignore_eos=True)
        assert isinstance(await stream.__anext__(), Delta)
        await app.stop(grace_s=0.1)
        events = [ev async for ev in stream]
    assert isinstance(events[-1], Result) and events[-1].finish_reason == "cancelled"
    assert len(worker.record.aborted) == 1
    await assert_no_sglang_leaks(app, worker)


async def test_a_stream_the_engine_never_ends_does_not_hold_the_shutdown(
    start_server: StartServer, start_sim: StartSim
) -> None:
    worker = await start_sim(time_scale=0.0)
    worker.faults.stall_after_chunks = 2
    app = await start_server(**sglang_settings(worker))
    async with AsyncClient(app.address) as c:
        stream = c.generate("stalls", max_tokens=50, ignore_eos=True)
        assert isinstance(await stream.__anext__(), Delta)
        # Bounded (a hang guard, not a timing check): the cut's wait, then cancel.
        await asyncio.wait_for(app.stop(grace_s=0.1), 30)
        try:
            events = [ev async for ev in stream]
        except FairgateError:
            events = []
    assert not any(isinstance(e, Result) and e.finish_reason == "length" for e in events)
    model = app.models.resolve("")
    assert model is not None
    assert model.dispatcher.in_flight == 0 and model.dispatcher.queued == 0
