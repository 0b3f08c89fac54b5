"""Attribute and instrument names (OpenTelemetry GenAI/RPC conventions where they fit)."""

from __future__ import annotations

# GenAI semantic conventions.
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
OPERATION_TEXT_COMPLETION = "text_completion"
# This server is the provider its clients talk to (one value: no cardinality).
PROVIDER_FAIRGATE = "fairgate"
# The model label of a call refused before a model was resolved.
NO_MODEL = "_none"

# RPC and error conventions.
RPC_SYSTEM = "rpc.system"
RPC_SERVICE = "rpc.service"
RPC_METHOD = "rpc.method"
RPC_GRPC_STATUS_CODE = "rpc.grpc.status_code"
# On metrics: the status name ("OK", "RESOURCE_EXHAUSTED"), on every point, so
# no series carries an empty label (`error.type` is set on failed spans only).
RPC_RESPONSE_STATUS_CODE = "rpc.response.status_code"
ERROR_TYPE = "error.type"

# fairgate's own.
TENANT = "fairgate.tenant"
REQUEST_ID = "fairgate.request.id"
PRIORITY = "fairgate.priority"
ENGINE_KIND = "fairgate.engine.kind"
CACHED_TOKENS = "fairgate.usage.cached_tokens"
# Times the engine retracted the request (SGLang's num_retractions): its KV was
# freed for a request of higher priority and it was prefilled again.
RETRACTIONS = "fairgate.engine.retractions"
QUEUE_WAIT_S = "fairgate.queue.wait_s"
# What an isolation lever did (service/engines/isolation_stats.py's EVENTS).
ISOLATION_EVENT = "fairgate.isolation.event"
TTFT_S = "fairgate.time_to_first_token_s"
REJECTION_REASON = "fairgate.rejection.reason"
REJECTION_LIMIT = "fairgate.rejection.limit"
OUTCOME = "fairgate.outcome"
QUOTA_RESULT = "fairgate.quota.result"
IN_FLIGHT_REQUESTS = "fairgate.admission.in_flight_requests"
IN_FLIGHT_KV_TOKENS = "fairgate.admission.in_flight_kv_tokens"
BUDGET_PERIOD = "fairgate.budget.period"
API_KEY_ID = "fairgate.api_key.id"
PROMPT_CONTENT = "gen_ai.prompt"
COMPLETION_CONTENT = "gen_ai.completion"

# Histogram bucket advice from the GenAI metric conventions, extended to
# >= 300 s: a queued request under load waits minutes (docs/load-testing.md seed table: 84 s p99).
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 320.0,
)  # fmt: skip
TPOT_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
DURATION_BUCKETS_S = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    163.84, 327.68,
)  # fmt: skip
QUEUE_WAIT_BUCKETS_S = (
    0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
)  # fmt: skip
