"""The `fairgate` command: serve, generate, models, count-tokens, bench."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from fairgate.cli.admin.cli import admin_app
from fairgate.cli.conn import ApiKeyOpt, CaFileOpt, CertFileOpt, KeyFileOpt, TlsOpt, tls_config
from fairgate.cli.lazy import LazyGroup
from fairgate.cli.shared import version
from fairgate.errors import FairgateError

typer_app = typer.Typer(
    # serve, bench and plan are imported only when asked for (fairgate.cli.lazy).
    cls=LazyGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Help is plain text, the same in every command (`fairgate[plot]` is not
    # markup); `serve` groups its settings in sections (fairgate.cli.serve).
    rich_markup_mode=None,
    context_settings={"max_content_width": 100},
    help="fairgate: a weighted-fair, multi-tenant gRPC front door for LLM engines.",
)
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

                from fairgate.cli.admin.render import print_data

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


def _fail(exc: FairgateError) -> None:
    typer.echo(f"error: {exc}", err=True)
    for field, desc in exc.field_violations:
        typer.echo(f"  {field}: {desc}", err=True)
    if exc.retry_after_s is not None:
        typer.echo(f"  retry after {exc.retry_after_s:.3f} s", err=True)
    raise typer.Exit(1)


app = typer_app


def main() -> None:
    """The `fairgate` program."""
    from fairgate.cli.shared import run

    run(app)


if __name__ == "__main__":
    main()
