"""`fairgate admin`: tenants, API keys, usage and declarative apply.

Connection flags (or env vars): --address (FAIRGATE_ADDRESS), --token
(FAIRGATE_ADMIN_TOKEN), --tls (FAIRGATE_TLS), --ca-file (FAIRGATE_CA_FILE),
--cert-file / --key-file (FAIRGATE_CLIENT_CERT_FILE / FAIRGATE_CLIENT_KEY_FILE),
--server-name (FAIRGATE_TLS_SERVER_NAME); --output table|json (FAIRGATE_OUTPUT).

Exit codes: 0 ok; 1 other error; 2 bad usage or input (INVALID_ARGUMENT, a bad
file); 3 not found; 4 conflict (stale etag, already exists, failed
precondition); 5 not allowed (UNAUTHENTICATED, PERMISSION_DENIED);
6 server unreachable (UNAVAILABLE, DEADLINE_EXCEEDED, TLS handshake).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import grpc
import typer

from fairgate.admin import render
from fairgate.admin.client import AdminClient
from fairgate.admin.tenant_args import tenant_from_flags
from fairgate.errors import FairgateError
from fairgate.tls import TlsConfig

EXIT_OK, EXIT_ERROR, EXIT_INPUT, EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_DENIED, EXIT_UNREACHABLE = (
    range(7)
)
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


@dataclass(slots=True)
class Conn:
    address: str
    token: str | None
    tls: TlsConfig | None
    output: Output
    timeout_s: float

    def client(self) -> AdminClient:
        return AdminClient(self.address, token=self.token, tls=self.tls, timeout_s=self.timeout_s)

    @property
    def json(self) -> bool:
        return self.output is Output.json


admin_app = typer.Typer(
    no_args_is_help=True, help="Administer tenants, API keys and quotas (AdminService)."
)
tenants_app = typer.Typer(no_args_is_help=True, help="Create, show, change and delete tenants.")
keys_app = typer.Typer(no_args_is_help=True, help="Issue, rotate, revoke and list API keys.")
admin_app.add_typer(tenants_app, name="tenants")
admin_app.add_typer(keys_app, name="keys")


@admin_app.callback()
def _connect(
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
        Output, typer.Option("--output", "-o", envvar="FAIRGATE_OUTPUT", help="table or json")
    ] = Output.table,
    timeout: Annotated[float, typer.Option(help="seconds per call")] = 10.0,
) -> None:
    try:
        tls_cfg = (
            TlsConfig(ca_file, cert_file, key_file, server_name)
            if tls or ca_file or cert_file
            else None
        )
    except ValueError as exc:
        _die(EXIT_INPUT, str(exc))
    ctx.obj = Conn(address, token, tls_cfg, output, timeout)


def _die(code: int, message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _fail(exc: FairgateError, as_json: bool) -> typer.Exit:
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
def _session(ctx: typer.Context) -> Iterator[tuple[Conn, AdminClient]]:
    conn: Conn = ctx.obj
    try:
        client = conn.client()
    except ValueError as exc:
        _die(EXIT_INPUT, str(exc))
    try:
        with client:
            yield conn, client
    except FairgateError as exc:
        _fail(exc, conn.json)


# -- tenants ------------------------------------------------------------------
WeightOpt = Annotated[float | None, typer.Option(help="fair-share weight (> 0)")]
PriorityOpt = Annotated[
    list[str] | None, typer.Option("--priority", help="allowed class (repeatable)")
]
OverQuotaOpt = Annotated[str | None, typer.Option(help="reject | wait")]
QuotaOpt = Annotated[
    list[str] | None,
    typer.Option("--quota", "-q", help="NAME=VALUE, e.g. requests_per_s=5 (none: no limit)"),
]


@tenants_app.command("list")
def tenants_list(ctx: typer.Context) -> None:
    """List tenants (the default tenant is marked)."""
    with _session(ctx) as (conn, client):
        resp = client.list_tenants()
        if conn.json:
            render.print_json(render.to_dict(resp))
        else:
            render.console().print(render.tenants_table(resp.tenants, resp.default_tenant_id))


@tenants_app.command("show")
def tenants_show(ctx: typer.Context, tenant_id: str) -> None:
    """Show one tenant with its etag."""
    with _session(ctx) as (conn, client):
        t = client.get_tenant(tenant_id)
        if conn.json:
            render.print_json(render.to_dict(t))
        else:
            default = client.list_tenants().default_tenant_id
            render.console().print(render.tenants_table([t], default))


@tenants_app.command("create")
def tenants_create(
    ctx: typer.Context,
    tenant_id: str,
    weight: WeightOpt = None,
    priority: PriorityOpt = None,
    over_quota: OverQuotaOpt = None,
    quota: QuotaOpt = None,
    disabled: Annotated[bool, typer.Option(help="create it disabled")] = False,
    default: Annotated[bool, typer.Option(help="also make it the default tenant")] = False,
) -> None:
    """Create a tenant."""
    try:
        tenant, _ = tenant_from_flags(
            tenant_id, weight, priority, over_quota, quota, None if not disabled else False
        )
    except ValueError as exc:
        _die(EXIT_INPUT, str(exc))
    with _session(ctx) as (conn, client):
        created = client.create_tenant(tenant)
        if default:
            client.set_default_tenant(created.id)
        _print_tenant(conn, created, f"created tenant {created.id} (etag {created.etag})")


@tenants_app.command("update")
def tenants_update(
    ctx: typer.Context,
    tenant_id: str,
    weight: WeightOpt = None,
    priority: PriorityOpt = None,
    over_quota: OverQuotaOpt = None,
    quota: QuotaOpt = None,
    enabled: Annotated[
        bool | None, typer.Option("--enable/--disable", help="serve it or refuse it")
    ] = None,
    etag: Annotated[
        str | None, typer.Option(help="only if the tenant is still at this etag")
    ] = None,
) -> None:
    """Change the given fields of a tenant (others stay as they are)."""
    try:
        tenant, paths = tenant_from_flags(tenant_id, weight, priority, over_quota, quota, enabled)
    except ValueError as exc:
        _die(EXIT_INPUT, str(exc))
    if not paths:
        _die(EXIT_INPUT, "nothing to change: give --weight, --priority, --quota, ...")
    tenant.etag = etag or ""
    with _session(ctx) as (conn, client):
        updated = client.update_tenant(tenant, paths)
        _print_tenant(conn, updated, f"updated tenant {updated.id} (etag {updated.etag})")


@tenants_app.command("delete")
def tenants_delete(
    ctx: typer.Context,
    tenant_id: str,
    etag: Annotated[
        str | None, typer.Option(help="only if the tenant is still at this etag")
    ] = None,
) -> None:
    """Delete a tenant and its API keys."""
    with _session(ctx) as (conn, client):
        client.delete_tenant(tenant_id, etag or "")
        if conn.json:
            render.print_json({"deleted": tenant_id})
        else:
            typer.echo(f"deleted tenant {tenant_id}")


@tenants_app.command("set-default")
def tenants_set_default(
    ctx: typer.Context,
    tenant_id: Annotated[str, typer.Argument(help="tenant id; '' for none")],
) -> None:
    """Name the tenant that serves requests naming none ('' to refuse them)."""
    with _session(ctx) as (conn, client):
        client.set_default_tenant(tenant_id)
        if conn.json:
            render.print_json({"default_tenant_id": tenant_id})
        else:
            typer.echo(f"default tenant: {tenant_id or '(none)'}")


def _print_tenant(conn: Conn, tenant: Any, message: str) -> None:
    if conn.json:
        render.print_json(render.to_dict(tenant))
    else:
        typer.echo(message)


# -- keys ---------------------------------------------------------------------
@keys_app.command("issue")
def keys_issue(
    ctx: typer.Context,
    tenant_id: str,
    name: Annotated[str, typer.Option(help="a label for the key")] = "",
) -> None:
    """Issue an API key; the secret is printed once and never again."""
    with _session(ctx) as (conn, client):
        resp = client.issue_key(tenant_id, name)
        _print_secret(conn, resp.key, resp.secret)


@keys_app.command("rotate")
def keys_rotate(
    ctx: typer.Context,
    key_id: str,
    grace_period: Annotated[float, typer.Option(help="seconds the old key keeps working")] = 0.0,
) -> None:
    """Replace a key: a new secret for the same tenant; the old key stops working."""
    with _session(ctx) as (conn, client):
        resp = client.rotate_key(key_id, grace_period)
        _print_secret(conn, resp.key, resp.secret, retired=resp.retired)


@keys_app.command("revoke")
def keys_revoke(ctx: typer.Context, key_id: str) -> None:
    """Revoke a key: it stops working at once."""
    with _session(ctx) as (conn, client):
        key = client.revoke_key(key_id)
        if conn.json:
            render.print_json(render.to_dict(key))
        else:
            typer.echo(f"revoked key {key.key_id} of tenant {key.tenant_id}")


@keys_app.command("list")
def keys_list(
    ctx: typer.Context,
    tenant: Annotated[str, typer.Option(help="only this tenant's keys")] = "",
    all_keys: Annotated[bool, typer.Option("--all", help="include revoked keys")] = False,
) -> None:
    """List keys (ids and hints, never secrets)."""
    with _session(ctx) as (conn, client):
        keys = client.list_keys(tenant, include_inactive=all_keys)
        if conn.json:
            render.print_json([render.to_dict(k) for k in keys])
        else:
            render.console().print(render.keys_table(keys))


def _print_secret(conn: Conn, key: Any, secret: str, retired: Any = None) -> None:
    if conn.json:
        out: dict[str, Any] = {"key": render.to_dict(key), "secret": secret}
        if retired is not None:
            out["retired"] = render.to_dict(retired)
        render.print_json(out)
        return
    typer.echo(f"key {key.key_id} for tenant {key.tenant_id}")
    if retired is not None:
        until = retired.expire_time.ToJsonString()
        typer.echo(f"old key {retired.key_id} stops working at {until}")
    typer.echo("secret (shown once; send it as `authorization: Bearer <secret>`):")
    typer.echo(secret)


# -- usage --------------------------------------------------------------------
@admin_app.command("usage")
def usage(
    ctx: typer.Context,
    tenant_ids: Annotated[list[str] | None, typer.Argument(help="tenants (default: all)")] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="seconds between refreshes")] = 1.0,
    iterations: Annotated[int, typer.Option(hidden=True, help="stop after N refreshes")] = 0,
) -> None:
    """Live usage per tenant: buckets, tokens in the window, in flight, queued, counter."""
    with _session(ctx) as (conn, client):
        ids = tenant_ids or []
        if not watch:
            resp = client.usage(ids)
            if conn.json:
                render.print_json(render.to_dict(resp))
            else:
                render.console().print(render.usage_table(resp))
            return
        _watch(conn, client, ids, interval, iterations)


def _watch(conn: Conn, client: AdminClient, ids: list[str], interval: float, n: int) -> None:
    from rich.live import Live

    done = 0
    try:
        if conn.json:
            while not n or done < n:
                sys.stdout.write(json.dumps(render.to_dict(client.usage(ids))) + "\n")
                sys.stdout.flush()
                done += 1
                if not n or done < n:
                    time.sleep(interval)
            return
        with Live(render.usage_table(client.usage(ids)), console=render.console()) as live:
            done = 1
            while not n or done < n:
                time.sleep(interval)
                live.update(render.usage_table(client.usage(ids)))
                done += 1
    except KeyboardInterrupt:
        return


# -- apply --------------------------------------------------------------------
@admin_app.command("apply")
def apply(
    ctx: typer.Context,
    file: Annotated[str, typer.Option("--file", "-f", help="tenants YAML (as `serve --tenants`)")],
    dry_run: Annotated[bool, typer.Option(help="show the changes, make none")] = False,
    prune: Annotated[bool, typer.Option(help="delete tenants the file does not declare")] = False,
) -> None:
    """Make the server's tenants match a tenants file (idempotent; atomic)."""
    from fairgate.admin.tenant_args import tenants_from_file

    try:
        tenants, default = tenants_from_file(file)
    except ValueError as exc:
        _die(EXIT_INPUT, str(exc))
    with _session(ctx) as (conn, client):
        resp = client.apply(tenants, default, prune=prune, dry_run=dry_run)
        if conn.json:
            render.print_json({**render.to_dict(resp), "dry_run": dry_run})
        else:
            con = render.console()
            for line in render.diff_lines(resp, dry_run):
                con.print(line)


__all__ = ["admin_app"]
