"""The real SGLang server for this suite: started once per session, killed at the end.

Every test here is marked `sglang` and runs only when selected (`pytest -m sglang
tests/sglang`; the default run deselects it). Selected, a failed install or
start-up is an error in every test, never a skip. `FAIRGATE_TEST_SGLANG_URLS=A,B`
reuses servers started by hand (A: default flags, B: the flags of `sglang_b`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fairgate.bench.sglang_cpu import RealSglang, SglangUnavailable, install, tokenizer_file

from tests.sglang_helpers import start_sim

# Flags of the second server: the other streaming mode, priority scheduling, a small batch.
B_FLAGS = (
    "--incremental-streaming-output",
    "--enable-priority-scheduling",
    "--max-running-requests",
    "4",
)
HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.sglang)
            # The first test of a session waits for start-up (20 s to minutes under load).
            item.add_marker(pytest.mark.timeout(900))


def _reused(index: int, flags: tuple[str, ...]) -> RealSglang | None:
    urls = [u for u in os.environ.get("FAIRGATE_TEST_SGLANG_URLS", "").split(",") if u]
    if index >= len(urls):
        return None
    return RealSglang(pid=0, url=urls[index].rstrip("/"), log=Path("/dev/null"), flags=flags)


def _start(index: int, *flags: str) -> Iterator[RealSglang]:
    reused = _reused(index, flags)
    if reused is not None:
        yield reused
        return
    try:
        install()
        server = RealSglang.start(*flags)
    except SglangUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def sglang_a() -> Iterator[RealSglang]:
    """SGLang with the scripts' defaults: cumulative chunks, 16 running, 16384 KV tokens."""
    yield from _start(0)


@pytest.fixture(scope="session")
def sglang_b() -> Iterator[RealSglang]:
    """SGLang with incremental chunks, priority scheduling and 4 running requests."""
    yield from _start(1, *B_FLAGS)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> str:
    """The served model's tokenizer.json, for exact prompt counts."""
    path = tokenizer_file()
    if not path.is_file():
        pytest.fail(f"no tokenizer at {path}: did install.sh run?", pytrace=False)
    return str(path)


__all__ = ["start_sim"]
