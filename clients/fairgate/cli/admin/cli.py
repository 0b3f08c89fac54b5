"""`fairgate admin`: tenants, API keys, usage and declarative apply.

Connection flags (or env vars), accepted before or after the subcommand:
--address (FAIRGATE_ADDRESS), --token (FAIRGATE_ADMIN_TOKEN), --tls
(FAIRGATE_TLS), --ca-file (FAIRGATE_CA_FILE), --cert-file / --key-file
(FAIRGATE_CLIENT_CERT_FILE / FAIRGATE_CLIENT_KEY_FILE), --server-name
(FAIRGATE_TLS_SERVER_NAME); --output table|json|yaml (FAIRGATE_OUTPUT).
Exit codes: fairgate/cli/admin/conn.py.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any

import typer

from fairgate.admin.client import AdminClient
from fairgate.cli.admin import render
from fairgate.cli.admin.conn import (
    EXIT_DRIFT,
    EXIT_INPUT,
    Conn,
    bad_flags,
    connect,
    die,
    emit,
    session,
    shared,
)
from fairgate.cli.admin.keys import keys_app
from fairgate.cli.admin.period_usage import FORMATS, print_period_usage
from fairgate.cli.admin.tenant_args import FlagErrors, tenant_from_flags
from fairgate.cli.admin.usage_export import usage_export

admin_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Administer tenants, API keys and quotas (AdminService).",
)
tenants_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Create, show, change and delete tenants."
)
admin_app.add_typer(tenants_app, name="tenants")
admin_app.add_typer(keys_app, name="keys")
admin_app.callback()(connect)


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
BudgetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--budget",
        help="PERIOD:NAME=VALUE,..., e.g. day:tokens=1000000,requests=500,"
        "counts=prompt+completion,warn_at=0.9 (the list, whole; none: no budgets)",
    ),
]


@tenants_app.command("list")
@shared
def tenants_list(ctx: typer.Context) -> None:
    """List tenants (the default tenant is marked)."""
    with session(ctx) as (conn, client):
        resp = client.list_tenants()
        if conn.json:
            emit(conn, render.to_dict(resp))
        else:
            render.console().print(render.tenants_table(resp.tenants, resp.default_tenant_id))


@tenants_app.command("show")
@shared
def tenants_show(ctx: typer.Context, tenant_id: str) -> None:
    """Show one tenant with its etag."""
    with session(ctx) as (conn, client):
        t = client.get_tenant(tenant_id)
        if conn.json:
            emit(conn, render.to_dict(t))
        else:
            default = client.list_tenants().default_tenant_id
            render.console().print(render.tenants_table([t], default))


@tenants_app.command("create")
@shared
def tenants_create(
    ctx: typer.Context,
    tenant_id: str,
    weight: WeightOpt = None,
    priority: PriorityOpt = None,
    over_quota: OverQuotaOpt = None,
    quota: QuotaOpt = None,
    budget: BudgetOpt = None,
    disabled: Annotated[bool, typer.Option(help="create it disabled")] = False,
    default: Annotated[bool, typer.Option(help="also make it the default tenant")] = False,
) -> None:
    """Create a tenant."""
    try:
        tenant, _ = tenant_from_flags(
            tenant_id,
            weight,
            priority,
            over_quota,
            quota,
            None if not disabled else False,
            budget,
            whole=True,
        )
    except FlagErrors as exc:
        raise bad_flags(exc.problems) from None
    with session(ctx) as (conn, client):
        created = client.create_tenant(tenant)
        if default:
            client.set_default_tenant(created.id)
        _print_tenant(conn, created, f"created tenant {created.id} (etag {created.etag})")


@tenants_app.command("update")
@shared
def tenants_update(
    ctx: typer.Context,
    tenant_id: str,
    weight: WeightOpt = None,
    priority: PriorityOpt = None,
    over_quota: OverQuotaOpt = None,
    quota: QuotaOpt = None,
    budget: BudgetOpt = None,
    enabled: Annotated[
        bool | None, typer.Option("--enable/--disable", help="serve it or refuse it")
    ] = None,
    etag: Annotated[
        str | None, typer.Option(help="only if the tenant is still at this etag")
    ] = None,
) -> None:
    """Change the given fields of a tenant (others stay as they are)."""
    try:
        tenant, paths = tenant_from_flags(
            tenant_id, weight, priority, over_quota, quota, enabled, budget
        )
    except FlagErrors as exc:
        raise bad_flags(exc.problems) from None
    if not paths:
        die(EXIT_INPUT, "nothing to change: give --weight, --priority, --quota, ...")
    tenant.etag = etag or ""
    with session(ctx) as (conn, client):
        updated = client.update_tenant(tenant, paths)
        _print_tenant(conn, updated, f"updated tenant {updated.id} (etag {updated.etag})")


@tenants_app.command("delete")
@shared
def tenants_delete(
    ctx: typer.Context,
    tenant_id: str,
    etag: Annotated[
        str | None, typer.Option(help="only if the tenant is still at this etag")
    ] = None,
) -> None:
    """Delete a tenant and its API keys."""
    with session(ctx) as (conn, client):
        client.delete_tenant(tenant_id, etag or "")
        if conn.json:
            emit(conn, {"deleted": tenant_id})
        else:
            typer.echo(f"deleted tenant {tenant_id}")


@tenants_app.command("set-default")
@shared
def tenants_set_default(
    ctx: typer.Context,
    tenant_id: Annotated[str, typer.Argument(help="tenant id; '' for none")],
) -> None:
    """Name the tenant that serves requests naming none ('' to refuse them)."""
    with session(ctx) as (conn, client):
        client.set_default_tenant(tenant_id)
        if conn.json:
            emit(conn, {"default_tenant_id": tenant_id})
        else:
            typer.echo(f"default tenant: {tenant_id or '(none)'}")


@tenants_app.command("export")
@shared
def tenants_export(ctx: typer.Context) -> None:
    """Print the server's tenants as a tenants file (YAML; -o json for JSON).

    `fairgate admin tenants export > tenants.yaml` then `fairgate admin apply
    -f tenants.yaml` is a no-op: the file is what `serve --tenants` and `apply` read."""
    from fairgate.cli.admin.tenant_args import tenants_to_file

    with session(ctx) as (conn, client):
        resp = client.list_tenants()
        doc = tenants_to_file(resp.tenants, resp.default_tenant_id)
        render.print_data(doc, "json" if conn.output.value == "json" else "yaml")


def _print_tenant(conn: Conn, tenant: Any, message: str) -> None:
    if conn.json:
        emit(conn, render.to_dict(tenant))
    else:
        typer.echo(message)


# -- usage --------------------------------------------------------------------
@admin_app.command("usage")
@shared
def usage(
    ctx: typer.Context,
    tenant_ids: Annotated[list[str] | None, typer.Argument(help="tenants (default: all)")] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="refresh until Ctrl-C")] = False,
    interval: Annotated[float, typer.Option(help="seconds between refreshes")] = 1.0,
    iterations: Annotated[int, typer.Option(hidden=True, help="stop after N refreshes")] = 0,
    period: Annotated[
        str | None, typer.Option(help="day or month: spend in that calendar window, with budgets")
    ] = None,
    tenant: Annotated[list[str] | None, typer.Option(help="only this tenant (repeatable)")] = None,
    by_key: Annotated[bool, typer.Option("--by-key", help="also a row per API key")] = False,
    window: Annotated[
        str, typer.Option(help="with --period: 2026-12-04 (day) or 2026-12 (month); default now")
    ] = "",
    fmt: Annotated[
        str | None, typer.Option("--format", help="with --period: table, json or csv")
    ] = None,
) -> None:
    """Live usage per tenant: buckets, tokens in the window, in flight, queued, counter.
    With --period: what each tenant (and key) spent in the day or month, its budget."""
    if period is not None or by_key or window or fmt is not None:
        _period(ctx, period, [*(tenant_ids or []), *(tenant or [])], by_key, window, fmt)
        return
    with session(ctx) as (conn, client):
        ids = [*(tenant_ids or []), *(tenant or [])]
        if not watch:
            resp = _current(client, ids)
            if conn.json:
                emit(conn, render.to_dict(resp))
            else:
                render.console().print(render.usage_table(resp))
            return
        _watch(conn, client, ids, interval, iterations)


def _period(
    ctx: typer.Context,
    period: str | None,
    ids: list[str],
    by_key: bool,
    window: str,
    fmt: str | None,
) -> None:
    if period not in ("day", "month"):
        die(EXIT_INPUT, f"--period must be day or month (got {period!r})")
    if fmt is not None and fmt not in FORMATS:
        die(EXIT_INPUT, f"--format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    with session(ctx) as (conn, client):
        resp = client.period_usage(period, ids, by_key, window)
        print_period_usage(resp, fmt or ("json" if conn.json else "table"))


def _current(client: AdminClient, ids: list[str]) -> Any:
    """Usage of the tenants that exist now (a pruned tenant's counters linger
    in the scheduler until it forgets them; they are not shown)."""
    resp = client.usage(ids)
    known = {t.id for t in client.list_tenants().tenants}
    if known:  # no tenants configured: every tenant id is served, show them all
        kept = [u for u in resp.usage if u.tenant_id in known]
        del resp.usage[:]
        resp.usage.extend(kept)
    return resp


def _watch(conn: Conn, client: AdminClient, ids: list[str], interval: float, n: int) -> None:
    from rich.live import Live

    done = 0
    try:
        if conn.json:
            while not n or done < n:
                sys.stdout.write(json.dumps(render.to_dict(_current(client, ids))) + "\n")
                sys.stdout.flush()
                done += 1
                if not n or done < n:
                    time.sleep(interval)
            return
        with Live(render.usage_table(_current(client, ids)), console=render.console()) as live:
            done = 1
            while not n or done < n:
                time.sleep(interval)
                live.update(render.usage_table(_current(client, ids)))
                done += 1
    except KeyboardInterrupt:
        return


admin_app.command("usage-export")(usage_export)


# -- apply --------------------------------------------------------------------
@admin_app.command("apply")
@shared
def apply(
    ctx: typer.Context,
    file: Annotated[str, typer.Option("--file", "-f", help="tenants YAML (as `serve --tenants`)")],
    dry_run: Annotated[bool, typer.Option(help="show the changes, make none")] = False,
    prune: Annotated[
        bool,
        typer.Option(help="delete tenants the file does not declare (and their API keys)"),
    ] = False,
    exit_code: Annotated[
        bool,
        typer.Option(
            "--exit-code",
            help=f"exit {EXIT_DRIFT} when the server differed from the file (CI drift check)",
        ),
    ] = False,
) -> None:
    """Make the server's tenants match a tenants file (idempotent; atomic)."""
    from fairgate.cli.admin.tenant_args import tenants_from_file

    try:
        tenants, default = tenants_from_file(file)
    except FlagErrors as exc:
        raise bad_flags(exc.problems) from None
    with session(ctx) as (conn, client):
        # The keys a prune deletes with their tenants, read before they go.
        keys = client.list_keys("") if prune else []
        resp = client.apply(tenants, default, prune=prune, dry_run=dry_run)
        from fairgate.v1 import admin_pb2 as apb

        deleted = {c.tenant_id for c in resp.changes if c.action == apb.TenantChange.ACTION_DELETE}
        by_tenant: dict[str, list[Any]] = {}
        for k in keys:
            if k.active and k.tenant_id in deleted:
                by_tenant.setdefault(k.tenant_id, []).append(k)
        drift = any(
            c.action
            in (
                apb.TenantChange.ACTION_CREATE,
                apb.TenantChange.ACTION_UPDATE,
                apb.TenantChange.ACTION_DELETE,
            )
            for c in resp.changes
        ) or resp.HasField("default_tenant")
        if conn.json:
            out = {**render.to_dict(resp), "dry_run": dry_run, "drift": drift}
            out["deleted_api_keys"] = {
                t: [k.key_id for k in ks] for t, ks in sorted(by_tenant.items())
            }
            emit(conn, out)
        else:
            con = render.console()
            for line in render.diff_lines(resp, dry_run, by_tenant):
                con.print(line)
    if exit_code and drift:
        raise typer.Exit(EXIT_DRIFT)


__all__ = ["admin_app"]
