"""`fairgate serve` that cannot start: one line naming the setting, a non-zero exit.

Each case runs the real command in a subprocess; all of them at once (one
fixture), so the dozen interpreter start-ups overlap. Log records (timestamped
DEBUG/INFO/WARNING lines) may come first; anything else on stderr (a
traceback, asyncio's "Event loop is closed", grpc-core's own lines) fails.
An address that is not host:port is a settings problem, listed with every
other one before anything starts (tests/unit/service/test_settings.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.startup import StartupError
from tests.conftest import StartServer

FAIRGATE = [sys.executable, "-m", "fairgate.cli.main", "serve", "--listen", "127.0.0.1:0"]
FAIRGATE += ["--http-listen", "127.0.0.1:0"]  # whatever the default port
LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING) ")


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    setting: str  # the setting the line must name (its flag and variable)
    says: str  # and what it must say
    exit_code: int = 2
    env: tuple[tuple[str, str], ...] = ()
    blocked: str = ""  # an optional package made unimportable


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("startup")
    (root / "garbage.pem").write_text("not a certificate\n")
    (root / "tok").mkdir()
    (root / "tok" / "tokenizer.json").write_text("{}")
    for package in ("uvloop", "tokenizers"):
        # First on PYTHONPATH: found, but its import fails as a missing package's does.
        (root / package / package).mkdir(parents=True)
        (root / package / package / "__init__.py").write_text(
            f"raise ImportError('No module named {package}')\n"
        )
    return root


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cases(port: int, files: Path) -> dict[str, Case]:
    garbage = str(files / "garbage.pem")
    redis = ("--store", "redis", "--redis-url", f"redis://127.0.0.1:{_closed_port()}/0")
    return {
        "busy http port": Case(
            ("--http-listen", f"127.0.0.1:{port}"), "http_listen", "already in use", 1
        ),
        "busy grpc port": Case(("--listen", f"127.0.0.1:{port}"), "listen", "already in use", 1),
        "address not on this machine": Case(
            ("--listen", "192.0.2.1:50051"), "listen", "not an address of this machine", 1
        ),
        "missing tokenizers package": Case(
            (),
            "tokenizer_path",
            "install 'fairgate[hf]'",
            2,
            (("FAIRGATE_TOKENIZER_PATH", str(files / "tok")),),
            "tokenizers",
        ),
        "missing uvloop": Case(
            ("--event-loop", "uvloop"), "event_loop", "install 'fairgate[uvloop]'", 2, (), "uvloop"
        ),
        "no tokenizer at the path": Case(
            ("--tokenizer", str(files / "nowhere")), "tokenizer_path", "no tokenizer.json"
        ),
        "not a tokenizer file": Case(
            ("--tokenizer", str(files / "tok")), "tokenizer_path", "not a Hugging Face"
        ),
        "missing TLS file": Case(
            ("--tls-cert-file", str(files / "none.pem"), "--tls-key-file", garbage),
            "tls_cert_file",
            "No such file",
        ),
        "bad TLS file": Case(
            ("--tls-cert-file", garbage, "--tls-key-file", garbage),
            "tls_cert_file",
            "not a PEM certificate and its key",
        ),
        "unreachable Redis": Case(
            (*redis, "--redis-failure-mode", "closed"), "redis_url", "unreachable", 1
        ),
    }


async def _serve(case: Case, files: Path) -> tuple[int, str]:
    env = dict(os.environ) | dict(case.env)
    if case.blocked:
        env["PYTHONPATH"] = str(files / case.blocked)
    proc = await asyncio.create_subprocess_exec(
        *FAIRGATE,
        *case.args,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.fixture(scope="module")
def outcomes(busy_port: int, files: Path) -> dict[str, tuple[int, str]]:
    table = cases(busy_port, files)

    async def run_all() -> list[tuple[int, str]]:
        return await asyncio.gather(*(_serve(c, files) for c in table.values()))

    return dict(zip(table, asyncio.run(run_all()), strict=True))


@pytest.mark.parametrize("name", list(cases(1, Path())))
def test_startup_failure_is_one_line_naming_the_setting(
    name: str, outcomes: dict[str, tuple[int, str]], busy_port: int, files: Path
) -> None:
    case = cases(busy_port, files)[name]
    code, err = outcomes[name]
    assert code == case.exit_code, err
    lines = [line for line in err.splitlines() if line.strip() and not LOG_RECORD.match(line)]
    assert len(lines) == 1, err
    (line,) = lines
    flag, var = "--" + case.setting.replace("_", "-"), "FAIRGATE_" + case.setting.upper()
    assert line.startswith("error: ") and case.says in line, line
    assert f"setting {case.setting}: {flag} / {var}" in line, line
    assert "Traceback" not in err and "never awaited" not in err


async def test_a_port_taken_after_the_check_closes_what_had_started(
    start_server: StartServer, busy_port: int
) -> None:
    # App.start itself (the port taken between the check and the bind): the gRPC
    # server, engine and stores it had started are closed before the error.
    before = asyncio.all_tasks()
    with pytest.raises(StartupError) as err:
        await start_server(http_listen=f"127.0.0.1:{busy_port}")
    assert err.value.setting == "http_listen" and "cannot listen" in str(err.value)
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - before == set()
