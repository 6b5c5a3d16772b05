"""Beyond (specdec): property tests and edge cases beyond the 20-test contract file.

Hypothesis draws random table-lookup targets and drafters (``tests/specdec_mocks.py``),
draft lengths, budgets, windows and end-of-sequence ids; whatever it draws, speculative
decoding must emit exactly the target's greedy chain, with consistent counters.
"""

from __future__ import annotations

import pytest
import torch
from device_mocks import (
    FAKE_DEVICE,
    AccelTableLM,
    AccelTensor,
    DeviceMismatch,
    FakeAccelerator,
    Float64OnDevice,
    to_accel,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from specdec_mocks import SumModLM, TableLM, chain_table, follow_chain, random_next_of, windowed_greedy

from g2c.specdec import (
    SpecStats,
    draft_greedy,
    draft_room,
    greedy_verify,
    mtp_propose,
    speculative_generate,
    speculative_verify,
)

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def successor_maps(draw, vocab):
    return draw(st.lists(st.integers(0, vocab - 1), min_size=vocab, max_size=vocab))


@st.composite
def spec_cases(draw):
    vocab = draw(st.integers(2, 12))
    target_next = draw(successor_maps(vocab))
    # Drafters: unrelated, perfect, or the target's map with a few entries changed.
    kind = draw(st.sampled_from(["random", "perfect", "perturbed"]))
    if kind == "random":
        drafter_next = draw(successor_maps(vocab))
    else:
        drafter_next = list(target_next)
        if kind == "perturbed":
            for v in draw(st.lists(st.integers(0, vocab - 1), max_size=3)):
                drafter_next[v] = draw(st.integers(0, vocab - 1))
    prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=6))
    return dict(
        vocab=vocab, target_next=target_next, drafter_next=drafter_next, prompt=prompt,
        k=draw(st.integers(1, 8)), budget=draw(st.integers(0, 25)),
        eos_id=draw(st.one_of(st.none(), st.integers(0, vocab - 1))),
        target_window=draw(st.integers(2, 10)), drafter_window=draw(st.integers(1, 10)),
        seed=draw(st.integers(0, 2**16)),
    )


@SETTINGS
@given(spec_cases())
def test_speculative_generate_is_always_the_target_greedy_chain(case):
    g = torch.Generator().manual_seed(case["seed"])
    # A table LM ignores the context, so its greedy chain does not depend on the window:
    # cropping to any window must still reproduce it exactly.
    target = TableLM(chain_table(case["target_next"], generator=g), max_seq_len=case["target_window"])
    drafter = TableLM(chain_table(case["drafter_next"], generator=g), max_seq_len=case["drafter_window"])
    out, stats = speculative_generate(target, drafter, case["prompt"], case["budget"], k=case["k"],
                                      eos_id=case["eos_id"])
    expected = follow_chain(case["target_next"], case["prompt"][-1], case["budget"], eos_id=case["eos_id"])
    assert out.tolist() == case["prompt"] + expected
    # Counter invariants.
    assert stats.generated == len(expected)
    assert stats.target_passes == len(target.calls)
    assert 0 <= stats.accepted <= min(stats.drafted, stats.generated)
    assert stats.target_passes <= stats.generated <= stats.target_passes * (case["k"] + 1)
    assert stats.drafted <= case["k"] * stats.target_passes
    assert all(call.shape[1] <= case["target_window"] for call in target.calls)
    if case["budget"] and case["target_next"] == case["drafter_next"] and case["eos_id"] is None:
        assert stats.acceptance_rate == (1.0 if stats.drafted else 0.0)
        # The window-edge rule (draft_room): a pass drafts min(k, budget left, window - context);
        # a perfect drafter then emits every draft plus the bonus token.
        passes, length, made = 0, len(case["prompt"]), 0
        while made < case["budget"]:
            drafts = max(0, min(case["k"], case["budget"] - made, case["target_window"] - length))
            emitted = min(drafts + 1, case["budget"] - made)
            passes, length, made = passes + 1, length + emitted, made + emitted
        assert stats.target_passes == passes


