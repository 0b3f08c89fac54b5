"""Server settings, declared once: type, range, default and a one-line doc each.

Embedded defaults, overridden by FAIRGATE_* env vars, then by `fairgate serve`
flags. The defaults run the whole service with no configuration at all: the
simulated engine (RTX 4090 preset, Llama-3.1-8B in 4-bit) in real time, the
in-memory state, on 127.0.0.1:50051.

The serving and engine groups are declared in settings_serving.py and
settings_engines.py, the rest here; `Settings` joins them, in that order.
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

from pydantic import field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from scheduler.ordering.policies import POLICIES
from scheduler.rules import LOCALITY_MIN_GAIN
from scheduler.tenancy.budgets import MAX_UTC_OFFSET_MIN
from scheduler.tenancy.tenants import QUOTA_RANGES, WEIGHT_RANGE
from service.settings_engines import EngineSettings
from service.settings_errors import ENV_PREFIX, OneOf, SettingsError
from service.settings_field import setting as _s
from service.settings_rules import SKIP_RULES, load, rule_problems
from service.settings_serving import ServingSettings

AUTH_MODES = ("auto", "api-key", "dev-header")
STORES = ("memory", "redis")
FAILURE_MODES = ("open", "closed")
ISOLATIONS = ("auto", "preempt", "reserve")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")

__all__ = ["ENV_PREFIX", "Settings", "SettingsError", "rule_problems"]

_W_LO, _W_HI = WEIGHT_RANGE
_RPS_LO, _RPS_HI = QUOTA_RANGES["requests_per_s"]


# Fields in the order of the operators' table: pydantic lists the bases' fields
# from the last base to the first (ServingSettings, then EngineSettings), then
# this class's own.
class Settings(EngineSettings, ServingSettings, BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", allow_inf_nan=False
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
        "reserve: keep the share idle; auto: preempt where the engine can, reserve beside "
        "staggered prefill (sglang_stagger_prefill_tokens).",
    )
    fair_light_takes_slot: bool = _s(
        False,
        "Beside fair_isolation reserve, on a pool of engines that preempt by priority: a "
        "light request goes where it starts soonest even if that worker's slots are full, "
        "and the engine retracts one running request for it; admission lends it a request "
        "slot beyond the room (up to fair_reserve_fraction of them), never KV.",
    )
    fair_light_takes_unsent_slots: bool = _s(
        False,
        "With fair_light_takes_slot: admission also lends a light tenant the slots of "
        "requests it admitted that no worker has yet (held by sglang_cold_start_hold_s, "
        "paced by sglang_stagger_pace_tokens, or waiting for a worker's staged-prefill "
        "lane), never KV.",
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
        "routing by locality, because a worker with room holds its prompt's prefix (at "
        f"least {LOCALITY_MIN_GAIN} tokens more than the fair head's). "
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
