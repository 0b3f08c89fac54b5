"""`stop_task`: a background loop that absorbs one cancellation (as redis-py turns
a cancel inside a command into a connection error, which the loop survives) is
still stopped; a task's own error still reaches the caller."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.tasks import raise_if_cancelling, stop_task


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


async def test_a_loop_that_checks_raise_if_cancelling_ends_on_one_cancel() -> None:
    """The loop absorbs the connection error a cancel became, but asks first whether
    it was asked to stop: the event loop's single cancel at shutdown is enough."""
    started = asyncio.Event()
    absorbed = 0

    async def loop() -> None:
        nonlocal absorbed
        while True:
            try:
                started.set()
                try:
                    await asyncio.sleep(3600)  # "a Redis command"
                except asyncio.CancelledError as exc:
                    raise ConnectionError("Connection closed by server") from exc
            except ConnectionError as exc:
                raise_if_cancelling(exc)
                absorbed += 1

    task = asyncio.create_task(loop())
    await started.wait()
    task.cancel()
    await asyncio.wait({task}, timeout=5)
    assert task.cancelled() and absorbed == 0


async def test_an_error_that_is_no_cancel_is_absorbed_as_before() -> None:
    try:
        raise ConnectionError("Redis went away")
    except ConnectionError as exc:
        raise_if_cancelling(exc)  # nothing asked this task to stop: no raise
