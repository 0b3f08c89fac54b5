"""Server settings, declared once: type, range, default and a one-line doc each.

Embedded defaults, overridden by FAIRGATE_* env vars, then by `fairgate serve`
flags. The defaults run the whole service with no configuration at all: the
simulated engine (RTX 4090 preset, Llama-3.1-8B in 4-bit) in real time, the
in-memory state, on 127.0.0.1:50051.

pydantic checks each field against its declaration and pydantic-settings reads
the variables; the few rules between fields are in settings_rules.py. Everything
derived from settings reads this class: the serve flags and their help
(clients/fairgate/cli/serve.py), the operators' table in docs/configuration.md
and the Helm chart's values schema (service/settings_doc.py; a test fails when
either drifts), and the errors, which list every bad setting at once
(service/settings_errors.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from scheduler.ordering.policies import POLICIES
from scheduler.tenancy.budgets import MAX_UTC_OFFSET_MIN
from scheduler.tenancy.tenants import QUOTA_RANGES, WEIGHT_RANGE
from service.engines.routing import ROUTINGS
from service.event_loop import EVENT_LOOPS
from service.settings_errors import ENV_PREFIX, OneOf, SettingsError
from service.settings_rules import SKIP_RULES, load, rule_problems

ENGINES = ("simulator", "sglang-http", "sglang")
AUTH_MODES = ("auto", "api-key", "dev-header")
STORES = ("memory", "redis")
FAILURE_MODES = ("open", "closed")
ISOLATIONS = ("auto", "preempt", "reserve")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
# Server processes per node (`workers`): beyond the cores of any node we run on.
MAX_WORKERS = 256

__all__ = ["ENV_PREFIX", "Settings", "SettingsError", "rule_problems"]


def _s(
    default: Any,
    doc: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    secret: bool = False,
) -> Any:
    """A setting: its default, its one-line doc, its bounds; a secret is never shown."""
    return Field(default, description=doc, ge=ge, gt=gt, le=le, lt=lt, repr=not secret)


_W_LO, _W_HI = WEIGHT_RANGE
_RPS_LO, _RPS_HI = QUOTA_RANGES["requests_per_s"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", allow_inf_nan=False
    )

    # -- serving ------------------------------------------------------------------
    listen: str = _s("127.0.0.1:50051", "gRPC address, host:port (port 0 picks a free one).")
    http_listen: str = _s(
        "127.0.0.1:8000",
        "OpenAI-compatible HTTP API host:port (/v1/chat/completions, /v1/completions, "
        '/v1/models); "" = off, port 0 picks a free one.',
    )
    metrics_listen: str = _s(
        "", 'Prometheus scrape endpoint host:port; "" = off, port 0 picks a free one.'
    )
    engine: Annotated[str, OneOf(ENGINES)] = _s(
        "simulator", "simulator (embedded), sglang-http (SGLang servers), sglang (in-process)."
    )
    model_name: str = _s("", "Model name clients use; empty: the simulator preset's name.")
    event_loop: Annotated[str, OneOf(EVENT_LOOPS)] = _s(
        "auto", "Event loop: auto (uvloop when installed), uvloop, asyncio."
    )
    workers: int = _s(
        1,
        "Server processes on this node, all on the same ports (SO_REUSEPORT); "
        "more than 1 needs store=redis.",
        ge=1,
        le=MAX_WORKERS,
    )
    shutdown_grace_s: float = _s(
        30.0, "On SIGTERM, how long streams in flight get to finish.", ge=0, le=3600
    )
    keepalive_time_s: float = _s(30.0, "gRPC keepalive ping interval.", gt=0)
    keepalive_timeout_s: float = _s(10.0, "gRPC keepalive ping timeout.", gt=0)
    max_concurrent_streams: int = _s(0, "gRPC streams per connection (0: no limit).", ge=0)
    max_request_bytes: int = _s(
        1 << 20,
        "Largest request, checked by the application (INVALID_ARGUMENT with details).",
        ge=1,
    )
    max_receive_message_bytes: int = _s(
        4 << 20, "Transport limit on a received message (above max_request_bytes).", ge=1
    )
    max_send_message_bytes: int = _s(4 << 20, "Transport limit on a sent message.", ge=1)
    default_max_tokens: int = _s(256, "Output tokens when a request sets none.", ge=1)
    max_output_tokens: int = _s(8192, "Most output tokens one request may ask for.", ge=1)
    tokenizer_path: str = _s(
        "",
        "Hugging Face tokenizer.json (or its directory) for exact counts and its chat "
        "template; empty: approximate counts.",
    )
    chat_template_path: str = _s(
        "",
        "Jinja2 chat template file; overrides the tokenizer directory's (neither: fairgate's "
        "ChatML).",
    )
    stream_coalesce: bool = _s(
        True, "Send tokens that are ready together in one message (never waits for more)."
    )
    stream_coalesce_window_ms: float = _s(
        0.0,
        "SGLang over HTTP: after each message, let tokens gather this long (first token "
        "never held; 0: send what each read brings).",
        ge=0,
        le=1000,
    )
    # -- simulator ------------------------------------------------------------------
    sim_gpu: str = _s("rtx-4090", "Simulator GPU preset (`fairgate plan` lists them).")
    sim_model: str = _s("llama-3.1-8b-int4", "Simulator model preset.")
    sim_time_scale: float = _s(
        1.0, "Simulator speed: 1 = real time, 0.1 = ten times faster, 0 = no delays.", ge=0
    )
    sim_seed: int = _s(0, "Simulator random seed.")
    sim_max_running_requests: int = _s(256, "Simulator's running-request slots.", ge=1)
    sim_chunked_prefill_tokens: int = _s(2048, "Simulator's prefill chunk, in tokens.", ge=1)
    sim_mean_output_tokens: float = _s(
        0.0,
        "Simulator's mean output length: it ends at EOS with chance 1/N a token (0: runs to max).",
        ge=0,
    )
    sim_kv_capacity_tokens: int = _s(
        0, "Override the preset's KV capacity in tokens (0: the preset's).", ge=0
    )
    sim_priority_scheduling: bool = _s(
        False, "Like SGLang's --enable-priority-scheduling: engine priorities order prefills."
    )
    sim_disable_priority_preemption: bool = _s(
        False,
        "Like SGLang's --disable-priority-preemption (else a priority gap above 10 preempts).",
    )
    # -- SGLang -----------------------------------------------------------------------
    sglang_urls: str = _s(
        "", "engine=sglang-http: comma-separated base URLs; more than one makes a worker pool."
    )
    sglang_connect_timeout_s: float = _s(5.0, "Connect timeout to an SGLang server.", gt=0)
    sglang_read_timeout_s: float = _s(
        60.0, "Longest silence on a stream (also the wait for the first token).", gt=0
    )
    sglang_retries: int = _s(
        1, "Retries on the same worker before the first token (single worker only).", ge=0
    )
    sglang_incremental_output: bool = _s(
        False,
        "The server runs --incremental-streaming-output (its /server_info wins when it says).",
    )
    sglang_health_interval_s: float = _s(
        2.0, "How often each SGLang worker's health is read.", gt=0
    )
    sglang_eject_after_failures: int = _s(
        3, "Pool circuit breaker: stream failures in a row that eject a worker.", ge=1
    )
    sglang_ejection_base_s: float = _s(
        5.0, "First ejection's length (doubles with each in a row, up to the max).", gt=0
    )
    sglang_ejection_max_s: float = _s(300.0, "Longest ejection.", gt=0)
    sglang_routing: Annotated[str, OneOf(ROUTINGS)] = _s(
        "locality",
        "Pool: locality (the worker where the first token comes soonest: prefill ahead "
        "of it, the prompt prefix it holds, its load) or least_full.",
    )
    sglang_prefix_affinity_tokens: int = _s(
        0,
        "Pool, routing=least_full: prefer the worker a prompt's first N tokens hash to "
        "(0: least load only).",
        ge=0,
    )
    sglang_stagger_prefill_tokens: int = _s(
        0,
        "Pool, routing=locality: staggered prefill; while a light tenant is active, a "
        "prompt of at least N tokens never takes the last worker free of long prefill, "
        "so a light request finds one on short steps (0: off; 1024 measured: docs/benchmarks.md).",
        ge=0,
    )
    sglang_stagger_light_window_s: float = _s(
        10.0,
        "Pool, staggered prefill: a light tenant is active this long after its last request.",
        gt=0,
    )
    sglang_cold_start_hold_s: float = _s(
        0.0,
        "Pool, with staggered prefill: while every worker is mid-prefill and a light tenant "
        "is active, a prompt with at least sglang_stagger_prefill_tokens uncached tokens "
        "waits, unsent, until a worker's prefill ends, for at most this long (0: off; "
        "measured: docs/benchmarks.md).",
        ge=0,
        le=60,
    )
    sglang_kv_events: str = _s(
        "",
        "Pool: each worker's SGLang KV events (its --kv-events-config zmq endpoint, "
        "e.g. tcp://host:5557, optionally ;REPLAY: its replay_endpoint), comma-separated in "
        "the order of sglang_urls; empty: off. Locality then uses the exact cache "
        "each worker reports instead of the guessed prefix index (the fallback "
        "after a gap in the events). Needs the kv-events extra.",
    )
    # engine=sglang (in-process, one GPU): the sglang.Engine's server flags that matter.
    sglang_model_path: str = _s(
        "", "engine=sglang (in-process): the model path or Hugging Face id (--model-path)."
    )
    sglang_tokenizer_path: str = _s(
        "", "engine=sglang: the tokenizer's path or id (--tokenizer-path; empty: the model's)."
    )
    sglang_context_length: int = _s(
        0, "engine=sglang: the model's context length (--context-length; 0: its config's).", ge=0
    )
    sglang_mem_fraction: float = _s(
        0.0,
        "engine=sglang: GPU memory share for weights and KV cache (--mem-fraction-static; "
        "0: SGLang's choice).",
        ge=0,
        lt=1,
    )
    sglang_chunked_prefill_size: int = _s(
        0,
        "engine=sglang: prefill chunk in tokens (--chunked-prefill-size; 0: SGLang's, -1: off).",
        ge=-1,
    )
    sglang_max_running_requests: int = _s(
        0, "engine=sglang: running-request slots (--max-running-requests; 0: SGLang's).", ge=0
    )
    sglang_priority_scheduling: bool = _s(
        False, "engine=sglang: engine priorities order prefills (--enable-priority-scheduling)."
    )
    sglang_engine_args: str = _s(
        "",
        "engine=sglang: further sglang.Engine keywords as a JSON object "
        '(e.g. {"device": "cpu"}); a key may not repeat a setting above.',
    )
    capacity_refresh_s: float = _s(
        2.0, "How often admission limits are re-read from the engine's capacity.", gt=0
    )
    staged_prefill_min_tokens: int = _s(
        0,
        "Staged prefill (simulator, sglang-http): a prompt of at least this many tokens "
        "enters its engine as prefill-only prefix stages, so that short requests start "
        "between them (0: off).",
        ge=0,
    )
    staged_prefill_stage_tokens: int = _s(
        2048,
        "Staged prefill: tokens added by each stage (the engine's prefill chunk or less).",
        ge=1,
    )
    staged_prefill_one_at_a_time: bool = _s(
        True,
        "Staged prefill: one staged prompt at a time per engine, from its first stage to its "
        "first token (a prefill step then carries one stage, not one from each long prompt).",
    )
    staged_prefill_cold_only: bool = _s(
        True,
        "Staged prefill: stage only a prompt whose part uncached on the worker the pool "
        "chose reaches the length to stage, from above the part held there; a long prompt "
        "cached there goes whole, in its turn among the engine's staged prompts. Without "
        "a pool (one URL) every long prompt is staged.",
    )
    # -- admission and fairness -----------------------------------------------------
    kv_target_fraction: float = _s(
        0.9,
        "Admission: in-flight KV tokens (prompt + max output) stay below this share of "
        "the engine's KV capacity.",
        gt=0,
        le=1,
    )
    running_target_fraction: float = _s(
        1.0, "Admission: running requests stay below this share of the engine's slots.", gt=0, le=1
    )
    policy: Annotated[str, OneOf(tuple(POLICIES))] = _s(
        "vtc", "Queue policy: vtc (weighted fair), or the baselines fcfs and rate-limit."
    )
    fair_reserve_fraction: float = _s(
        0.125,
        "Share of the engine's slots and KV kept free for light tenants below their fair "
        "share (fair_isolation reserve; 0: off).",
        ge=0,
        lt=1,
    )
    fair_lend_fraction: float = _s(
        0.25,
        "Share lent beyond a full engine to light tenants below their fair share "
        "(fair_isolation preempt: the engine retracts a flood's request; 0: off).",
        ge=0,
        lt=1,
    )
    fair_reserve_window_s: float = _s(
        10.0,
        "How long a tenant still counts as one to keep the reserve for after its last request.",
        ge=0,
        le=3600,
    )
    fair_isolation: Annotated[str, OneOf(ISOLATIONS)] = _s(
        "auto",
        "preempt: lend beyond the engine's room (SGLang with priority preemption); "
        "reserve: keep the share idle; auto: preempt where the engine can.",
    )
    fair_light_credit: float = _s(
        4096.0,
        "How far ahead (weighted tokens per unit weight) a light tenant is ordered; adds "
        "as much to the fairness bound (0: off).",
        ge=0,
        le=1e9,
    )
    fair_allowance_tokens: float = _s(
        4096.0,
        "How far (weighted tokens per unit weight) a request may go ahead of the fair "
        "order: with replicas, ahead of a tenant queued on another replica; with a pool "
        "routing by locality, because a worker with room holds its prompt's prefix. "
        "Adds as much to the fairness bound.",
        ge=0,
        le=1e9,
    )
    vtc_w_in: float = _s(1.0, "VTC cost of a prompt token.", ge=_W_LO, le=_W_HI)
    vtc_w_cached: float = _s(
        0.1,
        "VTC cost of a prompt token a worker already holds (a prefix cache hit, as "
        "locality routing estimates it; a shortfall the engine reports is charged at "
        "vtc_w_in). Quotas count every prompt token.",
        ge=0,
        le=_W_HI,
    )
    vtc_w_out: float = _s(2.0, "VTC cost of an output token.", ge=_W_LO, le=_W_HI)
    rate_limit_per_s: float = _s(
        10.0, "policy=rate-limit: requests/s per tenant.", ge=_RPS_LO, le=_RPS_HI
    )
    rate_limit_burst: float = _s(
        0.0,
        "policy=rate-limit: burst per tenant (0: one second's worth, else at least 1).",
        ge=0,
        le=QUOTA_RANGES["requests_burst"][1],
    )
    idle_tenant_ttl_s: float = _s(
        600.0,
        "A tenant the registry does not configure is forgotten, fleet-wide, after this long idle.",
        ge=1,
        le=7 * 86400,
    )
    # -- tenants and authentication -------------------------------------------------
    tenants_file: str = _s(
        "", "Tenants YAML (weights, quotas); empty: every tenant allowed, weight 1, no quotas."
    )
    default_tenant: str = _s(
        "default", "Tenant for requests that name none, when no tenants file sets one."
    )
    budget_utc_offset_min: int = _s(
        0,
        "Budgets' days and months begin at midnight at UTC plus this many minutes.",
        ge=-MAX_UTC_OFFSET_MIN,
        le=MAX_UTC_OFFSET_MIN,
    )
    tenant_header: str = _s(
        "x-fairgate-tenant",
        "Tenant header, honoured only without API keys; never overrides a key's tenant.",
    )
    auth_mode: Annotated[str, OneOf(AUTH_MODES)] = _s(
        "auto",
        "auto: keys required once any is issued; api-key: always; dev-header: opt-in dev mode.",
    )
    admin_token: str = _s(
        "", "Bearer token for the admin API; empty: the admin API is off.", secret=True
    )
    api_key_pepper: str = _s(
        "",
        "HMAC key for API-key hashes (at least 16 bytes), the same on every replica; "
        "empty: a random one per start.",
        secret=True,
    )
    tenant_sync_interval_s: float = _s(
        0.5, "How often this replica re-reads the tenant store's revision (0: never).", ge=0
    )
    tls_cert_file: str = _s("", "TLS certificate (PEM) for the server port; with tls_key_file.")
    tls_key_file: str = _s("", "TLS private key (PEM).")
    tls_client_ca_file: str = _s("", "Client CA (PEM): turns on mutual TLS.")
    # -- shared state -----------------------------------------------------------------
    store: Annotated[str, OneOf(STORES)] = _s(
        "memory",
        "memory (one replica) or redis (replicas share quotas, fairness and the engine's room).",
    )
    redis_url: str = _s("redis://127.0.0.1:6379/0", "Redis URL (store=redis).")
    redis_failure_mode: Annotated[str, OneOf(FAILURE_MODES)] = _s(
        "open", "Redis unreachable: open (local limits ÷ replicas) or closed (UNAVAILABLE)."
    )
    replicas: int = _s(
        1, "Replicas in the fleet (fail-open local limits divide by it; times workers).", ge=1
    )
    redis_prefix: str = _s("fg", "Prefix of every Redis key.")
    redis_domain: str = _s(
        "", "Replicas admitting into the same engine(s) share a domain; empty: the model name."
    )
    redis_timeout_s: float = _s(0.5, "Timeout of one Redis call.", gt=0)
    redis_lease_ttl_s: float = _s(
        10.0, "A replica's lease (at least twice redis_heartbeat_s).", gt=0
    )
    redis_heartbeat_s: float = _s(1.0, "How often a replica renews its lease.", gt=0)
    redis_flush_ms: float = _s(5.0, "Output-token charges are batched per replica this long.", ge=0)
    redis_poll_ms: float = _s(
        20.0, "While the engine is full fleet-wide, look for room freed elsewhere this often.", gt=0
    )
    redis_retry_s: float = _s(0.5, "While Redis is down, probe it at least this often.", gt=0)
    redis_failover_after_failures: int = _s(
        3, "Fail over after this many failed Redis calls in a row ...", ge=1
    )
    redis_failover_after_s: float = _s(2.0, "... or calls failing for this long.", gt=0)
    # -- observability ----------------------------------------------------------------
    log_level: Annotated[str, OneOf(LOG_LEVELS)] = _s("INFO", "Log level.")
    log_format: Annotated[str, OneOf(LOG_FORMATS)] = _s(
        "text", "text, or json: one object per line with trace_id and span_id."
    )
    telemetry_capture_content: bool = _s(
        False, "Put prompts and outputs on spans (off: never recorded)."
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _rules(self) -> Settings:
        # `load` runs the rules itself, on the fields that passed, to name each one's fields.
        if not SKIP_RULES.get():
            problems = rule_problems(self)
            if problems:
                raise ValueError("; ".join(message for _, message in problems))
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Settings(...) takes only what it is given; from_env adds the variables.
        return (init_settings,)

    @property
    def replica_processes(self) -> int:
        """The fleet's minimum size in admission replicas: each worker process is one."""
        return self.replicas * self.workers

    def light_share(self, lend: bool) -> float:
        """The share of the engine's room for light tenants below their fair share:
        lent beyond it (fair_isolation preempt) or kept free (reserve)."""
        return self.fair_lend_fraction if lend else self.fair_reserve_fraction

    def replace(self, **changes: Any) -> Settings:
        """A copy with `changes`, validated like any settings."""
        return load(type(self), {**self.model_dump(), **changes}, {})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then FAIRGATE_* variables (`environ`, default os.environ), then
        `overrides` (flags; None: not given). Raises SettingsError listing every problem."""
        source = EnvSettingsSource(cls, env_prefix=ENV_PREFIX, case_sensitive=False)
        if environ is not None:
            source.env_vars = parse_env_vars(environ, case_sensitive=False)
        values: dict[str, Any] = dict(source())
        flags = {k: v for k, v in overrides.items() if v is not None}
        return load(cls, {**values, **flags}, {k: "--" + k.replace("_", "-") for k in flags})
