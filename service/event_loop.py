"""The event loop the server runs on: uvloop when installed (setting `event_loop`).

uvloop (libuv) runs the same asyncio code with a cheaper loop; the gRPC and
HTTP fronts and the SGLang adapter are all asyncio. `auto` takes it when the
`uvloop` extra is installed and falls back to asyncio's own loop otherwise.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from service.startup import StartupError

T = TypeVar("T")

EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for `choice` (None: asyncio's default). Raises StartupError when
    uvloop is asked for and not installed."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"unknown event_loop {choice!r} (available: {', '.join(EVENT_LOOPS)})")
    if choice == "asyncio" or (choice == "auto" and not uvloop_installed()):
        return None
    try:
        import uvloop
    except ImportError:
        raise StartupError(
            "event_loop",
            "event_loop=uvloop but uvloop is not installed: pip install 'fairgate[uvloop]', "
            "or use event_loop=auto",
        ) from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run(main: Coroutine[Any, Any, T], choice: str) -> T:
    """`asyncio.run(main)` on the chosen loop."""
    try:
        factory = loop_factory(choice)
    except StartupError:
        main.close()  # never run: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
