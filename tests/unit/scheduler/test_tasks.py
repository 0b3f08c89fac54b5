"""`stop_task`: a background loop that absorbs one cancellation (as redis-py turns
a cancel inside a command into a connection error, which the loop survives) is
still stopped; a task's own error still reaches the caller."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.tasks import stop_task


async def test_a_loop_that_absorbs_a_cancel_is_stopped_all_the_same() -> None:
    absorbed = 0
    started = asyncio.Event()

    async def loop() -> None:
        nonlocal absorbed
        while True:
            try:
                started.set()
                await asyncio.sleep(3600)  # "a Redis command"
            except asyncio.CancelledError:
                if absorbed:
                    raise
                absorbed += 1  # turned into a connection error, logged, and on it goes

    task = asyncio.create_task(loop())
    await started.wait()
    # One cancel alone leaves it running.
    task.cancel()
    await asyncio.sleep(0.05)
    assert absorbed == 1 and not task.done()
    await asyncio.wait_for(stop_task(task, retry_s=0.01), 5)
    assert task.cancelled()


async def test_its_own_error_reaches_the_caller_and_none_is_nothing() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="boom"):
        await stop_task(task)
    await stop_task(None)
