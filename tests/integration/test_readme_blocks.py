"""The README's marked code blocks, run as a reader pastes them after the quick start.

Markers: an HTML comment on the line just before a fenced block.

- `<!-- server -->` (```sh): the block starts a server with `fairgate serve`
  (in a block like the quick start's `... && .venv/bin/fairgate serve`, the
  `&&` part that runs it; leading NAME=VALUE words are its environment). It
  is started once, with its own flags and variables, on the embedded defaults
  otherwise.
- `<!-- runnable -->` (```sh or ```python): the block runs against the server
  of the nearest `<!-- server -->` block above it and must exit 0; shell
  blocks under `bash -euo pipefail`, Python with this interpreter.

Mark every block that works on the defaults; leave unmarked what needs more
(a GPU, a Docker daemon, grpcurl).

What the test changes, and nothing else: servers listen on free loopback
ports instead of the documented 127.0.0.1:50051 (gRPC) and 127.0.0.1:8000
(HTTP), so those addresses in a block become the real ones, and
FAIRGATE_ADDRESS (the CLI's address variable) names the real gRPC port;
`.venv/bin/` is found on PATH as the directory of the Python running the
tests (the same .venv when run as the README says); FAIRGATE_* and OTEL_*
variables of the test's own environment are not passed on.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.markdown_docs import REPO, Block, code_blocks

GRPC_DOC = "127.0.0.1:50051"
HTTP_DOC = "127.0.0.1:8000"
BIN = Path(sys.executable).parent
READY = re.compile(r"fairgate listening on ([^\s,]+)(?:, OpenAI API on http://([^/\s]+))?")
START_TIMEOUT_S = 60
BLOCK_TIMEOUT_S = 60

RUNNABLE = [b for b in code_blocks() if b.marker == "runnable"]


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAIRGATE_", "OTEL_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


@dataclass
class Server:
    proc: subprocess.Popen[str]
    grpc: str
    http: str | None
    log: list[str] = field(default_factory=list)


def _serve_command(block: Block) -> tuple[dict[str, str], list[str]]:
    """The environment and argv of a server block's `fairgate serve`."""
    text = block.code.replace("\\\n", " ")
    for doc in (GRPC_DOC, HTTP_DOC):
        text = text.replace(doc, "127.0.0.1:0")
    (part,) = [p for p in text.split("&&") if "fairgate serve" in p]
    words = shlex.split(part, comments=True)
    env: dict[str, str] = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    assert words[:2] == [".venv/bin/fairgate", "serve"], block.code
    return env, [str(BIN / "fairgate"), *words[1:]]


def _start(block: Block) -> Server:
    env, argv = _serve_command(block)
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        # Both ports free ones, also where a block leaves the defaults: the
        # servers of several blocks run at once.
        env={
            **_clean_env(),
            "FAIRGATE_LISTEN": "127.0.0.1:0",
            "FAIRGATE_HTTP_LISTEN": "127.0.0.1:0",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    log: list[str] = []

    def read() -> None:  # keeps the pipe drained for the server's whole life
        assert proc.stdout is not None
        for line in proc.stdout:
            log.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            proc.kill()
            pytest.fail(f"README.md:{block.line}: server not listening: {''.join(log)}")
        if line is None:
            pytest.fail(f"README.md:{block.line}: server exited: {''.join(log)}")
        if m := READY.search(line):
            return Server(proc, m.group(1), m.group(2), log)


class Servers:
    """Each server block started once, when a block first needs it."""

    def __init__(self) -> None:
        self.running: dict[int, Server] = {}

    def get(self, block: Block) -> Server:
        if block.line not in self.running:
            self.running[block.line] = _start(block)
        return self.running[block.line]

    def stop(self) -> None:
        for server in self.running.values():
            server.proc.send_signal(signal.SIGTERM)
        for server in self.running.values():
            try:
                server.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    pool = Servers()
    yield pool
    pool.stop()


def test_readme_marks_blocks_to_run() -> None:
    assert {b.language for b in RUNNABLE} == {"sh", "python"}


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: f"README.md:{b.line}")
def test_block_runs_as_pasted(block: Block, servers: Servers) -> None:
    assert block.server is not None
    server = servers.get(block.server)
    code = block.code.replace(GRPC_DOC, server.grpc)
    if server.http is not None:
        code = code.replace(HTTP_DOC, server.http)
    if block.language == "sh":
        argv = ["bash", "-c", "set -euo pipefail\n" + code.replace(".venv/bin/", "")]
    else:
        argv = [sys.executable, "-c", code]
    env = {**_clean_env(), "FAIRGATE_ADDRESS": server.grpc}
    done = subprocess.run(
        argv,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, (
        f"README.md:{block.line} exited {done.returncode}\n--- stdout\n{done.stdout}"
        f"\n--- stderr\n{done.stderr}\n--- server log\n{''.join(server.log[-20:])}"
    )
    assert done.stdout.strip(), f"README.md:{block.line} printed nothing"
