"""The `fairgate` command: serve, generate, models, count-tokens, bench."""

from __future__ import annotations

import asyncio
import sys
from typing import Annotated

import typer

from fairgate.admin.cli import admin_app
from fairgate.bench.fleet_cli import fleet_command
from fairgate.bench.load_cli import load_command
from fairgate.cli.conn import ApiKeyOpt, CaFileOpt, CertFileOpt, KeyFileOpt, TlsOpt, tls_config
from fairgate.cli.serve import ServeCommand, serve_command
from fairgate.cli.shared import version
from fairgate.errors import FairgateError
from fairgate.plan.cli import plan_command

typer_app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Help is plain text, the same in every command (`fairgate[plot]` is not
    # markup); `serve` groups its settings in sections (fairgate.cli.serve).
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
    help="fairgate: a weighted-fair, multi-tenant gRPC front door for LLM engines.",
)
bench_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Benchmarks (print ratios measured in one run).",
)
typer_app.add_typer(bench_app, name="bench")
bench_app.command("load")(load_command)
bench_app.command("fleet")(fleet_command)
typer_app.command("plan")(plan_command)
typer_app.add_typer(admin_app, name="admin")


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"fairgate {version()}")
        raise typer.Exit(0)


@typer_app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_show_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
) -> None:
    """fairgate: a weighted-fair, multi-tenant gRPC front door for LLM engines."""


DEFAULT_TARGET = "127.0.0.1:50051"
TargetOpt = Annotated[
    str, typer.Option("--address", "-a", envvar="FAIRGATE_ADDRESS", help="server host:port")
]
TenantOpt = Annotated[str | None, typer.Option(help="tenant name sent in x-fairgate-tenant")]


