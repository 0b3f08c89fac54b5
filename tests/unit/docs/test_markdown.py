"""The README stays short and pasteable, and every documentation link lands."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.markdown_docs import README, REPO, anchors, code_blocks, links

# What .ci/run runs as "the README's test command"; it must stay word for word.
TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && .venv/bin/pytest"
DOCS = [
    README,
    REPO / "deploy/README.md",
    REPO / "deploy/helm/fairgate/README.md",
    *sorted((REPO / "docs").glob("*.md")),
]


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 400, f"README.md has {lines} lines; move detail to docs/"


def test_readme_test_command_is_the_one_ci_runs() -> None:
    commands = [b.code.strip() for b in code_blocks() if b.language == "sh"]
    assert TEST_COMMAND in commands
    assert TEST_COMMAND in (REPO / ".ci/run").read_text()


def test_readme_code_is_ascii() -> None:
    # A pasted "fg_..." with a Unicode ellipsis breaks HTTP clients.
    for block in code_blocks():
        bad = sorted({c for c in block.code if not c.isascii()})
        assert not bad, f"README.md:{block.line}: non-ASCII {bad} in a code block"


def test_every_server_block_serves_a_runnable_block() -> None:
    blocks = code_blocks()
    servers = [b for b in blocks if b.marker == "server"]
    used = {id(b.server) for b in blocks if b.marker == "runnable"}
    assert servers and all(id(s) in used for s in servers)
    for b in blocks:
        if b.marker == "runnable":
            assert b.server is not None, f"README.md:{b.line}: no server block above it"
            assert b.language in ("sh", "python"), b.line
        if b.marker == "server":
            assert b.language == "sh" and "fairgate serve" in b.code, b.line


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_land(doc: Path) -> None:
    for href in links(doc):
        if "://" in href or href.startswith("mailto:"):
            continue
        target, _, anchor = href.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        assert path.exists(), f"{doc.relative_to(REPO)}: {href}: no such file"
        if anchor and path.suffix == ".md":
            assert anchor in anchors(path), f"{doc.relative_to(REPO)}: {href}: no such heading"
