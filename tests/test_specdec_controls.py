"""Beyond (specdec-sampling): the engine's sampling controls, each lossless (issue 28, item 6).

``speculative_sample`` takes module 11's repetition penalty, stop ids, stop strings and per-token
logprobs (``g2c.specdec.sampling.controls``). Oracles:

* greedy: module 11's ``generate(..., repetition_penalty=...)`` token for token, cut where the
  stop rule written out in this file cuts it (every new token checked in turn);
* sampled: the exact joint law of the first three tokens under plain sampling with the penalty
  (the table mocks make it a product we enumerate, the penalty reading the whole history),
  against 1500 seeded runs with k = 2, by the chi-square bound of ``test_specdec_sampling.py``
  (false-failure probability below 1.3e-4 per check; the seeds are fixed). The same check
  rejects the two classic mistakes, run through the same engine: the penalty applied to the
  draft's q but not to the target's p, and a penalty that forgets the drafts accepted earlier in
  the same round (at the fixed seeds: X² ≈ 58 and 47 for the two right drafters, 1702 for the
  penalty on q only and 386 for the round-blind penalty, against a bound of 117);
* logprobs: one full forward pass of the target over the final sequence.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from specdec_mocks import TableLM, chain_table
from test_specdec_cached import _lm
from test_specdec_sampling import DRAFT_ROWS, TARGET_ROWS, _chi_square_ok

import g2c.specdec.sampling.controls as controls
from g2c.sampling import generate
from g2c.sampling.warpers import apply_repetition_penalty
from g2c.specdec.sampling.controls import ControlledTarget, StopRule, row_histories
from g2c.specdec.sampling.draft import Draft
from g2c.specdec.sampling.drafters import Drafter, LMDrafter, Sampler
from g2c.specdec.sampling.loop import speculative_sample
from g2c.specdec.sampling.target import CachedTarget, RecomputeTarget

LETTERS = "abcdefghijklmnopqrstuvwxyz012345"


def decode(ids) -> str:
    """A toy tokenizer's decode for V = 32: one letter per id."""
    return "".join(LETTERS[int(t)] for t in ids)


def plain_cut(new: list[int], *, stop_ids=(), stop_strings=()) -> list[int]:
    """Plain decoding's stop, written out: check after every new token."""
    for i, tok in enumerate(new):
        if tok in stop_ids or any(s in decode(new[:i + 1]) for s in stop_strings):
            return new[:i + 1]
    return new


# -- the pieces --------------------------------------------------------------------------------
def test_row_histories_of_a_chain():
    """Row i of a chain follows draft[:i] (a tree's rows follow their paths: tests/test_specdec_engine.py)."""
    assert row_histories(Draft(torch.tensor([5, 6, 7]))) == [[], [5], [5, 6], [5, 6, 7]]
    assert row_histories(Draft.empty()) == [[]]