@SETTINGS
@given(st.integers(1, 6), st.integers(2, 9), st.integers(0, 2**16))
def test_greedy_verify_agrees_with_a_reference_loop(k, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(k + 1, vocab, generator=g)
    choice = logits.argmax(-1)
    # Drafts that copy the target's choice for a random prefix, then differ.
    draft = choice[:k].clone()
    cut = int(torch.randint(0, k + 1, (1,), generator=g))
    if cut < k:
        draft[cut] = (draft[cut] + 1) % vocab
    assert greedy_verify(draft, logits) == (cut, int(choice[cut]))


@SETTINGS
@given(st.integers(1, 5), st.integers(2, 8), st.integers(0, 2**16))
def test_speculative_verify_returns_valid_tokens_without_nan(k, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    # Sparse random distributions: many exact zeros in p and in q.
    p = torch.rand(k + 1, vocab, generator=g) * (torch.rand(k + 1, vocab, generator=g) < 0.5)
    p[:, 0] += 1e-3                                                         # every row has mass
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(k, vocab, generator=g) * (torch.rand(k, vocab, generator=g) < 0.5)
    q[:, -1] += 1e-3
    q = q / q.sum(-1, keepdim=True)
    draft = torch.randint(0, vocab, (k,), generator=g)                      # may have q(x) = 0
    num_accepted, token = speculative_verify(draft, p, q, generator=g)
    assert 0 <= num_accepted <= k and 0 <= token < vocab
    assert p[num_accepted, token] > 0                                       # only tokens the target can emit
    for i in range(num_accepted):
        assert p[i, draft[i]] > 0                                           # p(x) = 0 is never accepted


def test_speculative_verify_zero_draft_probability_accepts_when_target_allows():
    # q(x) = 0 but p(x) > 0: min(1, p/q) -> 1, so the draft is accepted (no division, no NaN).
    p = torch.tensor([[0.2, 0.8], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0]])
    for seed in range(20):
        num_accepted, token = speculative_verify(torch.tensor([1]), p, q,
                                                 generator=torch.Generator().manual_seed(seed))
        assert num_accepted == 1 and token in (0, 1)


def test_speculative_verify_all_zero_residual_falls_back_to_target():
    # q >= p everywhere (rows that sum to 1 within the 1e-3 tolerance the verifier allows, as
    # rounding leaves them): a rejection is possible (u q(x) >= p(x), probability 1 - p/q, about
    # 0.18% here), yet max(0, p - q) is all zero. The fallback samples from p instead of 0/0.
    p = torch.tensor([[0.49955, 0.49955, 0.0], [0.3, 0.3, 0.4]])
    q = torch.tensor([[0.50045, 0.50045, 0.0]])
    seen = set()
    for seed in range(4000):
        num_accepted, token = speculative_verify(torch.tensor([0]), p, q,
                                                 generator=torch.Generator().manual_seed(seed))
        if num_accepted == 0:
            seen.add(token)
    assert seen and seen <= {0, 1}


def test_speculative_verify_rejects_bad_shapes():
    p, q = torch.full((3, 4), 0.25), torch.full((2, 4), 0.25)
    with pytest.raises(ValueError, match="draft_ids"):
        speculative_verify(torch.tensor([], dtype=torch.long), p, q)
    with pytest.raises(ValueError, match=r"target_probs must have shape \(3, V\)"):
        speculative_verify(torch.tensor([1, 2]), p[:2], q)
    with pytest.raises(ValueError, match=r"draft_probs must have shape \(2, V\)"):
        speculative_verify(torch.tensor([1, 2]), p, p)
    with pytest.raises(ValueError, match="share one vocabulary"):
        speculative_verify(torch.tensor([1, 2]), p, torch.full((2, 5), 0.2))


def test_spec_stats_record_rejects_impossible_counts():
    stats = SpecStats()
    with pytest.raises(ValueError, match="must be >= 0"):
        stats.record(drafted=-1, accepted=0, generated=1)
    with pytest.raises(ValueError, match="accepted=3 must be <= drafted=2"):
        stats.record(drafted=2, accepted=3, generated=3)
    with pytest.raises(ValueError, match="only emitted drafts count"):
        stats.record(drafted=4, accepted=3, generated=2)
    assert stats.target_passes == 0                                        # nothing was recorded


def test_draft_greedy_rejects_bad_inputs():
    drafter = TableLM(torch.eye(4))
    with pytest.raises(ValueError, match="ctx_ids"):
        draft_greedy(drafter, [], 2)
    with pytest.raises(ValueError, match="k must be >= 1"):
        draft_greedy(drafter, [1], 0)


def test_speculative_generate_rejects_non_integer_prompt_and_k():
    target = drafter = TableLM(torch.eye(4))
    with pytest.raises(ValueError, match="integer token ids"):
        speculative_generate(target, drafter, torch.tensor([1.7, 2.0]), 3)
    with pytest.raises(TypeError, match="k must be >= 1"):          # a float is a wrong type, never truncated
        speculative_generate(target, drafter, [1], 3, k=2.5)


def test_speculative_generate_rejects_tiny_target_window():
    target, drafter = TableLM(torch.eye(4), max_seq_len=1), TableLM(torch.eye(4))
    with pytest.raises(ValueError, match="max_seq_len"):
        speculative_generate(target, drafter, [1], 3)


def test_speculative_generate_reports_each_pass_and_restores_modes():
    g = torch.Generator().manual_seed(0)
    target = TableLM(chain_table([1, 2, 3, 0], generator=g))
    drafter = TableLM(chain_table([1, 2, 0, 0], generator=g)).eval()
    passes = []
    out, stats = speculative_generate(target, drafter, [0], 9, k=3,
                                      on_pass=lambda emitted, n: passes.append((list(emitted), n)))
    assert [t for emitted, _ in passes for t in emitted] == out.tolist()[1:]
    assert sum(n for _, n in passes) == stats.accepted and len(passes) == stats.target_passes
    assert all(0 <= n <= len(emitted) for emitted, n in passes)
    assert target.training and not drafter.training                         # modes restored


def test_specstats_add_pools_counters_and_rates():
    a, b = SpecStats(), SpecStats()
    a.record(drafted=4, accepted=3, generated=4)
    b.record(drafted=2, accepted=0, generated=1)
    b.record(drafted=2, accepted=2, generated=3)
    total = sum([a, b], SpecStats())
    assert (total.target_passes, total.drafted, total.accepted, total.generated) == (3, 8, 5, 8)
    assert total.acceptance_rate == 5 / 8 and total.tokens_per_pass == 8 / 3
    assert (a.target_passes, b.target_passes) == (1, 2)      # operands unchanged
    with pytest.raises(TypeError):
        a + 1


# -- token ids outside the vocabulary --------------------------------------------------------
# Decision: every entry point taking ids refuses an id outside [0, V) with a ValueError that
# names the argument and the range. Without it -1 indexes from the end (read as token V-1:
# the table row of the LAST token, accepted on every seed) and V raises a bare IndexError.

P3 = torch.tensor([[0.0, 0.0, 1.0], [1 / 3, 1 / 3, 1 / 3]])
Q3 = torch.tensor([[0.0, 0.0, 1.0]])


@pytest.mark.parametrize("bad", [-1, 5])
def test_verifiers_reject_draft_ids_outside_the_vocabulary(bad):
    pattern = rf"draft_ids holds token id {bad}, outside the vocabulary \[0, 3\)"
    with pytest.raises(ValueError, match=pattern):
        speculative_verify(torch.tensor([bad]), P3, Q3, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=pattern):
        greedy_verify(torch.tensor([bad]), torch.zeros(2, 3))


@pytest.mark.parametrize("bad", [-1, 4])
def test_speculative_generate_rejects_prompt_ids_outside_the_vocabulary(bad):
    target = drafter = TableLM(torch.eye(4))
    with pytest.raises(ValueError, match=rf"prompt_ids holds token id {bad}, outside the vocabulary \[0, 4\)"):
        speculative_generate(target, drafter, [1, bad], 3)


@pytest.mark.parametrize("bad", [-1, 4])
def test_draft_greedy_and_mtp_propose_reject_ids_outside_the_vocabulary(bad):
    # Both checks are provided code (as_token_ids with vocab_size) and run before any model call.
    model = TableLM(torch.eye(4))
    with pytest.raises(ValueError, match=rf"ctx_ids holds token id {bad}, outside the vocabulary \[0, 4\)"):
        draft_greedy(model, [0, bad], 2)
    with pytest.raises(ValueError, match=rf"ctx_ids holds token id {bad}, outside the vocabulary \[0, 4\)"):
        mtp_propose(model, None, [0, bad])
    assert model.calls == []


# -- modes restored on an exception, and the model protocol ------------------------------------
class Crash(Exception):
    """Raised by a mock model on purpose (not a RuntimeError, so NotImplementedError never counts)."""


class CrashingLM(TableLM):
    """A TableLM that raises on its second call, like a Ctrl-C in the middle of a loop."""

    def __call__(self, ids):
        if len(self.calls) >= 1:
            raise Crash("second call")
        return super().__call__(ids)


@pytest.mark.parametrize("crashing", ["target", "drafter"])
def test_speculative_generate_restores_modes_when_a_model_raises(crashing):
    g = torch.Generator().manual_seed(0)
    table = chain_table([1, 2, 3, 0], generator=g)
    target = (CrashingLM if crashing == "target" else TableLM)(table)
    drafter = (CrashingLM if crashing == "drafter" else TableLM)(table)
    assert target.training and drafter.training
    with pytest.raises(Crash):
        speculative_generate(target, drafter, [0], 6, k=1)
    assert target.training and drafter.training                             # both back in train mode
    target.eval()
    target.calls.clear()
    drafter.calls.clear()
    with pytest.raises(Crash):
        speculative_generate(target, drafter, [0], 6, k=1)
    assert not target.training and drafter.training                          # each gets its own mode back


def test_draft_greedy_restores_the_mode_when_the_drafter_raises():
    drafter = CrashingLM(torch.eye(4))
    with pytest.raises(Crash):
        draft_greedy(drafter, [0], 3)
    assert drafter.training


class PlainLM:
    """The bare LanguageModel protocol: vocab_size, max_seq_len, device and __call__; no modes."""

    def __init__(self, next_of: list[int]) -> None:
        self.table = chain_table(next_of, generator=torch.Generator().manual_seed(1))
        self.vocab_size, self.max_seq_len, self.device = len(next_of), 8, torch.device("cpu")

    def __call__(self, ids):
        return self.table[ids]


def test_speculative_generate_accepts_a_plain_callable_model():
    target, drafter = PlainLM([1, 2, 3, 0]), PlainLM([1, 2, 0, 0])
    out, stats = speculative_generate(target, drafter, [0], 7, k=2)
    assert out.tolist() == [0] + follow_chain([1, 2, 3, 0], 0, 7)
    assert stats.generated == 7
    assert draft_greedy(drafter, [0], 3).tolist() == [1, 2, 0]


def test_speculative_generate_names_what_a_model_lacks():
    class NoWindow:
        vocab_size, device = 4, torch.device("cpu")

        def __call__(self, ids):
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="target .*missing max_seq_len"):
        speculative_generate(NoWindow(), TableLM(torch.eye(4)), [0], 3)
    with pytest.raises(TypeError, match="drafter .*missing max_seq_len"):
        draft_greedy(NoWindow(), [0], 3)


