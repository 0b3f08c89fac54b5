"""The exact cache view re-keys engine pages of any size into fairgate's keys."""

from __future__ import annotations

import gc

import pytest

from service.engines.kv_view import CacheView
from service.engines.prefix_index import chain


def _store(view: CacheView, tokens: list[int], page: int, first_hash: int = 100) -> list[int]:
    """Store `tokens` as one radix node of pages of `page` tokens; their hashes."""
    hashes = [first_hash + n for n in range(-(-len(tokens) // page))]
    for n, h in enumerate(hashes):  # SGLang sends a node's pages one event each (merged)
        view.stored([h], hashes[n - 1] if n else None, tokens[n * page : (n + 1) * page], page)
    return hashes


@pytest.mark.parametrize("page", [1, 3, 16, 64])
def test_a_stored_prompt_matches_its_whole_blocks_whatever_the_page(page: int) -> None:
    view = CacheView()
    prompt = list(range(1, 101))  # 6 whole blocks of 16, and 4 tokens
    _store(view, prompt, page)
    assert view.match(chain(prompt)) == 96
    assert view.match(chain([*prompt[:40], 999, *prompt[41:]])) == 32  # differs in block 3


def test_removing_a_leaf_keeps_its_parent_and_a_missing_parent_goes_stale() -> None:
    view = CacheView()
    system = list(range(1, 33))
    parent = _store(view, system, 16)
    turn = [*system, *range(500, 532)]
    view.stored([7, 8], parent[-1], turn[32:], 16)
    assert view.match(chain(turn)) == 64
    view.removed([7, 8])
    assert view.match(chain(turn)) == 32
    assert not view.stale
    view.stored([9], 12345, list(range(16)), 16)  # a parent the view never saw
    assert view.stale
    view.cleared()
    assert not view.stale and view.match(chain(turn)) == 0


def test_a_prompt_asked_again_sees_what_was_stored_and_removed_since() -> None:
    """Admission asks the same queued prompt at every streamed chunk: the answer
    follows every change of the view in between."""
    view = CacheView()
    prompt = list(range(1, 65))
    keys = chain(prompt)
    assert view.match(keys) == 0
    first = _store(view, prompt[:32], 16)
    assert view.match(keys) == 32
    view.stored([50, 51], first[-1], prompt[32:], 16)
    assert view.match(keys) == 64
    view.removed([51])
    assert view.match(keys) == 48
    view.removed([12345])  # a block the view never saw changes nothing
    assert view.match(keys) == 48
    view.cleared()
    assert view.match(keys) == 0


def test_the_views_blocks_leave_the_collectors_sight() -> None:
    """A view holds a block per engine page: once collected (its inner tuples, then
    the block), none is walked again."""
    view = CacheView()
    parent = None
    for h in range(1, 200):
        view.stored([h], parent, list(range(h * 16, h * 16 + 16)), 16)
        parent = h
    gc.collect()
    gc.collect()
    assert not any(gc.is_tracked(b) for b in view._blocks.values())
