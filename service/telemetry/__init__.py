"""OpenTelemetry traces and metrics, the Prometheus endpoint and structured logs.

`setup.build_telemetry(settings)` reads the OTEL_* environment;
`telemetry.Telemetry` hands the server its interceptor and the generations
their lifecycle observer. Import the modules themselves: this package
re-exports nothing, so that no module of it imports its own package (one
direction only: instruments ← observation ← interceptor ← telemetry ← setup).
"""
