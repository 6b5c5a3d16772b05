"""Beyond (specdec-serving): B rows through the engine's round (provided ``batched_speculative_sample``).

Greedy: every row equals plain greedy decoding of its prompt alone (B = 1..4, ragged prompts, per-row
k with 0, LM and n-gram drafters). Sampled: each row has the plain law (seeded chi-square against the
exact law of the first two tokens), a test that also rejects rows sharing one random stream and one
acceptance uniform per batch; and a row with seed s emits what the engine emits alone with seed s.
"""

from __future__ import annotations

import pytest
import torch
from test_specdec_serving import _chi_square_p

import g2c.specdec.serving.batched as batched_module
from g2c.sampling.generate import generate
from g2c.specdec.sampling.draft import Draft
from g2c.specdec.sampling.drafters import LMDrafter, NGramDrafter
from g2c.specdec.sampling.loop import speculative_sample
from g2c.specdec.serving import StaticBatchK, batched_speculative_sample
from g2c.transformer import TransformerLM


def _lm(vocab: int, seed: int, *, dim: int = 16, layers: int = 1, spread: float = 3.0) -> TransformerLM:
    model = TransformerLM(vocab, dim, layers, 2, 48, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.token_embed.weight.mul_(spread)
    return model.eval()


class _ChainDrafter:
    """A cheap chain drafter: a fixed chain (deterministic, q one-hot) or i.i.d. draws from a fixed q
    with the row's generator (q rows reported)."""

    def __init__(self, chain, q=None):
        self.chain, self.q = list(chain), q
        self.vocab_size = 8

    def start(self, prompt_ids, *, sampler, generator):
        self.g = generator

    def propose(self, context_ids, k):
        if self.q is None:
            return Draft(torch.tensor(self.chain[:k]))
        return Draft(torch.multinomial(self.q, k, replacement=True, generator=self.g), self.q.expand(k, -1).clone())

    def commit(self, context_ids, num_accepted, *, target_hidden=None):
        pass


# --- greedy: token for token -------------------------------------------------------------------

PROMPTS = [[1, 2, 3, 4, 5], [6], [7, 3, 7, 3], [2, 9, 2]]


@pytest.mark.parametrize("batch", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["lm", "lm-cached", "ngram", "mixed"])
def test_batched_rows_equal_plain_greedy(batch, kind):
    target, draft_model = _lm(12, 1, layers=2), _lm(12, 2, dim=8)
    make = {"lm": lambda b: LMDrafter(draft_model), "lm-cached": lambda b: LMDrafter(draft_model, use_cache=True),
            "ngram": lambda b: NGramDrafter(),
            "mixed": lambda b: [NGramDrafter(), LMDrafter(draft_model, use_cache=True), LMDrafter(draft_model),
                                NGramDrafter(prompt_lookup_max=2)][b]}[kind]
    prompts = PROMPTS[:batch]
    ks = [3, 0, 4, 1][:batch]                       # per-row k; row 1 takes plain steps
    res = batched_speculative_sample(target, [make(b) for b in range(batch)], prompts, 10, k=ks, temperature=0.0)
    for p, out in zip(prompts, res.outputs):
        assert out.tolist() == generate(target, torch.tensor(p), 10, temperature=0.0).tolist()
    assert res.target_passes == max(len(r) for r in res.rounds)
    if batch > 1:
        assert all(a == 0 for a, _ in res.rounds[1])                  # k = 0: never a draft
    if kind != "ngram":
        assert sum(a for a, _ in res.rounds[0]) > 0                   # row 0 does accept drafts


def test_batched_rows_stop_at_eos_and_budget_on_their_own():
    target, draft_model = _lm(12, 1, layers=2), _lm(12, 2, dim=8)
    plain = [generate(target, torch.tensor(p), 12, temperature=0.0).tolist() for p in PROMPTS]
    eos = plain[0][len(PROMPTS[0]) + 3]                               # row 0's 4th new token
    res = batched_speculative_sample(target, lambda: LMDrafter(draft_model), PROMPTS, 12, k=3, temperature=0.0,
                                     eos_id=eos)
    for p, want, out in zip(PROMPTS, plain, res.outputs):
        new = want[len(p):]
        cut = new[:new.index(eos) + 1] if eos in new else new
        assert out.tolist() == p + cut
    # a controller's k (the lab's hook) for all rows, k = 0 included: still plain greedy per row
    res = batched_speculative_sample(target, lambda: NGramDrafter(), PROMPTS, 12, controller=StaticBatchK(0),
                                     temperature=0.0)
    assert [o.tolist() for o in res.outputs] == plain and res.target_passes == 12


def test_batched_rows_reach_the_window_edge():
    """prompt + budget = max_seq_len + 1 on the longest row: its room caps every row's k (down to plain
    steps), and every row still equals plain greedy; max_new_tokens = 0 runs no pass."""
    target, draft_model = _lm(12, 1, layers=2), _lm(12, 2, dim=8)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] * 3 + [1, 2, 3, 4, 5, 6, 7], [3], [4, 5]]      # 40, 1, 2 tokens
    drafters = [LMDrafter(draft_model), NGramDrafter(), LMDrafter(draft_model, use_cache=True)]
    res = batched_speculative_sample(target, drafters, prompts, 9, k=[4, 4, 2], temperature=0.0)
    for p, out in zip(prompts, res.outputs):
        assert out.tolist() == generate(target, torch.tensor(p), 9, temperature=0.0).tolist()
    none = batched_speculative_sample(target, lambda: NGramDrafter(), prompts, 0)
    assert [o.tolist() for o in none.outputs] == prompts and none.target_passes == 0
    with pytest.raises(ValueError, match="max_seq_len"):
        batched_speculative_sample(target, lambda: NGramDrafter(), prompts, 10)


