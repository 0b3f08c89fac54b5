"""The worker kept on short steps takes only prompts that leave its prefill below
`keep_tokens` (issue #33: the long mix's 200-1 500-token conversations, below the
long-prefill mark, entered it and the light request waited behind their step)."""

from __future__ import annotations

import pytest

from service.engines.routing import WorkerView
from service.engines.stagger import Stagger

VIEWS = [(0, WorkerView(0.1)), (1, WorkerView(0.1))]
PENDING = [0, 4000]  # w0 on short steps (the last one), w1 mid-prefill


def _left(st: Stagger, prompt_tokens: int, pending: list[int] = PENDING) -> list[int]:
    return [i for i, _ in st.kept(prompt_tokens, VIEWS, pending, [True, True], 5.0)]


@pytest.mark.parametrize(
    ("keep_tokens", "prompt", "left"),
    [
        (0, 300, [0, 1]),  # below the long mark: anywhere, as before
        (256, 300, [1]),  # a medium prompt is kept off the short-step worker
        (256, 100, [0, 1]),  # a light-sized one is not
        (256, 3000, [1]),  # a long one, as before
    ],
)
def test_the_short_step_worker_takes_only_what_keeps_it_below_keep_tokens(
    keep_tokens: int, prompt: int, left: list[int]
) -> None:
    st = Stagger(min_tokens=1024, keep_tokens=keep_tokens, light_seen_s=4.0, min_workers=2)
    assert _left(st, prompt) == left
    assert st.kept_free == int(left == [1])


def test_what_makes_a_worker_short_is_still_the_long_mark() -> None:
    st = Stagger(min_tokens=1024, keep_tokens=256, light_seen_s=4.0, min_workers=2)
    # w0 with 500 prefill pending is on short steps (below 1024): it is kept.
    assert _left(st, 300, [500, 4000]) == [1]
    # Neither is below 1024: no worker to keep, the prompt goes anywhere.
    assert _left(st, 300, [1100, 4000]) == [0, 1]
    # The part of it w0 holds cached does not count: 300 - 200 keeps w0 below 256.
    cached = [(0, WorkerView(0.1, 0, 200)), (1, WorkerView(0.1))]
    assert len(st.kept(300, cached, [0, 4000], [True, True], 5.0)) == 2
    quiet = Stagger(min_tokens=1024, keep_tokens=256, light_seen_s=-100.0, min_workers=2)
    assert _left(quiet, 300) == [0, 1]  # no light tenant active: no rule
