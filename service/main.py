"""Process entry point: run the server until SIGTERM/SIGINT, then drain.

With `workers` > 1 this process supervises that many server processes
(`service/workers.py`) instead of serving itself.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from service import event_loop
from service.settings import Settings
from service.startup import StartupError, check_address

if TYPE_CHECKING:
    from service.app import App
    from service.telemetry.telemetry import Telemetry

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def announce(app: App) -> None:
    """The line scripts wait for (tests, benchmarks): the bound address."""
    http = f", OpenAI API on {app.http.url}" if app.http is not None else ""
    print(
        f"fairgate listening on {app.address}{http} (model {app.models.default}, "
        f"engine {app.engine.kind}); Ctrl-C to stop",
        flush=True,
    )


async def start(settings: Settings, telemetry: Telemetry | None = None) -> App:
    """Start the server as a serving process runs it (this entry point's and the
    benchmarks' alike): with `gc_freeze`, what start built is then out of the
    garbage collector's sight."""
    # Imported here: a start refused before this (a port taken) skips its imports.
    from service.app import App

    app = await App.start(settings, telemetry)
    if settings.gc_freeze:
        from service.collector import freeze_startup

        freeze_startup()
    return app


async def serve(
    settings: Settings,
    *,
    telemetry: Telemetry | None = None,
    on_ready: Callable[[App], None] = announce,
    stop_signals: Sequence[signal.Signals] = STOP_SIGNALS,
) -> None:
    app = await start(settings, telemetry)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in stop_signals:
        loop.add_signal_handler(sig, stop.set)
    on_ready(app)
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
    try:
        check_ports(settings)
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    # Imported once the ports are known to be free: a refusal stays quick.
    from service.telemetry.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    if settings.workers > 1:
        from service.workers import supervise

        return supervise(settings)
    return run_server(settings, serve(settings))


def check_ports(settings: Settings) -> None:
    """The server's addresses resolve and are free: refused here, before anything
    starts, rather than half-way through (StartupError)."""
    check_address("listen", settings.listen)
    if settings.http_listen:
        check_address("http_listen", settings.http_listen, '; "" turns the OpenAI API off')
    if settings.metrics_listen:
        check_address("metrics_listen", settings.metrics_listen, '; "" turns it off')


def run_server(settings: Settings, main: Coroutine[Any, Any, None], who: str = "") -> int:
    """Run `main` (a `serve`) on the configured loop; the exit code (2: bad configuration,
    1: a port taken, Redis down)."""
    try:
        event_loop.run(main, settings.event_loop)
    except StartupError as exc:
        print(f"error: {who}{exc}", file=sys.stderr)
        return exc.exit_code
    except (ValueError, FileNotFoundError) as exc:
        # Configuration problems (tenants file, presets) say what to fix, no traceback.
        print(f"error: {who}{exc}", file=sys.stderr)
        return 2
    return 0
