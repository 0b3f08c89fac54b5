"""Pure scheduling domain: tenants, quotas, fair-queue policies, admission.

- `tenants`, `tenant_file`: tenant configs and the registry (YAML loader).
- `token_bucket`, `quotas`: per-tenant rate buckets, caps and reservations.
- `policy` (the Protocol), `vtc` (weighted fair, default), `fcfs`, `rate_limit`
  (baselines), built on `backlog` / `tenant_queue` / `keyed_heap`.
- `budget`, `dispatcher`, `timers`: the prefill gate and the event-driven pump.

No grpc, protobuf or OpenTelemetry imports here; time comes from a `Clock`.
"""
