"""Module 04: a byte-level BPE tokenizer.

Byte-pair encoding (Sennrich, Haddow, Birch, "Neural Machine Translation of Rare Words
with Subword Units", ACL 2016) in its byte-level form (Radford et al. 2019, GPT-2,
section 2.2): text is UTF-8 bytes, each byte is shown as one printable character, and a
learned, ranked list of merges glues frequent neighbours into longer tokens. Any string
round-trips, because every byte is in the base vocabulary.

Training the merges uses the ``tokenizers`` library (fast, provided). *Applying* the
merges to text — the merge loop — and decoding are the exercises.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["EOT", "BPETokenizer", "bytes_to_unicode"]

EOT = "<|endoftext|>"


def _token_id(i) -> int:
    """One token id as an int: an int, a NumPy integer or a 0-d integer tensor; a bool, a float or a
    string is a TypeError (``int(1.7)`` would quietly read token 1)."""
    if isinstance(i, bool) or getattr(i, "dtype", None) is not None and str(i.dtype) in ("bool", "torch.bool"):
        raise TypeError(f"ids must be token ids (ints), got a bool {i!r}")
    try:
        return operator.index(i)
    except TypeError:
        raise TypeError(f"ids must be token ids (ints), got {type(i).__name__} {i!r:.40}") from None


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """The byte -> printable character table of byte-level BPE (GPT-2's convention).

    Printable Latin-1 bytes map to themselves; the other 68 bytes (controls, space, ...)
    map to code points from 256 upward, so every byte has a visible, distinct stand-in.
    Provided (the ``tokenizers`` library uses the same table).
    """
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class BPETokenizer:
    """Byte-level BPE: ``encode(text) -> list[int]`` and ``decode(ids) -> str``.

    Args:
        vocab: token string (in the byte-to-unicode alphabet) -> id.
        merges: ranked merges, rank 0 first; each is a pair of token strings.
        special_tokens: strings that are never split and map to their own id (must be in
            ``vocab``); ``<|endoftext|>`` is the end-of-text marker.

    Attributes:
        vocab_size: number of ids.
        eot_id: id of ``<|endoftext|>`` (None if absent).

    Raises:
        ValueError: a merge or special token refers to a string not in the vocabulary.
    """

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], special_tokens: Iterable[str] = (EOT,)):
        self.vocab = dict(vocab)
        self.inverse = {i: s for s, i in self.vocab.items()}
        self.merges = [tuple(m) for m in merges]
        self.ranks = {pair: rank for rank, pair in enumerate(self.merges)}
        self.special_tokens = [s for s in special_tokens]
        for s in self.special_tokens:
            if s not in self.vocab:
                raise ValueError(f"special token {s!r} is not in the vocabulary")
        for a, b in self.merges:
            if a not in self.vocab or b not in self.vocab or a + b not in self.vocab:
                raise ValueError(f"merge {(a, b)!r} refers to a token not in the vocabulary "
                                 f"(both parts and {a + b!r} must be in it)")
        self.byte_encoder = bytes_to_unicode()
        self.byte_decoder = {c: b for b, c in self.byte_encoder.items()}
        self._special_re = (re.compile("(" + "|".join(re.escape(s) for s in sorted(self.special_tokens, key=len,
                                                                                      reverse=True)) + ")")
                            if self.special_tokens else None)
        self._pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        self._cache: dict[str, list[str]] = {}
        self._fast: Tokenizer | None = None

    # -- properties ----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """V: the number of ids, special tokens included (ids run over [0, V))."""
        return len(self.vocab)

    @property
    def eot_id(self) -> int | None:
        """The id of ``<|endoftext|>``, or None if this vocabulary has no such token."""
        return self.vocab.get(EOT)

    # -- training (provided) -------------------------------------------------------------
    @classmethod
    def train(cls, texts: Iterable[str], *, vocab_size: int = 4096, special_tokens: Iterable[str] = (EOT,),
              show_progress: bool = True) -> "BPETokenizer":
        """Learn merges from ``texts`` with the ``tokenizers`` library (byte-level BPE).

        Raises:
            ValueError: vocab_size smaller than 256 bytes + special tokens.
        """
        special = list(special_tokens)
        if vocab_size < 256 + len(special):
            raise ValueError(f"vocab_size must be >= {256 + len(special)} (bytes + special tokens), got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=show_progress,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer)
        return cls.from_tokenizers(tok)

    @classmethod
    def from_tokenizers(cls, tok: Tokenizer) -> "BPETokenizer":
        """Build from a ``tokenizers.Tokenizer`` holding a byte-level BPE model."""
        data = json.loads(tok.to_str())
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in data["model"]["merges"]]
        special = [t["content"] for t in data.get("added_tokens", []) if t.get("special")]
        vocab = dict(data["model"]["vocab"])
        for t in data.get("added_tokens", []):
            vocab[t["content"]] = t["id"]
        out = cls(vocab, merges, special)
        out._fast = tok
        return out

    def to_tokenizers(self) -> Tokenizer:
        """The equivalent ``tokenizers.Tokenizer`` (used for fast bulk encoding)."""
        if self._fast is None:
            # Special tokens stay in the model's vocab so they keep their ids (the library
            # would otherwise append them after the largest id).
            model = models.BPE(vocab=dict(self.vocab), merges=list(self.merges))
            tok = Tokenizer(model)
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
            tok.decoder = decoders.ByteLevel()
            tok.add_special_tokens(self.special_tokens)
            self._fast = tok
        return self._fast

    # -- save / load (provided) ----------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` in the ``tokenizers`` library's format."""
        self.to_tokenizers().save(str(path))

    @classmethod
    def load(cls, path: str | Path) -> "BPETokenizer":
        """Read a ``tokenizer.json`` written by ``save`` (or by the ``tokenizers`` library).

        Raises:
            FileNotFoundError: no file at ``path``.
            ValueError: the file is not a byte-level BPE tokenizer.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer file at {path}")
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a generic Exception on bad JSON
            raise ValueError(f"{path} is not a valid tokenizers JSON file: {exc}") from exc
        if json.loads(tok.to_str())["model"]["type"] != "BPE":
            raise ValueError(f"{path} does not hold a BPE model")
        return cls.from_tokenizers(tok)

    # -- encoding ------------------------------------------------------------------------
    def _split_special(self, text: str) -> list[tuple[str, bool]]:
        """Cut text around special tokens: [(piece, is_special), ...] (provided)."""
        if self._special_re is None:
            return [(text, False)]
        return [(p, p in self.special_tokens) for p in self._special_re.split(text) if p]

    def _pretokenize(self, text: str) -> list[str]:
        """GPT-2 regex split + byte-to-unicode mapping, via ``tokenizers`` (provided).

        Returns pieces such as ``["Once", "Ġupon", "Ġa", "Ġtime"]`` (Ġ stands for the
        space byte).
        """
        return [piece for piece, _ in self._pre.pre_tokenize_str(text)]

    def bpe(self, word: str) -> list[str]:
        """Apply the ranked merges to one pre-token.

        Args:
            word: a pre-token in the byte-to-unicode alphabet (one character per byte).

        Returns:
            its tokens, as strings whose concatenation is ``word``.

        Steps:
            1. Start from single characters.
            2. Repeat: among adjacent pairs, find the one with the lowest merge rank
               (``self.ranks``); stop when no adjacent pair is a merge.
            3. Merge *every* occurrence of that pair, left to right, without overlaps
               (``test_bpe_merges_by_rank_not_by_position``, ``test_bpe_repeated_pair``).
            (Results are cached in ``self._cache``: words repeat a lot.)
        """
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        # BEGIN SOLUTION
        parts = list(word)
        while len(parts) > 1:
            best = min(((self.ranks.get((a, b), float("inf")), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))))
            if best[0] == float("inf"):
                break
            pair = (parts[best[1]], parts[best[1] + 1])
            merged, i = [], 0
            while i < len(parts):
                if i < len(parts) - 1 and (parts[i], parts[i + 1]) == pair:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        # END SOLUTION
        self._cache[word] = parts
        return parts

    def encode(self, text: str) -> list[int]:
        """Text -> token ids.

        Special tokens in the text become their single id and are never split; the rest
        is pre-tokenized and each piece goes through ``bpe``.

        Args:
            text: any Python string (may be empty -> ``[]``).

        Returns:
            list[int], ids in [0, vocab_size).

        Raises:
            TypeError: text is not a str.

        Steps:
            1. ``_split_special`` (``test_encode_never_splits_special_tokens``).
            2. For ordinary pieces, ``_pretokenize`` then ``bpe`` each pre-token and look
               the tokens up in ``self.vocab`` (``test_encode_matches_tokenizers_library``).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode expects str, got {type(text).__name__}")
        # BEGIN SOLUTION
        ids: list[int] = []
        for piece, special in self._split_special(text):
            if special:
                ids.append(self.vocab[piece])
                continue
            for word in self._pretokenize(piece):
                ids.extend(self.vocab[t] for t in self.bpe(word))
        return ids
        # END SOLUTION

    def encode_batch_fast(self, texts: list[str]) -> list[list[int]]:
        """Encode many texts with the ``tokenizers`` library (same ids as ``encode``; provided)."""
        return [e.ids for e in self.to_tokenizers().encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text.

        Args:
            ids: iterable of ints (a list or a 1-D tensor).

        Returns:
            the text; byte sequences that are not valid UTF-8 (possible when decoding a
            prefix that cuts a character) become U+FFFD.

        Raises:
            TypeError: text instead of ids, or an id that is not an int (a float, a bool, a string:
                never truncated, ``1.7`` is not token 1).
            ValueError: an id is outside the vocabulary: "ids holds token id 400, outside the
                vocabulary [0, V)" (negative ids too: -1 is refused, not read as V-1).
                Checked before the exercise code runs (provided).

        Steps:
            1. Map ids to token strings (``self.inverse``); special tokens are their own text.
            2. Map each character of ordinary tokens back to its byte (``self.byte_decoder``)
               and decode the bytes as UTF-8 with ``errors="replace"``
               (``test_decode_roundtrips_unicode``).
        """
        if isinstance(ids, (str, bytes)):
            raise TypeError(f"decode takes token ids (a list of ints or a 1-D tensor), got text {ids[:40]!r}")
        ids = [_token_id(i) for i in ids]
        for i in ids:
            if not 0 <= i < self.vocab_size or i not in self.inverse:
                raise ValueError(f"ids holds token id {i}, outside the vocabulary [0, {self.vocab_size})")
        # BEGIN SOLUTION
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            tok = self.inverse[i]
            if tok in self.special_tokens:
                out.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
                out.append(tok)
            else:
                buf.extend(self.byte_decoder[c] for c in tok)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)
        # END SOLUTION
