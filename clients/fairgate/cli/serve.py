"""`fairgate serve`: one flag per server setting, built from `Settings` itself.

Every field of `service.settings.Settings` becomes `--field-name`; its help
is the comment above the field in settings.py, followed by the environment
variable and the default, so the flags, the variables and the defaults are
one list that cannot drift. Precedence: flag > FAIRGATE_* variable > default.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import Annotated, Any

import typer

# Short names kept from earlier releases.
ALIASES = {
    "sim_time_scale": ["--time-scale"],
    "tenants_file": ["--tenants"],
    "tokenizer_path": ["--tokenizer"],
}
_FIELD = re.compile(r"^\s{4}(\w+): [^=]+= ")


def field_help() -> dict[str, str]:
    """Settings field → the comment lines right above it in settings.py."""
    from service import settings

    out: dict[str, str] = {}
    comment: list[str] = []
    for line in inspect.getsource(settings.Settings).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("# ").strip())
            continue
        found = _FIELD.match(line)
        if found:
            out[found.group(1)] = " ".join(comment)
        comment = []
    return out


def _type(type_: object) -> type:
    return {"int": int, "float": float, "bool": bool}.get(str(type_), str)


def serve_command() -> Callable[..., None]:
    """`serve` as a function whose signature typer reads: one option per setting."""
    from service.settings import ENV_PREFIX, Settings

    helps = field_help()
    defaults = Settings()
    params: list[inspect.Parameter] = []
    for f in dataclasses.fields(Settings):
        type_ = _type(f.type)
        env = ENV_PREFIX + f.name.upper()
        secret = f.repr is False
        default: Any = getattr(defaults, f.name)
        if f.name == "api_key_pepper":
            default = "(random per start)"
        shown = "(set)" if secret and default else repr(default) if default == "" else default
        text = f"{helps.get(f.name, '')} [env {env}; default {shown}]".strip()
        if secret:
            text += " Prefer the variable: flags show in `ps`."
        flag = "--" + f.name.replace("_", "-")
        decls = [f"{flag}/--no-{flag[2:]}"] if type_ is bool else [flag, *ALIASES.get(f.name, [])]
        option = typer.Option(*decls, help=text, show_default=False)
        params.append(
            inspect.Parameter(
                f.name,
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
