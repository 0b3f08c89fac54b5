"""The supervisor's pure parts: what each worker is told (service/workers.py)."""

from __future__ import annotations

import socket

import pytest

from service.settings import Settings
from service.workers import reserve_port, settings_env, worker_settings


def test_a_worker_reads_back_exactly_the_supervisors_settings() -> None:
    s = Settings(
        store="redis",
        workers=3,
        replicas=2,
        sim_time_scale=0.125,
        stream_coalesce=False,
        api_key_pepper="p" * 20,
        admin_token="secret-token",
        redis_url="redis://h:1/2",
    )
    assert Settings.from_env(settings_env(s)) == s


def test_every_worker_counts_as_a_replica() -> None:
    assert Settings(store="redis", workers=4, replicas=3).replica_processes == 12


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:9464", ["127.0.0.1:9464", "127.0.0.1:9465", "127.0.0.1:9466"]),
        ("127.0.0.1:0", ["127.0.0.1:0"] * 3),
        ("", [""] * 3),
    ],
)
def test_worker_i_serves_metrics_on_port_plus_i(listen: str, expected: list[str]) -> None:
    s = Settings(store="redis", workers=3)
    assert [worker_settings(s, i, listen).metrics_listen for i in range(3)] == expected
    assert worker_settings(s, 2, listen).replace(metrics_listen="") == s


def test_port_zero_becomes_one_port_every_worker_can_bind() -> None:
    listen, held = reserve_port("127.0.0.1:0")
    assert held is not None
    port = int(listen.rsplit(":", 1)[1])
    try:
        assert port != 0
        with socket.socket() as worker:  # a worker binds it too (SO_REUSEPORT)...
            worker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            worker.bind(("127.0.0.1", port))
        with socket.socket() as other, pytest.raises(OSError):  # ...nobody else can
            other.bind(("127.0.0.1", port))
    finally:
        held.close()
    assert reserve_port("127.0.0.1:50051") == ("127.0.0.1:50051", None)