@typer_app.command()
def generate(
    prompt: Annotated[str, typer.Argument(help="prompt text", metavar="PROMPT")],
    address: TargetOpt = DEFAULT_TARGET,
    tenant: TenantOpt = None,
    max_tokens: Annotated[int | None, typer.Option(help="tokens to generate")] = None,
    temperature: Annotated[float | None, typer.Option()] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    stop: Annotated[list[str] | None, typer.Option(help="stop string (repeatable)")] = None,
    priority: Annotated[str, typer.Option(help="interactive | batch")] = "interactive",
    model: Annotated[str, typer.Option(help="model name (default: server's)")] = "",
    timeout: Annotated[float | None, typer.Option(help="deadline in seconds")] = None,
    api_key: ApiKeyOpt = None,
    tls: TlsOpt = False,
    ca_file: CaFileOpt = None,
    cert_file: CertFileOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Stream a completion to the terminal, then print usage and timings."""
    from fairgate.sync import Client
    from fairgate.types import Delta

    tls_cfg = tls_config(tls, ca_file, cert_file, key_file)
    try:
        with Client(
            address, tenant=tenant, api_key=api_key, tls=tls_cfg, timeout_s=timeout
        ) as client:
            for ev in client.generate(
                prompt,
                max_tokens=max_tokens,
                temperature=temperature,
                seed=seed,
                stop=stop or (),
                priority=priority,
                model=model,
            ):
                if isinstance(ev, Delta):
                    sys.stdout.write(ev.text)
                    sys.stdout.flush()
                else:
                    u, t = ev.usage, ev.timings
                    ttft = (
                        f"{t.time_to_first_token_s * 1e3:.1f} ms"
                        if t.time_to_first_token_s
                        else "-"
                    )
                    typer.echo(
                        f"\n\n[{ev.finish_reason}] request {ev.request_id} model {ev.model}\n"
                        f"usage: prompt {u.prompt_tokens}, completion {u.completion_tokens}, "
                        f"cached {u.cached_tokens}, total {u.total_tokens}\n"
                        f"timings: queue {t.queue_wait_s * 1e3:.1f} ms, first token {ttft}, "
                        f"total {t.total_s * 1e3:.1f} ms"
                        + (f"\nmessage: {ev.message}" if ev.message else ""),
                        err=False,
                    )
    except FairgateError as exc:
        _fail(exc)


@typer_app.command()
def models(
    address: TargetOpt = DEFAULT_TARGET,
    output: Annotated[
        str,
        typer.Option("--output", "-o", envvar="FAIRGATE_OUTPUT", help="table, json or yaml"),
    ] = "table",
    api_key: ApiKeyOpt = None,
    tls: TlsOpt = False,
    ca_file: CaFileOpt = None,
    cert_file: CertFileOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """List the served models."""
    from fairgate.sync import Client

    tls_cfg = tls_config(tls, ca_file, cert_file, key_file)
    try:
        with Client(address, api_key=api_key, tls=tls_cfg) as client:
            listed = client.list_models()
            if output in ("json", "yaml"):
                import dataclasses

                from fairgate.admin.render import print_data

                print_data([dataclasses.asdict(m) for m in listed], output)
                return
            if output != "table":
                typer.echo(f"error: --output {output!r}: use table, json or yaml", err=True)
                raise typer.Exit(2)
            for m in listed:
                mark = "*" if m.is_default else " "
                typer.echo(
                    f"{mark} {m.name}  engine={m.engine}  context={m.max_context_tokens}  "
                    f"max_output={m.max_output_tokens}  exact_tokens={m.exact_token_counts}"
                )
    except FairgateError as exc:
        _fail(exc)


@typer_app.command("count-tokens")
def count_tokens(
    text: Annotated[str, typer.Argument(help="text to count", metavar="TEXT")],
    address: TargetOpt = DEFAULT_TARGET,
    model: str = "",
    api_key: ApiKeyOpt = None,
    tls: TlsOpt = False,
    ca_file: CaFileOpt = None,
    cert_file: CertFileOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Count the tokens of a text with the server's tokenizer."""
    from fairgate.sync import Client

    tls_cfg = tls_config(tls, ca_file, cert_file, key_file)
    try:
        with Client(address, api_key=api_key, tls=tls_cfg) as client:
            n, exact = client.count_tokens(text, model=model)
            typer.echo(f"{n} tokens ({'exact' if exact else 'approximate'})")
    except FairgateError as exc:
        _fail(exc)


@typer_app.command()
def health(
    address: TargetOpt = DEFAULT_TARGET,
    service: Annotated[str, typer.Option(help="service name; empty = whole server")] = "",
    timeout: Annotated[float, typer.Option(help="seconds")] = 2.0,
    tls: TlsOpt = False,
    ca_file: CaFileOpt = None,
    cert_file: CertFileOpt = None,
    key_file: KeyFileOpt = None,
) -> None:
    """Check the server's gRPC health (exit 0 when SERVING); for probes and scripts."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from fairgate.tls import sync_channel

    with sync_channel(address, tls_config(tls, ca_file, cert_file, key_file)) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError as exc:
            typer.echo(f"unhealthy: {exc.code().name}", err=True)
            raise typer.Exit(1) from None
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    typer.echo(name)
    raise typer.Exit(0 if resp.status == health_pb2.HealthCheckResponse.SERVING else 1)


@typer_app.command("sim-server")
def sim_server(
    host: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0: any free port)")] = 30000,
    model: Annotated[str, typer.Option(help="simulator model preset")] = "llama-3.1-8b-int4",
    gpu: Annotated[
        str, typer.Option(help="GPU preset (rtx-4090, l40s, a100-80gb, h100-sxm, h200, ...)")
    ] = "rtx-4090",
    time_scale: Annotated[float, typer.Option(help="1 = real time, 0 = no delays")] = 1.0,
    max_running_requests: Annotated[int, typer.Option()] = 256,
    max_queued_requests: Annotated[int, typer.Option(help="0: unlimited")] = 0,
    kv_capacity_tokens: Annotated[int, typer.Option(help="0: the preset's")] = 0,
    seed: Annotated[int, typer.Option()] = 0,
    incremental_streaming_output: Annotated[
        bool, typer.Option(help="stream new text only, as SGLang's flag of that name")
    ] = False,
    enable_priority_scheduling: Annotated[bool, typer.Option()] = False,
    disable_radix_cache: Annotated[
        bool, typer.Option(help="no prefix cache (cached_tokens 0), as SGLang's flag")
    ] = False,
    fault_garble_after_chunks: Annotated[
        int | None, typer.Option(help="test fault: broken JSON after N chunks of each stream")
    ] = None,
    fault_stall_after_chunks: Annotated[
        int | None, typer.Option(help="test fault: go silent after N chunks of each stream")
    ] = None,
) -> None:
    """Run the simulated engine as a server speaking SGLang's native HTTP API."""
    from service.engines.simulator.http_server import main as sim_main

    args = [
        f"--host={host}",
        f"--port={port}",
        f"--model={model}",
        f"--gpu={gpu}",
        f"--time-scale={time_scale}",
        f"--max-running-requests={max_running_requests}",
        f"--max-queued-requests={max_queued_requests}",
        f"--kv-capacity-tokens={kv_capacity_tokens}",
        f"--seed={seed}",
    ]
    if incremental_streaming_output:
        args.append("--incremental-streaming-output")
    if enable_priority_scheduling:
        args.append("--enable-priority-scheduling")
    if disable_radix_cache:
        args.append("--disable-radix-cache")
    if fault_garble_after_chunks is not None:
        args.append(f"--fault-garble-after-chunks={fault_garble_after_chunks}")
    if fault_stall_after_chunks is not None:
        args.append(f"--fault-stall-after-chunks={fault_stall_after_chunks}")
    sim_main(args)


@bench_app.command("stream")
def bench_stream(
    concurrency: Annotated[str, typer.Option(help="comma-separated stream counts")] = "1,64,512",
    tokens: Annotated[int, typer.Option(help="tokens per stream")] = 256,
    duration: Annotated[float, typer.Option(help="seconds per measurement")] = 3.0,
    coalesce: Annotated[bool, typer.Option(help="let fairgate coalesce ready tokens")] = True,
) -> None:
    """Streaming ceiling: bare grpc.aio vs fairgate on the zero-latency simulator."""
    from fairgate.bench.stream import main as bench_main

    levels = [int(x) for x in concurrency.split(",") if x.strip()]
    asyncio.run(bench_main(levels, tokens, duration, coalesce))


@bench_app.command("http-overhead")
def bench_http_overhead(
    requests: Annotated[int, typer.Option(help="requests per protocol per round")] = 200,
    concurrency: Annotated[int, typer.Option(help="streams at once")] = 32,
    tokens: Annotated[int, typer.Option(help="tokens per stream")] = 128,
    rounds: Annotated[int, typer.Option(help="alternating rounds per protocol")] = 3,
) -> None:
    """Server CPU per streamed token: the OpenAI HTTP front vs gRPC, in one run."""
    from fairgate.bench.http_overhead import main as bench_main

    asyncio.run(bench_main(requests, concurrency, tokens, rounds))


@bench_app.command("fairness")
def bench_fairness(
    scenarios: Annotated[str, typer.Option(help="scenario keys among a-i")] = "abcdef",
    seconds: Annotated[float, typer.Option(help="simulated seconds per run")] = 30.0,
    time_scale: Annotated[float, typer.Option(help="simulator time scale")] = 0.5,
    seed: Annotated[int, typer.Option(help="arrival trace seed")] = 1,
    policies: Annotated[
        str,
        typer.Option(
            help="comma-separated; vtc@F runs vtc with F of the engine kept or lent "
            "for light tenants (fair_reserve_fraction and fair_lend_fraction), "
            "vtc:reserve / vtc:preempt with that fair_isolation (default auto)"
        ),
    ] = "fcfs,rate-limit,vtc",
    replicas: Annotated[
        int, typer.Option(min=1, help="vtc on N fairgate replicas sharing Redis and one engine")
    ] = 1,
    json_out: Annotated[str, typer.Option("--json", help="also write the report here")] = "",
    virtual: Annotated[
        bool,
        typer.Option(
            help="replay on simulated time in this process (the same rules and engine "
            "model; no gRPC, no load-dependent noise; one replica)"
        ),
    ] = False,
    seeds: Annotated[
        str,
        typer.Option(
            help="several traces, e.g. 1-10 or 1,4,7 (instead of --seed): each run, "
            "then the median (min-max) of each ratio over them"
        ),
    ] = "",
    staged_prefill: Annotated[
        str,
        typer.Option(
            help="stage sizes in tokens, e.g. 1024,2048,1024:free: each vtc policy runs "
            "again with staged prefill in stages of that size (prompts longer than one "
            "stage; one at a time per engine, or all at once with :free)"
        ),
    ] = "",
) -> None:
    """Fair (VTC) vs FCFS vs per-tenant rate limits on the same arrival traces."""
    from fairgate.bench.fairness import Policy
    from fairgate.bench.fairness import main as fairness_main
    from fairgate.bench.fairness_report import print_summary, summarize, write_json
    from fairgate.bench.fairness_scenarios import scenarios as scenario_table

    try:
        chosen = tuple(Policy.parse(p) for p in policies.split(",") if p.strip())
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policies") from None
    sizes = [x for x in staged_prefill.split(",") if x.strip()]
    try:
        chosen += tuple(p.staged(n) for n in sizes for p in chosen if p.name == "vtc")
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--staged-prefill") from None
    known = scenario_table(seconds)
    if not scenarios or any(k not in known for k in scenarios):
        raise typer.BadParameter(f"use keys among {''.join(known)}", param_hint="--scenarios")
    if virtual and replicas > 1:
        raise typer.BadParameter("--virtual replays one replica", param_hint="--replicas")
    try:
        seed_list = _seed_list(seeds) if seeds else [seed]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--seeds") from None
    reports = {
        s: asyncio.run(fairness_main(scenarios, seconds, time_scale, s, chosen, replicas, virtual))
        for s in seed_list
    }
    if len(seed_list) == 1:
        report = reports[seed_list[0]]
    else:
        summary = summarize(reports)
        print_summary(summary, seed_list)
        report = {"seeds": {str(s): r for s, r in reports.items()}, "summary": summary}
    if json_out:
        write_json(json_out, report)


def _seed_list(spec: str) -> list[int]:
    """`1-10` or `1,4,7` -> the seeds, in order."""
    out: list[int] = []
    for part in spec.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"{spec!r}: use ranges and lists of seeds such as 1-10 or 1,4,7")
        out += list(range(int(lo), int(hi) + 1)) if dash else [int(lo)]
    if not out:
        raise ValueError(f"{spec!r}: no seeds")
    return out


