"""`fairgate serve`: one flag per server setting, built from `Settings` itself.

Every field of `service.settings.Settings` becomes `--field-name`; its help
is the field's doc (its Field description) and its range, followed by the
default, so the flags, the variables and the defaults are one list that cannot
drift. Precedence: flag > FAIRGATE_* variable > default. `serve --help` lists
them in sections (`SECTIONS`); a setting with a fixed set of values shows them
as its metavar (`choices`, read from the same declaration).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, cast

import typer
from pydantic.fields import FieldInfo

# typer carries its own click (typer._click): TyperCommand's hooks take its types.
from typer._click import Context, HelpFormatter
from typer.core import TyperCommand

# Short names kept from earlier releases.
ALIASES = {
    "sim_time_scale": ["--time-scale"],
    "tenants_file": ["--tenants"],
    "tokenizer_path": ["--tokenizer"],
}

# `serve --help` sections: a setting goes in the first whose names or prefixes
# match it (a test checks that none is left over).
SECTIONS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    (
        "Listening",
        (
            "listen",
            "http_listen",
            "metrics_listen",
            "workers",
            "event_loop",
            "gc_freeze",
            "shutdown_grace_s",
        ),
        ("tls_",),
    ),
    (
        "Model and engine",
        ("engine", "model_name", "tokenizer_path", "chat_template_path", "default_max_tokens"),
        ("max_output_tokens", "capacity_refresh_s", "stream_coalesce", "staged_prefill_"),
    ),
    ("Simulated engine (engine simulator)", (), ("sim_",)),
    ("SGLang engines (engine sglang-http, sglang)", (), ("sglang_",)),
    (
        "Scheduling and fairness",
        ("policy", "kv_target_fraction", "running_target_fraction", "idle_tenant_ttl_s"),
        ("fair_", "vtc_", "rate_limit_"),
    ),
    (
        "Tenants and authentication",
        ("tenants_file", "default_tenant", "tenant_header", "auth_mode", "admin_token"),
        ("api_key_", "tenant_sync_", "budget_"),
    ),
    ("Shared state and replicas (store redis)", ("store", "replicas"), ("redis_",)),
    ("Transport limits", ("max_request_bytes", "max_concurrent_streams"), ("max_", "keepalive_")),
    ("Logs and telemetry", ("log_level", "log_format"), ("telemetry_",)),
]
OTHER_SECTION = "Options"  # --help, and a setting no section names


def section_of(name: str) -> str:
    for title, names, prefixes in SECTIONS:
        if name in names or name.startswith(prefixes):
            return title
    return OTHER_SECTION


def choices() -> dict[str, tuple[str, ...]]:
    """Settings with a fixed set of values → the values (their metavar in the help):
    those `Settings` declares with `OneOf`, and the simulator's presets."""
    from service.engines.simulator.hardware import GPUS, MODELS
    from service.settings import Settings
    from service.settings_errors import options

    listed = {
        name: values
        for name, f in Settings.model_fields.items()
        if (values := options(f)) is not None
    }
    # The presets are checked when the simulator is built, against these tables.
    return listed | {"sim_gpu": tuple(GPUS), "sim_model": tuple(MODELS)}


class ServeCommand(TyperCommand):
    """`serve`, whose help lists the settings' flags in `SECTIONS`."""

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        rows: dict[str, list[tuple[str, str]]] = {title: [] for title, _, _ in SECTIONS}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            title = section_of(param.name or "") if param.name != "help" else OTHER_SECTION
            rows.setdefault(title, []).append(record)
        for title, records in rows.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)


def _range(f: FieldInfo) -> str:
    """The range of a bounded number (" Allowed: a number in (0, 1]."); nothing
    where the metavar says it all (<int>, [a|b], --x/--no-x)."""
    from service.settings_errors import allowed

    kind = allowed(f)
    bounded = f.annotation in (int, float) and kind not in ("an integer", "a number")
    return f" Allowed: {kind}." if bounded else ""


def serve_command() -> Callable[..., None]:
    """`serve` as a function whose signature typer reads: one option per setting."""
    from service.settings import ENV_PREFIX, Settings

    listed = choices()
    params: list[inspect.Parameter] = []
    for name, f in Settings.model_fields.items():
        type_ = cast(type, f.annotation) if f.annotation in (int, float, bool) else str
        env = ENV_PREFIX + name.upper()
        secret = f.repr is False
        default: Any = f.default
        if name == "api_key_pepper":
            default = "(random per start)"
        if type_ is bool:
            default = "on" if default else "off"
        # The variable is FAIRGATE_ + the flag's name (said once, in the description);
        # an empty default (unset) goes unsaid; so do values the metavar lists.
        shown = "" if default == "" else f" [default {'(set)' if secret else default}]"
        text = f"{f.description}{_range(f)}{shown}"
        if secret:
            text += f" Prefer the variable {env}: flags show in `ps`."
        flag = "--" + name.replace("_", "-")
        decls = [f"{flag}/--no-{flag[2:]}"] if type_ is bool else [flag, *ALIASES.get(name, [])]
        metavar = "[" + "|".join(listed[name]) + "]" if name in listed else None
        option = typer.Option(*decls, help=text, show_default=False, metavar=metavar)
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[type_ | None, option],
            )
        )

    def serve(**values: Any) -> None:
        from service.main import run

        try:
            settings = Settings.from_env(**values)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        raise typer.Exit(run(settings))

    serve.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    serve.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    serve.__doc__ = (
        "Run the server (embedded defaults: simulated RTX 4090, in-memory state). "
        "Every setting is a flag and a variable, FAIRGATE_ and the flag's name "
        "(--http-listen: FAIRGATE_HTTP_LISTEN); flags win."
    )
    return serve


# `fairgate serve` on its own: the root command imports this module on first use
# (fairgate.cli.lazy), so the client commands run where only the client is installed.
serve_app = typer.Typer(rich_markup_mode=None, add_completion=False)
serve_app.command("serve", cls=ServeCommand)(serve_command())
