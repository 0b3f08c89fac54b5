"""Reading the project's Markdown: marked code blocks, links and heading anchors.

A code block is marked by an HTML comment on the line just before its fence:
`<!-- runnable -->` (the block runs as pasted against the server of the
nearest `<!-- server -->` block above it) or `<!-- server -->` (the block
starts that server). tests/integration/test_readme_blocks.py runs them.
Parsing is markdown-it-py's (CommonMark), not regular expressions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt
from markdown_it.token import Token

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MARKERS = ("runnable", "server")
_MARKER = re.compile(r"^<!--\s*(\S+)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    language: str  # the fence's info string: sh, python, ...
    code: str
    line: int  # 1-based line of the opening fence
    marker: str | None  # runnable, server or None
    server: Block | None  # for a runnable block: the server block above it


def _tokens(path: Path) -> list[Token]:
    return MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8"))


def code_blocks(path: Path = README) -> list[Block]:
    """Every fenced code block, with its marker and the server it runs against."""
    blocks: list[Block] = []
    server: Block | None = None
    previous: Token | None = None
    for tok in _tokens(path):
        if tok.type == "fence" and tok.map is not None:
            marker = None
            if previous is not None and previous.type == "html_block":
                m = _MARKER.match(previous.content.strip())
                if m:
                    marker = m.group(1)
                    if marker not in MARKERS:
                        raise ValueError(f"{path}:{tok.map[0] + 1}: unknown marker {marker!r}")
            block = Block(
                tok.info.strip(),
                tok.content,
                tok.map[0] + 1,
                marker,
                server if marker == "runnable" else None,
            )
            if marker == "server":
                server = block
            blocks.append(block)
        previous = tok
    return blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped,
    spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a file's headings (a repeated one gets -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    toks = _tokens(path)
    for i, tok in enumerate(toks):
        if tok.type != "heading_open":
            continue
        text = "".join(c.content for c in toks[i + 1].children or [] if c.content)
        base = slug(text)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    """Every link target in a file (inline links; images are not links here)."""
    out: list[str] = []
    for tok in _tokens(path):
        for child in tok.children or []:
            if child.type == "link_open":
                out.append(str(child.attrs["href"]))
    return out