@bench_app.command("decision")
def bench_decision(
    tenants: Annotated[str, typer.Option(help="comma-separated backlogged tenant counts")] = (
        "10,1000,10000"
    ),
) -> None:
    """Cost of one scheduling decision vs the number of backlogged tenants."""
    from fairgate.bench.decision import main as decision_main

    decision_main([int(x) for x in tenants.split(",") if x.strip()])


@bench_app.command("sglang-overhead")
def bench_sglang_overhead(
    concurrency: Annotated[str, typer.Option(help="comma-separated stream counts")] = "64,512",
    tokens: Annotated[int, typer.Option(help="tokens per long stream")] = 128,
    streams_per_worker: Annotated[int, typer.Option(help="streams each worker runs")] = 2,
) -> None:
    """Per-request and per-token cost of the SGLang HTTP adapter vs the in-process simulator."""
    from fairgate.bench.sglang_overhead import main as bench_main

    levels = [int(x) for x in concurrency.split(",") if x.strip()]
    asyncio.run(bench_main(levels, tokens, streams_per_worker))


@bench_app.command("gateway")
def bench_gateway(
    modes: Annotated[str, typer.Option(help="zero (zero-latency workers), real (4090s)")] = (
        "zero,real"
    ),
    concurrency: Annotated[str, typer.Option(help="comma-separated stream counts")] = "1,64,256",
    workers: Annotated[int, typer.Option(help="sim-server workers behind every gateway")] = 1,
    repetitions: Annotated[int, typer.Option(help="interleaved repetitions")] = 2,
    tokens: Annotated[int, typer.Option(help="output tokens per request")] = 128,
    waves: Annotated[int, typer.Option(help="requests per stream, at least")] = 2,
    budget_tokens: Annotated[int, typer.Option(help="output tokens per cell, at least")] = 20000,
    variant: Annotated[
        list[str] | None,
        typer.Option(
            help="fairgate variant LABEL[:setting=value,...] (repeatable; default: fairgate);"
            " src=DIR runs it from another fairgate checkout"
        ),
    ] = None,
    http: Annotated[
        bool, typer.Option(help="also load the first variant's OpenAI HTTP front")
    ] = True,
    smg: Annotated[
        str | None, typer.Option(help="smg binary (default: beside python, then PATH)")
    ] = None,
    no_smg: Annotated[bool, typer.Option("--no-smg", help="leave smg out")] = False,
    capacity_workers: Annotated[
        int, typer.Option(help="capacity search up to this many real-time workers (0: off)")
    ] = 0,
    per_worker_c: Annotated[int, typer.Option(help="capacity search: streams per worker")] = 64,
    incremental: Annotated[
        bool, typer.Option(help="workers stream new output only (--incremental-streaming-output)")
    ] = False,
    grpc_channels: Annotated[
        int,
        typer.Option(
            help="connections each gRPC target's calls spread over (fairgate --workers "
            "N splits connections, not calls)"
        ),
    ] = 1,
    sglang_cpu: Annotated[
        bool,
        typer.Option(
            help="the real SGLang server on CPU (../shared/sglang-cpu): its own HTTP server "
            "vs smg vs fairgate over HTTP vs fairgate in-process (the first variant's "
            "settings apply to both fairgates; --modes and --workers do not apply)"
        ),
    ] = False,
    sglang_running: Annotated[
        int, typer.Option(help="--sglang-cpu: SGLang's --max-running-requests (start.sh's 16)")
    ] = 16,
) -> None:
    """Direct vs fairgate (gRPC, HTTP) vs smg in front of the same sim-server workers.

    A variant with store=redis or workers=N > 1 (`--variant w2:workers=2`) runs
    on a throwaway local redis-server, whose CPU counts as the variant's."""
    from fairgate.bench.gateway import main as bench_main
    from fairgate.bench.gateway import parse_variant

    try:
        variants = [parse_variant(v) for v in variant or ["fairgate"]]
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if sglang_cpu:
        from fairgate.bench.gateway_sglang import main as sglang_main

        asyncio.run(
            sglang_main(
                levels=[int(x) for x in concurrency.split(",") if x.strip()],
                reps=repetitions,
                tokens=tokens,
                waves=waves,
                smg_binary=None if no_smg else (smg or ""),
                variant=variants[0].settings,
                max_running=sglang_running,
            )
        )
        return
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    if any(m not in ("zero", "real") for m in mode_list):
        typer.echo("error: --modes takes zero and/or real", err=True)
        raise typer.Exit(2)
    asyncio.run(
        bench_main(
            modes=mode_list,
            workers=workers,
            levels=[int(x) for x in concurrency.split(",") if x.strip()],
            reps=repetitions,
            tokens=tokens,
            waves=waves,
            budget_tokens=budget_tokens,
            variants=variants,
            http=http,
            smg_binary=None if no_smg else (smg or ""),
            capacity_workers=capacity_workers,
            per_worker_c=per_worker_c,
            incremental=incremental,
            grpc_channels=grpc_channels,
        )
    )


