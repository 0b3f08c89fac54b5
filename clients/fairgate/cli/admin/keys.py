"""`fairgate admin keys`: issue, update, rotate, revoke and list API keys (and
their own limits, docs/tenants.md#per-key-limits)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fairgate.cli.admin import render
from fairgate.cli.admin.conn import EXIT_INPUT, Conn, bad_flags, die, emit, session, shared
from fairgate.cli.admin.tenant_args import FlagErrors, key_limits_from_flags

keys_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Issue, update, rotate, revoke and list API keys.",
)


KeyQuotaOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--quota",
        "-q",
        help="the key's own limit NAME=VALUE, within its tenant's: requests_per_s, "
        "requests_burst, tokens_per_min, tokens_burst, max_concurrent (none: no limit)",
    ),
]
KeyBudgetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--budget",
        help="the key's own budget PERIOD:NAME=VALUE,..., as the tenant's (within its "
        "tenant's budget for that period), e.g. day:tokens=100000,requests=50 "
        "(the list, whole; none: no budgets of its own)",
    ),
]
KeyPriorityOpt = Annotated[
    list[str] | None,
    typer.Option("--priority", help="a class the key may send (repeatable; default: its tenant's)"),
]


@keys_app.command("issue")
@shared
def keys_issue(
    ctx: typer.Context,
    tenant_id: str,
    name: Annotated[str, typer.Option(help="a label for the key")] = "",
    quota: KeyQuotaOpt = None,
    priority: KeyPriorityOpt = None,
    budget: KeyBudgetOpt = None,
) -> None:
    """Issue an API key; the secret is printed once and never again."""
    try:
        limits, _ = key_limits_from_flags(quota, priority, budgets=budget)
    except FlagErrors as exc:
        raise bad_flags(exc.problems) from None
    with session(ctx) as (conn, client):
        resp = client.issue_key(tenant_id, name, limits)
        _print_secret(conn, resp.key, resp.secret)


@keys_app.command("update")
@shared
def keys_update(
    ctx: typer.Context,
    key_id: str,
    quota: KeyQuotaOpt = None,
    priority: KeyPriorityOpt = None,
    any_priority: Annotated[
        bool, typer.Option(help="drop the key's own priorities (its tenant's apply)")
    ] = False,
    budget: KeyBudgetOpt = None,
) -> None:
    """Change a key's own limits (the ones given; others stay as they are)."""
    try:
        limits, paths = key_limits_from_flags(quota, priority, any_priority, budget)
    except FlagErrors as exc:
        raise bad_flags(exc.problems) from None
    if not paths:
        die(EXIT_INPUT, "nothing to change: give --quota, --priority, --any-priority or --budget")
    with session(ctx) as (conn, client):
        key = client.update_key(key_id, limits, paths)
        if conn.json:
            emit(conn, render.to_dict(key))
        else:
            typer.echo(
                f"updated key {key.key_id}: {render.key_limits_text(key).replace(chr(10), ', ')}"
            )


@keys_app.command("rotate")
@shared
def keys_rotate(
    ctx: typer.Context,
    key_id: str,
    grace_period: Annotated[float, typer.Option(help="seconds the old key keeps working")] = 0.0,
) -> None:
    """Replace a key: a new secret for the same tenant; the old key stops working."""
    with session(ctx) as (conn, client):
        resp = client.rotate_key(key_id, grace_period)
        _print_secret(conn, resp.key, resp.secret, retired=resp.retired)


@keys_app.command("revoke")
@shared
def keys_revoke(ctx: typer.Context, key_id: str) -> None:
    """Revoke a key: it stops working at once."""
    with session(ctx) as (conn, client):
        key = client.revoke_key(key_id)
        if conn.json:
            emit(conn, render.to_dict(key))
        else:
            typer.echo(f"revoked key {key.key_id} of tenant {key.tenant_id}")


@keys_app.command("list")
@shared
def keys_list(
    ctx: typer.Context,
    tenant: Annotated[str, typer.Option(help="only this tenant's keys")] = "",
    all_keys: Annotated[bool, typer.Option("--all", help="include revoked keys")] = False,
) -> None:
    """List keys (ids and hints, never secrets)."""
    with session(ctx) as (conn, client):
        keys = client.list_keys(tenant, include_inactive=all_keys)
        if conn.json:
            emit(conn, [render.to_dict(k) for k in keys])
        else:
            render.console().print(render.keys_table(keys))


def _print_secret(conn: Conn, key: Any, secret: str, retired: Any = None) -> None:
    if conn.json:
        out: dict[str, Any] = {"key": render.to_dict(key), "secret": secret}
        if retired is not None:
            out["retired"] = render.to_dict(retired)
        emit(conn, out)
        return
    typer.echo(f"key {key.key_id} for tenant {key.tenant_id}")
    if retired is not None:
        until = retired.expire_time.ToJsonString()
        typer.echo(f"old key {retired.key_id} stops working at {until}")
    typer.echo("secret (shown once; send it as `authorization: Bearer <secret>`):")
    typer.echo(secret)
