"""The typer command behind `fairgate bench load` (registered in cli/main.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

DEFAULT_TARGET = "127.0.0.1:50051"


def load_command(
    address: Annotated[
        str, typer.Option("--address", "-a", envvar="FAIRGATE_ADDRESS", help="server host:port")
    ] = DEFAULT_TARGET,
    concurrency: Annotated[
        str, typer.Option(help="closed loop: comma-separated concurrency levels")
    ] = "10,50,100,300,500,1000",
    rate: Annotated[
        str | None,
        typer.Option(help="open loop instead: comma-separated arrival rates (requests/s)"),
    ] = None,
    cv: Annotated[
        float, typer.Option(help="open loop burstiness: CV of gaps (1 Poisson, >1 gamma-bursty)")
    ] = 1.0,
    burstiness: Annotated[
        float | None,
        typer.Option(
            help="open loop, as vLLM's --burstiness: gamma shape of the gaps "
            "(1 Poisson, < 1 burstier); overrides --cv (cv = 1/sqrt(burstiness))",
            show_default=False,
        ),
    ] = None,
    percentiles: Annotated[
        str,
        typer.Option(
            "--percentiles",
            "--metric-percentiles",
            help="latency percentiles to report, comma-separated (JSON: p<q>_<metric>_ms)",
        ),
    ] = "50,99",
    duration: Annotated[
        float | None, typer.Option(help="seconds each step issues requests")
    ] = 30.0,
    requests: Annotated[
        int | None, typer.Option(help="at most this many requests per step")
    ] = None,
    drain: Annotated[
        float, typer.Option(help="seconds in-flight requests may finish after a step")
    ] = 60.0,
    prompt_tokens: Annotated[str, typer.Option(help="prompt length: N or LO-HI")] = "256",
    output_tokens: Annotated[str, typer.Option(help="output length: N or LO-HI")] = "256",
    trace: Annotated[
        Path | None, typer.Option(help="JSONL with prompt_tokens/output_tokens per line")
    ] = None,
    tenant: Annotated[
        list[str] | None,
        typer.Option(help="NAME[:SHARE[:API_KEY|env:VAR]] (repeatable); default one tenant"),
    ] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(help="goodput SLO on TTFT")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(help="goodput SLO on TPOT")] = None,
    timeout: Annotated[float | None, typer.Option(help="per-request deadline (s)")] = None,
    model: Annotated[str, typer.Option(help="model name (default: server's)")] = "",
    channels: Annotated[int, typer.Option(help="gRPC connections to spread streams over")] = 4,
    protocol: Annotated[
        str,
        typer.Option(help="grpc, or http: the OpenAI API (--address is its host:port or URL)"),
    ] = "grpc",
    seed: Annotated[int, typer.Option(help="random seed (lengths, tenants, arrivals)")] = 0,
    json_file: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="write the report as JSON (each step with vllm bench serve's names "
            "and per-request records)",
        ),
    ] = None,
    result_dir: Annotated[
        Path | None,
        typer.Option(help="write one vllm-bench-serve-compatible JSON file per step here"),
    ] = None,
    plot_dir: Annotated[
        Path | None, typer.Option(help="write PNG plots here (needs fairgate[plot])")
    ] = None,
    time_scale: Annotated[
        float,
        typer.Option(
            help="the server simulator's time scale: report times in simulated seconds "
            "(durations given here stay wall-clock)"
        ),
    ] = 1.0,
    markdown: Annotated[bool, typer.Option(help="print the table as Markdown")] = False,
    sglang_urls: Annotated[
        str | None,
        typer.Option(
            help="comma-separated SGLang worker URLs: start a fairgate in front of them "
            "(engine sglang-http, a pool when several) and load it instead of --address"
        ),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="with --sglang-urls: the model's tokenizer.json (exact counts)"),
    ] = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Load generator: closed loop at concurrency steps or open loop (Poisson/gamma)."""
    from rich.console import Console

    from fairgate.bench.load import LoadConfig, RunReport, run_load
    from fairgate.bench.report import render_table, write_json, write_plots, write_results
    from fairgate.bench.stats import Slo
    from fairgate.bench.workload import Lengths, Tenant, Trace, parse_length, parse_tenant

    try:
        lengths = Lengths(
            prompt=parse_length(prompt_tokens),
            output=parse_length(output_tokens),
            trace=Trace.load(trace) if trace else None,
        )
        tenants = [parse_tenant(t) for t in tenant] if tenant else [Tenant("default")]
        if burstiness is not None:
            if burstiness <= 0:
                raise ValueError("--burstiness must be > 0")
            cv = 1.0 / burstiness**0.5
        qs = [float(x) for x in percentiles.split(",") if x.strip()]
        if rate:
            mode, levels = "open", [float(x) for x in rate.split(",") if x.strip()]
        else:
            mode, levels = "closed", [float(int(x)) for x in concurrency.split(",") if x.strip()]
        config = LoadConfig(
            target=address,
            lengths=lengths,
            tenants=tenants,
            mode=mode,
            levels=levels,
            cv=cv,
            duration_s=duration if duration and duration > 0 else None,
            requests=requests,
            drain_s=drain,
            request_timeout_s=timeout,
            slo=Slo(
                ttft_s=slo_ttft_ms / 1e3 if slo_ttft_ms is not None else None,
                tpot_s=slo_tpot_ms / 1e3 if slo_tpot_ms is not None else None,
            ),
            model=model,
            channels=channels,
            seed=seed,
            time_scale=time_scale,
            protocol=protocol,
            percentiles=qs,
        )
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None

    async def run(config: LoadConfig, *progress_fn: Any) -> RunReport:
        if not sglang_urls:
            return await run_load(config, *progress_fn)
        from fairgate.bench.common import server_process

        fairgate = {"engine": "sglang-http", "sglang_urls": sglang_urls}
        if tokenizer is not None:
            fairgate["tokenizer_path"] = str(tokenizer)
        async with server_process("fairgate", **fairgate) as address:
            return await run_load(dataclasses.replace(config, target=address), *progress_fn)

    console = Console()  # the terminal's width; 80 for pipes (the tables fit)
    if progress:
        from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[done]}/{task.fields[sent]} done"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        task_ids: dict[str, TaskID] = {}

        def on_progress(label: str, done: int, sent: int, frac: float) -> None:
            if label not in task_ids:
                task_ids[label] = bar.add_task(label, total=1.0, done=0, sent=0)
            bar.update(task_ids[label], completed=frac, done=done, sent=sent)

        with bar:
            report = asyncio.run(run(config, on_progress))
    else:
        report = asyncio.run(run(config))
    render_table(report, console, markdown=markdown)
    if json_file is not None:
        write_json(report, json_file)
        console.print(f"JSON report: {json_file}")
    if result_dir is not None:
        files = write_results(report, result_dir)
        console.print(f"vllm-compatible results: {len(files)} files in {result_dir}")
    if plot_dir is not None:
        try:
            paths = write_plots(report, plot_dir)
        except RuntimeError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        console.print("plots: " + ", ".join(str(p) for p in paths))