# -- devices: graded on a fake accelerator (no GPU needed) -------------------------------------
# ``device_mocks.FakeAccelerator`` makes AccelTensors behave like tensors on a GPU/MPS device:
# mixing them with CPU tensors, a CPU generator on them, or float64 on them raises.

def test_fake_accelerator_catches_what_a_gpu_would():
    with FakeAccelerator():
        ids = to_accel(torch.arange(3))
        with pytest.raises(DeviceMismatch):
            ids == torch.arange(3)                                          # noqa: B015
        with pytest.raises(Float64OnDevice):
            to_accel(torch.ones(3)).double()
        with pytest.raises(DeviceMismatch):
            torch.multinomial(to_accel(torch.ones(3)), 1, generator=torch.Generator())
        assert torch.equal(to_accel(torch.ones(3)).cpu().double(), torch.ones(3, dtype=torch.float64))
        assert (ids == torch.arange(3).to(ids.device)).all()


def test_greedy_verify_stays_on_the_inputs_device():
    # Inputs on one (fake) accelerator: comparing them there is right; pulling one argument to
    # the CPU and comparing it with the other fails on CUDA/MPS and here.
    logits = torch.tensor([[0.0, 5.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 5.0]])  # argmax 1, 0, 2
    with FakeAccelerator():
        assert greedy_verify(to_accel(torch.tensor([1, 2])), to_accel(logits)) == (1, 0)
        assert greedy_verify(to_accel(torch.tensor([1, 0])), to_accel(logits)) == (2, 2)


