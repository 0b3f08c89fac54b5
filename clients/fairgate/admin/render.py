"""Output for `fairgate admin`: rich tables for people, JSON for scripts."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from rich.console import Console
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
    "max_concurrent": "concurrent",
    "max_queued": "queued",
    "max_queue_wait_s": "queue wait s",
    "max_prompt_tokens": "prompt",
    "max_output_tokens": "output",
    "max_output_tokens_interactive": "output (interactive)",
}


def console() -> Console:
    # Pipes and test runners are not terminals: do not squeeze tables into 80 columns.
    width = None if sys.stdout.isatty() else max(160, shutil.get_terminal_size().columns)
    return Console(width=width, highlight=False)


def to_dict(msg: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True) + "\n")


def _num(v: float) -> str:
    return f"{v:g}"


def quotas_text(q: apb.TenantQuotas) -> str:
    parts = [
        f"{short}={_num(getattr(q, name))}"
        for name, short in _QUOTA_SHORT.items()
        if q.HasField(name)  # type: ignore[arg-type]
    ]
    return ", ".join(parts) or "-"


def priorities_text(t: apb.Tenant) -> str:
    return ",".join(_PRIORITY.get(p, str(p)) for p in t.priorities) or "all"


def tenants_table(tenants: Iterable[apb.Tenant], default_id: str) -> Table:
    table = Table(title="tenants", title_justify="left")
    for col in ("id", "weight", "enabled", "priorities", "over quota", "quotas", "keys", "etag"):
        table.add_column(col)
    for t in tenants:
        mark = " (default)" if t.id == default_id else ""
        table.add_row(
            t.id + mark,
            _num(t.weight),
            "yes" if t.enabled else "NO",
            priorities_text(t),
            _MODE.get(t.over_quota, "reject"),
            quotas_text(t.quotas),
            str(t.active_api_keys),
            t.etag,
        )
    return table


def keys_table(keys: Iterable[apb.ApiKey]) -> Table:
    table = Table(title="API keys", title_justify="left")
    for col in ("key id", "tenant", "name", "hint", "created", "expires", "active"):
        table.add_column(col)
    for k in keys:
        expires = k.expire_time.ToJsonString() if k.HasField("expire_time") else "-"
        table.add_row(
            k.key_id,
            k.tenant_id,
            k.display_name or "-",
            k.hint,
            k.create_time.ToJsonString(),
            expires,
            "yes" if k.active else "no",
        )
    return table


def _bucket(b: apb.BucketLevel, present: bool) -> str:
    return f"{b.level:,.1f} / {b.burst:,.0f}" if present else "-"


def usage_table(resp: apb.GetUsageResponse) -> Table:
    table = Table(title=f"usage (policy {resp.policy})", title_justify="left")
    cols = (
        "tenant",
        "model",
        "in flight",
        "queued",
        "req bucket",
        "token bucket",
        "tokens in window",
        "counter",
        "rejected",
        "finished",
        "paused",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("tenant", "model") else "right")
    for u in resp.usage:
        rejected = str(u.rejected_total)
        if u.rejections:
            rejected += " (" + ", ".join(f"{k}={v}" for k, v in sorted(u.rejections.items())) + ")"
        table.add_row(
            u.tenant_id,
            u.model,
            str(u.in_flight),
            str(u.queued),
            _bucket(u.request_bucket, u.HasField("request_bucket")),
            _bucket(u.token_bucket, u.HasField("token_bucket")),
            f"{u.tokens_used_in_window:,.0f}" if u.HasField("token_bucket") else "-",
            f"{u.virtual_counter:,.1f}" if u.HasField("virtual_counter") else "-",
            rejected,
            str(u.finished_total),
            "yes" if u.paused else "",
        )
    return table


_SIGN = {
    apb.TenantChange.ACTION_CREATE: ("+", "create", "green"),
    apb.TenantChange.ACTION_UPDATE: ("~", "update", "yellow"),
    apb.TenantChange.ACTION_DELETE: ("-", "delete", "red"),
    apb.TenantChange.ACTION_UNCHANGED: ("=", "unchanged", "dim"),
    apb.TenantChange.ACTION_KEEP: (" ", "keep (not in the file; --prune deletes it)", "dim"),
}


def diff_lines(resp: apb.ApplyTenantsResponse, dry_run: bool) -> list[str]:
    lines: list[str] = []
    counts: dict[str, int] = {}
    for c in resp.changes:
        sign, verb, color = _SIGN.get(c.action, ("?", "?", "white"))
        counts[verb.split()[0]] = counts.get(verb.split()[0], 0) + 1
        lines.append(f"[{color}]{sign} {c.tenant_id}: {verb}[/{color}]")
        for f in c.fields:
            before = f.before or "(none)"
            after = f.after or "(none)"
            if c.action == apb.TenantChange.ACTION_CREATE:
                lines.append(f"    {f.field}: {after}")
            elif c.action == apb.TenantChange.ACTION_DELETE:
                lines.append(f"    {f.field}: {before}")
            else:
                lines.append(f"    {f.field}: {before} → {after}")
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
