"""Generated code must match the .proto files; the API must pass buf lint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_generated_code_matches_protos() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_buf_lint() -> None:
    buf = shutil.which("buf") or str(Path(sys.executable).parent / "buf")
    if not Path(buf).exists():
        pytest.fail("buf is not installed; `pip install -e '.[dev]'` brings it (buf-bin)")
    proc = subprocess.run(
        [buf, "lint"], cwd=ROOT / "protos", capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
