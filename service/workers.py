"""`fairgate serve --workers N`: N server processes on one node, on the same ports.

Python serves one core per process (the GIL), so a node with spare cores runs
several *workers*: each is a whole fairgate server (its own engine adapter,
its own shared `Dispatcher`, a replica of its own in Redis, named by its pid),
and the kernel spreads new connections across them (SO_REUSEPORT on the gRPC
port and the OpenAI HTTP port). Admission state — quotas, VTC counters, the
engine's room, tenants and keys — is shared through the Redis store, exactly
as between replicas on different nodes, so `workers` > 1 requires
store=redis (Settings.validate says so at start-up).

This process (the supervisor) serves nothing. It:
- resolves port 0 to one concrete port every worker binds (held by a
  SO_REUSEPORT socket of its own until all listen, so nobody else takes it);
- gives every worker the same API-key pepper (a random one when none is set:
  keys issued through one worker must verify on the others);
- gives worker i the metrics port `metrics_listen` + i (a scrape endpoint
  reports its own process; Prometheus scrapes each, OTLP tells them apart by
  `service.instance.id`);
- starts the workers (`python -m service.worker_process`) and waits until
  each has reported that it listens (one JSON line on a pipe; the pipe's end
  of file is also how the supervisor learns that a worker exited);
- forwards SIGTERM/SIGINT as SIGTERM (workers ignore SIGINT, so a terminal's
  Ctrl-C, sent to the whole process group, is not counted twice): each drains
  (service/drain.py); a second signal cuts the drains short;
- when a worker dies unexpectedly, stops the others (gracefully) and exits
  non-zero. Not restarted: the process manager (Kubernetes, systemd) restarts
  the pod and counts it, where a silent in-pod restart would hide a crash
  loop and leave a pod serving below its size in the meantime;
- never leaves orphans: workers ask the kernel for SIGTERM when the
  supervisor dies (PR_SET_PDEATHSIG, Linux), even by SIGKILL.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import selectors
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType

from service.settings import ENV_PREFIX, Settings
from service.telemetry.setup import prometheus_listen

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerReady:
    """What a worker reports once it listens."""

    index: int
    pid: int
    address: str
    http_url: str
    metrics_url: str
    model: str
    engine: str


class WorkerFailed(RuntimeError):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def settings_env(settings: Settings) -> dict[str, str]:
    """Every setting as its FAIRGATE_* variable (what a worker reads back)."""
    out = {}
    for name in Settings.model_fields:
        value = getattr(settings, name)
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out[ENV_PREFIX + name.upper()] = text
    return out


def _split(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


def reserve_port(listen: str) -> tuple[str, socket.socket | None]:
    """`host:0` → `host:<a free port>` and the SO_REUSEPORT socket holding it."""
    host, port = _split(listen)
    if port != 0:
        return listen, None
    bare = host.strip("[]") or "0.0.0.0"
    family, type_, proto, _, addr = socket.getaddrinfo(
        bare, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, type_, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(addr)
    return f"{host}:{sock.getsockname()[1]}", sock


def worker_settings(settings: Settings, index: int, metrics_listen: str) -> Settings:
    """Worker `index`'s settings: its own metrics port, the rest shared."""
    if metrics_listen:
        host, port = _split(metrics_listen)
        metrics_listen = f"{host}:{port + index if port else 0}"
    return settings.replace(metrics_listen=metrics_listen)


def _resource_attributes(environ: Mapping[str, str], index: int) -> str:
    """OTEL_RESOURCE_ATTRIBUTES naming the worker (one instance per process for OTLP)."""
    given = environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    mine = [f"fairgate.worker={index}"]
    if "service.instance.id=" not in given:
        mine.append(f"service.instance.id={socket.gethostname()}-{os.getpid()}-w{index}")
    return ",".join([a for a in (given,) if a] + mine)


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    pipe: int  # read end of the worker's ready pipe; EOF: it exited
    buf: bytes = b""
    ready: WorkerReady | None = None
    exit_code: int | None = None
    signalled: int = 0  # SIGTERMs sent


