"""Process entry point: run the server until SIGTERM/SIGINT, then drain."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from service import event_loop
from service.app import App
from service.settings import Settings
from service.telemetry.logs import configure_logging


async def serve(settings: Settings) -> None:
    app = await App.start(settings)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    http = f", OpenAI API on {app.http.url}" if app.http is not None else ""
    print(
        f"fairgate listening on {app.address}{http} (model {app.models.default}, "
        f"engine {app.engine.kind}); Ctrl-C to stop",
        flush=True,
    )
    await stop.wait()
    log = logging.getLogger(__name__)
    log.info("shutting down, draining for up to %ss", settings.shutdown_grace_s)
    stop.clear()
    stopping = asyncio.create_task(app.stop())
    again = asyncio.create_task(stop.wait())
    await asyncio.wait({stopping, again}, return_when=asyncio.FIRST_COMPLETED)
    if again.done():
        # A second signal (Ctrl-C twice): cut the streams still running now.
        log.warning("second signal: cutting the drain short")
        app.drain.cut_short()
    again.cancel()
    await stopping


def run(settings: Settings) -> int:
    """Serve until stopped; returns the process exit code (2: bad configuration)."""
    configure_logging(settings.log_level, settings.log_format)
    try:
        event_loop.run(serve(settings), settings.event_loop)
    except (ValueError, FileNotFoundError) as exc:
        # Configuration problems (tenants file, presets) say what to fix, no traceback.
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
