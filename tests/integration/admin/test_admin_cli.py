"""`fairgate admin` end to end against a real server (in-memory store)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import grpc
import pytest
from fairgate import Client, FairgateError
from fairgate.admin import AdminClient
from fairgate.v1 import admin_pb2 as apb

from tests.helpers import sim
from tests.integration.admin.conftest import ADMIN_TOKEN, Cli, ServerThread, write


def _json(result) -> object:  # type: ignore[no-untyped-def]
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_tenant_lifecycle_and_keys(cli: Cli, server_thread: ServerThread) -> None:
    addr = server_thread.address
    # Create, list, show (JSON parsed back).
    r = cli(
        "admin",
        "tenants",
        "create",
        "team-a",
        "--weight",
        "2",
        "--quota",
        "requests_per_s=50",
        "--priority",
        "interactive",
        "--default",
    )
    assert r.exit_code == 0, r.output
    assert "created tenant team-a (etag 1)" in r.stdout
    listed = _json(cli("admin", "-o", "json", "tenants", "list"))
    assert listed["default_tenant_id"] == "team-a"  # type: ignore[index]
    (tenant,) = listed["tenants"]  # type: ignore[index]
    assert tenant["id"] == "team-a" and tenant["weight"] == 2 and tenant["etag"] == "1"
    assert tenant["quotas"] == {"requests_per_s": 50}
    assert tenant["priorities"] == ["PRIORITY_CLASS_INTERACTIVE"]
    table = cli("admin", "tenants", "list")
    assert table.exit_code == 0 and "team-a *" in table.stdout and "req/s=50" in table.stdout

    # Update some fields; the rest stay.
    r = cli("admin", "tenants", "update", "team-a", "--weight", "3", "-q", "max_concurrent=4")
    assert r.exit_code == 0, r.output
    shown = _json(cli("admin", "-o", "json", "tenants", "show", "team-a"))
    assert shown["weight"] == 3 and shown["etag"] == "2"  # type: ignore[index]
    # int64 fields are JSON numbers (not proto3 JSON's strings).
    assert shown["quotas"] == {"requests_per_s": 50, "max_concurrent": 4}  # type: ignore[index]
    # The dispatcher saw it (no restart).
    model = server_thread.app.models.resolve("")
    assert model is not None
    assert model.dispatcher.quotas.tenants.weight_of("team-a") == 3

    # Issue a key: it works for generate; the secret is shown once.
    issued = _json(cli("admin", "-o", "json", "keys", "issue", "team-a", "--name", "ci"))
    secret = issued["secret"]  # type: ignore[index]
    key_id = issued["key"]["key_id"]  # type: ignore[index]
    assert secret.startswith(f"fg_{key_id}_")
    with Client(addr, api_key=secret) as c:
        assert c.complete("hello", max_tokens=3).result.finish_reason == "length"
    keys = _json(cli("admin", "-o", "json", "keys", "list", "--tenant", "team-a"))
    assert [k["key_id"] for k in keys] == [key_id]  # type: ignore[union-attr]
    assert secret not in json.dumps(keys)
    # Keys are now in use: no key → UNAUTHENTICATED.
    with Client(addr) as c, pytest.raises(FairgateError) as err:
        c.complete("hello", max_tokens=3)
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED

    # Rotate: the new key works, the old one stops.
    rotated = _json(cli("admin", "-o", "json", "keys", "rotate", key_id))
    new_secret = rotated["secret"]  # type: ignore[index]
    with Client(addr, api_key=new_secret) as c:
        c.complete("hi", max_tokens=2)
    with Client(addr, api_key=secret) as c, pytest.raises(FairgateError) as err:
        c.complete("hi", max_tokens=2)
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED

    # Revoke: stops working at once; the engine never sees the refused request.
    started = sim(server_thread.app).stats.started
    r = cli("admin", "keys", "revoke", rotated["key"]["key_id"])  # type: ignore[index]
    assert r.exit_code == 0, r.output
    with Client(addr, api_key=new_secret) as c, pytest.raises(FairgateError) as err:
        c.complete("hi", max_tokens=2)
    assert err.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert err.value.reason == "API_KEY_INVALID"
    assert sim(server_thread.app).stats.started == started

    # Usage shows what the tenant did.
    # Buckets of a tenant with no traffic yet read full.
    cli("admin", "tenants", "create", "idle", "-q", "tokens_per_min=600")
    idle = _json(cli("admin", "-o", "json", "usage", "idle"))["usage"][0]  # type: ignore[index]
    assert idle["token_bucket"] == {"level": 600, "burst": 600, "rate_per_s": 10}
    assert idle["tokens_used_in_window"] == 0
    usage = _json(cli("admin", "-o", "json", "usage", "team-a"))
    (u,) = usage["usage"]  # type: ignore[index]
    assert u["tenant_id"] == "team-a" and u["finished_total"] == 2
    assert u["request_bucket"]["burst"] == 50
    assert "virtual_counter" in u
    watched = cli("admin", "usage", "--watch", "--interval", "0.05", "--iterations", "2")
    assert watched.exit_code == 0 and "team-a" in watched.stdout

    # Delete: needs another default first; a stale etag conflicts.
    r = cli("admin", "tenants", "delete", "team-a")
    assert r.exit_code == 4 and "default tenant" in r.stderr
    cli("admin", "tenants", "set-default", "")
    r = cli("admin", "tenants", "delete", "team-a", "--etag", "1")
    assert r.exit_code == 4 and "ABORTED" in r.stderr and "stale" in r.stderr
    r = cli("admin", "tenants", "delete", "team-a", "--etag", "2")
    assert r.exit_code == 0, r.output
    r = cli("admin", "tenants", "show", "team-a")
    assert r.exit_code == 3 and "NOT_FOUND" in r.stderr


def test_concurrent_conflicting_updates(cli: Cli, server_thread: ServerThread) -> None:
    assert cli("admin", "tenants", "create", "shared").exit_code == 0
    barrier = threading.Barrier(2)
    results: dict[float, object] = {}

    def update(weight: float) -> None:
        with AdminClient(server_thread.address, token=ADMIN_TOKEN) as admin:
            barrier.wait()
            try:
                results[weight] = admin.update_tenant(
                    apb.Tenant(id="shared", weight=weight, etag="1"), ["weight"]
                )
            except FairgateError as exc:
                results[weight] = exc

    threads = [threading.Thread(target=update, args=(w,)) for w in (2.0, 3.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    errors = [r for r in results.values() if isinstance(r, FairgateError)]
    winners = [r for r in results.values() if isinstance(r, apb.Tenant)]
    assert len(errors) == 1 and len(winners) == 1
    assert errors[0].code == grpc.StatusCode.ABORTED and errors[0].reason == "ETAG_MISMATCH"
    shown = _json(cli("admin", "-o", "json", "tenants", "show", "shared"))
    assert shown["weight"] == winners[0].weight and shown["etag"] == "2"  # type: ignore[index]
    # The CLI reports the loser's conflict with exit code 4 (and JSON on stderr).
    r = cli("admin", "-o", "json", "tenants", "update", "shared", "--weight", "5", "--etag", "1")
    assert r.exit_code == 4
    assert json.loads(r.stderr)["error"]["code"] == "ABORTED"


TENANTS_V1 = """
default_tenant: web
tenants:
  - id: web
    weight: 2
    quotas: {requests_per_s: 10}
  - id: batch-jobs
    priorities: [batch]
    over_quota: wait