def test_stop_rule_cuts_at_the_first_stopping_token():
    rule = StopRule(eos_id=None, stop_ids=[7], stop_strings=["cd"], decode=decode, prompt_len=2)
    ids = torch.tensor([0, 2, 1])                       # prompt "ac", one new token "b"
    assert rule.cut(ids, [2, 3, 4]) == ([2, 3], True)   # "b" + "c" + "d": stops on the "d"
    # "c" committed, then "d": the stop string spans the committed token and this round's
    assert rule.cut(torch.tensor([0, 2, 2]), [3, 7]) == ([3], True)   # the string ends before the stop id
    assert rule.cut(ids, [0, 7, 3]) == ([0, 7], True)   # a stop id
    assert rule.cut(ids, [0, 0]) == ([0, 0], False)
    # the prompt's text never stops the run: "cd" in the prompt only
    assert StopRule(stop_strings=["cd"], decode=decode, prompt_len=2).cut(torch.tensor([2, 3]), [0]) == ([0], False)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"stop_ids": [32]}, ValueError, "stop_ids"),
    ({"stop_ids": [-1]}, ValueError, "stop_ids"),
    ({"stop_ids": [1.5]}, TypeError, "stop_ids"),
    ({"stop_strings": [""], "decode": decode}, ValueError, "stop_strings"),
    ({"stop_strings": ["ab"]}, ValueError, "need decode"),
    ({"stop_strings": [3], "decode": decode}, TypeError, "stop_strings"),
    ({"stop_strings": ["ab"], "decode": "decode"}, TypeError, "decode"),
    ({"repetition_penalty": 0.0}, ValueError, "repetition_penalty"),
    ({"repetition_penalty": float("nan")}, ValueError, "repetition_penalty"),
    ({"repetition_penalty": "1.2"}, TypeError, "repetition_penalty"),
    ({"stop_ids": True}, TypeError, "stop_ids"),
    ({"stop_ids": torch.tensor([True, False])}, TypeError, "stop_ids"),
    ({"stop_ids": "5"}, TypeError, "stop_strings"),
    ({"stop_strings": b"ab", "decode": decode}, TypeError, "bytes"),
    ({"stop_strings": ["ab"], "decode": lambda ids: list(decode(ids))}, TypeError, "decode must return"),
    ({"logprobs": "no"}, TypeError, "logprobs must be True or False"),
])
def test_engine_refuses_bad_controls(kwargs, error, match):
    target = _lm(2, max_seq_len=16)
    with pytest.raises(error, match=match):
        speculative_sample(target, LMDrafter(_lm(3, dim=8, layers=1, max_seq_len=16)), [1, 2], 4, temperature=0.0,
                           **kwargs)


@pytest.mark.parametrize("one_id", [5, np.int64(5), torch.tensor(5), [5], torch.tensor([5])])
def test_stop_ids_take_one_id_or_many(one_id):
    assert StopRule(stop_ids=one_id, vocab_size=32).stop_ids == frozenset({5})


