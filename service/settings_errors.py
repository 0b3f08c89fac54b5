"""How a setting's allowed values and its problems are worded.

One wording for the errors (every bad setting at once, each naming its
FAIRGATE_* variable or flag, the value and what is allowed), the serve flags'
help and the operators' table, all read from the declaration in settings.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import annotated_types as at
from pydantic import GetCoreSchemaHandler
from pydantic.fields import FieldInfo
from pydantic_core import CoreSchema, ErrorDetails, core_schema

if TYPE_CHECKING:
    from service.settings import Settings

ENV_PREFIX = "FAIRGATE_"


@dataclass(frozen=True, slots=True)
class OneOf:
    """A text setting whose value is one of `options` (typed `str` for callers)."""

    options: tuple[str, ...]

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.literal_schema(list(self.options))


class SettingsError(ValueError):
    """Every invalid setting, one per line."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        count = f"{len(self.problems)} problem" + ("s" if len(self.problems) != 1 else "")
        super().__init__(
            f"invalid settings ({count}):\n" + "\n".join(f"  {p}" for p in self.problems)
        )


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def options(field: FieldInfo) -> tuple[str, ...] | None:
    """A setting's fixed set of values (declared `OneOf`), or None."""
    return next((m.options for m in field.metadata if isinstance(m, OneOf)), None)


def allowed(field: FieldInfo) -> str:
    """What a setting accepts: "an integer in [1, 256]", "one of a, b", "true or false"."""
    choices = options(field)
    if choices is not None:
        return "one of " + ", ".join(choices)
    if field.annotation is bool:
        return "true or false"
    if field.annotation not in (int, float):
        return "text"
    kind = "an integer" if field.annotation is int else "a number"
    lo = hi = ""
    for m in field.metadata:
        if isinstance(m, at.Ge):
            lo = f"[{_g(m.ge)}"
        elif isinstance(m, at.Gt):
            lo = f"({_g(m.gt)}"
        elif isinstance(m, at.Le):
            hi = f"{_g(m.le)}]"
        elif isinstance(m, at.Lt):
            hi = f"{_g(m.lt)})"
    if lo and hi:
        return f"{kind} in {lo}, {hi}"
    if lo:
        return f"{kind} {'>=' if lo[0] == '[' else '>'} {lo[1:]}"
    if hi:
        return f"{kind} {'<=' if hi[-1] == ']' else '<'} {hi[:-1]}"
    return kind


def _g(bound: Any) -> str:
    return f"{bound:g}"


def shown(field: FieldInfo | None, value: Any) -> str:
    """A value as an error shows it; never a secret's (declared repr=False)."""
    return "(hidden)" if field is not None and field.repr is False else repr(value)


def _given(name: str, shown_value: str, origin: Mapping[str, str]) -> str:
    """`FAIRGATE_X=value`, or `--x=value (FAIRGATE_X)` for a flag."""
    flag = origin.get(name)
    if flag:
        return f"{flag}={shown_value} ({env_name(name)})"
    return f"{env_name(name)}={shown_value}"


def field_problem(cls: type[Settings], error: ErrorDetails, origin: Mapping[str, str]) -> str:
    name = str(error["loc"][0])
    field = cls.model_fields.get(name)
    if field is None:
        return f"{name}: unknown setting"
    given = _given(name, shown(field, error["input"]), origin)
    return f"{given}: expected {allowed(field)}"


def rule_problem(
    fields: tuple[str, ...], message: str, settings: Settings, origin: Mapping[str, str]
) -> str:
    values = ", ".join(
        _given(f, shown(type(settings).model_fields[f], getattr(settings, f)), origin)
        for f in fields
    )
    return f"{values}: {message}"
