"""Chat templates: found where Hugging Face keeps them, rendered as transformers does."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from service.chat_template import (
    ChatMessage,
    ChatTemplateError,
    chat_template_for,
    load_chat_template,
)

LLAMA2_STYLE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if m['role'] == 'user' %}[INST] {{ m['content'] | trim }} [/INST]"
    "{% else %} {{ m['content'] | trim }} {{ eos_token }}{% endif %}{% endfor %}"
)


def _config(tmp_path: Path, **fields: object) -> Path:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(fields))
    return tmp_path


def test_tokenizer_config_template_with_special_tokens(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        chat_template=LLAMA2_STYLE,
        bos_token="<s>",
        eos_token={"content": "</s>", "lstrip": False},
    )
    tpl = load_chat_template("", str(path / "tokenizer.json"))
    assert tpl is not None
    out = tpl.render([ChatMessage("user", " hi "), ChatMessage("assistant", "yo")])
    assert out == "<s>[INST] hi [/INST] yo </s>"
    with pytest.raises(ChatTemplateError, match="must alternate"):
        tpl.render([ChatMessage("assistant", "first")])


def test_named_templates_use_the_default_and_jinja_file_wins(tmp_path: Path) -> None:
    _config(
        tmp_path,
        chat_template=[
            {"name": "tool_use", "template": "TOOLS"},
            {"name": "default", "template": "{{ messages[0].content }}|"},
        ],
    )
    tpl = load_chat_template("", str(tmp_path))
    assert tpl is not None and tpl.render([ChatMessage("user", "a")]) == "a|"
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}>{% endif %}"
    )
    tpl = load_chat_template("", str(tmp_path))
    assert tpl is not None and tpl.render([ChatMessage("user", "a")]) == "user:a>"
    explicit = tmp_path / "explicit.jinja"
    explicit.write_text("X{{ messages | length }}")
    tpl = load_chat_template(str(explicit), str(tmp_path))
    assert tpl is not None and tpl.render([ChatMessage("user", "a")]) == "X1"


def test_no_template_anywhere_is_none(tmp_path: Path) -> None:
    assert load_chat_template("", "") is None
    assert load_chat_template("", str(_config(tmp_path, bos_token="<s>"))) is None


def test_a_model_without_one_gets_chatml_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    turns = [ChatMessage("system", "be brief"), ChatMessage("user", "hi")]
    chatml = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    with caplog.at_level(logging.WARNING, logger="service.chat_template"):
        tpl = chat_template_for("llama", "", str(_config(tmp_path, bos_token="<s>")))
    assert tpl.render(turns) == chatml + "<|im_start|>assistant\n"
    (record,) = caplog.records
    assert "'llama' has no chat template" in record.getMessage()
    assert "FAIRGATE_CHAT_TEMPLATE_PATH" in record.getMessage()
    # The simulated model's format is ChatML: no warning; a model's own wins.
    caplog.clear()
    assert chat_template_for("sim", "", "", warn=False).render(turns).startswith(chatml)
    explicit = tmp_path / "own.jinja"
    explicit.write_text("OWN")
    assert chat_template_for("llama", str(explicit), "").render(turns) == "OWN"
    assert not caplog.records


def test_the_sandbox_refuses_unsafe_templates(tmp_path: Path) -> None:
    explicit = tmp_path / "evil.jinja"
    explicit.write_text("{{ messages.__class__.__mro__ }}")
    tpl = load_chat_template(str(explicit), "")
    assert tpl is not None
    with pytest.raises(ChatTemplateError):
        tpl.render([ChatMessage("user", "a")])
