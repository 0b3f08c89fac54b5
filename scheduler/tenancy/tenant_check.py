"""One validator for a tenant from any source, listing every problem at once.

The tenants file (`serve --tenants`, `admin apply`), the admin CLI's flags
(`admin tenants create/update`) and the admin API all hand a tenant over as
plain values (`id`, `weight`, `priorities`, `enabled`, `over_quota`,
`quotas: {name: value}`); `read_tenant` checks each field's kind, then the
ranges and rules declared in tenants.py (TenantConfig/TenantQuotas.problems)
on every field that has the right kind, so N bad fields give N problems.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.request import Priority
from scheduler.tenancy.tenants import (
    INTEGER_QUOTAS,
    OVER_QUOTA_MODES,
    QUOTA_RANGES,
    TenantConfig,
    TenantQuotas,
)

# (field path, what to fix): "weight", "quotas.max_queued", "priorities".
Problem = tuple[str, str]
TENANT_FIELDS = ("id", "weight", "priorities", "enabled", "over_quota", "quotas")
PRIORITY_NAMES = {p.name.lower(): p for p in Priority}
_NO_LIMIT = ("none", "null", "")


def _number(
    value: Any, integer: bool, text: bool, or_else: str = ""
) -> tuple[float | int | None, str | None]:
    """(the number, None) or (None, what is wrong); `text`: "5" is read as 5."""
    kind = ("an integer" if integer else "a number") + or_else
    if text and isinstance(value, str):
        try:
            value = int(value) if integer else float(value)
        except ValueError:
            return None, f"expected {kind}, got {value!r}"
    # bool is an int in Python; `weight: yes` is a mistake, not 1.
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok:
        return None, f"expected {kind}, got {value!r}"
    return (int(value) if integer else float(value)), None


def read_tenant(
    raw: Mapping[str, Any], *, text: bool = False, partial: bool = False
) -> tuple[dict[str, Any], list[Problem]]:
    """The typed values of the fields `raw` gives (`quotas` as a dict; a quota set to
    None or, with `text`, "none" is no limit), and every problem.

    `text`: numbers may be given as text (command-line flags). `partial`: an update
    of the fields given; fields it omits are not required and the rules between
    quotas are left to whoever holds the rest (the server)."""
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    for key in raw:
        if key not in TENANT_FIELDS:
            problems.append((str(key), f"unknown field (known: {', '.join(TENANT_FIELDS)})"))
    tid = raw.get("id")
    if not isinstance(tid, str) or not tid.strip():
        problems.append(("id", "every tenant needs a non-empty string id"))
    else:
        values["id"] = tid
    if raw.get("weight") is not None:
        weight, wrong = _number(raw["weight"], False, text)
        if wrong:
            problems.append(("weight", wrong))
        else:
            values["weight"] = weight
    if "priorities" in raw:
        names = raw["priorities"]
        if not isinstance(names, list | tuple) or not names:
            problems.append(
                ("priorities", f"expected a non-empty list of {sorted(PRIORITY_NAMES)}")
            )
        else:
            unknown = [n for n in names if n not in PRIORITY_NAMES]
            problems.extend(
                ("priorities", f"unknown class {n!r} (known: {sorted(PRIORITY_NAMES)})")
                for n in unknown
            )
            if not unknown:
                values["priorities"] = frozenset(PRIORITY_NAMES[n] for n in names)
    if raw.get("enabled") is not None:
        if isinstance(raw["enabled"], bool):
            values["enabled"] = raw["enabled"]
        else:
            problems.append(("enabled", f"expected true or false, got {raw['enabled']!r}"))
    if raw.get("over_quota") is not None:
        if raw["over_quota"] in OVER_QUOTA_MODES:
            values["over_quota"] = raw["over_quota"]
        else:
            modes = list(OVER_QUOTA_MODES)
            problems.append(("over_quota", f"expected one of {modes}, got {raw['over_quota']!r}"))
    quotas = raw.get("quotas")
    if quotas is not None:
        if not isinstance(quotas, Mapping):
            problems.append(("quotas", f"expected a mapping, got {type(quotas).__name__}"))
        else:
            values["quotas"] = _read_quotas(quotas, text, problems)
    _judge(values, problems, partial)
    return values, problems


def _read_quotas(raw: Mapping[str, Any], text: bool, problems: list[Problem]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in raw.items():
        where = f"quotas.{name}"
        if name not in QUOTA_RANGES:
            problems.append((where, f"unknown field (known: {', '.join(QUOTA_RANGES)})"))
        elif value is None or (text and isinstance(value, str) and value.lower() in _NO_LIMIT):
            out[name] = None
        else:
            number, wrong = _number(value, name in INTEGER_QUOTAS, text, " or null (no limit)")
            if wrong:
                problems.append((where, wrong))
            else:
                out[name] = number
    return out


def _judge(values: dict[str, Any], problems: list[Problem], partial: bool) -> None:
    """The ranges and rules of tenants.py on every value of the right kind."""
    cfg = config_of(values | {"id": values.get("id", "x")})
    given = set(values) | {f"quotas.{q}" for q in values.get("quotas", {})}
    bad = {field for field, _ in problems}
    for field, message in cfg.problems(rules=not partial):
        if field in bad or (field == "id" and "id" not in values):
            continue
        if partial and field not in given:
            continue
        problems.append((field, message))


def config_of(values: Mapping[str, Any]) -> TenantConfig:
    """A TenantConfig from `read_tenant`'s values (defaults for what they omit)."""
    weight = values.get("weight")
    return TenantConfig(
        tenant_id=values["id"],
        weight=1.0 if weight is None else weight,
        priorities=values.get("priorities", frozenset(Priority)),
        enabled=values.get("enabled", True),
        quotas=TenantQuotas(**values.get("quotas", {})),
        over_quota=values.get("over_quota", "reject"),
    )


def check_tenant(raw: Mapping[str, Any]) -> tuple[TenantConfig | None, list[Problem]]:
    """(the config, []) when `raw` is a valid whole tenant, else (None, every problem)."""
    values, problems = read_tenant(raw)
    return (None, problems) if problems else (config_of(values), [])
