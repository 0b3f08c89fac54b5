"""`fairgate admin usage-export`: the usage log for billing (AdminService.ExportUsage).

Pages through the log from a cursor and prints one record per line (JSON
Lines, or CSV with a header). With `--cursor-file` it starts where the file
says and writes the new cursor there once the records are out, so a billing
job run again (after its own or the server's restart) resumes without gaps or
duplicates. A server without a shared store keeps the log in memory: it says so
on stderr (such a log starts afresh when the server restarts)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from fairgate.cli.admin.conn import EXIT_INPUT, die, session, shared

FIELDS = (
    "cursor",
    "request_id",
    "tenant_id",
    "model",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "finish_reason",
    "key_id",
    "refusal",
    "finished_at",
)


@shared
def usage_export(
    ctx: typer.Context,
    cursor: Annotated[str, typer.Option(help="start after this record (a next_cursor)")] = "",
    cursor_file: Annotated[
        Path | None,
        typer.Option(help="read the start cursor from this file, write the new one back"),
    ] = None,
    page: Annotated[int, typer.Option(min=1, max=10_000, help="records per call")] = 1000,
    fmt: Annotated[str, typer.Option("--format", help="jsonl or csv")] = "jsonl",
) -> None:
    """Per-request usage records for billing, oldest first, from a cursor."""
    if fmt not in ("jsonl", "csv"):
        die(EXIT_INPUT, f"--format must be jsonl or csv, not {fmt!r}")
    if cursor_file is not None and cursor_file.exists():
        cursor = cursor or cursor_file.read_text().strip()
    writer = csv.writer(sys.stdout) if fmt == "csv" else None
    if writer is not None:
        writer.writerow(FIELDS)
    with session(ctx) as (_, client):
        while True:
            resp = client.export_usage(cursor, page)
            if not resp.durable and not cursor:
                sys.stderr.write("note: this server keeps its usage log in memory only\n")
            for r in resp.records:
                row = [getattr(r, f) for f in FIELDS[:-1]] + [r.finished_at.ToJsonString()]
                if writer is not None:
                    writer.writerow(row)
                else:
                    sys.stdout.write(json.dumps(dict(zip(FIELDS, row, strict=True))) + "\n")
            sys.stdout.flush()
            if resp.next_cursor == cursor or not resp.records:
                break
            cursor = resp.next_cursor
    if cursor_file is not None and cursor:
        cursor_file.write_text(cursor + "\n")
