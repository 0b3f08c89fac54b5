"""OpenTelemetry traces and metrics, the Prometheus endpoint and structured logs.

`build_telemetry(settings)` reads the OTEL_* environment; `Telemetry` hands
the server its interceptor and the servicer its per-request observations.
"""

from service.telemetry.observation import RPC_SCOPE, GenerateObservation, NoopObservation
from service.telemetry.setup import build_telemetry
from service.telemetry.telemetry import Telemetry

__all__ = [
    "RPC_SCOPE",
    "GenerateObservation",
    "NoopObservation",
    "Telemetry",
    "build_telemetry",
]