@bench_app.command("store")
def bench_store(
    redis_url: Annotated[
        str, typer.Option(help="Redis to use (default: start a local redis-server)")
    ] = "",
    flush_ms: Annotated[str, typer.Option(help="output-charge batching intervals (ms)")] = "0,5,20",
    tenants: Annotated[int, typer.Option(help="tenants")] = 8,
    concurrency: Annotated[int, typer.Option(help="requests in the closed loop")] = 256,
    seconds: Annotated[float, typer.Option(help="seconds per run")] = 3.0,
) -> None:
    """Shared admission: in-memory vs Redis store (admissions/s, step latency, round trips)."""
    from fairgate.bench.store import main as store_main

    intervals = [float(x) for x in flush_ms.split(",") if x.strip()] or [5.0]
    asyncio.run(store_main(redis_url, intervals, tenants, concurrency, seconds))


@bench_app.command("telemetry")
def bench_telemetry(
    concurrency: Annotated[str, typer.Option(help="comma-separated stream counts")] = "1,64",
    tokens: Annotated[int, typer.Option(help="tokens per stream")] = 256,
    duration: Annotated[float, typer.Option(help="seconds per measurement")] = 1.5,
    rounds: Annotated[int, typer.Option(help="alternating rounds per cell")] = 8,
) -> None:
    """Streamed throughput, server CPU per request and TTFT with OpenTelemetry fully on vs off."""
    from fairgate.bench.telemetry import main as bench_main

    levels = [int(x) for x in concurrency.split(",") if x.strip()]
    asyncio.run(bench_main(levels, tokens, duration, rounds))


def _fail(exc: FairgateError) -> None:
    typer.echo(f"error: {exc}", err=True)
    for field, desc in exc.field_violations:
        typer.echo(f"  {field}: {desc}", err=True)
    if exc.retry_after_s is not None:
        typer.echo(f"  retry after {exc.retry_after_s:.3f} s", err=True)
    raise typer.Exit(1)


typer_app.command("serve", cls=ServeCommand)(serve_command())
app = typer_app


def main() -> None:
    """The `fairgate` program."""
    from fairgate.cli.shared import run

    run(app)


if __name__ == "__main__":
    main()
