"""What every `fairgate` command shares: the version flag, one-line errors,
and connection options accepted before or after an admin subcommand.

Typer options live on the command that declares them, so `fairgate admin -o
json keys issue t` worked and `fairgate admin keys issue t -o json` did not.
`with_shared_options` gives every command its group's options too (same
names, same help): given there, they override the group's value.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Annotated, Any, get_args

import grpc

from fairgate.cli.extras import missing_extra
from fairgate.errors import FairgateError


def version() -> str:
    try:
        return metadata.version("fairgate")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree without install
        from fairgate import __version__

        return __version__


def with_shared_options(
    shared: Callable[..., Any], apply: Callable[[Any, str, Any], None]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the options of its group's callback `shared` too.

    Given after the subcommand they override the group's values (`apply(ctx.obj,
    name, value)`; the group's callback has built ctx.obj by then). Same
    names and help; no defaults or env vars here (the group read those)."""
    extra: list[inspect.Parameter] = []
    for p in inspect.signature(shared, eval_str=True).parameters.values():
        if p.name == "ctx":
            continue
        base, info = get_args(p.annotation)
        option = copy.copy(info)
        option.envvar = None
        option.show_default = False
        extra.append(
            inspect.Parameter(
                p.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[base | None, option],
            )
        )
    names = {p.name for p in extra}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(command, eval_str=True)

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = kwargs.get("ctx") or args[0]
            for name in names:
                value = kwargs.pop(name, None)
                if value is not None:
                    apply(ctx.obj, name, value)
            return command(*args, **kwargs)

        own = list(sig.parameters.values())
        taken = {p.name for p in own}
        params = own + [p for p in extra if p.name not in taken]
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper

    return decorate


def one_line_error(exc: BaseException) -> str:
    """One line for a failure a user can act on (server unreachable, a bad file)."""
    if isinstance(exc, FairgateError):
        return f"{exc.code.name}: {exc.message}"
    if isinstance(exc, grpc.RpcError):
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        return f"{code.name if code else 'RPC'}: {details}"
    if isinstance(exc, ConnectionError | TimeoutError | FileNotFoundError | PermissionError):
        return f"{type(exc).__name__}: {exc}"
    return str(exc)


def run(cli: Callable[..., Any], args: list[str] | None = None) -> None:
    """Run `cli` as a program: usage errors as click prints them, expected
    failures (server unreachable, a bad file) as one line, exit code 1."""
    try:
        cli(args=args, prog_name="fairgate")
    except ModuleNotFoundError as exc:  # a command run without its extra (sim-server, …)
        line = missing_extra(exc, "this command", "server")
        if line is None:
            raise
        sys.stderr.write(f"error: {line}\n")
        sys.exit(1)
    except (FairgateError, grpc.RpcError, OSError) as exc:
        sys.stderr.write(f"error: {one_line_error(exc)}\n")
        sys.exit(1)
    except ExceptionGroup as group:  # from a TaskGroup: report the first expected failure
        expected = group.subgroup(lambda e: isinstance(e, FairgateError | grpc.RpcError | OSError))
        if expected is None:
            raise
        first: BaseException = expected
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        sys.stderr.write(f"error: {one_line_error(first)}\n")
        sys.exit(1)
