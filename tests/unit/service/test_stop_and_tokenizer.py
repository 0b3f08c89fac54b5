"""Stop-string hold-back, and the tokenizers (exact from tokenizer.json, approximate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.engines.stop import StopMatcher
from service.startup import StartupError
from service.tokenizer import ApproxTokenizer, HfTokenizer, load_tokenizer


def _stream(stops: tuple[str, ...], pieces: list[str]) -> tuple[str, str | None]:
    m = StopMatcher(stops)
    out = ""
    for p in pieces:
        text, matched = m.feed(p)
        out += text
        if matched:
            return out, matched
    return out + m.flush(), None


def test_stop_spanning_pieces_is_never_emitted() -> None:
    assert _stream(("END",), ["hello E", "N", "D more"]) == ("hello ", "END")


def test_false_prefix_is_released() -> None:
    assert _stream(("END",), ["a E", "Nx", " b"]) == ("a ENx b", None)


def test_held_text_flushed_at_stream_end() -> None:
    assert _stream(("END",), ["tail E"]) == ("tail E", None)


def test_earliest_stop_wins() -> None:
    assert _stream(("cd", "b"), ["abcd"]) == ("a", "b")


def test_approx_tokenizer_counts_words_and_punctuation() -> None:
    t = ApproxTokenizer(vocab_size=1000)
    ids = t.encode("Hello, world! Internationalization")
    assert len(ids) == 8  # Hello , world ! + 4 pieces of the long word
    assert all(256 <= i < 1000 for i in ids)
    assert t.encode("same text") == t.encode("same text")
    assert not t.exact


@pytest.fixture
def tokenizer_dir(tmp_path: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]"])
    tok.train_from_iterator(["the quick brown fox", "jumps over the lazy dog"], trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def test_hf_tokenizer_exact_counts(tokenizer_dir: Path) -> None:
    t = load_tokenizer(str(tokenizer_dir), vocab_size=32000)
    assert isinstance(t, HfTokenizer) and t.exact
    assert len(t.encode("the lazy fox")) == 3
    assert t.vocab_size == 9  # 8 words + [UNK]


def test_missing_tokenizer_json_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match=r"no tokenizer\.json at .*tokenizer_path") as err:
        HfTokenizer(tmp_path)
    assert err.value.setting == "tokenizer_path"
