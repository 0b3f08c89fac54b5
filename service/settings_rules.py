"""The rules between settings, and the loader that reports every problem at once.

Each field's own type and range are declared on `Settings` (settings.py) and
checked by pydantic; what no field type states lives here: the rules between
settings (and the few single-setting checks beyond a range). `load` reports the
fields' problems and then the rules broken among the settings that passed, so
one message lists every bad setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from scheduler.tenancy.tenants import QUOTA_RANGES, tenant_id_problem
from service.settings_errors import SettingsError, field_problem, rule_problem

if TYPE_CHECKING:
    from service.settings import Settings

# pydantic-settings validates in __init__, where a validation context does not reach.
SKIP_RULES: ContextVar[bool] = ContextVar("skip_rules", default=False)


HOST_PORT = "must be host:port (e.g. 127.0.0.1:8000)"


def host_port(address: str) -> tuple[str, int] | None:
    """`host:port` (an IPv6 host in brackets) → (host without brackets, port);
    None when it is not that. An empty host is every interface."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        return None
    return host.strip("[]") or "0.0.0.0", int(port)


def _host_port(value: str) -> bool:
    return host_port(value) is not None


def rule_problems(s: Settings) -> list[tuple[tuple[str, ...], str]]:
    """The rules between settings (and the few no field type states): each broken
    one as (the settings it names, what to fix)."""
    out: list[tuple[tuple[str, ...], str]] = []

    def need(ok: bool, fields: tuple[str, ...], message: str) -> None:
        if not ok:
            out.append((fields, message))

    need(_host_port(s.listen), ("listen",), HOST_PORT)
    need(not s.http_listen or _host_port(s.http_listen), ("http_listen",), HOST_PORT)
    need(not s.metrics_listen or _host_port(s.metrics_listen), ("metrics_listen",), HOST_PORT)
    need(
        s.max_request_bytes <= s.max_receive_message_bytes,
        ("max_request_bytes", "max_receive_message_bytes"),
        "max_request_bytes must be <= max_receive_message_bytes",
    )
    need(
        s.vtc_w_cached <= s.vtc_w_in,
        ("vtc_w_cached", "vtc_w_in"),
        "vtc_w_cached must be <= vtc_w_in (a cache hit costs no more than a computed token)",
    )
    need(
        s.rate_limit_burst == 0 or s.rate_limit_burst >= QUOTA_RANGES["requests_burst"][0],
        ("rate_limit_burst",),
        "must be 0 (one second's worth) or at least 1",
    )
    id_problem = tenant_id_problem(s.default_tenant) if s.default_tenant else None
    need(id_problem is None, ("default_tenant",), str(id_problem))
    urls = [u.strip() for u in s.sglang_urls.split(",") if u.strip()]
    if s.engine == "sglang-http":
        need(bool(urls), ("engine", "sglang_urls"), "engine sglang-http needs sglang_urls")
    need(
        all(u.startswith(("http://", "https://")) for u in urls),
        ("sglang_urls",),
        "sglang_urls must be http:// or https:// URLs",
    )
    need(
        s.engine != "sglang" or s.staged_prefill_min_tokens == 0,
        ("engine", "staged_prefill_min_tokens"),
        "staged prefill runs with engine simulator or sglang-http (not in-process yet)",
    )
    need(
        not s.staged_prefill_sheltered_stage_tokens
        or (s.staged_prefill_min_tokens > 0 and s.sglang_stagger_prefill_tokens > 0),
        (
            "staged_prefill_sheltered_stage_tokens",
            "staged_prefill_min_tokens",
            "sglang_stagger_prefill_tokens",
        ),
        "staged_prefill_sheltered_stage_tokens widens stages where staggered prefill shelters "
        "the worker: set staged_prefill_min_tokens and sglang_stagger_prefill_tokens too",
    )
    need(
        not s.staged_prefill_short_first
        or (
            s.staged_prefill_min_tokens > 0
            and s.staged_prefill_one_at_a_time
            and s.sglang_stagger_prefill_tokens > 0
        ),
        (
            "staged_prefill_short_first",
            "staged_prefill_min_tokens",
            "staged_prefill_one_at_a_time",
            "sglang_stagger_prefill_tokens",
        ),
        "staged_prefill_short_first orders a worker's staged-prefill lane by the stagger's long "
        "mark: set staged_prefill_min_tokens and sglang_stagger_prefill_tokens, and keep "
        "staged_prefill_one_at_a_time",
    )
    need(
        not s.fair_light_takes_unsent_slots or s.fair_light_takes_slot,
        ("fair_light_takes_unsent_slots", "fair_light_takes_slot"),
        "fair_light_takes_unsent_slots lends slots beside fair_light_takes_slot: set both",
    )
    need(
        s.engine != "sglang" or bool(s.sglang_model_path),
        ("engine", "sglang_model_path"),
        "engine sglang needs sglang_model_path",
    )
    need(
        s.engine != "sglang" or s.workers == 1,
        ("engine", "workers"),
        "engine sglang runs the model inside the one fairgate process: workers must be 1",
    )
    need(
        s.sglang_ejection_base_s <= s.sglang_ejection_max_s,
        ("sglang_ejection_base_s", "sglang_ejection_max_s"),
        "need sglang_ejection_base_s <= sglang_ejection_max_s",
    )
    need(
        not s.api_key_pepper or len(s.api_key_pepper.encode()) >= 16,
        ("api_key_pepper",),
        "api_key_pepper must be at least 16 bytes",
    )
    need(
        bool(s.tls_cert_file) == bool(s.tls_key_file),
        ("tls_cert_file", "tls_key_file"),
        "tls_cert_file and tls_key_file go together",
    )
    need(
        not s.tls_client_ca_file or bool(s.tls_cert_file),
        ("tls_client_ca_file", "tls_cert_file"),
        "tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file",
    )
    need(
        s.workers == 1 or s.store == "redis",
        ("workers", "store"),
        f"workers={s.workers} needs store=redis (FAIRGATE_STORE=redis or --store redis, and "
        "FAIRGATE_REDIS_URL): the worker processes share quotas, fairness and the engine's "
        "room through Redis",
    )
    need(
        s.redis_lease_ttl_s >= 2 * s.redis_heartbeat_s,
        ("redis_lease_ttl_s", "redis_heartbeat_s"),
        "redis_lease_ttl_s must be at least twice redis_heartbeat_s",
    )
    return out


def load(cls: type[Settings], values: dict[str, Any], origin: Mapping[str, str]) -> Settings:
    """`cls` from raw `values`, or SettingsError with every problem: each field
    against its declaration, then the rules between the fields that passed.
    `origin`: where a value came from when not its variable (a flag)."""
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        errors = exc.errors()
    problems = [field_problem(cls, e, origin) for e in errors if e["loc"]]
    bad = {str(e["loc"][0]) for e in errors if e["loc"]}
    token = SKIP_RULES.set(True)
    try:
        fine = cls.model_validate({k: v for k, v in values.items() if k not in bad})
    finally:
        SKIP_RULES.reset(token)
    problems += [
        rule_problem(fields, message, fine, origin)
        for fields, message in rule_problems(fine)
        if not bad & set(fields)
    ]
    raise SettingsError(problems)