def test_overflowing_penalty_or_temperature_is_the_argmax_limit():
    """A penalty of 1e-40 divides a positive logit into +inf; a temperature of 1e-40 overflows every
    row. Module 11's ``generate`` takes the argmax there (its T -> 0 rule); the engine's p is then
    one-hot at the same argmax, so the sampled run is plain decoding's, not a crash."""
    row = torch.tensor([[1.0, 3.0, -2.0], [0.5, 0.2, 0.1]])
    torch.testing.assert_close(Sampler(1e-40).probs(row), torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    target, small = _lm(2, max_seq_len=16), _lm(3, dim=8, layers=1, max_seq_len=16)
    plain = generate(target, [5, 11, 5], 8, temperature=1.0, repetition_penalty=1e-40,
                     generator=torch.Generator().manual_seed(0))
    for use_cache in (False, True):
        ids, _ = speculative_sample(target, LMDrafter(small, sample=True), [5, 11, 5], 8, k=3, temperature=1.0,
                                    repetition_penalty=1e-40, use_cache=use_cache,
                                    generator=torch.Generator().manual_seed(1))
        assert ids.tolist() == plain.tolist()


# -- greedy: token for token against module 11 ---------------------------------------------------
@pytest.mark.parametrize("use_cache", [False, True])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_penalty_stops_and_logprobs_equal_plain_decoding(k, use_cache):
    target = _lm(2, max_seq_len=24)
    small = _lm(2, max_seq_len=24)      # the target's twin, drafting without the penalty: it agrees until a repeat
    prompt, n, theta = [4, 9, 4, 1], 16, 1.8
    plain = generate(target, prompt, n, temperature=0.0, repetition_penalty=theta)[len(prompt):].tolist()
    assert plain != generate(target, prompt, n, temperature=0.0)[len(prompt):].tolist()   # the penalty matters
    ids, stats = speculative_sample(target, LMDrafter(small, use_cache=use_cache), prompt, n, k=k, temperature=0.0,
                                    use_cache=use_cache, repetition_penalty=theta, logprobs=True)
    assert ids[len(prompt):].tolist() == plain
    assert 0 < stats.accepted < stats.drafted            # drafts accepted, and some refused by the penalty
    full = torch.log_softmax(target(ids.unsqueeze(0))[0].float(), dim=-1)               # (N, V)
    want = full[torch.arange(len(prompt) - 1, len(ids) - 1), ids[len(prompt):]]
    assert len(stats.logprobs) == n
    torch.testing.assert_close(torch.tensor(stats.logprobs), want, atol=1e-4, rtol=1e-4)
    # stops: a string spanning two tokens in the middle of the text, and a stop id later on
    text = decode(plain)
    stop_string, stop_id = text[5:7], plain[9]
    want_cut = plain_cut(plain, stop_ids=(stop_id,), stop_strings=(stop_string,))
    assert len(want_cut) < n
    ids, stats = speculative_sample(target, LMDrafter(small, use_cache=use_cache), prompt, n, k=k, temperature=0.0,
                                    use_cache=use_cache, repetition_penalty=theta, stop_ids=[stop_id],
                                    stop_strings=[stop_string], decode=decode, logprobs=True)
    assert ids[len(prompt):].tolist() == want_cut
    assert len(stats.logprobs) == stats.generated == len(want_cut)


# -- a decode that is not prefix-monotone (issue 57) ---------------------------------------------
LEAD, CONT = 26, 27                      # the two bytes of "é" (0xC3 0xA9); ids 0-25 are the letters a-z


def byte_decode(ids) -> str:
    """A byte-level decode for V = 32: a cut character shows as U+FFFD until its next byte arrives, so
    the text after token i need not start with the text after token i - 1."""
    raw = bytes(0xC3 if t == LEAD else 0xA9 if t == CONT else 0x61 + int(t) % 26 for t in ids)
    return raw.decode("utf-8", errors="replace")


@pytest.mark.parametrize("k", [1, 4])
def test_stop_string_is_found_with_a_decode_that_is_not_prefix_monotone(k):
    """Plain decoding stops right after the lead byte ("b c \ufffd"); the round's whole text ("b c é d
    ...") no longer holds U+FFFD, so a cut that decodes only the round's text ran on (issue 57). The tree
    presets share the cut: tests/tooling/test_fuzz.py runs them with such decodes."""
    next_of = list(range(1, 33))
    next_of[0], next_of[1], next_of[2], next_of[LEAD], next_of[CONT] = 1, 2, LEAD, CONT, 3
    next_of[31] = 4
    model = TableLM(chain_table(next_of, generator=torch.Generator().manual_seed(0)), max_seq_len=32)
    prompt, n = [0], 12
    plain = generate(model, prompt, n, temperature=0.0)[1:].tolist()
    assert plain[:5] == [1, 2, LEAD, CONT, 3] and "\ufffd" not in byte_decode(plain)
    want = next(plain[:i + 1] for i in range(n) if "\ufffd" in byte_decode(plain[:i + 1]))
    assert want == [1, 2, LEAD]
    controls = {"stop_strings": ["\ufffd"], "decode": byte_decode, "temperature": 0.0}
    ids, _ = speculative_sample(model, LMDrafter(model), prompt, n, k=k, **controls)
    assert ids[1:].tolist() == want
    # the rule alone: a round that brings both bytes at once still stops on the lead byte
    rule = StopRule(stop_strings=["\ufffd"], decode=byte_decode, prompt_len=1)
    assert rule.cut(torch.tensor([0, 1]), [2, LEAD, CONT, 3]) == ([2, LEAD], True)
    assert rule.cut(torch.tensor([0, 1, 2, LEAD]), [CONT, 3]) == ([CONT, 3], False)   # that byte already passed


def test_penalty_reads_tokens_past_the_window():
    """Past the window the target sees the last max_seq_len tokens, the penalty every token said."""
    target, small = _lm(2, max_seq_len=8), _lm(3, dim=8, layers=1, max_seq_len=8)
    prompt = [4, 9, 4, 1, 7, 7, 3]
    plain = generate(target, prompt, 12, temperature=0.0, repetition_penalty=2.0)
    ids, _ = speculative_sample(target, LMDrafter(small), prompt, 12, k=3, temperature=0.0, repetition_penalty=2.0)
    assert ids.tolist() == plain.tolist()


# -- sampled: the law of plain sampling with the penalty ------------------------------------------
THETA = 2.5


def _exact_penalised(target: TableLM, prompt: list[int], n: int, sampler: Sampler, theta: float) -> dict:
    """P(first n tokens) under plain sampling: each step's row penalised with the whole history."""
    out = {}
    for seq in itertools.product(range(target.vocab_size), repeat=n):
        prob, hist = 1.0, list(prompt)
        for tok in seq:
            row = apply_repetition_penalty(target.table[hist[-1]], torch.tensor(hist), theta)
            prob *= float(sampler.probs(row)[tok])
            hist.append(tok)
        out[seq] = prob
    return out


class _PenalisedQ(Drafter):
    """A table drafter that applies the penalty to its own q (context + its drafts so far)."""

    vocab_size = 4

    def __init__(self, table: TableLM, theta: float) -> None:
        self.table, self.theta = table, theta

    def propose(self, context_ids, k):
        hist, tokens, rows = context_ids.tolist(), [], []
        for _ in range(k):
            row = apply_repetition_penalty(self.table.table[hist[-1]], torch.tensor(hist), self.theta)
            q = self.sampler.probs(row)
            tok = int(torch.multinomial(q, 1, generator=self.generator))
            tokens.append(tok)
            rows.append(q)
            hist.append(tok)
        return Draft(torch.tensor(tokens), torch.stack(rows))


def _counts(drafter, theta, *, seed, runs=1500, **kw):
    target = TableLM(torch.tensor(TARGET_ROWS))
    g = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(runs):
        out, _ = speculative_sample(target, drafter, [1, 3], 3, k=2, temperature=1.0, generator=g,
                                    repetition_penalty=theta, **kw)
        counts[tuple(out[2:].tolist())] += 1
    return counts


def _exact():
    return _exact_penalised(TableLM(torch.tensor(TARGET_ROWS)), [1, 3], 3, Sampler(1.0), THETA)


@pytest.mark.parametrize("drafter", ["plain q", "penalised q"])
def test_sampled_penalty_is_lossless(drafter):
    """Either drafter: its q is whatever it sampled from; the penalised p makes the law exact."""
    table = TableLM(torch.tensor(DRAFT_ROWS))
    d = LMDrafter(table, sample=True) if drafter == "plain q" else _PenalisedQ(table, THETA)
    ok, stat, bound = _chi_square_ok(_counts(d, THETA, seed=3), _exact())
    assert ok, f"{drafter}: X²={stat:.1f} > {bound:.1f}"


def test_classic_penalty_mistakes_are_rejected(monkeypatch):
    """The same check fails both classic mistakes (X² far above the bound)."""
    exact = _exact()
    # 1. the penalty on the draft's q only: the engine's p is left unpenalised
    ok, stat, bound = _chi_square_ok(_counts(_PenalisedQ(TableLM(torch.tensor(DRAFT_ROWS)), THETA), 1.0, seed=3),
                                     exact)
    assert not ok, f"penalty on q only passed: X²={stat:.1f} <= {bound:.1f}"
    # 2. every row penalised with the committed context only, forgetting this round's drafts
    monkeypatch.setattr(controls, "row_histories", lambda draft: [[] for _ in range(len(draft) + 1)])
    ok, stat, bound = _chi_square_ok(_counts(LMDrafter(TableLM(torch.tensor(DRAFT_ROWS)), sample=True), THETA,
                                             seed=3), exact)
    assert not ok, f"a penalty blind to this round's drafts passed: X²={stat:.1f} <= {bound:.1f}"


def test_controlled_target_keeps_the_inner_targets_state():
    """The wrapper adds nothing the inner target would not do when no control is on."""
    target = _lm(2, max_seq_len=16)
    for inner in (RecomputeTarget(target), CachedTarget(target)):
        wrapped = ControlledTarget(inner)
        prompt = torch.tensor([3, 1, 4])
        wrapped.start(prompt)
        a, _ = wrapped.score(prompt, Draft(torch.tensor([1, 5])))
        inner.start(prompt)
        b, _ = inner.score(prompt, Draft(torch.tensor([1, 5])))
        torch.testing.assert_close(a, b)
        assert wrapped.max_seq_len == 16 and wrapped.vocab_size == target.vocab_size
