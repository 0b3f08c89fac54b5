"""How one setting is declared: its default, one-line doc and bounds.

Every settings group (settings_serving.py, settings_engines.py, settings.py)
declares its fields with `setting`, so the serve flags, the operators' table
and the Helm schema read the same doc and bounds (settings_doc.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field


def setting(
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
