"""Fixtures for the admin API: a server in a background thread (so the blocking
CLI and AdminClient can drive it from plain test functions), admin helpers."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fairgate.cli.main import app as cli_app
from typer.testing import CliRunner

from service.app import App
from service.settings import Settings
from tests.tls_certs import CertFiles, make_certs

ADMIN_TOKEN = "test-admin-token-0123456789"
T = TypeVar("T")


class ServerThread:
    """A fairgate server on its own event loop in a daemon thread."""

    def __init__(self, **overrides: Any) -> None:
        base = Settings(
            listen="127.0.0.1:0",
            http_listen="",
            sim_time_scale=0.0,
            shutdown_grace_s=0.5,
            admin_token=ADMIN_TOKEN,
        )
        self.settings = base.replace(**overrides)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.app: App = self.call(App.start(self.settings))

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    @property
    def address(self) -> str:
        return self.app.address

    def stop(self) -> None:
        self.call(self.app.stop(grace_s=0.2))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def server_thread() -> Iterator[ServerThread]:
    srv = ServerThread()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("certs"))


class Cli:
    """Runs `fairgate ...` in-process against one server, with the admin token in env."""

    def __init__(self, address: str, token: str | None = ADMIN_TOKEN) -> None:
        self.env = {"FAIRGATE_ADDRESS": address}
        if token is not None:
            self.env["FAIRGATE_ADMIN_TOKEN"] = token
        self.runner = CliRunner()

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> Any:
        return self.runner.invoke(cli_app, list(args), env={**self.env, **(env or {})})


@pytest.fixture
def cli(server_thread: ServerThread) -> Cli:
    return Cli(server_thread.address)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)
