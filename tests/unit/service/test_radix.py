"""The simulator's radix tree against a naive model: cached sequences as a list."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from service.engines.simulator.radix import Node, RadixCache, common_prefix_len


def _paths(tree: RadixCache) -> set[tuple[int, ...]]:
    """Every root-to-leaf sequence the tree holds."""
    out: set[tuple[int, ...]] = set()
    stack: list[tuple[Node, tuple[int, ...]]] = [(tree.root, ())]
    while stack:
        node, path = stack.pop()
        path = path + tuple(node.key)
        if not node.children:
            out.add(path)
        stack.extend((c, path) for c in node.children.values())
    return out


def _size(tree: RadixCache) -> int:
    stack, n = [tree.root], 0
    while stack:
        node = stack.pop()
        n += len(node.key)
        stack.extend(node.children.values())
    return n


def test_common_prefix_len_across_blocks() -> None:
    a = list(range(300))
    assert common_prefix_len(a, a) == 300
    assert common_prefix_len(a, [*a[:130], -1, *a[131:]]) == 130
    assert common_prefix_len(a[:10], [9, *a], 1) == 10
    assert common_prefix_len([], a) == 0


def test_insert_splits_and_matches_shared_prefixes() -> None:
    tree = RadixCache()
    assert tree.insert([1, 2, 3, 4])[0] == 0
    assert tree.insert([1, 2, 5])[0] == 2  # split after [1, 2]
    assert _paths(tree) == {(1, 2, 3, 4), (1, 2, 5)}
    assert tree.total_size == 5 == tree.evictable_size
    assert tree.match_prefix([1, 2, 3, 9])[0] == 3  # ends inside [3, 4]: split again
    assert _paths(tree) == {(1, 2, 3, 4), (1, 2, 5)} and tree.total_size == 5
    assert tree.match_prefix([7])[0] == 0
    assert tree.insert([1, 2, 3, 4])[0] == 4 and tree.total_size == 5


def test_locked_prefix_is_protected_and_never_evicted() -> None:
    tree = RadixCache()
    tree.insert([1, 2, 3, 4])
    tree.insert([1, 2, 9, 9, 9])
    _, node = tree.match_prefix([1, 2, 3, 4])
    tree.lock(node)
    assert (tree.protected_size, tree.evictable_size) == (4, 3)
    assert tree.evict(100) == 3  # only [9, 9, 9]
    assert _paths(tree) == {(1, 2, 3, 4)}
    tree.unlock(node)
    assert (tree.protected_size, tree.evictable_size) == (0, 4)
    assert tree.evict(1) == 2 and _paths(tree) == {(1, 2)}  # a whole leaf goes


def test_evicts_least_recently_used_first() -> None:
    tree = RadixCache()
    for first in (1, 2, 3):
        tree.insert([first] * 10)
    tree.match_prefix([1, 1])  # 1 is now the most recent
    assert tree.evict(15) == 20
    assert _paths(tree) == {(1,) * 10}


ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "match", "lock", "unlock", "evict"]),
        st.lists(st.integers(0, 3), max_size=12),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_tree_agrees_with_a_naive_model(steps: list[tuple[str, list[int]]]) -> None:
    tree = RadixCache()
    cached: set[tuple[int, ...]] = set()  # every cached sequence (prefixes implied)
    locks: list[tuple[Node, tuple[int, ...]]] = []

    def naive_match(key: list[int]) -> int:
        return max((common_prefix_len(s, key) for s in cached), default=0)

    for op, key in steps:
        if op == "insert":
            before = naive_match(key)
            assert tree.insert(key)[0] == min(before, len(key))
            cached.add(tuple(key))
        elif op == "match":
            assert tree.match_prefix(key)[0] == naive_match(key)
        elif op == "lock":
            n, node = tree.match_prefix(key)
            tree.lock(node)
            locks.append((node, tuple(key[:n])))
        elif op == "unlock" and locks:
            tree.unlock(locks.pop(len(key) % len(locks))[0])
        elif op == "evict":
            tree.evict(len(key) * 3)
            # What is left: the tree's sequences; locked prefixes survive.
            cached = {p for p in _paths(tree)}
        for _, prefix in locks:
            assert naive_match(list(prefix)) == len(prefix)
        # The tree holds each distinct prefix once; sizes add up.
        distinct = {s[:i] for s in cached for i in range(1, len(s) + 1)}
        assert _size(tree) == len(distinct) == tree.total_size
        locked = {p[:i] for _, p in locks for i in range(1, len(p) + 1)}
        assert tree.protected_size == len(locked)