@dataclass
class Supervisor:
    """Starts `settings.workers` servers, forwards stop signals, reaps them."""

    settings: Settings
    extra_env: Mapping[str, str] = field(default_factory=dict)
    workers: list[_Worker] = field(default_factory=list)
    stopping: bool = False
    failure: WorkerFailed | None = None
    _sel: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)

    def start(self) -> list[WorkerReady]:
        """Start every worker; returns once all listen. Raises `WorkerFailed` (after
        stopping the rest) if one exits first."""
        s = self.settings
        held: list[socket.socket] = []
        try:
            listen, sock = reserve_port(s.listen)
            held += [sock] if sock else []
            http_listen = s.http_listen
            if http_listen:
                http_listen, sock = reserve_port(http_listen)
                held += [sock] if sock else []
            pepper = s.api_key_pepper
            if not pepper:
                pepper = secrets.token_urlsafe(32)
                log.warning(
                    "no FAIRGATE_API_KEY_PEPPER: the %d workers share a random one; API keys "
                    "issued now will not verify after a restart nor on other nodes",
                    s.workers,
                )
            if s.engine == "simulator":
                log.warning(
                    "engine=simulator with %d workers: each worker simulates a GPU of its own, "
                    "while admission counts one engine's room for all of them; for one "
                    "simulated GPU behind the workers use `fairgate sim-server` and "
                    "engine=sglang-http",
                    s.workers,
                )
            shared = s.replace(listen=listen, http_listen=http_listen, api_key_pepper=pepper)
            metrics = prometheus_listen(s, {**os.environ, **self.extra_env})
            for i in range(s.workers):
                if self.stopping:  # a signal while starting them
                    break
                self._spawn(i, worker_settings(shared, i, metrics))
            self._loop(until_ready=True)
        finally:
            for sock in held:
                sock.close()
        if self.failure is not None:
            raise self.failure
        return [w.ready for w in self.workers if w.ready is not None]

    def _spawn(self, index: int, settings: Settings) -> None:
        env = {**os.environ, **self.extra_env, **settings_env(settings)}
        env["OTEL_RESOURCE_ATTRIBUTES"] = _resource_attributes(env, index)
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "service.worker_process",
                    str(index),
                    str(os.getpid()),
                    str(write_fd),
                ],
                env=env,
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
            )
        finally:
            os.close(write_fd)
        self.workers.append(_Worker(index, proc, read_fd))
        self._sel.register(read_fd, selectors.EVENT_READ, self.workers[-1])

    def stop(self, *_: object) -> None:
        """SIGTERM every live worker (a second call: cut their drains short)."""
        self.stopping = True
        for w in self.workers:
            self._terminate(w)

    def _terminate(self, w: _Worker) -> None:
        if w.exit_code is None:
            w.signalled += 1
            w.proc.send_signal(signal.SIGTERM)  # a no-op once it is reaped

    def wait(self) -> int:
        """Wait until every worker exited: 0 after a requested stop, else the first
        failed worker's exit status (1 when it died of a signal)."""
        self._loop(until_ready=False)
        return self.failure.exit_code if self.failure is not None else 0

    def _loop(self, *, until_ready: bool) -> None:
        while self._sel.get_map():
            if until_ready and all(w.ready or w.exit_code is not None for w in self.workers):
                return
            for key, _ in self._sel.select():
                self._on_readable(key.data)

    def _on_readable(self, w: _Worker) -> None:
        chunk = os.read(w.pipe, 4096)
        if chunk:
            w.buf += chunk
            line, nl, w.buf = w.buf.partition(b"\n")
            if nl:
                w.ready = WorkerReady(**json.loads(line))
                if self.stopping and not w.signalled:  # started after the stop
                    self._terminate(w)
            else:
                w.buf = line
            return
        self._sel.unregister(w.pipe)
        os.close(w.pipe)
        w.exit_code = w.proc.wait()
        if self.stopping:
            log.info("worker %d (pid %d) exited with %d", w.index, w.proc.pid, w.exit_code)
            return
        when = "before listening" if w.ready is None else "unexpectedly"
        self.failure = WorkerFailed(
            f"worker {w.index} (pid {w.proc.pid}) exited {when} with {w.exit_code}",
            w.exit_code if w.exit_code > 0 else 1,
        )
        log.error("%s: stopping the other workers", self.failure)
        self.stop()


def supervise(settings: Settings) -> int:
    """`fairgate serve` with workers > 1: run them until a signal; the exit code."""
    sup = Supervisor(settings)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        sup.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        ready = sup.start()
    except WorkerFailed as exc:
        sup.wait()
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if sup.stopping:  # a signal while they started
        return sup.wait()
    first = ready[0]
    http = f", OpenAI API on {first.http_url}" if first.http_url else ""
    pids = " ".join(str(r.pid) for r in ready)
    print(
        f"fairgate listening on {first.address}{http} (model {first.model}, engine "
        f"{first.engine}, {len(ready)} workers: pids {pids}); Ctrl-C to stop",
        flush=True,
    )
    for r in ready:
        if r.metrics_url:
            log.info("worker %d (pid %d) metrics on %s", r.index, r.pid, r.metrics_url)
    return sup.wait()