def test_speculative_verify_computes_on_the_cpu_in_float64():
    # Tables on the accelerator: .double() before .cpu() (float64 on the device, which MPS
    # lacks) or a CPU generator drawing next to device tensors raise. Same seed, same result
    # as on the CPU.
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(4, 6, generator=g), -1)
    q = torch.softmax(torch.randn(3, 6, generator=g), -1)
    draft = torch.tensor([1, 4, 2])
    for seed in range(5):
        expected = speculative_verify(draft, p, q, generator=torch.Generator().manual_seed(seed))
        with FakeAccelerator():
            got = speculative_verify(to_accel(draft), to_accel(p), to_accel(q),
                                     generator=torch.Generator().manual_seed(seed))
        assert got == expected


def test_speculative_generate_hands_the_verifier_one_device(monkeypatch):
    import g2c.specdec.generate as loop

    seen = []
    real = loop.greedy_verify

    def spy(draft_ids, target_logits):
        seen.append((isinstance(draft_ids, AccelTensor), isinstance(target_logits, AccelTensor)))
        return real(draft_ids, target_logits)

    monkeypatch.setattr(loop, "greedy_verify", spy)
    g = torch.Generator().manual_seed(0)
    target_next, drafter_next = [1, 2, 3, 0, 2], [1, 2, 0, 0, 2]
    target = AccelTableLM(chain_table(target_next, generator=g))
    drafter = AccelTableLM(chain_table(drafter_next, generator=g))
    with FakeAccelerator():
        out, stats = speculative_generate(target, drafter, [0], 9, k=3)
    assert out.tolist() == [0] + follow_chain(target_next, 0, 9)
    assert type(out) is torch.Tensor                                        # the output is a CPU tensor
    assert len(seen) == stats.target_passes
    assert all(draft_on_device == rows_on_device for draft_on_device, rows_on_device in seen), seen


