"""Module 11: logit warpers and the ``generate`` loop.

Oracles: warped logits by hand, mock models whose next token is known (and which record
every context they are called with), the argmax chain computed step by step, and sampling
frequencies with a fixed generator.
"""

from __future__ import annotations

import math

import pytest
import torch
from device_mocks import AccelTableLM, FakeAccelerator

from g2c.nn import Module
from g2c.sampling import (
    LanguageModel,
    apply_repetition_penalty,
    apply_temperature,
    as_token_ids,
    eval_mode,
    generate,
    sample_from_logits,
    top_k_filter,
    top_p_filter,
)

NEG_INF = float("-inf")
V = 10


class Recorder(Module):
    """Mock LM: logits[b, t] = table[ids[b, t]] (a bigram table); records every input."""

    def __init__(self, table: torch.Tensor, max_seq_len: int = 16) -> None:
        super().__init__()
        self.table = table
        self.vocab_size = table.shape[-1]
        self.max_seq_len = max_seq_len
        self.calls: list[list[int]] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        assert ids.dim() == 2 and ids.shape[0] == 1 and ids.shape[1] <= self.max_seq_len
        self.calls.append(ids[0].tolist())
        return self.table[ids]                                               # (1, T, V)


def _successor_table() -> torch.Tensor:
    """Row i puts a clear maximum on (i + 1) % V: greedy decoding counts upwards."""
    table = torch.zeros(V, V)
    table[torch.arange(V), (torch.arange(V) + 1) % V] = 5.0
    return table


def _random_table(seed: int = 0) -> torch.Tensor:
    return torch.randn(V, V, generator=torch.Generator().manual_seed(seed))


# -- apply_temperature ---------------------------------------------------------------------

def test_temperature_scales_logits():
    logits = torch.tensor([2.0, -1.0, 0.5])
    torch.testing.assert_close(apply_temperature(logits, 0.5), torch.tensor([4.0, -2.0, 1.0]))
    torch.testing.assert_close(apply_temperature(logits, 2.0), torch.tensor([1.0, -0.5, 0.25]))
    torch.testing.assert_close(apply_temperature(logits, 1.0), logits)


def test_temperature_computes_in_float32():
    # float16 logits / 1e-4 overflow float16 (max 65504) to inf; in float32 they are exact.
    logits = torch.tensor([10.0, 9.0, -100.0], dtype=torch.float16)
    out = apply_temperature(logits, 1e-4)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([1e5, 9e4, -1e6]))


@pytest.mark.parametrize("t", [0.0, -1.0, float("inf"), float("nan")])
def test_temperature_rejects_non_positive(t):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        apply_temperature(torch.zeros(3), t)


# -- top_k_filter --------------------------------------------------------------------------

def test_top_k_keeps_ties():
    logits = torch.tensor([1.0, 3.0, 3.0, 2.0, 0.0])
    # k = 1 and k = 2: the k-th largest value is 3, and both 3s are kept.
    for k in (1, 2):
        torch.testing.assert_close(top_k_filter(logits, k), torch.tensor([NEG_INF, 3.0, 3.0, NEG_INF, NEG_INF]))
    torch.testing.assert_close(top_k_filter(logits, 3), torch.tensor([NEG_INF, 3.0, 3.0, 2.0, NEG_INF]))


def test_top_k_filters_each_row_and_keeps_all_when_k_is_large():
    logits = torch.tensor([[0.1, 0.4, 0.3], [5.0, -1.0, 2.0]])
    expected = torch.tensor([[NEG_INF, 0.4, 0.3], [5.0, NEG_INF, 2.0]])
    torch.testing.assert_close(top_k_filter(logits, 2), expected)
    torch.testing.assert_close(top_k_filter(logits, 3), logits)
    torch.testing.assert_close(top_k_filter(logits, 50), logits)


def test_top_k_rejects_k_below_one():
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        top_k_filter(torch.zeros(4), 0)