# --- sampled: the plain law per row --------------------------------------------------------------

LAW_T, LAW_PROMPT = 0.5, [1, 5, 2]


@torch.no_grad()
def _law_setup():
    """A target, the exact law of its first two tokens after LAW_PROMPT at temperature LAW_T, and its
    greedy chain (the deterministic draft)."""
    target = _lm(8, 4)
    p1 = torch.softmax(target(torch.tensor([LAW_PROMPT]))[0, -1].double() / LAW_T, -1)
    law = {}
    for a in range(8):
        p2 = torch.softmax(target(torch.tensor([LAW_PROMPT + [a]]))[0, -1].double() / LAW_T, -1)
        law.update({(a, b): float(p1[a] * p2[b]) for b in range(8)})
    first = int(p1.argmax())
    second = max(range(8), key=lambda b: law[(first, b)])
    return target, law, [first, second]


def _batched_counts(make_drafter, seeds, *, batch: int, batches: int, on_round=None) -> dict:
    """Counts of the first two new tokens of ``batch`` rows on LAW_PROMPT, over ``batches`` batches (an
    extra ragged row with k = 0 rides along, not counted); ``seeds(r)`` gives batch r's per-row seeds."""
    target, _, chain = _law_setup()
    counts: dict[tuple, int] = {}
    for r in range(batches):
        gens = [torch.Generator().manual_seed(s) for s in seeds(r)] + [torch.Generator().manual_seed(10**6 + r)]
        res = batched_speculative_sample(target, [make_drafter(chain) for _ in range(batch + 1)],
                                         [LAW_PROMPT] * batch + [[3, 4]], 2, k=[2] * batch + [0],
                                         temperature=LAW_T, generators=gens, on_round=on_round)
        for out in res.outputs[:batch]:
            key = tuple(out[len(LAW_PROMPT):].tolist())
            counts[key] = counts.get(key, 0) + 1
    return counts


# Tolerances: each run is seeded, so its p-value is a fixed number. Under the right law p is uniform
# on [0, 1], so the pass threshold 1e-3 would fail one seed in a thousand. The correct loop gives p =
# 0.87 (deterministic draft, 256 rows) and 0.42 (sampled draft with q rows, 256 rows) here; the
# shared stream gives p = 1e-32 (128 rows), one uniform per batch p = 4e-22 (384 rows), so the
# thresholds 1e-3 and 1e-6 sit far from both. Both mutants keep each row's marginal law in
# expectation; what they break is the independence of the rows, which the pooled counts see as
# overdispersion: identical prompts and drafts make every row of a batch move together.


