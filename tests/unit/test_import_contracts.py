"""The import contracts of pyproject.toml ([tool.importlinter]) hold: scheduler <-
service <- command line / benchmarks / planner, a scheduler without gRPC,
protobuf, OpenTelemetry or HTTP, a client that imports neither the server nor
the command line, and no import cycles. `.ci/run` runs `lint-imports` too; this
keeps the README's test command checking them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "Contracts: 4 kept, 0 broken." in done.stdout, done.stdout[-2000:]