# -- top_p_filter --------------------------------------------------------------------------

def test_top_p_keeps_the_crossing_token():
    # Probabilities 0.1, 0.4, 0.2, 0.3 (vocabulary order). Sorted: 0.4, 0.3, 0.2, 0.1, with
    # cumulative mass 0.4, 0.7, 0.9, 1.0. For p = 0.5 the 0.3 token crosses p and stays.
    probs = torch.tensor([0.1, 0.4, 0.2, 0.3])
    logits = probs.log()
    out = top_p_filter(logits, 0.5)
    torch.testing.assert_close(out, torch.tensor([NEG_INF, math.log(0.4), NEG_INF, math.log(0.3)]))
    kept = torch.isfinite(top_p_filter(logits, 0.8))                       # crosses at 0.9
    assert kept.tolist() == [False, True, True, True]


def test_top_p_always_keeps_the_top_token_and_p_one_keeps_all():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 2.5, -1.0]])
    kept = torch.isfinite(top_p_filter(logits, 0.01))
    assert kept.tolist() == [[False, True, False], [False, True, False]]
    torch.testing.assert_close(top_p_filter(logits, 1.0), logits)


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5])
def test_top_p_rejects_p_outside_unit_interval(p):
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        top_p_filter(torch.zeros(4), p)


# -- apply_repetition_penalty --------------------------------------------------------------

def test_repetition_penalty_moves_seen_tokens_down():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    before = logits.clone()
    out = apply_repetition_penalty(logits, torch.tensor([0, 1, 1]), 2.0)
    # seen: 0 (positive, divided) and 1 (negative, multiplied); repeats count once.
    torch.testing.assert_close(out, torch.tensor([1.0, -2.0, 0.5, 3.0]))
    assert torch.equal(logits, before)            # input untouched
    torch.testing.assert_close(apply_repetition_penalty(logits, torch.tensor([0, 1]), 1.0), logits)


def test_repetition_penalty_rejects_non_positive():
    with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
        apply_repetition_penalty(torch.zeros(3), torch.tensor([0]), 0.0)


# -- sample_from_logits --------------------------------------------------------------------

def test_sample_from_logits_matches_the_softmax_frequencies():
    # 4000 draws: a frequency's standard deviation is sqrt(p(1-p)/n) <= 0.0079, so 0.03 is
    # about 4 sigma; the generator is fixed, so the test is deterministic anyway.
    probs = torch.tensor([0.5, 0.3, 0.2])
    g = torch.Generator().manual_seed(0)
    draws = torch.tensor([sample_from_logits(probs.log(), generator=g) for _ in range(4000)])
    freq = torch.bincount(draws, minlength=3).float() / 4000
    torch.testing.assert_close(freq, probs, rtol=0, atol=0.03)


def test_sample_from_logits_greedy_and_top_k_one_are_argmax():
    logits = torch.tensor([0.2, 1.5, -0.3, 1.4])
    assert sample_from_logits(logits, temperature=0.0) == 1
    g = torch.Generator().manual_seed(0)
    assert {sample_from_logits(logits, top_k=1, generator=g) for _ in range(20)} == {1}


def test_sample_from_logits_tiny_temperature_is_the_argmax_limit():
    # Decision: scaled logits holding +inf/NaN (logit / 1e-40 overflows float32) give the
    # argmax, the T -> 0 limit, never a RuntimeError from multinomial.
    g = torch.Generator().manual_seed(0)
    assert sample_from_logits(torch.tensor([1.0, 2.0, 0.5]), temperature=1e-40, generator=g) == 1
    assert sample_from_logits(torch.tensor([1.0, 2.0, float("-inf")]), temperature=1e-40, generator=g) == 1
    # float16 logits at T = 1e-4: computed in float32, exp(-1e4) = 0, so token 0 on every seed.
    half = torch.tensor([10.0, 9.0, -100.0], dtype=torch.float16)
    assert {sample_from_logits(half, temperature=1e-4, generator=g) for _ in range(20)} == {0}