def test_the_whole_stack_runs_on_a_device_without_float64_or_mixing():
    # A small TransformerLM and MTPHead moved to the fake accelerator: every op of the
    # transformer, generate, speculative_generate and mtp_propose must keep its tensors on one
    # device and create no float64 there, and give the CPU results.
    from g2c.sampling import generate
    from g2c.specdec import MTPHead
    from g2c.transformer import TransformerLM

    g = torch.Generator().manual_seed(0)
    base = TransformerLM(32, 16, 2, 2, 16, generator=g)
    head = MTPHead(base, generator=g)
    expected = (mtp_propose(base, head, [1, 2, 3]), generate(base, [1, 2], 5, temperature=0.0).tolist(),
                speculative_generate(base, base, [1, 2], 5, k=2)[0].tolist())
    with FakeAccelerator():
        base.to(FAKE_DEVICE)
        head.to(FAKE_DEVICE)
        assert isinstance(base.token_embed.weight, AccelTensor)
        got = (mtp_propose(base, head, [1, 2, 3]), generate(base, [1, 2], 5, temperature=0.0).tolist(),
               speculative_generate(base, base, [1, 2], 5, k=2)[0].tolist())
    assert got == expected


def test_verifiers_refuse_nan_scores_and_non_probabilities():
    draft = torch.tensor([1])
    with pytest.raises(ValueError, match="target_logits holds NaN"):
        greedy_verify(draft, torch.tensor([[0.0, float("nan"), 1.0], [1.0, 0.0, 0.0]]))
    good = torch.tensor([[0.2, 0.5, 0.3], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[0.1, 0.8, 0.1]])
    for bad, what in [(torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), "a zero row"),
                      (torch.tensor([[-0.1, 0.6, 0.5], [1.0, 0.0, 0.0]]), "a negative entry"),
                      (torch.tensor([[float("inf"), 0.0, 0.0], [1.0, 0.0, 0.0]]), "an infinite entry")]:
        with pytest.raises(ValueError, match="target_probs must hold probabilities"):
            speculative_verify(draft, bad, q, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="draft_probs must hold probabilities"):
        speculative_verify(draft, good, torch.tensor([[0.0, 0.0, 0.0]]), generator=torch.Generator().manual_seed(0))


