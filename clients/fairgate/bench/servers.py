"""Servers the benchmarks start in a child process (one core for the server,
one for the load generator): a bare grpc.aio streaming server and fairgate.

Run as `python -m fairgate.bench.servers MODE [KEY=VALUE ...]`; prints
`PORT <n>` when ready and exits when stdin closes.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from fairgate.v1 import inference_pb2 as pb
from fairgate.v1 import inference_pb2_grpc as pb_grpc

WORD = " token"


class BareInference(pb_grpc.InferenceServiceServicer):
    """The ceiling: the same messages as fairgate, with no work behind them."""

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        n = request.sampling.max_tokens
        for i in range(n):
            yield pb.GenerateResponse(delta=pb.TokenDelta(text=WORD, index=i))
        result = pb.GenerateResult(
            request_id=request.request_id, finish_reason=pb.FINISH_REASON_LENGTH
        )
        result.usage.completion_tokens = n
        yield pb.GenerateResponse(result=result)

    async def ListModels(
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListModelsResponse:
        return pb.ListModelsResponse()

    async def CountTokens(
        self, request: pb.CountTokensRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CountTokensResponse:
        return pb.CountTokensResponse()


def overrides_from_args(args: list[str]) -> dict[str, str]:
    """The KEY=VALUE arguments after MODE."""
    return dict(arg.split("=", 1) for arg in args)


def settings_env(overrides: dict[str, str]) -> dict[str, str]:
    """The FAIRGATE_* variables the server's settings are read from (the bench's
    own keys, telemetry, already taken out)."""
    return {f"FAIRGATE_{k.upper()}": v for k, v in overrides.items()}


async def _serve(mode: str, overrides: dict[str, str]) -> None:
    if mode == "bare":
        server = grpc.aio.server()
        pb_grpc.add_InferenceServiceServicer_to_server(BareInference(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        stop: Callable[[float], Awaitable[None]] = server.stop
    else:
        from service.main import start
        from service.settings import Settings

        # telemetry=off|on|env: none, everything on with exporters that discard, OTEL_*.
        telemetry_mode = overrides.pop("telemetry", "env")
        env = settings_env(overrides)
        env.setdefault("FAIRGATE_HTTP_LISTEN", "")  # on only where a bench asks for it
        settings = Settings.from_env(env, listen="127.0.0.1:0", log_level="WARNING")
        from fairgate.bench.telemetry_server import bench_telemetry

        telemetry, report = bench_telemetry(telemetry_mode, settings)
        # As `fairgate serve` starts it (the collector's freeze included).
        app = await start(settings, telemetry)
        port = app.port

        async def stop(grace_s: float) -> None:
            await app.stop(grace_s)
            report()

    print(f"PORT {port}", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    await stop(0)


def _supervise(overrides: dict[str, str]) -> None:
    """fairgate with workers > 1: this process supervises them (service/workers.py)."""
    from service.settings import Settings
    from service.workers import Supervisor

    telemetry_mode = overrides.pop("telemetry", "env")
    if telemetry_mode not in ("off", "env"):
        raise SystemExit("telemetry=on (the bench's discarding exporters) needs workers=1")
    env = settings_env(overrides)
    settings = Settings.from_env(env, listen="127.0.0.1:0", log_level="WARNING")
    supervisor = Supervisor(
        settings, extra_env={"OTEL_SDK_DISABLED": "true"} if telemetry_mode == "off" else {}
    )
    ready = supervisor.start()
    print(f"PORT {ready[0].address.rsplit(':', 1)[1]}", flush=True)
    sys.stdin.read()
    supervisor.stop()
    sys.exit(supervisor.wait())


def main() -> None:
    mode = sys.argv[1]
    overrides = overrides_from_args(sys.argv[2:])
    if mode == "fairgate" and int(overrides.get("workers", "1")) > 1:
        _supervise(overrides)
    from service import event_loop

    # The server's own choice (FAIRGATE_EVENT_LOOP's setting), auto by default.
    event_loop.run(_serve(mode, overrides), overrides.get("event_loop", "auto"))


if __name__ == "__main__":
    main()
