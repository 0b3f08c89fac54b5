"""The grpc.aio server: its transport options, interceptors, services and port.

App.start (service/app.py) builds the parts; this module puts them on one
server: the inference and admin services, health (per service, for probes)
and reflection, and binds the listening port or says why it cannot.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from fairgate.v1 import admin_pb2, admin_pb2_grpc, inference_pb2, inference_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from service.settings import Settings
from service.startup import EXIT_ENVIRONMENT, StartupError
from service.tls import server_credentials

SERVICE_NAME = inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name
ADMIN_SERVICE_NAME = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name


class BindError(StartupError):
    """A port could not be bound (taken, or a bad address)."""


def new_server(
    settings: Settings, interceptors: Sequence[grpc.aio.ServerInterceptor]
) -> grpc.aio.Server:
    return grpc.aio.server(options=_server_options(settings), interceptors=interceptors)


def add_services(
    server: grpc.aio.Server,
    inference: inference_pb2_grpc.InferenceServiceServicer,
    admin: admin_pb2_grpc.AdminServiceServicer,
) -> HealthServicer:
    """The inference and admin services, health and reflection on `server`; the health."""
    inference_pb2_grpc.add_InferenceServiceServicer_to_server(inference, server)
    admin_pb2_grpc.add_AdminServiceServicer_to_server(admin, server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            ADMIN_SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    return health


def bind(server: grpc.aio.Server, settings: Settings) -> int:
    """Listen on settings.listen (TLS when configured); the port bound, or BindError."""
    creds = server_credentials(settings)
    try:
        if creds is None:
            port = server.add_insecure_port(settings.listen)
        else:
            port = server.add_secure_port(settings.listen, creds)
    except RuntimeError:  # grpc's "Failed to bind to address …" (checked before: a race)
        port = 0
    if port == 0:
        raise BindError("listen", f"cannot listen on {settings.listen}", EXIT_ENVIRONMENT)
    return port


async def serving(health: HealthServicer) -> None:
    """Probes read SERVING: the server as a whole and the inference service."""
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    await health.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)


def _server_options(s: Settings) -> list[tuple[str, int]]:
    opts = [
        ("grpc.max_receive_message_length", s.max_receive_message_bytes),
        ("grpc.max_send_message_length", s.max_send_message_bytes),
        ("grpc.keepalive_time_ms", int(s.keepalive_time_s * 1000)),
        ("grpc.keepalive_timeout_ms", int(s.keepalive_timeout_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
        # Explicit, since gRPC turns SO_REUSEPORT on by default (Linux): workers of
        # one node share the port (service/workers.py); a lone server fails to bind
        # a port already taken rather than silently splitting its traffic.
        ("grpc.so_reuseport", 1 if s.workers > 1 else 0),
    ]
    if s.max_concurrent_streams:
        opts.append(("grpc.max_concurrent_streams", s.max_concurrent_streams))
    return opts
