"""The `fairgate` command against a real server."""

from __future__ import annotations

import asyncio
import sys

import pytest

from service.app import App

FAIRGATE = [sys.executable, "-m", "fairgate.cli.main"]


async def _run(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *FAIRGATE, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_generate_streams_and_prints_usage(server: App) -> None:
    code, out, err = await _run(
        "generate", "hello from the cli", "-a", server.address, "--max-tokens", "12"
    )
    assert code == 0, err
    assert "[length]" in out
    assert "completion 12" in out
    assert "first token" in out


async def test_generate_bad_input_exits_nonzero_with_field(server: App) -> None:
    code, _, err = await _run("generate", "x", "-a", server.address, "--max-tokens", "0")
    assert code == 1
    assert "INVALID_ARGUMENT" in err and "sampling.max_tokens" in err


async def test_models_and_count_tokens(server: App) -> None:
    code, out, _ = await _run("models", "-a", server.address)
    assert code == 0 and server.models.default in out
    code, out, _ = await _run("models", "-a", server.address, "-o", "json")
    import json

    (listed,) = json.loads(out)
    assert code == 0 and listed["name"] == server.models.default and listed["is_default"]
    code, out, _ = await _run("count-tokens", "one two three", "-a", server.address)
    assert code == 0 and out.startswith("3 tokens")


async def test_health_command(server: App) -> None:
    code, out, _ = await _run("health", "-a", server.address)
    assert (code, out.strip()) == (0, "SERVING")
    await server.stop(grace_s=0)
    code, _, err = await _run("health", "-a", server.address, "--timeout", "1")
    assert code == 1 and "unhealthy" in err


async def test_serve_refuses_a_bad_tenants_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "tenants.yaml"
    bad.write_text(
        "tenants:\n  - id: x\n    weight: -1\n  - id: y\n    over_quota: later\n"
        "  - id: z\n    quotas: {max_queued: many}\n"
    )
    code, _, err = await _run(
        "serve", "--tenants", str(bad), "--listen", "127.0.0.1:0", "--http-listen", ""
    )
    assert code == 2 and "Traceback" not in err
    # Issue 26: every bad tenant at once, not the first.
    assert "3 problems" in err
    assert "tenant 'x': field 'weight'" in err and "tenant 'y': field 'over_quota'" in err
    assert "tenant 'z': field 'quotas.max_queued'" in err


async def test_serve_lists_every_bad_setting_from_variables_and_flags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FAIRGATE_KV_TARGET_FRACTION", "2")
    monkeypatch.setenv("FAIRGATE_WORKERS", "many")
    code, out, err = await _run(
        "serve", "--listen", "127.0.0.1:0", "--http-listen", "", "--policy", "lottery"
    )
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "error: invalid settings (3 problems):",
        "  FAIRGATE_WORKERS='many': expected an integer in [1, 256]",
        "  FAIRGATE_KV_TARGET_FRACTION='2': expected a number in (0, 1]",
        "  --policy='lottery' (FAIRGATE_POLICY): expected one of vtc, fcfs, rate-limit",
    ]


async def test_serve_refuses_preemption_the_engine_cannot_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The simulator without priority scheduling preempts nothing.
    monkeypatch.setenv("FAIRGATE_FAIR_ISOLATION", "preempt")
    code, _, err = await _run("serve", "--listen", "127.0.0.1:0", "--http-listen", "")
    assert code == 2
    assert "fair_isolation=preempt needs an engine that preempts" in err
    assert "Traceback" not in err
    monkeypatch.setenv("FAIRGATE_FAIR_ISOLATION", "sometimes")
    code, _, err = await _run("serve", "--listen", "127.0.0.1:0", "--http-listen", "")
    assert code == 2
    assert "FAIRGATE_FAIR_ISOLATION='sometimes': expected one of auto, preempt, reserve" in err


async def test_bench_store_prints_both_stores(redis_url: str) -> None:
    code, out, err = await _run(
        "bench",
        "store",
        "--redis-url",
        redis_url,
        "--seconds",
        "0.3",
        "--flush-ms",
        "5",
        "--concurrency",
        "16",
    )
    assert code == 0, err
    assert "memory store" in out and "redis store, flush 5 ms" in out
    assert "round trips/req" in out and "CPU us/req" in out
    # Each run admitted requests and spent this process's CPU on them.
    rows = [line for line in out.splitlines() if line.startswith(("embedded", "memory", "redis"))]
    assert len(rows) == 3
    for row in rows:
        rate, _vs, cpu_us = row[30:].split()[:3]
        assert float(rate) > 0 and float(cpu_us) > 0, row


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_server_is_one_line_not_a_traceback() -> None:
    address = f"127.0.0.1:{_closed_port()}"
    for args in (
        ("bench", "load", "-a", address, "--requests", "4"),
        ("models", "-a", address),
    ):
        code, _, err = await _run(*args)
        assert code == 1, err
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: UNAVAILABLE"), err


async def test_version_completion_and_help() -> None:
    from fairgate.cli.shared import version

    code, out, _ = await _run("--version")
    assert (code, out.strip()) == (0, f"fairgate {version()}")
    code, out, _ = await _run("--help")
    assert code == 0 and "--install-completion" in out
    # Every setting is a serve flag, in a section, with its doc and default; choices
    # listed (from the declaration), ranges said.
    from fairgate.cli.serve import OTHER_SECTION, SECTIONS, section_of

    from service.settings import Settings

    code, out, _ = await _run("serve", "--help")
    assert code == 0
    flat = " ".join(out.split())
    for name in Settings.model_fields:
        assert "--" + name.replace("_", "-") in flat, name
        assert section_of(name) != OTHER_SECTION, f"{name} is in no section"
    assert all(f"\n{title}:\n" in out for title, _, _ in SECTIONS)
    assert (
        "--listen <str> gRPC address, host:port (port 0 picks a free one). "
        "[default 127.0.0.1:50051]"
    ) in flat
    assert "--engine [simulator|sglang-http|sglang]" in flat
    assert "--log-level [DEBUG|INFO|WARNING|ERROR|CRITICAL]" in flat
    assert "Allowed: a number in (0, 1]. [default 0.9]" in flat  # kv_target_fraction
    assert "FAIRGATE_HTTP_LISTEN" in flat  # the rule for every variable, said once
    code, out, _ = await _run("generate", "--help")
    usage = out.splitlines()[0]  # typer marks a required argument with braces: {PROMPT}
    assert code == 0 and "generate [OPTIONS]" in usage and "PROMPT" in usage, usage
    # Help text is not Rich markup: `[plot]` survives.
    code, out, _ = await _run("bench", "load", "--help")
    assert code == 0 and "fairgate[plot]" in out


async def test_serve_flags_reach_the_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A flag for a setting that used to be env-only: its validation answers.
    code, _, err = await _run(
        "serve", "--store", "nowhere", "--listen", "127.0.0.1:0", "--http-listen", ""
    )
    assert code == 2 and "--store='nowhere' (FAIRGATE_STORE): expected one of memory, redis" in err
