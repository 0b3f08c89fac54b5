"""A started server keeps what start built out of the garbage collector's walks."""

from __future__ import annotations

import gc
import os
import signal
from collections.abc import Iterator

import pytest

from service.app import App
from service.main import serve
from service.settings import Settings


@pytest.fixture(autouse=True)
def _unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


async def _frozen_when_ready(gc_freeze: bool) -> int:
    """Serve until ready, note how many objects are frozen then, and stop."""
    seen: list[int] = []

    def ready(app: App) -> None:
        seen.append(gc.get_freeze_count())
        os.kill(os.getpid(), signal.SIGUSR1)

    settings = Settings(
        listen="127.0.0.1:0", http_listen="127.0.0.1:0", metrics_listen="", gc_freeze=gc_freeze
    )
    await serve(settings, on_ready=ready, stop_signals=(signal.SIGUSR1,))
    return seen[0]


async def test_a_started_server_has_frozen_what_start_built() -> None:
    assert await _frozen_when_ready(True) > 10_000


async def test_gc_freeze_off_leaves_the_collector_alone() -> None:
    assert await _frozen_when_ready(False) == 0