def test_batched_sampling_has_the_plain_law_per_row():
    _, law, _ = _law_setup()
    assert abs(sum(law.values()) - 1) < 1e-9 and max(law.values()) > 0.25   # a peaked law: drafts get accepted
    counts = _batched_counts(lambda chain: _ChainDrafter(chain), lambda r: [1000 * r + b for b in range(32)],
                             batch=32, batches=8)
    assert _chi_square_p(counts, law, 32 * 8) > 1e-3
    q = torch.softmax(torch.arange(8.0) / 3, 0)                        # a sampled draft with its q rows
    counts = _batched_counts(lambda chain: _ChainDrafter(chain, q), lambda r: [1000 * r + b for b in range(32)],
                             batch=32, batches=8)
    assert _chi_square_p(counts, law, 32 * 8) > 1e-3


def test_law_test_rejects_one_random_stream_for_all_rows():
    # the mistake: every row draws the same stream (one seed for the batch, copied per row)
    _, law, _ = _law_setup()
    counts = _batched_counts(lambda chain: _ChainDrafter(chain), lambda r: [r] * 32, batch=32, batches=4)
    assert _chi_square_p(counts, law, 32 * 4) < 1e-6


def test_law_test_rejects_one_acceptance_uniform_per_batch(monkeypatch):
    # the mistake: one uniform per draft position per round, shared by every row (per-batch acceptance);
    # the residual and bonus samples still come from each row's own generator
    _, law, _ = _law_setup()
    shared = {"u": None, "g": torch.Generator().manual_seed(5)}

    def one_uniform_verify(draft_ids, draft_probs, target_logits, *, sampler, generator):
        if shared["u"] is None:
            shared["u"] = torch.rand(8, generator=shared["g"])
        p = sampler.probs(target_logits)                                # (k'+1, V); q one-hot at the drafts
        for i, x in enumerate(draft_ids.tolist()):
            if shared["u"][i] >= p[i, x]:
                residual = p[i].clone()
                residual[x] = 0.0
                return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        return draft_ids.numel(), int(torch.multinomial(p[-1], 1, generator=generator))

    monkeypatch.setattr(batched_module, "verify_round", one_uniform_verify)
    counts = _batched_counts(lambda chain: _ChainDrafter(chain), lambda r: [1000 * r + b for b in range(32)],
                             batch=32, batches=12, on_round=lambda *a: shared.update(u=None))
    assert _chi_square_p(counts, law, 32 * 12) < 1e-6


def test_batched_rows_equal_the_engine_alone_with_the_same_seed():
    """Per row the draws come in the engine's order from the row's own generator: row b with seed s emits
    what ``speculative_sample`` emits alone with seed s (a shared generator would break this)."""
    target, draft_model = _lm(12, 1, layers=2, spread=2.0), _lm(12, 2, dim=8, spread=2.0)
    prompts, ks, seeds = PROMPTS[:3], [3, 2, 1], [7, 8, 9]
    drafters = [LMDrafter(draft_model, sample=True), NGramDrafter(), LMDrafter(draft_model, sample=True,
                                                                                use_cache=True)]
    res = batched_speculative_sample(target, drafters, prompts, 8, k=ks, temperature=1.0,
                                     generators=[torch.Generator().manual_seed(s) for s in seeds])
    alone = [LMDrafter(draft_model, sample=True), NGramDrafter(), LMDrafter(draft_model, sample=True, use_cache=True)]
    for p, k, s, d, out in zip(prompts, ks, seeds, alone, res.outputs):
        want, _ = speculative_sample(target, d, p, 8, k=k, temperature=1.0, generator=torch.Generator().manual_seed(s))
        assert out.tolist() == want.tolist()


# --- bad input ----------------------------------------------------------------------------------


