"""`fairgate serve` loads no benchmark or planner code: not at start, not while it
serves a request (issue #31: the server used to import 19 bench modules at start).
Read from the running server itself with `python -X importtime`."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

from fairgate.sync import Client

FORBIDDEN = ("fairgate.bench", "fairgate.plan")


def _imported(log: str) -> set[str]:
    # importtime lines: "import time: self | cumulative | <indent>module"
    return {m.group(1) for m in re.finditer(r"^import time:.*\|\s*(\S+)\s*$", log, re.M)}


def test_serve_imports_no_bench_or_plan_module(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAIRGATE_", "OTEL_"))}
    command = [sys.executable, "-X", "importtime", "-m", "fairgate.cli.main", "serve"]
    command += ["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"]
    log_path = tmp_path / "imports.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
        assert proc.stdout is not None
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            line = proc.stdout.readline() if ready else ""
            found = re.search(r"listening on (\S+), OpenAI API on (\S+) ", line)
            assert found, f"no announcement: {line!r}"
            with Client(found.group(1)) as client:
                assert client.complete("hello", max_tokens=4).result.usage.completion_tokens == 4
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            proc.stdout.close()
    modules = _imported(log_path.read_text())
    assert "service.app" in modules  # the log is the server's, and it was read
    leaked = sorted(m for m in modules if m.startswith(FORBIDDEN))
    assert leaked == [], f"serve imported {len(leaked)} bench/plan modules: {leaked}"