"""
TENANTS_V2 = """
default_tenant: web
tenants:
  - id: web
    weight: 4
    quotas: {requests_per_s: 10, max_concurrent: 3}
  - id: analytics
"""


def test_apply_dry_run_diff_and_idempotence(cli: Cli, tmp_path: Path) -> None:
    v1 = write(tmp_path, "v1.yaml", TENANTS_V1)
    dry = cli("admin", "apply", "-f", v1, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "+ batch-jobs: create" in dry.stdout and "+ web: create" in dry.stdout
    assert "default tenant: (none) → web" in dry.stdout
    assert "dry run: 2 to create" in dry.stdout
    assert _json(cli("admin", "-o", "json", "tenants", "list"))["tenants"] == []  # type: ignore[index]

    applied = cli("admin", "apply", "-f", v1)
    assert applied.exit_code == 0 and "applied: 2 created" in applied.stdout
    again = cli("admin", "apply", "-f", v1)
    assert again.exit_code == 0 and "no changes" in again.stdout
    assert "= web: unchanged" in again.stdout

    v2 = write(tmp_path, "v2.yaml", TENANTS_V2)
    dry = _json(cli("admin", "-o", "json", "apply", "-f", v2, "--dry-run", "--prune"))
    changes = {c["tenant_id"]: c for c in dry["changes"]}  # type: ignore[index]
    assert changes["analytics"]["action"] == "ACTION_CREATE"
    assert changes["batch-jobs"]["action"] == "ACTION_DELETE"
    assert changes["web"]["action"] == "ACTION_UPDATE"
    assert {"field": "weight", "before": "2", "after": "4"} in changes["web"]["fields"]
    assert {"field": "quotas.max_concurrent", "before": "", "after": "3"} in changes["web"][
        "fields"
    ]
    assert dry["dry_run"] is True and dry["applied"] is False  # type: ignore[index]
    text = cli("admin", "apply", "-f", v2, "--dry-run")
    assert "weight: 2 → 4" in text.stdout and "batch-jobs: keep" in text.stdout

    assert cli("admin", "apply", "-f", v2, "--prune").exit_code == 0
    listed = _json(cli("admin", "-o", "json", "tenants", "list"))
    assert [t["id"] for t in listed["tenants"]] == ["analytics", "web"]  # type: ignore[index]


def test_bad_input_says_what_to_fix(cli: Cli, tmp_path: Path) -> None:
    # Judged before any call, by the validator the server and the tenants file use.
    r = cli("admin", "tenants", "create", "neg", "--weight", "-1")
    assert r.exit_code == 2
    assert "--weight: weight must be a finite number in [0.001, 1000]" in r.stderr
    r = cli("admin", "tenants", "create", "zero", "-q", "requests_per_s=0")
    assert r.exit_code == 2
    assert "--quota requests_per_s: requests_per_s must be" in r.stderr and "omit it" in r.stderr
    r = cli("admin", "tenants", "create", "x" * 300)
    assert r.exit_code == 2 and "at most 63 characters" in r.stderr
    r = cli("admin", "tenants", "create", "bad/name")
    assert r.exit_code == 2 and "letters, digits" in r.stderr
    r = cli("admin", "tenants", "create", "q", "-q", "requests_per_sec=3")
    assert r.exit_code == 2 and "requests_per_s" in r.stderr
    typo = write(tmp_path, "typo.yaml", "tenants:\n  - id: a\n    wieght: 2\n")
    r = cli("admin", "apply", "-f", typo)
    assert r.exit_code == 2
    assert "tenant 'a'" in r.stderr and "wieght" in r.stderr and "unknown field" in r.stderr
    huge = write(tmp_path, "huge.yaml", f"tenants:\n  - id: {'n' * 100}\n")
    r = cli("admin", "apply", "-f", huge)
    # The tenants file loader applies the admin id rule itself, naming the file.
    assert r.exit_code == 2 and "huge.yaml" in r.stderr and "field 'id'" in r.stderr
    assert "at most 63" in r.stderr
    # Nothing was created by any of these.
    assert _json(cli("admin", "-o", "json", "tenants", "list"))["tenants"] == []  # type: ignore[index]


def test_admin_credentials(server_thread: ServerThread) -> None:
    no_token = Cli(server_thread.address, token=None)
    r = no_token("admin", "tenants", "list")
    assert r.exit_code == 5 and "UNAUTHENTICATED" in r.stderr
    assert "set FAIRGATE_ADMIN_TOKEN (or --token)" in r.stderr
    r = no_token("admin", "--token", "wrong", "tenants", "list")
    assert r.exit_code == 5 and "invalid admin token" in r.stderr
    assert "FAIRGATE_ADMIN_TOKEN" in r.stderr


def test_options_after_the_subcommand_and_output_formats(
    cli: Cli, server_thread: ServerThread
) -> None:
    anon = Cli(server_thread.address, token=None)
    # Connection options and -o after the subcommand, as before it.
    r = anon("admin", "tenants", "create", "t1", "--token", ADMIN_TOKEN, "-o", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["id"] == "t1"
    issued = anon("admin", "keys", "issue", "t1", "-o", "json", "--token", ADMIN_TOKEN)
    assert issued.exit_code == 0, issued.output
    assert json.loads(issued.stdout)["secret"].startswith("fg_")
    # After the subcommand wins over before it.
    r = anon("admin", "--token", "wrong", "tenants", "list", "--token", ADMIN_TOKEN)
    assert r.exit_code == 0, r.output
    r = anon("admin", "-a", "127.0.0.1:1", "tenants", "list", "-a", server_thread.address)
    assert r.exit_code == 5  # reached the server (no token), not unreachable (6)
    listed = cli("admin", "tenants", "list", "-o", "yaml")
    assert listed.exit_code == 0, listed.output
    import yaml

    doc = yaml.safe_load(listed.stdout)
    assert [t["id"] for t in doc["tenants"]] == ["t1"] and doc["tenants"][0]["active_api_keys"] == 1


def test_export_applies_back_unchanged(cli: Cli, tmp_path: Path) -> None:
    v1 = write(tmp_path, "v1.yaml", TENANTS_V1)
    assert cli("admin", "apply", "-f", v1).exit_code == 0
    cli("admin", "tenants", "update", "web", "-q", "max_queue_wait_s=2.5", "--disable")
    exported = cli("admin", "tenants", "export")
    assert exported.exit_code == 0, exported.output
    path = write(tmp_path, "exported.yaml", exported.stdout)
    again = cli("admin", "apply", "-f", path, "--dry-run", "--prune", "--exit-code")
    assert again.exit_code == 0, again.output
    assert "dry run: 0 to create, 0 to update, 0 to delete" in again.stdout


def test_prune_names_the_keys_it_deletes_and_exit_code_on_drift(cli: Cli, tmp_path: Path) -> None:
    v1 = write(tmp_path, "v1.yaml", TENANTS_V1)
    assert cli("admin", "apply", "-f", v1).exit_code == 0
    key_id = _json(cli("admin", "-o", "json", "keys", "issue", "batch-jobs"))["key"]["key_id"]  # type: ignore[index]
    v2 = write(tmp_path, "v2.yaml", TENANTS_V2)
    dry = cli("admin", "apply", "-f", v2, "--prune", "--dry-run", "--exit-code")
    assert dry.exit_code == 7, dry.output  # drift
    assert f"deletes 1 API key(s) with it: {key_id}" in dry.stdout
    plain = cli("admin", "apply", "-f", v2, "--prune", "--dry-run")
    assert plain.exit_code == 0  # without --exit-code, drift is not an error
    done = _json(cli("admin", "-o", "json", "apply", "-f", v2, "--prune"))
    assert done["deleted_api_keys"] == {"batch-jobs": [key_id]}  # type: ignore[index]
    assert done["drift"] is True  # type: ignore[index]
    same = cli("admin", "apply", "-f", v2, "--prune", "--exit-code")
    assert same.exit_code == 0 and "no changes" in same.stdout


def test_every_bad_flag_and_field_is_listed(cli: Cli, tmp_path: Path) -> None:
    r = cli(
        "admin", "tenants", "create", "t", "--priority", "urgent", "--over-quota", "later",
        "-q", "nope=1", "-q", "max_queued=lots",
    )  # fmt: skip
    assert r.exit_code == 2
    for part in ("'urgent'", "'later'", "--quota nope: unknown field", "--quota max_queued"):
        assert part in r.stderr, (part, r.stderr)
    assert r.stderr.count("error:") == 4
    # Issue 26: a bad weight and a bad quota value, both at once; update too.
    r = cli("admin", "tenants", "create", "t", "--weight", "0", "-q", "max_queued=abc")
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [
        "error: --quota max_queued: expected an integer or null (no limit), got 'abc'",
        "error: --weight: weight must be a finite number in [0.001, 1000] (got 0.0)",
    ]
    r = cli("admin", "tenants", "update", "t", "--weight", "0", "-q", "max_queued=abc")
    assert r.exit_code == 2 and r.stderr.count("error:") == 2
    bad = write(
        tmp_path,
        "bad.yaml",
        "tenants:\n"
        "  - id: a\n    weight: -2\n    wieght: 1\n"
        "    quotas: {max_queued: 0, requests_per_s: x}\n"
        "  - id: b\n    over_quota: later\n",
    )
    r = cli("admin", "apply", "-f", bad)
    assert r.exit_code == 2
    for part in ("wieght", "'weight'", "quotas.max_queued", "quotas.requests_per_s", "over_quota"):
        assert part in r.stderr, (part, r.stderr)
    assert r.stderr.count("error:") == 5  # one per bad field
