"""Stopping a background task: cancel it, and wait until it has ended.

One cancel is not always enough: redis-py turns a cancellation that lands
inside a command into a connection error, and the loops that survive Redis
faults (tenant sync, key leases, the prefix share) absorb that error and go on
looping, so that a shutdown awaiting them never ends. Those loops call
`raise_if_cancelling` where they absorb such errors, so that one cancel is
enough (the event loop's own shutdown cancels once); `stop_task` also cancels
again until the task is done.
"""

from __future__ import annotations

import asyncio
from typing import Any


def raise_if_cancelling(exc: BaseException) -> None:
    """Raise CancelledError if the current task was asked to stop: `exc`, caught by
    a loop that survives it, may be a cancel that a library turned into an error."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc


async def stop_task(task: asyncio.Task[Any] | None, retry_s: float = 0.1) -> None:
    """Cancel `task` until it has ended (None: nothing to stop); its own error,
    other than the cancellation, is raised here."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_s)
    if not task.cancelled():
        task.result()