# -- the model protocol and eval_mode (provided) ---------------------------------------------

class Crash(Exception):
    """Raised by a mock model on purpose (not a RuntimeError, so NotImplementedError never counts)."""


class CrashingRecorder(Recorder):
    def forward(self, ids):
        if self.calls:
            raise Crash("second call")
        return super().forward(ids)


class PlainLM:
    """Only the required part of LanguageModel: no training flag, no train()/eval()."""

    vocab_size, max_seq_len, device = V, 16, torch.device("cpu")

    def __call__(self, ids):
        return _successor_table()[ids]


def test_eval_mode_restores_modes_on_an_exception_and_skips_plain_models():
    a, b, plain = Recorder(torch.zeros(V, V)), Recorder(torch.zeros(V, V)).eval(), PlainLM()
    with pytest.raises(Crash):
        with eval_mode(a, b, plain, a):
            assert not a.training and not b.training
            raise Crash("inside")
    assert a.training and not b.training
    assert isinstance(plain, LanguageModel) and isinstance(a, LanguageModel)


def test_generate_restores_the_mode_when_the_model_raises():
    model = CrashingRecorder(_successor_table())
    assert model.training
    with pytest.raises(Crash):
        generate(model, [1], 5, temperature=0.0)
    assert model.training


def test_generate_accepts_a_plain_callable_model():
    assert generate(PlainLM(), [3], 4, temperature=0.0).tolist() == [3, 4, 5, 6, 7]


def test_generate_names_what_a_model_lacks():
    class NoVocab:
        max_seq_len, device = 4, torch.device("cpu")

        def __call__(self, ids):
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="model .*missing vocab_size"):
        generate(NoVocab(), [1], 2)


def test_as_token_ids_checks_the_vocabulary_range():
    assert as_token_ids(torch.tensor([0, 9]), vocab_size=V).tolist() == [0, 9]
    with pytest.raises(ValueError, match=r"ids holds token id -1, outside the vocabulary \[0, 10\)"):
        as_token_ids([3, -1], "ids", vocab_size=V)


# -- generate ------------------------------------------------------------------------------

def test_generate_greedy_is_argmax_chain():
    table = _random_table(1)
    model = Recorder(table)
    out = generate(model, [3, 7], 8, temperature=0.0)
    chain = [3, 7]
    for _ in range(8):                            # the bigram mock: next = argmax of the last row
        chain.append(int(table[chain[-1]].argmax()))
    assert out.tolist() == chain


def test_generate_seeded_is_reproducible():
    model = Recorder(torch.zeros(V, V))           # uniform over V = 10 tokens
    a = generate(model, [1], 20, generator=torch.Generator().manual_seed(0))
    b = generate(model, [1], 20, generator=torch.Generator().manual_seed(0))
    c = generate(model, [1], 20, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)                  # equal by chance with probability 10**-20


def test_generate_tiny_temperature_is_the_greedy_chain():
    table = _random_table(2)
    greedy = generate(Recorder(table), [3], 6, temperature=0.0)
    tiny = generate(Recorder(table), [3], 6, temperature=1e-40, generator=torch.Generator().manual_seed(0))
    assert tiny.tolist() == greedy.tolist()


def test_generate_on_a_device_keeps_inputs_together_and_float64_off_it():
    # A fake accelerator (tests/device_mocks.py): mixing CPU and device tensors, a CPU
    # generator on device tensors, or float64 on the device raise, as on CUDA/MPS.
    model = AccelTableLM(_random_table(3))
    expected = generate(Recorder(_random_table(3)), [1, 2], 6, temperature=0.8, top_k=5, top_p=0.9,
                        repetition_penalty=1.2, generator=torch.Generator().manual_seed(0))
    with FakeAccelerator():
        out = generate(model, [1, 2], 6, temperature=0.8, top_k=5, top_p=0.9, repetition_penalty=1.2,
                       generator=torch.Generator().manual_seed(0))
    assert type(out) is torch.Tensor and out.tolist() == expected.tolist()


