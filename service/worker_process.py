"""One worker of `fairgate serve --workers N` (started by service/workers.py).

`python -m service.worker_process INDEX PARENT_PID READY_FD`, settings in the
FAIRGATE_* environment. It dies with its supervisor (PR_SET_PDEATHSIG →
SIGTERM → the usual drain), ignores SIGINT (the supervisor forwards Ctrl-C
as SIGTERM), and writes one JSON line (`WorkerReady`) to READY_FD once it
listens, keeping the descriptor open until it exits.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import json
import logging
import os
import signal
import sys

from service.app import App
from service.main import run_server, serve
from service.settings import Settings
from service.telemetry.logs import configure_logging
from service.workers import WorkerReady

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int) -> None:
    """SIGTERM from the kernel when the supervisor dies (Linux); exit now if it
    already has (it died between our fork and this call)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != parent_pid:
        sys.exit(1)


def main(argv: list[str]) -> int:
    index, parent_pid, ready_fd = (int(a) for a in argv)
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ready = os.fdopen(ready_fd, "w")
    settings = Settings.from_env()
    configure_logging(settings.log_level, settings.log_format, worker=index)

    def on_ready(app: App) -> None:
        metrics = app.telemetry.metrics_endpoint
        report = WorkerReady(
            index=index,
            pid=os.getpid(),
            address=app.address,
            http_url=app.http.url if app.http is not None else "",
            metrics_url=metrics.url if metrics is not None else "",
            model=app.models.default,
            engine=app.engine.kind,
        )
        ready.write(json.dumps(dataclasses.asdict(report)) + "\n")
        ready.flush()

    main = serve(settings, on_ready=on_ready, stop_signals=(signal.SIGTERM,))
    return run_server(settings, main, who=f"worker {index}: ")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