# -- the window edge ------------------------------------------------------------------------
# SumModLM's next token is the sum of the ids it sees, mod 7: unlike a table LM, any row that
# loses context (a crop at the window edge) changes the output. Window 8, prompt [1, 2].
# 7 new tokens is the longest run whose every token's context fits the window
# (prompt + output = window + 1); 15 runs well past it.
WINDOW, EDGE_PROMPT = 8, [1, 2]


def test_sum_mod_mock_follows_its_rule():
    model = SumModLM(max_seq_len=WINDOW)
    ids = torch.tensor([[1, 2, 3, 6, 5, 3, 6, 5]])
    assert model(ids)[0].argmax(-1).tolist() == [sum(ids[0, :t + 1].tolist()) % 7 for t in range(8)]
    assert windowed_greedy(model, EDGE_PROMPT, 7) == [1, 2, 3, 6, 5, 3, 6, 5, 3]    # issue 20's example
    assert windowed_greedy(model, EDGE_PROMPT, 8)[-1] == (sum([2, 3, 6, 5, 3, 6, 5, 3]) % 7)   # slid by one


def test_draft_room_is_the_window_edge_rule():
    assert [draft_room(4, n, 8) for n in (2, 4, 5, 7, 8, 12)] == [4, 4, 3, 1, 0, 0]
    assert draft_room(0, 2, 8) == 0 and draft_room(3, 2, 4) == 2


@pytest.mark.parametrize("k", range(1, 7))
def test_speculative_generate_equals_generate_at_the_window_edge(k):
    """Every k, up to the window edge and past it: the output is plain greedy decoding with
    module 11's crop (the rule-only oracle ``windowed_greedy``). Before the shared rule the
    loop cropped the context to make room for k drafts, and its rows saw less than plain
    decoding does (k = 3 gave [..., 3, 5, 3, 6] for [..., 3, 6, 5, 3]). A perfect drafter is
    never rejected, and past the window every pass is a plain step (no drafts)."""
    target = SumModLM(max_seq_len=WINDOW)
    g = torch.Generator().manual_seed(k)
    drafters = {"perfect": SumModLM(max_seq_len=WINDOW), "short window": SumModLM(max_seq_len=3),
                "table": TableLM(chain_table(random_next_of(7, g), generator=g), max_seq_len=WINDOW)}
    for name, drafter in drafters.items():
        for n in (7, 15):
            out, stats = speculative_generate(target, drafter, EDGE_PROMPT, n, k=k)
            assert out.tolist() == windowed_greedy(target, EDGE_PROMPT, n), f"{name} drafter, {n} tokens"
            if name == "perfect":
                assert stats.acceptance_rate == 1.0
                plain = n - (WINDOW + 1 - len(EDGE_PROMPT))          # tokens whose context slid
                assert stats.target_passes >= plain + 1 and stats.generated == n
    long_prompt = [3, 1, 4, 1, 5, 2, 6, 5, 3, 5]                          # longer than the window
    out, stats = speculative_generate(target, drafters["perfect"], long_prompt, 5, k=k)
    assert out.tolist() == windowed_greedy(target, long_prompt, 5) and stats.drafted == 0
