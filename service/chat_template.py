"""Chat templates: a conversation rendered into the prompt text the model was trained on.

The template comes from the model's tokenizer directory, where Hugging Face
keeps it (`chat_template.jinja`, or `chat_template` in `tokenizer_config.json`),
or from an explicit file (`FAIRGATE_CHAT_TEMPLATE_PATH`). It is rendered the way
`transformers` renders it (sandboxed Jinja2, `trim_blocks`/`lstrip_blocks`,
`raise_exception`, `tojson`, `strftime_now`, the special tokens as variables,
`add_generation_prompt=True`), so the engine sees the same prompt as with
the model's own tokenizer.

A model with none gets fairgate's default, ChatML (`chat_templates/chatml.jinja`):
the simulated model's format, and for a real model a guess, said in a warning
at start, that `FAIRGATE_CHAT_TEMPLATE_PATH` or the tokenizer directory replaces.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")
DEFAULT_TEMPLATE = "chatml.jinja"

log = logging.getLogger(__name__)


class ChatTemplateError(ValueError):
    """The conversation cannot be rendered (the template refused it)."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._template = env.from_string(source)
        self._special = dict(special_tokens or {})

    def render(self, messages: list[ChatMessage]) -> str:
        """The prompt for the assistant's next turn; ChatTemplateError if refused."""
        try:
            return self._template.render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=True,
                **self._special,
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template failed: {exc}") from exc


def _token_text(value: object) -> str | None:
    # tokenizer_config.json writes special tokens as strings or AddedToken dicts.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def load_chat_template(template_path: str, tokenizer_path: str) -> ChatTemplate | None:
    """The explicit template file, else the tokenizer directory's; None when neither has one."""
    directory: Path | None = None
    if tokenizer_path:
        p = Path(tokenizer_path)
        directory = p if p.is_dir() else p.parent
    config: dict[str, Any] = {}
    if directory is not None and (directory / "tokenizer_config.json").is_file():
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    special = {k: t for k in _SPECIAL_TOKENS if (t := _token_text(config.get(k))) is not None}
    source: str | None = None
    if template_path:
        source = Path(template_path).read_text(encoding="utf-8")
    elif directory is not None and (directory / "chat_template.jinja").is_file():
        source = (directory / "chat_template.jinja").read_text(encoding="utf-8")
    else:
        raw = config.get("chat_template")
        if isinstance(raw, list):  # named templates: use the default one
            named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
            raw = named.get("default")
        if isinstance(raw, str):
            source = raw
    return None if source is None else ChatTemplate(source, special)


def default_chat_template() -> ChatTemplate:
    """fairgate's default template (ChatML), shipped in the package."""
    source = resources.files("service.chat_templates").joinpath(DEFAULT_TEMPLATE)
    return ChatTemplate(source.read_text(encoding="utf-8"))


def chat_template_for(
    model_name: str, template_path: str, tokenizer_path: str, *, warn: bool = True
) -> ChatTemplate:
    """The model's template (`load_chat_template`), else the default; `warn`: say so
    (a real model may have been trained on another format)."""
    found = load_chat_template(template_path, tokenizer_path)
    if found is not None:
        return found
    if warn:
        log.warning(
            "model %r has no chat template: chat requests are rendered as ChatML "
            "(fairgate's default), which may not be the format it was trained on; set "
            "FAIRGATE_CHAT_TEMPLATE_PATH, or FAIRGATE_TOKENIZER_PATH to its tokenizer directory",
            model_name,
        )
    return default_chat_template()
