"""Beyond (specdec-sampling, provided): the sampling controls every speculative run takes, written once.

Plain decoding (module 11's ``g2c.sampling.generate``) offers more than the warpers: a repetition
penalty over everything said so far, and a serving engine adds stop tokens, stop strings and the
log-probability of each emitted token. Each is lossless under speculation when it is applied where
plain decoding applies it, row by row:

* **Repetition penalty** (Keskar et al., "CTRL", 2019, section 4.1; module 11's
  ``apply_repetition_penalty``). Plain decoding penalises the logits of step t with every token
  before t: the prompt, every committed token (also those that slid out of the window), and, in a
  speculative round, the drafts *before* row i of the block. So row i of a chain is penalised with
  ``context + draft[:i]``, and the row after tree node j with ``context + the path to j``. The
  penalty goes on the target's rows p. A drafter may ignore it: its q is whatever it sampled from
  and the verifier corrects the difference (fewer acceptances, same output). The two classic
  mistakes, a penalty on q but not on p, and a penalty that forgets the drafts accepted earlier in
  the same round, both change the output's law; ``tests/test_specdec_sampling.py`` shows each
  rejected by the distribution test that passes the right rule.
* **Stops** (``StopRule``): ``eos_id``, any of ``stop_ids``, or the first emitted token after which
  the generated text (``decode`` of the new tokens) contains one of ``stop_strings``. The round's
  emitted tokens are checked one prefix at a time, each prefix decoded on its own (a decode need
  not be prefix-monotone: a byte-level decode shows half a character as U+FFFD, and the next byte
  replaces it), so the run ends on exactly the token plain decoding would have stopped on, and
  that token is kept (as EOS is).
* **Logprobs**: ``log_softmax`` of the target's raw logits (temperature 1, no penalty, no filter)
  at each emitted token, the number a perplexity is built from; one float per new token, equal to
  what one full forward pass over the final sequence gives inside the window.

``ControlledTarget`` wraps any ``Target`` (chain or tree, recompute, cached or fast) and applies the
penalty and records the logprobs; ``speculative_sample`` builds it only when a control asks for it,
so a run without controls is the same object graph as before.

Shape letters: R rows scored this round (k'+1 for a chain, n+1 for a tree), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from g2c.sampling.model import check_count, check_repetition_penalty
from g2c.sampling.warpers import apply_repetition_penalty

from .target import Target

__all__ = ["ControlledTarget", "StopRule", "check_logprobs", "check_repetition_penalty", "row_histories"]


def check_logprobs(flag) -> bool:
    """``logprobs`` must be a bool (a string such as "no" is truthy: refused, not guessed).

    Raises:
        TypeError: anything but True or False ("logprobs must be True or False").
    """
    if not isinstance(flag, bool):
        raise TypeError(f"logprobs must be True or False, got {type(flag).__name__} {flag!r}")
    return flag


def _stop_id_list(stop_ids) -> list:
    """``stop_ids`` as a list of candidates: None -> [], one id (an int, a NumPy integer, a 0-d
    integer tensor) -> [it], an iterable (list, tuple, set, 1-D tensor) -> its items."""
    if stop_ids is None:
        return []
    if isinstance(stop_ids, torch.Tensor):
        if stop_ids.dtype == torch.bool or stop_ids.dtype.is_floating_point or stop_ids.dim() > 1:
            raise TypeError(f"stop_ids must be token ids (ints), got a {stop_ids.dtype} tensor of shape "
                            f"{tuple(stop_ids.shape)}")
        return stop_ids.reshape(-1).tolist()
    if isinstance(stop_ids, (str, bytes)):
        raise TypeError(f"stop_ids must be token ids (ints), got {type(stop_ids).__name__} {stop_ids!r}; "
                        "a text to stop at goes in stop_strings")
    try:
        return list(stop_ids)
    except TypeError:
        return [stop_ids]                      # one id; check_count judges it below


def row_histories(draft) -> list[list[int]]:
    """The draft tokens that precede each scored row of a ``Draft``: 1 + n lists. Row 0 follows the
    root (nothing drafted), row 1 + j the path root -> node j (node j included): for a chain,
    ``draft.tokens[:j + 1]``."""
    tokens, parents = draft.tokens.tolist(), draft.parents.tolist()
    paths: list[list[int]] = []
    for j, parent in enumerate(parents):
        paths.append((paths[parent] if parent >= 0 else []) + [tokens[j]])
    return [[]] + paths


class StopRule:
    """Where a speculative round's emitted tokens end: EOS, stop ids, stop strings. Provided.

    The one cut every run of the engine shares. ``cut(ids, emitted)`` checks the emitted tokens one
    prefix at a time, in order, as plain decoding checks after each token (decoding every prefix:
    with a decode that is not prefix-monotone, such as bytes rendered with U+FFFD for a cut
    character, the text after token i need not start with the text after token i - 1), and
    returns the tokens up to and including the first that stops the run.

    Args:
        eos_id: an id in [0, V) or None (already checked by ``check_eos_id``).
        stop_ids: more ids that end the run, each in [0, V): one id or an iterable of ids (a list,
            a set, a 1-D integer tensor); None or empty for none.
        stop_strings: a string or strings, non-empty; the run ends after the first token that makes
            the generated text (``decode`` of every new token so far, the prompt excluded) contain
            one. Only the new text is read: with the prompt "...The e" and the stop string "The end",
            a generated "nd" does not stop the run, a generated "The end" does.
        decode: token ids (list of int) -> str, the tokenizer's ``decode``; needed with stop strings.
        prompt_len: tokens of the prompt (the generated text starts after them).
        vocab_size: V, to check the stop ids.

    Raises:
        TypeError: stop_ids not integers (a bool, a float, a bool tensor), stop_strings not strings
            (bytes included), decode not callable; at ``cut``, decode returning anything but a str.
        ValueError: a stop id outside [0, V) ("stop_ids"); an empty stop string; stop strings
            without ``decode`` ("stop_strings need decode").
    """

    def __init__(self, *, eos_id: int | None = None, stop_ids: Iterable[int] | None = None,
                 stop_strings: Iterable[str] | None = None, decode: Callable[[list[int]], str] | None = None,
                 prompt_len: int = 0, vocab_size: int | None = None) -> None:
        ids = set() if eos_id is None else {int(eos_id)}
        for t in _stop_id_list(stop_ids):
            t = check_count(t, "stop_ids", minimum=None)             # ints, NumPy ints; bools and floats refused
            if t < 0 or (vocab_size is not None and t >= vocab_size):
                raise ValueError(f"stop_ids: {t} is outside the vocabulary [0, {vocab_size})")
            ids.add(t)
        if isinstance(stop_strings, bytes):
            raise TypeError("stop_strings must be text (str), got bytes; decode them first (b'...'.decode())")
        if stop_strings is not None and not isinstance(stop_strings, (str, Iterable)):
            raise TypeError(f"stop_strings must be a str or a list of str, got {type(stop_strings).__name__} "
                            f"{stop_strings!r}")
        strings = [] if stop_strings is None else ([stop_strings] if isinstance(stop_strings, str)
                                                   else list(stop_strings))
        for s in strings:
            if not isinstance(s, str):
                raise TypeError(f"stop_strings must be strings, got {type(s).__name__} {s!r}")
            if not s:
                raise ValueError("stop_strings: an empty string would stop before the first token; drop it")
        if strings and decode is None:
            raise ValueError("stop_strings need decode (the tokenizer's decode: ids -> text) to read the "
                             "generated text")
        if decode is not None and not callable(decode):
            raise TypeError(f"decode must be a callable (ids -> text), got {type(decode).__name__}")
        self.stop_ids = frozenset(ids)
        self.stop_strings = tuple(strings)
        self.decode = decode
        self.prompt_len = int(prompt_len)

    def __repr__(self) -> str:
        return f"StopRule(stop_ids={sorted(self.stop_ids)}, stop_strings={list(self.stop_strings)})"

    def _text_stops(self, new_tokens: list[int]) -> bool:
        text = self.decode(new_tokens)
        if not isinstance(text, str):         # a list would turn "in" into membership: refuse, never guess
            raise TypeError(f"decode must return the text (a str), got {type(text).__name__}; pass the "
                            "tokenizer's decode (ids -> str)")
        return any(s in text for s in self.stop_strings)

    def cut(self, ids: torch.Tensor, emitted: list[int]) -> tuple[list[int], bool]:
        """(emitted up to and including the first stopping token, whether the run stops).

        Args:
            ids: (N,) the committed ids before this round (prompt first).
            emitted: this round's tokens, already cut to the budget.
        """
        end = next((i + 1 for i, tok in enumerate(emitted) if tok in self.stop_ids), None)   # first stop id
        if self.stop_strings and emitted:
            # Every prefix is decoded, as plain decoding decodes after every token: the text of a prefix
            # need not be a prefix of the text (a byte-level decode renders a cut character as U+FFFD,
            # which the next byte turns into the character), so the whole round's text cannot stand in.
            before = ids[self.prompt_len:].tolist()
            upto = emitted if end is None else emitted[:end]
            end = next((i + 1 for i in range(len(upto)) if self._text_stops(before + upto[:i + 1])), end)
        if end is None:
            return emitted, False
        return emitted[:end], True


class ControlledTarget(Target):
    """Any ``Target`` with a repetition penalty on its rows and the emitted tokens' logprobs. Provided.

    ``score`` returns the inner target's rows, each penalised with the committed context and the
    drafts before it (``row_histories``); ``commit`` records, when asked, the raw log-probability of
    every emitted token (row i of a chain; row 0 then the accepted path's nodes of a tree:
    ``Draft.committed_rows``). Everything else (``start``, ``visible``, the cache, the kept
    layers a drafter reads) is the inner target's.

    Args:
        inner: the ``Target`` to wrap.
        repetition_penalty: > 0; 1.0 leaves the rows unchanged.
        logprobs: keep ``self.logprobs``, one float per emitted token.

    Source: CTRL's penalty (Keskar et al. 2019, section 4.1) over the whole sequence, as module 11
    and transformers' ``RepetitionPenaltyLogitsProcessor`` apply it; vLLM and SGLang apply their
    penalties to the target's rows of the verified block the same way.
    """

    def __init__(self, inner: Target, *, repetition_penalty: float = 1.0, logprobs: bool = False) -> None:
        self.inner = inner
        self.model = inner.model
        self.penalty = check_repetition_penalty(repetition_penalty)
        self.keep_logprobs = check_logprobs(logprobs)
        self.logprobs: list[float] = []
        self._raw: torch.Tensor | None = None
        self._draft = None
        self._length = 0

    def __getattr__(self, name):                  # the inner target's own attributes (cache, layers, timers)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.inner.max_seq_len

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.logprobs = []
        return self.inner.start(prompt_ids)

    def visible(self, context_ids: torch.Tensor) -> int:
        return self.inner.visible(context_ids)

    def score(self, context_ids: torch.Tensor, draft):
        logits, states = self.inner.score(context_ids, draft)              # (R, V), states | None
        self._raw, self._draft, self._length = logits, draft, len(context_ids)
        if self.penalty == 1.0:
            return logits, states
        histories = row_histories(draft)
        if len(histories) != logits.shape[0]:
            raise RuntimeError(f"ControlledTarget: {type(self.inner).__name__} returned {logits.shape[0]} rows for "
                               f"a draft of {len(histories) - 1}; expected one row per draft token plus one")
        context = context_ids.tolist()
        rows = [apply_repetition_penalty(logits[i], torch.tensor(context + h, dtype=torch.long), self.penalty)
                for i, h in enumerate(histories)]
        return torch.stack(rows), states                                    # (R, V)

    def commit(self, context_ids: torch.Tensor, num_accepted: int) -> None:
        if self.keep_logprobs and self._raw is not None:
            emitted = context_ids[self._length:].tolist()
            rows = self._draft.committed_rows(len(emitted))
            logp = torch.log_softmax(self._raw[rows].float(), dim=-1).cpu()      # (e, V)
            self.logprobs.extend(logp[torch.arange(len(rows)), torch.tensor(emitted)].tolist())
        self._raw = None
        return self.inner.commit(context_ids, num_accepted)