def test_generate_crops_to_context_window():
    model = Recorder(_successor_table(), max_seq_len=4)
    out = generate(model, [0, 1, 2, 3, 4, 5], 3, temperature=0.0)
    assert out.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8]
    assert model.calls == [[2, 3, 4, 5], [3, 4, 5, 6], [4, 5, 6, 7]]     # the last max_seq_len tokens


def test_generate_stops_at_eos():
    model = Recorder(_successor_table())
    out = generate(model, [2], 10, temperature=0.0, eos_id=5)
    assert out.tolist() == [2, 3, 4, 5]           # eos emitted, included, then stop
    assert len(model.calls) == 3


def test_generate_returns_cpu_long_prompt_plus_new_tokens():
    model = Recorder(_successor_table())
    model.train()
    out = generate(model, torch.tensor([4, 5], dtype=torch.int32), 3, temperature=0.7, top_k=3, top_p=0.9,
                   repetition_penalty=1.3, generator=torch.Generator().manual_seed(0))
    assert out.dtype == torch.int64 and out.device.type == "cpu" and out.dim() == 1
    assert out.shape == (5,) and out[:2].tolist() == [4, 5]
    assert model.training                         # the mode is restored
    assert generate(model, [4, 5], 0).tolist() == [4, 5]


def test_generate_repetition_penalty_changes_the_greedy_choice():
    # Row 1 prefers token 1 (logit 2.0) over token 2 (1.5); token 1 was seen, so a penalty of
    # 2 halves it to 1.0 and token 2 wins.
    table = torch.zeros(V, V)
    table[1, 1], table[1, 2] = 2.0, 1.5
    model = Recorder(table)
    assert generate(model, [1], 1, temperature=0.0).tolist() == [1, 1]
    assert generate(model, [1], 1, temperature=0.0, repetition_penalty=2.0).tolist() == [1, 2]


def test_generate_repetition_penalty_covers_tokens_outside_the_window():
    # "Every token so far": token 1 sits only before the last max_seq_len = 4 tokens, so the model no
    # longer sees it, but the penalty still halves its logit (2.0 -> 1.0) and token 2 (1.5) wins. A
    # penalty over the cropped window alone would keep token 1.
    table = torch.zeros(V, V)
    table[0, 1], table[0, 2] = 2.0, 1.5
    model = Recorder(table, max_seq_len=4)
    prompt = [1, 0, 0, 0, 0]
    assert generate(model, prompt, 1, temperature=0.0).tolist() == prompt + [1]
    assert generate(model, prompt, 1, temperature=0.0, repetition_penalty=2.0).tolist() == prompt + [2]


@pytest.mark.parametrize("prompt, kwargs, match", [
    ([1], {"temperature": -0.5}, "temperature must be >= 0"),
    ([1], {"top_k": 0}, "top_k must be >= 1"),
    ([1], {"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ([1], {"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ([1], {"max_new_tokens": -1}, "max_new_tokens must be >= 0"),
    ([1], {"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
    ([], {}, "non-empty 1-D"),
    ([[1, 2]], {}, "non-empty 1-D"),
    ([1.7, 2.0], {}, "integer token ids"),             # floats are refused, never silently cast
    ([True, False], {}, "integer token ids"),
    ([1], {"temperature": float("nan")}, "temperature must be >= 0"),
    ([1], {"temperature": float("inf")}, "temperature must be >= 0 and finite"),
    ([1, -1], {}, r"prompt_ids holds token id -1, outside the vocabulary \[0, 10\)"),  # not read as token 9
    ([1, 10], {}, r"prompt_ids holds token id 10, outside the vocabulary \[0, 10\)"),
])
def test_generate_rejects_invalid_arguments(prompt, kwargs, match):
    kwargs = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate(Recorder(_successor_table()), prompt, **kwargs)
