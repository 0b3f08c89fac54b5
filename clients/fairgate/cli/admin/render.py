"""Output for `fairgate admin`: rich tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import inference_pb2 as pb

_PRIORITY = {pb.PRIORITY_CLASS_INTERACTIVE: "interactive", pb.PRIORITY_CLASS_BATCH: "batch"}
_MODE = {apb.OVER_QUOTA_MODE_WAIT: "wait"}
_QUOTA_SHORT = {
    "requests_per_s": "req/s",
    "requests_burst": "req burst",
    "tokens_per_min": "tok/min",
    "tokens_burst": "tok burst",
    "max_concurrent": "conc",
    "max_queued": "queued",
    "max_queue_wait_s": "wait s",
    "max_prompt_tokens": "prompt",
    "max_output_tokens": "output",
    "max_output_tokens_interactive": "out/int",
}


def console() -> Console:
    # The terminal's width (80 for pipes, or $COLUMNS): tables are built to fit 80.
    return Console(highlight=False)


_INT64 = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def _numbers(desc: Any, value: dict[str, Any]) -> dict[str, Any]:
    """Proto3 JSON writes 64-bit integers as strings (for JavaScript); a CLI's
    readers are jq and scripts, so they are numbers here."""
    for f in desc.fields:
        if f.name not in value:
            continue
        v = value[f.name]
        sub = f.message_type
        if sub is not None and sub.GetOptions().map_entry:
            vf = sub.fields_by_name["value"]
            if vf.type in _INT64:
                value[f.name] = {k: int(x) for k, x in v.items()}
            elif vf.message_type is not None:
                value[f.name] = {k: _numbers(vf.message_type, x) for k, x in v.items()}
        elif f.type in _INT64:
            value[f.name] = [int(x) for x in v] if isinstance(v, list) else int(v)
        elif sub is not None and not sub.full_name.startswith("google.protobuf."):
            if isinstance(v, list):
                value[f.name] = [_numbers(sub, x) for x in v]
            elif isinstance(v, dict):
                value[f.name] = _numbers(sub, v)
    return value


def to_dict(msg: Message) -> dict[str, Any]:
    raw = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _numbers(msg.DESCRIPTOR, raw)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def print_data(value: Any, output: str) -> None:
    """`value` as JSON, or YAML with `-o yaml`."""
    if output == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(value, sort_keys=False, allow_unicode=True))
    else:
        print_json(value)


def _num(v: float) -> str:
    return f"{v:g}"


def quotas_text(q: apb.TenantQuotas, sep: str = ", ", num: Any = _num) -> str:
    parts = [
        f"{short}={num(getattr(q, name))}"
        for name, short in _QUOTA_SHORT.items()
        if q.HasField(name)  # type: ignore[arg-type]
    ]
    return sep.join(parts) or "-"


def budget_text(b: apb.Budget) -> str:
    """ "1000000 tok (prompt+completion), 500 req" or "-"."""
    parts = []
    if b.HasField("tokens"):
        kinds = f" ({'+'.join(b.counts)})" if b.counts else ""
        parts.append(f"{b.tokens} tok{kinds}")
    if b.HasField("requests"):
        parts.append(f"{b.requests} req")
    return ", ".join(parts) or "-"


def priorities_text(t: apb.Tenant | apb.ApiKeyLimits) -> str:
    return ",".join(_PRIORITY.get(p, str(p)) for p in t.priorities) or "all"


def key_limits_text(k: apb.ApiKey) -> str:
    """A key's own limits, one per line ("-": only its tenant's apply)."""
    if not k.HasField("limits"):
        return "-"
    parts = [] if not k.limits.priorities else [priorities_text(k.limits)]
    # A narrow column: 60000 → 60k.
    quotas = quotas_text(k.limits.quotas, "\n", lambda v: _short(v).replace(".0", ""))
    parts += [quotas] if quotas != "-" else []
    parts += [f"{b.period}: {budget_text(b)}" for b in k.limits.budgets]
    return "\n".join(parts) or "-"


def _table(title: str, caption: str | None = None) -> Table:
    # Light borders and one space of padding: tables fit 80 columns.
    return Table(
        title=title,
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 1, 0, 0),
    )


def _columns(table: Table, names: Iterable[str], wrap: Iterable[str], right: bool = False) -> None:
    """Columns in `wrap` fold long values; the others keep theirs whole."""
    folding = set(wrap)
    for name in names:
        justify: Any = "right" if right and name not in folding else "left"
        table.add_column(name, overflow="fold", no_wrap=name not in folding, justify=justify)


def tenants_table(tenants: Iterable[apb.Tenant], default_id: str) -> Table:
    tenants = list(tenants)
    # The legend only when a row carries the mark.
    marked = any(t.id == default_id for t in tenants)
    table = _table("tenants", "* default tenant" if marked else None)
    _columns(table, ("id", "weight", "on", "classes", "mode", "quotas", "keys", "etag"), ["id"])
    for t in tenants:
        mark = " *" if t.id == default_id else ""
        table.add_row(
            t.id + mark,
            _num(t.weight),
            "yes" if t.enabled else "NO",
            priorities_text(t).replace(",", "\n"),
            _MODE.get(t.over_quota, "reject"),
            "\n".join(
                [quotas_text(t.quotas, "\n")] + [f"{b.period}: {budget_text(b)}" for b in t.budgets]
            ),
            str(t.active_api_keys),
            t.etag,
        )
    return table


def keys_table(keys: Iterable[apb.ApiKey]) -> Table:
    """Key ids (what rotate and revoke take), never secrets; hints: -o json."""
    table = _table("API keys")
    names = ("key id", "tenant", "name", "limits", "created", "expires")
    _columns(table, names, ("tenant", "name", "limits"))
    for k in keys:
        expires = _time(k.expire_time) if k.HasField("expire_time") else "-"
        table.add_row(
            k.key_id,
            k.tenant_id,
            k.display_name or "-",
            key_limits_text(k),
            _time(k.create_time),
            expires if k.active else "revoked",
        )
    return table


def _time(ts: Any) -> str:
    """A timestamp to the minute, UTC ("2026-12-01 09:40Z")."""
    return str(ts.ToDatetime().strftime("%Y-%m-%d %H:%MZ"))


def _short(v: float) -> str:
    """1234.5 → 1.2k: numbers that fit a narrow column."""
    v = float(v)
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.1f}{unit}"
    return f"{v:.0f}" if v == int(v) else f"{v:.1f}"


def _bucket(b: apb.BucketLevel, present: bool) -> str:
    return f"{_short(b.level)}/{_short(b.burst)}" if present else "-"


def usage_table(resp: apb.GetUsageResponse, keep: Iterable[str] | None = None) -> Table:
    """Live usage in 8 narrow columns (fits 80; tokens in the window and
    rejections by reason: -o json); `keep`: only these tenants."""
    kept = None if keep is None else set(keep)
    shown = [u for u in resp.usage if kept is None or u.tenant_id in kept]
    models = {u.model for u in resp.usage}
    fleet = f", {resp.replicas} replicas" if resp.replicas > 1 else ""
    paused = "* paused (held by its own limits); " if any(u.paused for u in shown) else ""
    table = _table(f"usage (policy {resp.policy}{fleet})", f"{paused}more columns: -o json")
    cols = ("tenant", "run", "queued", "req bkt", "tok bkt", "counter", "rej", "done")
    _columns(table, cols, ["tenant"], right=True)
    for u in shown:
        name = u.tenant_id + (f" ({u.model})" if len(models) > 1 else "")
        table.add_row(
            name + (" *" if u.paused else ""),
            str(u.in_flight),
            str(u.queued),
            _bucket(u.request_bucket, u.HasField("request_bucket")),
            _bucket(u.token_bucket, u.HasField("token_bucket")),
            _short(u.virtual_counter) if u.HasField("virtual_counter") else "-",
            str(u.rejected_total),
            str(u.finished_total),
        )
    return table


def period_table(title: str) -> Table:
    """The columns of `admin usage --period` (cli/admin/period_usage.py)."""
    table = _table(title, "spent: % of the budget; ! at warn_at, x spent (refused until reset)")
    cols = ("tenant/key", "prompt", "cached", "compl", "req", "refused", "budget", "spent")
    _columns(table, cols, ["tenant/key", "budget"], right=True)
    return table


_SIGN = {
    apb.TenantChange.ACTION_CREATE: ("+", "create", "green"),
    apb.TenantChange.ACTION_UPDATE: ("~", "update", "yellow"),
    apb.TenantChange.ACTION_DELETE: ("-", "delete", "red"),
    apb.TenantChange.ACTION_UNCHANGED: ("=", "unchanged", "dim"),
    apb.TenantChange.ACTION_KEEP: (" ", "keep (not in the file; --prune deletes it)", "dim"),
}


def diff_lines(
    resp: apb.ApplyTenantsResponse,
    dry_run: bool,
    deleted_keys: Mapping[str, Sequence[apb.ApiKey]] | None = None,
) -> list[str]:
    """The changes, one line each (Rich markup); `deleted_keys`: the active API
    keys of each tenant a prune deletes (they go with it)."""
    lines: list[str] = []
    counts: dict[str, int] = {}
    for c in resp.changes:
        sign, verb, color = _SIGN.get(c.action, ("?", "?", "white"))
        counts[verb.split()[0]] = counts.get(verb.split()[0], 0) + 1
        lines.append(f"[{color}]{sign} {escape(c.tenant_id)}: {verb}[/{color}]")
        for f in c.fields:
            before = escape(f.before or "(none)")
            after = escape(f.after or "(none)")
            if c.action == apb.TenantChange.ACTION_CREATE:
                lines.append(f"    {f.field}: {after}")
            elif c.action == apb.TenantChange.ACTION_DELETE:
                lines.append(f"    {f.field}: {before}")
            else:
                lines.append(f"    {f.field}: {before} → {after}")
        keys = (deleted_keys or {}).get(c.tenant_id, ())
        if c.action == apb.TenantChange.ACTION_DELETE and keys:
            ids = ", ".join(k.key_id for k in keys)
            verb = "deletes" if dry_run else "deleted"
            lines.append(f"    [red]{verb} {len(keys)} API key(s) with it: {ids}[/red]")
    if resp.HasField("default_tenant"):
        d = resp.default_tenant
        lines.append(f"~ default tenant: {d.before or '(none)'} → {d.after or '(none)'}")
    summary = ", ".join(
        f"{counts.get(k, 0)} to {k}" if dry_run else f"{counts.get(k, 0)} {k}d"
        for k in ("create", "update", "delete")
    )
    if dry_run:
        lines.append(f"dry run: {summary}; nothing was changed")
    elif resp.applied:
        lines.append(f"applied: {summary}")
    else:
        lines.append("no changes: the server already matches the file")
    return lines
