"""`fairgate serve`: one flag per server setting, built from `Settings` itself.

Every field of `service.settings.Settings` becomes `--field-name`; its help
is the field's doc and allowed values, followed by the environment variable
and the default, so the flags, the variables and the defaults are one list
that cannot drift. Precedence: flag > FAIRGATE_* variable > default.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, cast

import typer

# Short names kept from earlier releases.
ALIASES = {
    "sim_time_scale": ["--time-scale"],
    "tenants_file": ["--tenants"],
    "tokenizer_path": ["--tokenizer"],
}


def serve_command() -> Callable[..., None]:
    """`serve` as a function whose signature typer reads: one option per setting."""
    from service.settings import ENV_PREFIX, Settings
    from service.settings_errors import allowed

    params: list[inspect.Parameter] = []
    for name, f in Settings.model_fields.items():
        type_ = cast(type, f.annotation) if f.annotation in (int, float, bool) else str
        env = ENV_PREFIX + name.upper()
        secret = f.repr is False
        default: Any = f.default
        if name == "api_key_pepper":
            default = "(random per start)"
        shown = "(set)" if secret and default else repr(default) if default == "" else default
        kind = allowed(f)
        doc = f"{f.description} Allowed: {kind}." if kind != "text" else f.description
        text = f"{doc} [env {env}; default {shown}]"
        if secret:
            text += " Prefer the variable: flags show in `ps`."
        flag = "--" + name.replace("_", "-")
        decls = [f"{flag}/--no-{flag[2:]}"] if type_ is bool else [flag, *ALIASES.get(name, [])]
        option = typer.Option(*decls, help=text, show_default=False)
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
        "Every setting is a flag and a FAIRGATE_* variable; flags win."
    )
    return serve
