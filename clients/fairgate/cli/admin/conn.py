"""`fairgate admin` connection options, output format, exit codes and errors.

The options are declared once on the `admin` group and accepted after any
subcommand too (`fairgate admin keys issue t -o json`), see
`fairgate.cli.shared.with_shared_options` (`@shared` on each command).

Exit codes: 0 ok; 1 other error; 2 bad usage or input (INVALID_ARGUMENT, a bad
file); 3 not found; 4 conflict (stale etag, already exists, failed
precondition); 5 not allowed (UNAUTHENTICATED, PERMISSION_DENIED);
6 server unreachable (UNAVAILABLE, DEADLINE_EXCEEDED, TLS handshake);
7 drift (`apply --exit-code`: the server differs from the file).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import grpc
import typer

from fairgate.admin.client import AdminClient
from fairgate.cli.admin import render
from fairgate.cli.shared import with_shared_options
from fairgate.errors import FairgateError
from fairgate.tls import TlsConfig

(
    EXIT_OK,
    EXIT_ERROR,
    EXIT_INPUT,
    EXIT_NOT_FOUND,
    EXIT_CONFLICT,
    EXIT_DENIED,
    EXIT_UNREACHABLE,
    EXIT_DRIFT,
) = range(8)
_EXIT_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: EXIT_INPUT,
    grpc.StatusCode.NOT_FOUND: EXIT_NOT_FOUND,
    grpc.StatusCode.ABORTED: EXIT_CONFLICT,
    grpc.StatusCode.ALREADY_EXISTS: EXIT_CONFLICT,
    grpc.StatusCode.FAILED_PRECONDITION: EXIT_CONFLICT,
    grpc.StatusCode.UNAUTHENTICATED: EXIT_DENIED,
    grpc.StatusCode.PERMISSION_DENIED: EXIT_DENIED,
    grpc.StatusCode.UNAVAILABLE: EXIT_UNREACHABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: EXIT_UNREACHABLE,
}


class Output(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"


@dataclass(slots=True)
class Conn:
    address: str = "127.0.0.1:50051"
    token: str | None = None
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None
    output: Output = Output.table
    timeout: float = 10.0

    def client(self) -> AdminClient:
        tls_cfg = None
        if self.tls or self.ca_file or self.cert_file:
            tls_cfg = TlsConfig(self.ca_file, self.cert_file, self.key_file, self.server_name)
        return AdminClient(self.address, token=self.token, tls=tls_cfg, timeout_s=self.timeout)

    @property
    def json(self) -> bool:
        """Machine-readable output (JSON or YAML) rather than a table."""
        return self.output is not Output.table


def set_option(conn: Conn, name: str, value: Any) -> None:
    """An option given after the subcommand overrides the group's."""
    setattr(conn, name, Output(value) if name == "output" else value)


def connect(
    ctx: typer.Context,
    address: Annotated[
        str, typer.Option("--address", "-a", envvar="FAIRGATE_ADDRESS", help="server host:port")
    ] = "127.0.0.1:50051",
    token: Annotated[
        str | None,
        typer.Option(envvar="FAIRGATE_ADMIN_TOKEN", help="admin token", show_default=False),
    ] = None,
    tls: Annotated[bool, typer.Option(envvar="FAIRGATE_TLS", help="use TLS")] = False,
    ca_file: Annotated[
        str | None, typer.Option(envvar="FAIRGATE_CA_FILE", help="PEM root CA (implies --tls)")
    ] = None,
    cert_file: Annotated[
        str | None, typer.Option(envvar="FAIRGATE_CLIENT_CERT_FILE", help="client cert (mTLS)")
    ] = None,
    key_file: Annotated[
        str | None, typer.Option(envvar="FAIRGATE_CLIENT_KEY_FILE", help="client key (mTLS)")
    ] = None,
    server_name: Annotated[
        str | None,
        typer.Option(envvar="FAIRGATE_TLS_SERVER_NAME", help="name to verify in the server cert"),
    ] = None,
    output: Annotated[
        Output,
        typer.Option("--output", "-o", envvar="FAIRGATE_OUTPUT", help="table, json or yaml"),
    ] = Output.table,
    timeout: Annotated[float, typer.Option(help="seconds per call")] = 10.0,
) -> None:
    """Connection options: here or after any subcommand."""
    ctx.obj = Conn(address, token, tls, ca_file, cert_file, key_file, server_name, output, timeout)


# Every admin command takes the connection options too.
shared = with_shared_options(connect, set_option)


def die(code: int, message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def fail(exc: FairgateError, as_json: bool) -> NoReturn:
    code = _EXIT_BY_CODE.get(exc.code, EXIT_ERROR)
    if as_json:
        err: dict[str, Any] = {"code": exc.code.name, "message": exc.message}
        if exc.reason:
            err["reason"] = exc.reason
        if exc.field_violations:
            err["field_violations"] = [
                {"field": f, "description": d} for f, d in exc.field_violations
            ]
        sys.stderr.write(json.dumps({"error": err}) + "\n")
    else:
        # With field violations listed below, the summary line need not repeat them.
        message = exc.message.split(":", 1)[0] if exc.field_violations else exc.message
        typer.echo(f"error: {exc.code.name}: {message}", err=True)
        for field, desc in exc.field_violations:
            typer.echo(f"  {field}: {desc}", err=True)
    raise typer.Exit(code)


@contextmanager
def session(ctx: typer.Context) -> Iterator[tuple[Conn, AdminClient]]:
    conn: Conn = ctx.obj
    try:
        client = conn.client()
    except ValueError as exc:
        die(EXIT_INPUT, str(exc))
    try:
        with client:
            yield conn, client
    except FairgateError as exc:
        fail(exc, conn.json)


def bad_flags(problems: list[str]) -> typer.Exit:
    """Every bad flag, one `error:` line each; exit code 2 (raise what it returns)."""
    for problem in problems:
        typer.echo(f"error: {problem}", err=True)
    return typer.Exit(EXIT_INPUT)


def emit(conn: Conn, value: Any) -> None:
    """`value` as the chosen output format (JSON or YAML)."""
    render.print_data(value, conn.output.value)
