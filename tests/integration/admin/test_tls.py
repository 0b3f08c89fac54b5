"""TLS and mutual TLS on the server port, for both services, from clients and the CLI."""

from __future__ import annotations

import asyncio
import json
import sys

import grpc
import pytest
from fairgate import AsyncClient, FairgateError, TlsConfig

from service.app import App
from tests.conftest import StartServer
from tests.helpers import sim
from tests.integration.admin.conftest import ADMIN_TOKEN, Cli, ServerThread
from tests.tls_certs import CertFiles


async def _refused(app: App, **kwargs: object) -> FairgateError:
    started = sim(app).stats.started
    async with AsyncClient(app.address, timeout_s=3, **kwargs) as c:  # type: ignore[arg-type]
        with pytest.raises(FairgateError) as err:
            await c.complete("must not run", max_tokens=1)
    assert sim(app).stats.started == started
    return err.value


async def test_tls_server(start_server: StartServer, certs: CertFiles) -> None:
    app = await start_server(tls_cert_file=certs.server_cert, tls_key_file=certs.server_key)
    async with AsyncClient(app.address, tls=TlsConfig(ca_file=certs.ca)) as c:
        assert (await c.complete("over tls", max_tokens=2)).result.finish_reason == "length"
    # A plaintext client cannot talk to a TLS port.
    err = await _refused(app)
    assert err.code == grpc.StatusCode.UNAVAILABLE
    # A client that does not trust the server's CA refuses the handshake.
    err = await _refused(app, tls=TlsConfig(ca_file=certs.other_ca))
    assert err.code == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls(start_server: StartServer, certs: CertFiles) -> None:
    app = await start_server(
        tls_cert_file=certs.server_cert,
        tls_key_file=certs.server_key,
        tls_client_ca_file=certs.ca,
    )
    mtls = TlsConfig(ca_file=certs.ca, cert_file=certs.client_cert, key_file=certs.client_key)
    async with AsyncClient(app.address, tls=mtls) as c:
        await c.complete("mutual", max_tokens=1)
    err = await _refused(app, tls=TlsConfig(ca_file=certs.ca))  # no client certificate
    assert err.code == grpc.StatusCode.UNAVAILABLE


def test_cli_over_mutual_tls(certs: CertFiles) -> None:
    srv = ServerThread(
        tls_cert_file=certs.server_cert,
        tls_key_file=certs.server_key,
        tls_client_ca_file=certs.ca,
    )
    try:
        cli = Cli(srv.address)
        tls_env = {
            "FAIRGATE_CA_FILE": certs.ca,
            "FAIRGATE_CLIENT_CERT_FILE": certs.client_cert,
            "FAIRGATE_CLIENT_KEY_FILE": certs.client_key,
        }
        r = cli("admin", "-o", "json", "tenants", "create", "secure", env=tls_env)
        assert r.exit_code == 0, r.output
        r = cli("admin", "--timeout", "3", "tenants", "list", env={"FAIRGATE_CA_FILE": certs.ca})
        assert r.exit_code == 6, r.output  # handshake refused without a client cert
        r = cli("admin", "--timeout", "3", "tenants", "list")
        assert r.exit_code == 6, r.output  # plaintext
        r = cli("admin", "-o", "json", "keys", "issue", "secure", env=tls_env)
        secret = json.loads(r.stdout)["secret"]
        # A couple of real processes: generate (API key + mTLS) and health.
        code, out, err = asyncio.run(
            _subprocess(
                "generate",
                "tls from a subprocess",
                "-a",
                srv.address,
                "--max-tokens",
                "3",
                "--ca-file",
                certs.ca,
                "--cert-file",
                certs.client_cert,
                "--key-file",
                certs.client_key,
                "--api-key",
                secret,
            )
        )
        assert code == 0, err
        assert "completion 3" in out
        code, _, err = asyncio.run(
            _subprocess(
                "health",
                "-a",
                srv.address,
                "--ca-file",
                certs.ca,
                "--cert-file",
                certs.client_cert,
                "--key-file",
                certs.client_key,
            )
        )
        assert code == 0, err
    finally:
        srv.stop()


async def _subprocess(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "fairgate.cli.main",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "FAIRGATE_ADMIN_TOKEN": ADMIN_TOKEN},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
