"""`fairgate bench …`: the benchmark commands (loaded only when `bench` is asked
for: the root command registers this app lazily, so `serve` never imports bench)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Annotated

import typer

from fairgate.bench.fleet_cli import fleet_command
from fairgate.bench.load_cli import load_command
from fairgate.bench.seeds import seed_list

bench_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Benchmarks (print ratios measured in one run).",
)
bench_app.command("load")(load_command)
bench_app.command("fleet")(fleet_command)


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
        chosen_seeds = seed_list(seeds) if seeds else [seed]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--seeds") from None
    reports = {
        s: asyncio.run(fairness_main(scenarios, seconds, time_scale, s, chosen, replicas, virtual))
        for s in chosen_seeds
    }
    if len(chosen_seeds) == 1:
        report = reports[chosen_seeds[0]]
    else:
        summary = summarize(reports)
        print_summary(summary, chosen_seeds)
        report = {"seeds": {str(s): r for s, r in reports.items()}, "summary": summary}
    if json_out:
        write_json(json_out, report)


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


@bench_app.command("stagger")
def bench_stagger(
    engines: Annotated[str, typer.Option(help="comma-separated engine counts")] = "1,2,4",
    seeds: Annotated[str, typer.Option(help="trace seeds, e.g. 1-3 or 1,4,7")] = "1-3",
    mixes: Annotated[str, typer.Option(help="comma-separated: long, prefix")] = "long,prefix",
    levers: Annotated[
        str,
        typer.Option(
            help="comma-separated among none, stagger, staged, hold, all, staged-cold, "
            "all-cold, kv, staged-cold+kv, all-cold+kv (kv: the exact cache view from KV events)"
        ),
    ] = "none,stagger,staged,hold,all,staged-cold,all-cold",
    min_tokens: Annotated[
        int, typer.Option(min=1, help="stagger and hold: a long prompt's uncached tokens")
    ] = 1024,
    keep_tokens: Annotated[
        int,
        typer.Option(
            min=0,
            help="stagger: the worker kept on short steps takes only prompts that leave its "
            "prefill below this (0: --min-tokens)",
        ),
    ] = 0,
    hold_max_s: Annotated[float, typer.Option(min=0.01, help="hold: the longest hold")] = 2.0,
    stage_tokens: Annotated[int, typer.Option(min=1, help="staged: tokens per stage")] = 512,
    stage_min_tokens: Annotated[
        int, typer.Option(min=2, help="staged: prompts of at least this many tokens")
    ] = 2049,
    pace_tokens: Annotated[
        int,
        typer.Option(
            min=0,
            help="hold: short prompts paced to this much queued prefill a worker while the "
            "light tenant is active (FAIRGATE_SGLANG_STAGGER_PACE_TOKENS; 0: off)",
        ),
    ] = 0,
    sheltered_stage_tokens: Annotated[
        int,
        typer.Option(
            min=0,
            help="staged: stages of up to this many tokens where the stagger shelters the "
            "worker (FAIRGATE_STAGED_PREFILL_SHELTERED_STAGE_TOKENS; 0: off)",
        ),
    ] = 0,
    short_first: Annotated[
        bool,
        typer.Option(
            help="staged: a short prompt waiting for a worker's lane goes between a long "
            "one's stages (FAIRGATE_STAGED_PREFILL_SHORT_FIRST)",
        ),
    ] = False,
    seconds: Annotated[float, typer.Option(min=1, help="simulated seconds per trace")] = 30.0,
    load: Annotated[
        float,
        typer.Option(
            min=0.01,
            help="the heavy tenants' rates x this (1: as listed; above ~1.5 they stay "
            "backlogged, where Jain over service has footing)",
        ),
    ] = 1.0,
    replicas: Annotated[int, typer.Option(min=1, help="fairgate replicas placing requests")] = 1,
    share: Annotated[
        bool, typer.Option(help="replicas hear each other's long prefills (prefix share)")
    ] = True,
    kv_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="each engine's KV tokens, admission at kv_target_fraction of them, as "
            "`bench fleet`'s workers (16000); default: the preset's, admission at 60000",
        ),
    ] = None,
    engine_mode: Annotated[
        str,
        typer.Option(
            help="engines that schedule by priority and preempt (as `bench fleet`'s workers, "
            "SGLang --enable-priority-scheduling) with fair_isolation auto (lends room beyond "
            "them, keeps a reserve beside staggered prefill), preempt or reserve; auto+slot: "
            "auto with fair_light_takes_slot; auto+unsent: auto+slot with "
            "fair_light_takes_unsent_slots; fcfs: FCFS engines and the reserve (every table "
            "before session 21)"
        ),
    ] = "auto",
    round_trip: Annotated[
        bool,
        typer.Option(
            help="--no-round-trip, a what-if: a staged prompt's next stage (and the lane's "
            "next request) reaches its engine before the engine forms its next step, as if "
            "the engine queued it itself; live it is sent in answer to the stage's end and "
            "misses that step"
        ),
    ] = True,
    json_out: Annotated[str, typer.Option("--json", help="also write every run here")] = "",
) -> None:
    """Issue #33's levers on the virtual fleet (simulated time): the light tenant's
    TTFT against its solo run beside long cold prompts and a prefix-heavy mix, on
    each engine count, per lever combination, over seeds (median and spread), with
    tokens/s against no levers, Jain over service and over queue wait, and the bars."""
    from fairgate.bench.stagger import ENGINE_MODES, MIXES
    from fairgate.bench.stagger import levers as lever_table
    from fairgate.bench.stagger_report import main as stagger_main

    if keep_tokens > min_tokens:
        raise typer.BadParameter("at most --min-tokens", param_hint="--keep-tokens")
    table = lever_table(
        min_tokens,
        hold_max_s,
        stage_tokens,
        keep_tokens,
        stage_min_tokens,
        pace_tokens,
        sheltered_stage_tokens,
        short_first,
    )
    names = [x.strip() for x in levers.split(",") if x.strip()]
    if not names or any(n not in table for n in names):
        raise typer.BadParameter(f"use names among {','.join(table)}", param_hint="--levers")
    if engine_mode not in ENGINE_MODES:
        raise typer.BadParameter(f"one of {','.join(ENGINE_MODES)}", param_hint="--engine-mode")
    mix_list = [x.strip() for x in mixes.split(",") if x.strip()]
    if not mix_list or any(m not in MIXES for m in mix_list):
        raise typer.BadParameter(f"use mixes among {','.join(MIXES)}", param_hint="--mixes")
    try:
        counts = [int(x) for x in engines.split(",") if x.strip()]
        chosen_seeds = seed_list(seeds)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if not counts or min(counts) < 1:
        raise typer.BadParameter("engine counts are positive integers", param_hint="--engines")
    # "none" first: the others' tokens/s are set against it.
    combos = {n: table[n] for n in ["none", *names] if n in names or n == "none"}
    stagger_main(
        mix_list,
        counts,
        chosen_seeds,
        combos,
        seconds,
        json_out,
        replicas,
        share,
        kv_tokens,
        dataclasses.replace(ENGINE_MODES[engine_mode], round_trip=round_trip),
        load,
    )
