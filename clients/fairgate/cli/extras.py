"""The one message for a command whose optional dependencies are not installed
(pyproject's extras: cli, server, bench), instead of an import traceback."""

from __future__ import annotations

OWN_PACKAGES = ("fairgate", "service", "scheduler")


def missing_extra(exc: ModuleNotFoundError, what: str, extra: str) -> str | None:
    """One line naming the extra that provides `exc`'s module, or None when the
    missing module is our own (a broken install: let the traceback show)."""
    if exc.name is None or exc.name.split(".")[0] in OWN_PACKAGES:
        return None
    return (
        f"{what} needs the {extra} extra (missing module {exc.name!r}): "
        f"pip install 'fairgate[{extra}]'"
    )