def test_batched_engine_rejects_bad_input():
    target = _lm(8, 1)
    ngram = lambda: NGramDrafter()                                      # noqa: E731
    with pytest.raises(ValueError, match="generators has 1 entries for 2 prompts"):
        batched_speculative_sample(target, ngram, [[1], [2]], 3, generators=[torch.Generator()])
    g = torch.Generator()
    with pytest.raises(ValueError, match=r"generators\[1\] is the same object"):
        batched_speculative_sample(target, ngram, [[1], [2]], 3, generators=[g, g])
    with pytest.raises(TypeError, match="one CPU torch.Generator per row"):
        batched_speculative_sample(target, ngram, [[1], [2]], 3, generators=[g, None])
    with pytest.raises(ValueError, match=r"prompts\[1\] must be a non-empty"):
        batched_speculative_sample(target, ngram, [[1], []], 3)
    with pytest.raises(ValueError, match="k must be an int >= 0"):
        batched_speculative_sample(target, ngram, [[1], [2]], 3, k=-1)
    with pytest.raises(ValueError, match="k must be ints >= 0"):
        batched_speculative_sample(target, ngram, [[1], [2]], 3, k=[1, -2])
    with pytest.raises(ValueError, match="k has 3 entries for 2 prompts"):
        batched_speculative_sample(target, ngram, [[1], [2]], 3, k=[1, 2, 3])
    with pytest.raises(ValueError, match="drafters has 1 entries"):
        batched_speculative_sample(target, [NGramDrafter()], [[1], [2]], 3)
    d = NGramDrafter()
    with pytest.raises(ValueError, match=r"drafters\[1\] is the same object"):
        batched_speculative_sample(target, [d, d], [[1], [2]], 3)
    with pytest.raises(ValueError, match="vocab_size"):
        batched_speculative_sample(target, lambda: LMDrafter(_lm(9, 0)), [[1]], 3)
    with pytest.raises(TypeError, match="TransformerLM target"):
        batched_speculative_sample(object(), ngram, [[1]], 3)


def test_batched_engine_rejects_bad_input_at_the_door():
    """Bad arguments fail before any pass with a TypeError/ValueError that names them (never a raw
    error from inside a round, never one raised after tokens were emitted)."""
    target = _lm(8, 1)
    ngram = lambda: NGramDrafter()                                      # noqa: E731
    with pytest.raises(ValueError, match="one flat sequence of token ids"):
        batched_speculative_sample(target, ngram, [1, 2, 3], 3)
    with pytest.raises(ValueError, match="one flat sequence of token ids"):
        batched_speculative_sample(target, ngram, torch.tensor([1, 2, 3]), 3)
    with pytest.raises(TypeError, match="on_round must be a callable"):
        batched_speculative_sample(target, ngram, [[1]], 3, on_round=5)
    with pytest.raises(TypeError, match="drafters is one D: pass one drafter per row"):
        batched_speculative_sample(target, type("D", (_ChainDrafter,), {"__call__": lambda s: s})([1]), [[1]], 3)
    with pytest.raises(TypeError, match="must take no arguments"):
        batched_speculative_sample(target, lambda b: NGramDrafter(), [[1]], 3)
    with pytest.raises(TypeError, match=r"drafters\[0\]: drafter \(NoneType\)"):
        batched_speculative_sample(target, lambda: None, [[1]], 3)
    with pytest.raises(TypeError, match=r"generators\[1\]: generator must be a torch.Generator"):
        batched_speculative_sample(target, ngram, [[1], [2]], 3, generators=[torch.Generator(), 7])

    class _K:
        def __init__(self, k):
            self.k = k

        def next_k(self, n):
            return self.k

        def update(self, **kw):
            pass

    with pytest.raises(TypeError, match=r"controller.next_k\(1\) must return an int >= 0"):
        batched_speculative_sample(target, ngram, [[1]], 3, controller=_K(2.0))
    with pytest.raises(ValueError, match=r"controller.next_k\(1\) must return an int >= 0"):
        batched_speculative_sample(target, ngram, [[1]], 3, controller=_K(-1))
    with pytest.raises(ValueError, match="k per row with a controller"):
        batched_speculative_sample(target, ngram, [[1], [2]], 3, k=[1, 2], controller=_K(2))
    out = batched_speculative_sample(target, ngram, [[1]], 3, temperature=0, controller=_K(torch.tensor(2)))
    assert out.outputs[0].numel() == 4                                  # a 0-d integer tensor is a whole number


def test_batched_engine_restores_train_mode_when_on_round_raises():
    target, draft_model = _lm(8, 1).train(), _lm(8, 2, dim=8).train()

    def boom(rows, emitted, accepted):
        raise RuntimeError("on_round failed")

    with pytest.raises(RuntimeError, match="on_round failed"):
        batched_speculative_sample(target, lambda: LMDrafter(draft_model), [[1], [2]], 4, on_round=boom)
    assert target.training and draft_model.training
