"""Subcommands imported on first use (click's lazy-loading group).

`fairgate serve` must not pay for, or depend on, the benchmarks and the
planner (they pull the virtual fleet, the simulator and the load generator),
and the client commands (`generate`, `models`, `admin`) must run where only
the client is installed. The root group names these commands up front and
imports one only when the command line (or the help listing) asks for it; a
command whose extra is not installed fails with one line naming the extra."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import NamedTuple

import typer

# typer carries its own click (typer._click): TyperGroup's hooks take its types.
from typer._click import ClickException, Command, Context, HelpFormatter
from typer.core import TyperCommand, TyperGroup

from fairgate.cli.extras import missing_extra


class Lazy(NamedTuple):
    module: str
    attr: str  # a typer.Typer or a typer command function
    extra: str  # what `pip install 'fairgate[...]'` provides its dependencies


LAZY_COMMANDS: dict[str, Lazy] = {
    "serve": Lazy("fairgate.cli.serve", "serve_app", "server"),
    "bench": Lazy("fairgate.bench.cli", "bench_app", "bench"),
    "plan": Lazy("fairgate.plan.cli", "plan_command", "server"),
}


def _click_command(name: str, target: typer.Typer | Callable[..., object]) -> Command:
    if isinstance(target, typer.Typer):
        command = typer.main.get_command(target)
        command.name = name
        return command
    holder = typer.Typer(rich_markup_mode=None, add_completion=False)
    holder.command(name)(target)
    return typer.main.get_command(holder)


def load(name: str) -> Command:
    """The click command `name` of `LAZY_COMMANDS`, imported now."""
    lazy = LAZY_COMMANDS[name]
    try:
        target = getattr(importlib.import_module(lazy.module), lazy.attr)
    except ModuleNotFoundError as exc:
        line = missing_extra(exc, f"`fairgate {name}`", lazy.extra)
        if line is None:
            raise
        raise ClickException(line) from None
    return _click_command(name, target)


class LazyGroup(TyperGroup):
    """The root group: eager commands as typer registered them, plus `LAZY_COMMANDS`."""

    _listing = False

    def list_commands(self, ctx: Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if cmd_name not in LAZY_COMMANDS:
            return super().get_command(ctx, cmd_name)
        try:
            return load(cmd_name)
        except ClickException as exc:
            if not self._listing:
                raise
            # `fairgate --help` where an extra is missing: list it, say what it needs.
            return TyperCommand(cmd_name, help=f"(not installed) {exc.message}")

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False
