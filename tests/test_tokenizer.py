"""Module 04: byte-level BPE (the merge loop, encode, decode) and the StoryTokenizer.

Oracles: hand-built merge tables for ``bpe``; the ``tokenizers`` library (the same merges,
Rust implementation) for ``encode``; the round trip ``decode(encode(s)) == s`` for
arbitrary Unicode (hypothesis) for ``decode``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from g2c.assets import load_story_tokenizer
from g2c.tokenizer import EOT, BPETokenizer, bytes_to_unicode

CORPUS = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.",
    "One day, Lily saw a big red ball under a tree. She ran to the ball and picked it up.",
    "Tom was a happy dog. He liked to run and jump in the grass with his friend Sam.",
    "The sun was shining and the birds were singing. Mom said, \"Let's go to the beach!\"",
    "Ben and Mia built a tall tower of blocks. Then the tower fell down and they laughed.",
    "The little cat was sad because it lost its toy. A kind bird helped the cat find it.",
    "Café, naïve, über — 世界 こんにちは 🐱🐶 and numbers 12345 6789.",
] * 5

SAMPLES = [
    "",
    "Once upon a time",
    "  leading spaces and trailing  ",
    "Lily's dog didn't want to go. \"No!\" he barked.\n\nThe end.",
    "tabs\tand\r\nwindows newlines",
    "unseen words: xylophone quizzical jumbo",
    "émoji 🐱 and 世界 mixed with ASCII 42",
    "a<|endoftext|>b",
]


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, vocab_size=400, show_progress=False)


def _tiny(merges: list[tuple[str, str]]) -> BPETokenizer:
    """A tokenizer whose vocabulary is the 256 byte symbols, EOT, then one token per merge."""
    vocab = {c: i for i, c in enumerate(bytes_to_unicode().values())}
    vocab[EOT] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return BPETokenizer(vocab, merges)


# -- construction and training (provided) --------------------------------------------------
def test_bytes_to_unicode_is_a_bijection():
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ"


def test_init_rejects_unknown_special_token():
    with pytest.raises(ValueError, match="special token '<pad>' is not in the vocabulary"):
        BPETokenizer({"a": 0}, [], special_tokens=["<pad>"])


def test_init_rejects_merge_outside_vocab():
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, EOT: 4}
    with pytest.raises(ValueError, match=r"merge \('b', 'c'\)"):
        BPETokenizer(vocab, [("a", "b"), ("b", "c")])


def test_train_rejects_tiny_vocab():
    with pytest.raises(ValueError, match="vocab_size must be >= 257"):
        BPETokenizer.train(["abc"], vocab_size=100, show_progress=False)


def test_train_vocab_and_eot(tok):
    assert tok.vocab_size == 400
    assert tok.eot_id is not None and tok.inverse[tok.eot_id] == EOT


# -- bpe: the merge loop -------------------------------------------------------------------
def test_bpe_merges_by_rank_not_by_position():
    # (b, c) has rank 0, so "abc" -> a|bc even though (a, b) comes first in the word.
    t = _tiny([("b", "c"), ("a", "b")])
    assert t.bpe("abc") == ["a", "bc"]
    # ranks decide at every round: after "ab" forms, ("ab", "c") is the next best merge
    t2 = _tiny([("a", "b"), ("b", "c"), ("ab", "c")])
    assert t2.bpe("abc") == ["abc"]
    assert t2.bpe("xbc") == ["x", "bc"]


def test_bpe_repeated_pair():
    t = _tiny([("a", "a"), ("aa", "aa")])
    # every occurrence merges left to right without overlaps: aaa -> aa|a, not a|aa
    assert t.bpe("aaa") == ["aa", "a"]
    assert t.bpe("aaaa") == ["aaaa"]
    assert t.bpe("aaaaa") == ["aaaa", "a"]
    assert t.bpe("abaa") == ["a", "b", "aa"]


def test_bpe_without_merges_is_characters():
    t = _tiny([])
    assert t.bpe("hello") == list("hello")
    assert t.bpe("x") == ["x"]


def test_bpe_hand_table_matches_tokenizers_library():
    merges = [("a", "a"), ("b", "c"), ("aa", "bc"), ("Ġ", "aa")]
    t = _tiny(merges)
    text = "aaabc aaaa bcbc abcaa aabc"
    lib = BPETokenizer(t.vocab, t.merges, t.special_tokens)  # fresh: builds its own library copy
    assert t.encode(text) == lib.encode_batch_fast([text])[0]


# -- encode --------------------------------------------------------------------------------
def test_encode_rejects_non_str(tok):
    with pytest.raises(TypeError, match="encode expects str, got bytes"):
        tok.encode(b"abc")


def test_encode_empty_string(tok):
    assert tok.encode("") == []


def test_encode_never_splits_special_tokens(tok):
    eot = tok.eot_id
    ids = tok.encode("a<|endoftext|>b")
    assert ids == tok.encode("a") + [eot] + tok.encode("b")
    assert tok.encode(EOT + EOT) == [eot, eot]
    assert tok.encode(" " + EOT + "\n") == tok.encode(" ") + [eot] + tok.encode("\n")
    # a near miss is ordinary text and never produces the special id
    assert eot not in tok.encode("<|endoftext|")
    assert eot not in tok.encode("<|endoftext |>")


def test_encode_matches_tokenizers_library(tok):
    ours = [tok.encode(s) for s in SAMPLES + CORPUS[:7]]
    assert ours == tok.encode_batch_fast(SAMPLES + CORPUS[:7])
    assert max(max(ids, default=0) for ids in ours) < tok.vocab_size
    # the merges actually compress: the trained sentence needs far fewer ids than bytes
    s = CORPUS[0]
    assert len(tok.encode(s)) < len(s.encode()) / 2


def test_encode_matches_library_rebuilt_from_vocab_and_merges(tok):
    # an independent library tokenizer built only from (vocab, merges, special tokens)
    rebuilt = BPETokenizer(tok.vocab, tok.merges, tok.special_tokens)
    assert [tok.encode(s) for s in SAMPLES] == rebuilt.encode_batch_fast(SAMPLES)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_encode_matches_library_on_arbitrary_text(tok, text):
    assert tok.encode(text) == tok.encode_batch_fast([text])[0]


# -- decode --------------------------------------------------------------------------------
def test_decode_roundtrips_unicode(tok):
    for s in SAMPLES + ["Ünïcödé ✓ \u200b zero-width, 𝔘𝔫𝔦 and \x00 control"]:
        assert tok.decode(tok.encode(s)) == s


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_decode_encode_roundtrip_property(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_decode_partial_character_is_replacement(tok):
    first_byte_of_e_acute = tok.vocab[bytes_to_unicode()["é".encode()[0]]]
    assert tok.decode([first_byte_of_e_acute]) == "\ufffd"


def test_decode_accepts_tensor(tok):
    import torch

    ids = tok.encode("the cat")
    assert tok.decode(torch.tensor(ids)) == "the cat"


@pytest.mark.parametrize("bad", [400, -1])
def test_decode_rejects_ids_outside_the_vocabulary(tok, bad):
    # -1 must not be read as the last token (negative indexing); the check is provided code.
    with pytest.raises(ValueError, match=rf"ids holds token id {bad}, outside the vocabulary \[0, {tok.vocab_size}\)"):
        tok.decode([0, bad])


# -- save / load (provided) ----------------------------------------------------------------
def test_save_load_round_trip(tok, tmp_path):
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    back = BPETokenizer.load(path)
    assert back.vocab == tok.vocab and back.merges == tok.merges
    assert back.special_tokens == tok.special_tokens
    assert [back.encode(s) for s in SAMPLES] == [tok.encode(s) for s in SAMPLES]


def test_save_keeps_special_token_ids(tok, tmp_path):
    # built from (vocab, merges) alone, not from a library object: the saved file must
    # still give <|endoftext|> its own id, not a fresh one after the largest id
    path = tmp_path / "tokenizer.json"
    BPETokenizer(tok.vocab, tok.merges, tok.special_tokens).save(path)
    back = BPETokenizer.load(path)
    assert back.vocab == tok.vocab and back.eot_id == tok.eot_id
    assert back.encode_batch_fast(["a" + EOT]) == [tok.encode("a") + [tok.eot_id]]


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        BPETokenizer.load(tmp_path / "nope.json")


def test_load_bad_file(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text("this is not json")
    with pytest.raises(ValueError, match="not a valid tokenizers JSON file"):
        BPETokenizer.load(path)


def test_load_rejects_non_bpe_model(tmp_path):
    from tokenizers import Tokenizer, models

    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(path))
    assert json.loads(path.read_text())["model"]["type"] == "WordLevel"
    with pytest.raises(ValueError, match="does not hold a BPE model"):
        BPETokenizer.load(path)


# -- StoryTokenizer (the shipped artifact) -------------------------------------------------
STORIES = [
    "Once upon a time, there was a little boy named Tim. Tim had a red ball.",
    "Sue saw a big, fluffy cloud. \"Look, Mom!\" she said. Her mom smiled.",
    "The bunny hopped to the pond.<|endoftext|>Once there was a tiny frog.",
]


@pytest.fixture(scope="module")
def story():
    return load_story_tokenizer()


def test_story_tokenizer_vocab_and_eot(story):
    assert story.vocab_size == 4096
    assert story.eot_id is not None
    assert story.encode(EOT) == [story.eot_id]


def test_story_tokenizer_matches_library(story):
    ours = [story.encode(s) for s in STORIES]
    assert ours == story.encode_batch_fast(STORIES)
    assert [story.decode(ids) for ids in ours] == STORIES
    # trained on TinyStories: a plain story sentence is ~4 characters per token or better
    assert len(STORIES[0]) / len(ours[0]) > 3
