"""Server settings: embedded defaults, overridden by FAIRGATE_* env vars, then flags.

The defaults run the whole service with no configuration at all: the
simulated engine (RTX 4090 preset, Llama-3.1-8B in 4-bit) in real time, the
in-memory state, FCFS dispatch, on 127.0.0.1:50051.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field, fields
from typing import Any

from scheduler.tenancy.tenants import QUOTA_RANGES, WEIGHT_RANGE, range_problem, tenant_id_problem
from service.event_loop import EVENT_LOOPS

ENV_PREFIX = "FAIRGATE_"
ENGINES = ("simulator", "sglang-http", "sglang")
AUTH_MODES = ("auto", "api-key", "dev-header")
STORES = ("memory", "redis")
FAILURE_MODES = ("open", "closed")
ISOLATIONS = ("auto", "preempt", "reserve")
# Server processes per node (`workers`): beyond the cores of any node we run on.
MAX_WORKERS = 256


@dataclass(frozen=True, slots=True)
class Settings:
    listen: str = "127.0.0.1:50051"
    engine: str = "simulator"
    # Name clients use; empty means the simulator preset's model name.
    model_name: str = ""
    # Simulator preset.
    sim_gpu: str = "rtx-4090"
    sim_model: str = "llama-3.1-8b-int4"
    sim_time_scale: float = 1.0
    sim_seed: int = 0
    sim_max_running_requests: int = 256
    sim_chunked_prefill_tokens: int = 2048
    sim_mean_output_tokens: float = 0.0
    # Override the preset's KV capacity (tokens); 0 keeps the preset's.
    sim_kv_capacity_tokens: int = 0
    # SGLang's --enable-priority-scheduling (fairgate's engine priorities order
    # the simulator's prefills).
    sim_priority_scheduling: bool = False
    # SGLang's --disable-priority-preemption (else a priority gap above 10 preempts).
    sim_disable_priority_preemption: bool = False
    # SGLang over HTTP (engine = "sglang-http"): comma-separated base URLs;
    # more than one makes a worker pool.
    sglang_urls: str = ""
    sglang_connect_timeout_s: float = 5.0
    # Longest silence on a stream (also the wait for the first token).
    sglang_read_timeout_s: float = 60.0
    # Retries on the same worker before the first token (single worker only).
    sglang_retries: int = 1
    # The server runs --incremental-streaming-output (its /server_info wins when it says).
    sglang_incremental_output: bool = False
    sglang_health_interval_s: float = 2.0
    # Pool circuit breaker: stream failures in a row that eject a worker, and how
    # long an ejection lasts (doubling with each ejection in a row, up to the max).
    sglang_eject_after_failures: int = 3
    sglang_ejection_base_s: float = 5.0
    sglang_ejection_max_s: float = 300.0
    # Pool: prefer the worker a prompt's first N tokens hash to (0 = least load only).
    sglang_prefix_affinity_tokens: int = 0
    # In-process SGLang (engine = "sglang"): model path and extra Engine kwargs as JSON.
    sglang_model_path: str = ""
    sglang_engine_args: str = ""
    # How often the admission limits are re-read from the engine's capacity.
    capacity_refresh_s: float = 2.0
    # Send tokens that are ready together in one message (never waits for more).
    stream_coalesce: bool = True
    # The event loop: auto (uvloop when installed), uvloop, asyncio.
    event_loop: str = "auto"
    # SGLang over HTTP, coalescing: after each message, let tokens gather this long
    # before the next (the first token is never held; 0: send what each read brings).
    stream_coalesce_window_ms: float = 0.0
    # Directory (or file) with a Hugging Face tokenizer.json; empty: approximate counts.
    # Its tokenizer_config.json (or chat_template.jinja) supplies the chat template.
    tokenizer_path: str = ""
    # A Jinja2 chat template file; overrides the tokenizer directory's.
    chat_template_path: str = ""
    default_max_tokens: int = 256
    max_output_tokens: int = 8192
    # Application limit on one request; the transport limit is set above it
    # so oversized prompts get INVALID_ARGUMENT with details, not a bare error.
    max_request_bytes: int = 1 << 20
    max_receive_message_bytes: int = 4 << 20
    max_send_message_bytes: int = 4 << 20
    # Admission gate targets, as fractions of the engine's reported capacity.
    kv_target_fraction: float = 0.9
    running_target_fraction: float = 1.0
    # Queue policy: "vtc" (weighted fair), or the baselines "fcfs" and "rate-limit".
    policy: str = "vtc"
    # Share of the engine's slots and KV kept free for light tenants below their
    # fair share (fair_isolation reserve), so a light tenant is not stuck behind
    # a flood that fills an engine that cannot preempt. 0 turns it off.
    fair_reserve_fraction: float = 0.125
    # Share of the engine's slots and KV lent beyond a full engine to light
    # tenants below their fair share (fair_isolation preempt): the engine
    # retracts a flood's running request for each. Larger than the kept share,
    # since lending idles nothing (bench fairness --virtual, scenario f, ten
    # traces: victim p99 1.51x solo at 1/8, 1.43x at 1/4 and above, engine
    # tokens/s the same). 0 turns it off.
    fair_lend_fraction: float = 0.25
    # How long a tenant still counts as one to keep the reserve for after its
    # last request left (a light tenant between two requests).
    fair_reserve_window_s: float = 10.0
    # How the reserve's share is given to light tenants: "preempt" lends it beyond
    # the engine's room and lets the engine retract a flood's running request
    # (SGLang with --enable-priority-scheduling, preemption on); "reserve" keeps
    # it idle for them; "auto": preempt where the engine can, else reserve.
    fair_isolation: str = "auto"
    # How far ahead (weighted tokens per unit of weight) a light tenant, one with
    # a few requests queued at most, is ordered: its own last request must not
    # make it wait behind tenants queued all along. Adds as much to the fairness
    # bound between it and the others; 0 turns it off.
    fair_light_credit: float = 4096.0
    vtc_w_in: float = 1.0
    vtc_w_out: float = 2.0
    # The rate-limit baseline's per-tenant requests/s (and burst; 0 = 1 s worth).
    rate_limit_per_s: float = 10.0
    rate_limit_burst: float = 0.0
    # A tenant the registry does not configure (open and dev-header modes: any
    # valid id a caller names) is forgotten, fleet-wide, after this long idle:
    # the bound on the scheduler state such callers can make it keep.
    idle_tenant_ttl_s: float = 600.0
    # Tenants YAML (weights, quotas); empty: every tenant allowed, weight 1, no quotas.
    tenants_file: str = ""
    # Tenant header: honoured only without API keys (auth_mode auto before any
    # key is issued, or dev-header); never overrides a key's tenant.
    tenant_header: str = "x-fairgate-tenant"
    # Authentication (service/auth.py): "auto" (keys required once any key is
    # issued), "api-key" (always required), "dev-header" (opt-in dev mode).
    auth_mode: str = "auto"
    # Bearer token for the admin API; empty: the admin API is off.
    admin_token: str = field(default="", repr=False)
    # HMAC key for API-key hashes; the same on every replica sharing a store.
    # Empty: a random one per start, shared by its workers (keys do not survive a restart).
    api_key_pepper: str = field(default="", repr=False)
    # How often this replica re-reads the tenant store's revision (0: never).
    tenant_sync_interval_s: float = 0.5
    # TLS on the server port (PEM files); a client CA turns on mutual TLS.
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    # Tenant for requests that name none, when no tenants file sets one.
    default_tenant: str = "default"
    shutdown_grace_s: float = 30.0
    # Shared state: "memory" (one replica) or "redis" (replicas share quotas,
    # fairness and the engine's room; see README "Several replicas").
    store: str = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Redis unreachable: "open" (local limits ÷ replicas) or "closed" (UNAVAILABLE).
    redis_failure_mode: str = "open"
    # Replicas in the fleet (the fail-open local limits divide by it); with
    # workers > 1 each replica counts as `workers` (replicas × workers processes).
    replicas: int = 1
    # Server processes on this node, all on the same ports (SO_REUSEPORT), sharing
    # admission through the Redis store (needs store=redis); one core each.
    workers: int = 1
    redis_prefix: str = "fg"
    # Replicas that admit into the same engine(s) share a domain; empty: the model name.
    redis_domain: str = ""
    redis_timeout_s: float = 0.5
    redis_lease_ttl_s: float = 10.0
    redis_heartbeat_s: float = 1.0
    # Output-token charges are batched per replica this long.
    redis_flush_ms: float = 5.0
    # While the engine is full fleet-wide, look for room freed elsewhere this often.
    redis_poll_ms: float = 20.0
    redis_retry_s: float = 0.5
    # Hysteresis before failing over: this many failed Redis calls in a row, or
    # calls failing for this long (one slow call retries instead).
    redis_failover_after_failures: int = 3
    redis_failover_after_s: float = 2.0
    keepalive_time_s: float = 30.0
    keepalive_timeout_s: float = 10.0
    max_concurrent_streams: int = 0
    log_level: str = "INFO"
    # Observability (OTLP exporters are configured with the standard OTEL_* variables).
    # "text", or "json": one object per line with trace_id and span_id.
    log_format: str = "text"
    # OpenAI-compatible HTTP API host:port ("" = off; port 0 picks a free one):
    # /v1/chat/completions, /v1/completions, /v1/models on the same scheduler.
    http_listen: str = ""
    # Prometheus scrape endpoint host:port ("" = off; port 0 picks a free one).
    metrics_listen: str = ""
    # Put prompts and outputs on spans (off: never recorded).
    telemetry_capture_content: bool = False

    @property
    def replica_processes(self) -> int:
        """The fleet's minimum size in admission replicas: each worker process is one."""
        return self.replicas * self.workers

    def light_share(self, lend: bool) -> float:
        """The share of the engine's room for light tenants below their fair share:
        lent beyond it (fair_isolation preempt) or kept free (reserve)."""
        return self.fair_lend_fraction if lend else self.fair_reserve_fraction

    def validate(self) -> Settings:
        problems = []
        if self.sim_time_scale < 0:
            problems.append("sim_time_scale must be >= 0")
        if self.event_loop not in EVENT_LOOPS:
            problems.append(f"event_loop must be one of {', '.join(EVENT_LOOPS)}")
        if not 0 <= self.stream_coalesce_window_ms <= 1000:
            problems.append("stream_coalesce_window_ms must be in [0, 1000]")
        if not 0 < self.kv_target_fraction <= 1:
            problems.append("kv_target_fraction must be in (0, 1]")
        if not 0 < self.running_target_fraction <= 1:
            problems.append("running_target_fraction must be in (0, 1]")
        if self.default_max_tokens < 1 or self.max_output_tokens < 1:
            problems.append("default_max_tokens and max_output_tokens must be >= 1")
        if self.max_request_bytes > self.max_receive_message_bytes:
            problems.append("max_request_bytes must be <= max_receive_message_bytes")
        if not 0 <= self.fair_reserve_fraction < 1:
            problems.append("fair_reserve_fraction must be in [0, 1)")
        if not 0 <= self.fair_lend_fraction < 1:
            problems.append("fair_lend_fraction must be in [0, 1)")
        if not 0 <= self.fair_reserve_window_s <= 3600:
            problems.append("fair_reserve_window_s must be in [0, 3600]")
        if not 1 <= self.idle_tenant_ttl_s <= 7 * 86400:
            problems.append("idle_tenant_ttl_s must be in [1, 604800]")
        if self.fair_isolation not in ISOLATIONS:
            problems.append(f"fair_isolation must be one of {', '.join(ISOLATIONS)}")
        if not 0 <= self.fair_light_credit <= 1e9:
            problems.append("fair_light_credit must be in [0, 1e9]")
        # The same finite ranges as tenants' weights and quotas (scheduler/tenancy/tenants.py).
        ranged = [
            ("vtc_w_in", self.vtc_w_in, WEIGHT_RANGE),
            ("vtc_w_out", self.vtc_w_out, WEIGHT_RANGE),
            ("rate_limit_per_s", self.rate_limit_per_s, QUOTA_RANGES["requests_per_s"]),
        ]
        if self.rate_limit_burst:  # 0: one second's worth
            ranged.append(
                ("rate_limit_burst", self.rate_limit_burst, QUOTA_RANGES["requests_burst"])
            )
        problems.extend(p for name, v, r in ranged if (p := range_problem(name, v, r)))
        if self.default_tenant and (p := tenant_id_problem(self.default_tenant)):
            problems.append(f"default_tenant: {p}")
        if self.engine not in ENGINES:
            problems.append(f"unknown engine {self.engine!r} (available: {', '.join(ENGINES)})")
        if self.engine == "sglang-http":
            urls = [u.strip() for u in self.sglang_urls.split(",") if u.strip()]
            if not urls:
                problems.append("engine sglang-http needs sglang_urls")
            if any(not u.startswith(("http://", "https://")) for u in urls):
                problems.append("sglang_urls must be http:// or https:// URLs")
        if self.engine == "sglang" and not self.sglang_model_path:
            problems.append("engine sglang needs sglang_model_path")
        if self.sglang_read_timeout_s <= 0 or self.sglang_connect_timeout_s <= 0:
            problems.append("sglang timeouts must be > 0")
        if self.sglang_eject_after_failures < 1:
            problems.append("sglang_eject_after_failures must be >= 1")
        if not 0 < self.sglang_ejection_base_s <= self.sglang_ejection_max_s:
            problems.append("need 0 < sglang_ejection_base_s <= sglang_ejection_max_s")
        if self.auth_mode not in AUTH_MODES:
            problems.append(
                f"unknown auth_mode {self.auth_mode!r} (available: {', '.join(AUTH_MODES)})"
            )
        if self.api_key_pepper and len(self.api_key_pepper.encode()) < 16:
            problems.append("api_key_pepper must be at least 16 bytes")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            problems.append("tls_cert_file and tls_key_file go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            problems.append("tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file")
        if self.store not in STORES:
            problems.append(f"unknown store {self.store!r} (available: {', '.join(STORES)})")
        if self.redis_failure_mode not in FAILURE_MODES:
            problems.append("redis_failure_mode must be open or closed")
        if self.replicas < 1:
            problems.append("replicas must be >= 1")
        if not 1 <= self.workers <= MAX_WORKERS:
            problems.append(f"workers must be in [1, {MAX_WORKERS}]")
        elif self.workers > 1 and self.store != "redis":
            problems.append(
                f"workers={self.workers} needs store=redis (FAIRGATE_STORE=redis or "
                "--store redis, and FAIRGATE_REDIS_URL): the worker processes share "
                "quotas, fairness and the engine's room through Redis"
            )
        if self.redis_failover_after_failures < 1 or not self.redis_failover_after_s > 0:
            problems.append(
                "redis_failover_after_failures must be >= 1 and redis_failover_after_s > 0"
            )
        if self.redis_lease_ttl_s < 2 * self.redis_heartbeat_s or self.redis_heartbeat_s <= 0:
            problems.append("redis_lease_ttl_s must be at least twice redis_heartbeat_s (> 0)")
        if self.log_format not in ("text", "json"):
            problems.append("log_format must be text or json")
        if self.metrics_listen and ":" not in self.metrics_listen:
            problems.append("metrics_listen must be host:port")
        if self.http_listen and ":" not in self.http_listen:
            problems.append("http_listen must be host:port")
        if problems:
            raise ValueError("invalid settings: " + "; ".join(problems))
        return self

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return dataclasses.replace(cls(), **values).validate()


def _parse(name: str, type_: object, raw: str) -> Any:
    try:
        if type_ in (int, "int"):
            return int(raw)
        if type_ in (float, "float"):
            return float(raw)
        if type_ in (bool, "bool"):
            return raw.strip().lower() in ("1", "true", "yes", "on")
    except ValueError as exc:
        raise ValueError(f"{ENV_PREFIX}{name.upper()}={raw!r}: {exc}") from exc
    return raw
