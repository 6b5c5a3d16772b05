"""Beyond (specdec-lab): the calculator, "Be the Verifier" and the batched serving loop.

Part 1 pins every closed form in ``g2c/specdec/theory.py`` (provided code) to the worked
numbers of the lecture, and pins the readings under which the lecture's numbers hold where
its arithmetic does not check out. Part 2 checks the simulator exercise statistically
(fixed generators, tolerances derived in comments) and shows each test rejects a classic
wrong implementation. Part 3 checks batched speculative decoding row by row against
independent greedy runs.
"""

from __future__ import annotations

import math

import pytest
import torch

from g2c.specdec.lab.simulate import (
    PassRecorder,
    Rounds,
    draw_rounds,
    fit_alpha,
    per_position_acceptance,
    simulate_rounds,
)
from g2c.specdec.theory import (
    bimodal_itl,
    break_even_alpha,
    emitted_distribution,
    expected_accepted,
    expected_rollback,
    expected_tokens_per_pass,
    free_verify_k_ceiling,
    kv_reservation_bytes,
    memory_floor_step_s,
    optimal_k,
    ridge_point,
    speculative_intensity,
    speedup_per_round,
    speedup_per_token,
    tau_cap,
    tree_expected_tokens,
)

KIB = 1024
# The lecture's running example: a 70B model in FP16 on an H100.
WEIGHTS_70B = 140e9          # 2P bytes (= FLOPs per token)
KV_70B = 320 * KIB           # bytes of K and V per token (80 layers, 8 KV heads of 128, FP16)
H100_FLOPS, H100_BW = 989e12, 3.35e12


# --- part 1: the calculator (provided code) --------------------------------------------

def test_tau_matches_sum_and_closed_form():
    for alpha in (0.0, 0.3, 0.85, 0.99):
        for k in range(0, 9):
            assert expected_tokens_per_pass(alpha, k) == pytest.approx(sum(alpha ** i for i in range(k + 1)))
    assert expected_tokens_per_pass(1.0, 4) == 5.0
    assert expected_tokens_per_pass(0.0, 4) == 1.0


def test_tau_cap_lecture_085_is_6_67():
    assert tau_cap(0.85) == pytest.approx(6.6667, abs=5e-5)
    assert round(tau_cap(0.85), 2) == 6.67
    assert expected_tokens_per_pass(0.85, 200) == pytest.approx(tau_cap(0.85))
    assert all(expected_tokens_per_pass(0.85, k) < tau_cap(0.85) for k in range(0, 50))
    assert tau_cap(1.0) == math.inf


def test_emitted_distribution_sums_to_one_with_mean_tau():
    pmf = emitted_distribution(0.85, 4)
    assert len(pmf) == 5 and sum(pmf) == pytest.approx(1.0)
    assert sum((r + 1) * p for r, p in enumerate(pmf)) == pytest.approx(expected_tokens_per_pass(0.85, 4))
    assert emitted_distribution(0.85, 1) == pytest.approx([0.15, 0.85])


def test_speedup_per_round_lecture_numbers():
    # The lecture's canonical law tau / (1 + c_draft), c_draft = draft cost of a whole round.
    assert round(speedup_per_round(2.5, 0.1), 2) == 2.27
    assert round(speedup_per_round(3.5, 0.1), 2) == 3.18
    assert round(speedup_per_round(2.0, 0.3), 2) == 1.54


def test_speedup_conventions_agree_only_when_c_is_k_times_c1():
    alpha, k, c1 = 0.85, 4, 0.1
    tau = expected_tokens_per_pass(alpha, k)
    per_token = speedup_per_token(alpha, k, c1)                 # (E[acc] + 1) / (1 + k c1)
    assert per_token == pytest.approx((expected_accepted(alpha, k) + 1) / (1 + k * c1))
    assert per_token == pytest.approx(speedup_per_round(tau, k * c1))
    assert per_token != pytest.approx(speedup_per_round(tau, c1))  # same "c", other convention: 2.65 vs 3.37
    assert speedup_per_token(alpha, 1, c1) == pytest.approx(speedup_per_round(1.85, c1))


def test_optimal_k_is_interior_and_beats_neighbours():
    k, s = optimal_k(0.85, 0.1)
    assert k == 7 and s == pytest.approx(2.853, abs=1e-3)
    for alpha, c1 in [(0.6, 0.05), (0.85, 0.02), (0.95, 0.1), (0.5, 0.3)]:
        k, s = optimal_k(alpha, c1)
        brute = max(speedup_per_token(alpha, j, c1) for j in range(1, 65))
        assert s == pytest.approx(brute)
        if k > 1:
            assert speedup_per_token(alpha, k - 1, c1) <= s
        assert speedup_per_token(alpha, k + 1, c1) <= s
    assert optimal_k(0.85, 0.0, k_max=16)[0] == 16   # free drafts: longer is always better


def test_break_even_alpha_k1_equals_c_and_is_a_root():
    assert break_even_alpha(0.1, 1) == pytest.approx(0.1, abs=1e-9)
    for c1, k in [(0.1, 4), (0.05, 8), (0.3, 2)]:
        a = break_even_alpha(c1, k)
        assert speedup_per_token(a, k, c1) == pytest.approx(1.0, abs=1e-9)
        assert speedup_per_token(a - 0.01, k, c1) < 1.0 < speedup_per_token(a + 0.01, k, c1)
    assert break_even_alpha(1.0, 3) == 1.0   # drafts as dear as the target never pay


def test_expected_rollback_lecture_k4_alpha085():
    assert round(expected_accepted(0.85, 4), 2) == 2.71
    assert round(expected_rollback(0.85, 4), 2) == 1.29
    # "about 423 KB": 1.29 rows of 320 KiB each, in decimal kilobytes.
    assert round(expected_rollback(0.85, 4) * KV_70B / 1e3) == 423
    assert expected_rollback(1.0, 4) == 0.0 and expected_rollback(0.0, 4) == 4.0


def test_kv_reservation_lecture_numbers():
    assert round(kv_reservation_bytes(4, KV_70B) / 1e6, 1) == 1.6
    # k = 8: 9 x 320 KiB = 2.95 MB; the lecture rounds it to "3.0 MB".
    assert kv_reservation_bytes(8, KV_70B) / 1e6 == pytest.approx(2.949, abs=1e-3)
    assert round(16 * KV_70B / 1e6, 1) == 5.2            # one 16-token page
    assert round(kv_reservation_bytes(1, 34 * KIB) / 1e3) == 70   # DeepSeek-V3 MLA, k = 1


def test_tree_formula_chain_equals_tau():
    alpha, k = 0.7, 5
    chain = tree_expected_tokens([-1, 0, 1, 2, 3], [alpha] * k)
    assert chain == pytest.approx(expected_tokens_per_pass(alpha, k))


def test_tree_lecture_1_11_vs_1_40_reading():
    # The lecture gives no acceptance values for "1.11 vs 1.40 at the same 4-token budget".
    # The reading we test: an entropic position whose top four candidates are each accepted
    # with probability 0.1. A chain of four spends the budget on depth (0.1 + 0.01 + ...),
    # four siblings on breadth (disjoint events: 4 x 0.1).
    chain = tree_expected_tokens([-1, 0, 1, 2], [0.1] * 4)
    siblings = tree_expected_tokens([-1, -1, -1, -1], [0.1] * 4)
    assert round(chain, 2) == 1.11 and round(siblings, 2) == 1.40


def test_tree_formula_mixed_tree_by_hand():
    # root -> {a: 0.6, b: 0.3}; a -> {c: 0.5}: 1 + 0.6 + 0.3 + 0.6 * 0.5
    assert tree_expected_tokens([-1, -1, 0], [0.6, 0.3, 0.5]) == pytest.approx(2.2)


def test_tree_formula_validates_inputs():
    with pytest.raises(ValueError, match=r"siblings are disjoint"):
        tree_expected_tokens([-1, -1], [0.7, 0.6])
    with pytest.raises(ValueError, match=r"parents\[1\] = 1"):
        tree_expected_tokens([-1, 1], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"one entry per node"):
        tree_expected_tokens([-1], [0.5, 0.5])
    with pytest.raises(ValueError, match=r"accept\[0\] must be a probability"):
        tree_expected_tokens([-1], [1.5])


def test_roofline_lecture_floor_and_ridge():
    assert round(memory_floor_step_s(WEIGHTS_70B, H100_BW) * 1e3, 1) == 41.8
    assert round(1 / memory_floor_step_s(WEIGHTS_70B, H100_BW)) == 24
    assert round(ridge_point(H100_FLOPS, H100_BW)) == 295


def test_intensity_with_lecture_constants_gives_139_not_104():
    # The lecture's own 70B constants (2P = 140 GB, kv = 320 KiB per token, L = 2048).
    assert round(speculative_intensity(WEIGHTS_70B, 32, 4, 2048, KV_70B)) == 139
    assert round(speculative_intensity(WEIGHTS_70B, 32, 4, 2048, 320e3)) == 139   # decimal KB: same
    # ... and at B = 128 it is already past the ridge of 295.
    assert speculative_intensity(WEIGHTS_70B, 128, 4, 2048, KV_70B) > ridge_point(H100_FLOPS, H100_BW)


def test_intensity_lecture_104_and_204_follow_from_kv_1_14_mb():
    kv = 1.14e6
    assert round(speculative_intensity(WEIGHTS_70B, 32, 4, 2048, kv)) == 104
    assert round(speculative_intensity(WEIGHTS_70B, 128, 4, 2048, kv)) == 204
    assert speculative_intensity(WEIGHTS_70B, 128, 4, 2048, kv) < 295


def test_intensity_plain_decode_single_request_is_about_one():
    assert speculative_intensity(WEIGHTS_70B, 1, 0, 0, KV_70B) == pytest.approx(1.0)


def test_free_verify_k_ceiling_lecture_148():
    ridge = ridge_point(H100_FLOPS, H100_BW)
    # "k* ~ 148 at batch 1": the lecture drops the KV factor (2P + kv L) / 2P ~ 1.0096 ...
    assert round(free_verify_k_ceiling(ridge, 0.5, 1.0, WEIGHTS_70B, 1, 0.0)) == 148
    # ... which with the 1.3 GB of KV at L = 4K lifts the ceiling to 149.
    k_star = free_verify_k_ceiling(ridge, 0.5, 1.0, WEIGHTS_70B, 1, KV_70B * 4096)
    assert math.floor(k_star) == 149
    assert free_verify_k_ceiling(ridge, 0.5, 1.0, WEIGHTS_70B, 32, KV_70B * 4096) < 8


def test_bimodal_itl_lecture_70b_mtp_example():
    # The lecture's rounded 41.8 ms step: 45.98 / 1.85 = 24.85 -> 24.9 ms. (From the unrounded
    # floor 41.79 ms the mean is 24.85 too, but rounds to 24.8: the lecture rounds twice.)
    itl = bimodal_itl(0.0418, 0.85, 1, 0.10)
    assert round(itl.round_s * 1e3, 1) == 46.0
    assert round(itl.mean_s * 1e3, 1) == 24.9
    assert itl.emitted_pmf == pytest.approx((0.15, 0.85))
    assert itl.burst_fraction == pytest.approx(0.85 / 1.85)


@pytest.mark.parametrize("call, match", [
    (lambda: expected_tokens_per_pass(1.2, 4), r"alpha must be a probability in \[0, 1\], got 1.2"),
    (lambda: expected_tokens_per_pass(0.5, -1), r"k must be an int >= 0"),
    (lambda: speedup_per_round(0.5, 0.1), r"tau must be >= 1"),
    (lambda: speedup_per_round(2.0, -0.1), r"c must be a finite number >= 0"),
    (lambda: optimal_k(0.8, 0.1, k_max=0), r"k_max must be an int >= 1"),
    (lambda: break_even_alpha(0.1, 0), r"k must be an int >= 1"),
    (lambda: speculative_intensity(140e9, 0, 4, 2048, 1.0), r"batch must be an int >= 1"),
    (lambda: speculative_intensity(140e9, 1, 4, -1, 1.0), r"context must be an int >= 0"),
    (lambda: ridge_point(0, 1.0), r"flops_per_s must be > 0"),
    (lambda: bimodal_itl(0.0, 0.8, 1, 0.1), r"target_step_s must be > 0"),
])
def test_theory_validates_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: expected_tokens_per_pass(0.5, 2.0), r"k must be an int, got float 2\.0"),
    (lambda: expected_tokens_per_pass("0.5", 2), r"alpha must be a real number, got str"),
    (lambda: expected_tokens_per_pass(torch.tensor([0.5, 0.6]), 2), r"alpha must be a real number, got Tensor"),
    (lambda: optimal_k(0.8, 0.1, k_max=8.0), r"k_max must be an int, got float"),
    (lambda: speculative_intensity(140e9, 2.0, 4, 2048, 1.0), r"batch must be an int, got float"),
    (lambda: speedup_per_round(None, 0.1), r"tau must be a real number, got NoneType"),
    (lambda: tree_expected_tokens([-1, 0.0], [0.5, 0.5]), r"parents\[1\] must be an int, got float"),
    (lambda: tree_expected_tokens(3, [0.5]), r"parents must be a sequence"),
])
def test_theory_reports_a_wrong_type_as_a_type_error(call, match):
    # issue 31: a float k, a string alpha were ValueErrors ("k must be an int >= 0") or raw errors
    with pytest.raises(TypeError, match=match):
        call()


def test_theory_reads_0d_tensors_and_numpy_scalars_as_numbers():
    # issue 31: alpha=torch.tensor(0.8) was refused as "not a probability in [0, 1]"
    import numpy as np

    assert expected_tokens_per_pass(torch.tensor(0.5), torch.tensor(3)) == pytest.approx(1.875)
    assert expected_tokens_per_pass(np.float64(0.5), np.int64(3)) == pytest.approx(1.875)
    assert optimal_k(torch.tensor(0.85), torch.tensor(0.1))[0] == optimal_k(0.85, 0.1)[0]
    assert tree_expected_tokens(torch.tensor([-1, 0]), torch.tensor([0.5, 0.5])) == pytest.approx(1.75)
    assert tree_expected_tokens((p for p in [-1, 0]), iter([0.5, 0.5])) == pytest.approx(1.75)   # read once


# --- part 2: the simulator (exercise) ---------------------------------------------------

def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _tolerance(alpha: float, k: int, n: int) -> float:
    # Emitted per round has the exact pmf of theory.emitted_distribution; the mean of n
    # i.i.d. rounds has standard error sigma / sqrt(n). 5 standard errors: a correct
    # implementation fails with probability < 1e-6 (and the seed is fixed anyway).
    pmf = emitted_distribution(alpha, k)
    mean = sum((r + 1) * p for r, p in enumerate(pmf))
    var = sum((r + 1 - mean) ** 2 * p for r, p in enumerate(pmf))
    return 5 * math.sqrt(var / n)


def _mean_ok(emitted: torch.Tensor, alpha: float, k: int) -> bool:
    return abs(emitted.float().mean().item() - expected_tokens_per_pass(alpha, k)) <= _tolerance(alpha, k, len(emitted))


def _freqs_ok(emitted: torch.Tensor, alpha: float, k: int) -> bool:
    # Each count of "r tokens emitted" is Binomial(n, p_r): within 5 standard deviations.
    n = len(emitted)
    for r, p in enumerate(emitted_distribution(alpha, k), start=1):
        count = int((emitted == r).sum())
        if abs(count - n * p) > 5 * math.sqrt(n * p * (1 - p)) + 1e-9:
            return False
    return int(((emitted < 1) | (emitted > k + 1)).sum()) == 0


def test_simulate_rounds_shapes_and_types():
    r = simulate_rounds(0.7, 3, 0.05, 50, generator=_gen(0))
    assert isinstance(r, Rounds) and r.k == 3 and r.c == 0.05
    assert r.accepted.shape == (50,) and r.emitted.shape == (50,)
    assert r.accepted.dtype == torch.long and r.emitted.dtype == torch.long
    assert r.accepted.device.type == "cpu"
    assert int(r.accepted.min()) >= 0 and int(r.accepted.max()) <= 3
    assert torch.equal(r.emitted, r.accepted + 1)


def test_simulate_rounds_alpha_edges():
    assert torch.equal(simulate_rounds(0.0, 4, 0.0, 100, generator=_gen(1)).emitted, torch.ones(100, dtype=torch.long))
    assert torch.equal(simulate_rounds(1.0, 4, 0.0, 100, generator=_gen(1)).accepted,
                       torch.full((100,), 4, dtype=torch.long))


@pytest.mark.parametrize("alpha, k", [(0.85, 4), (0.6, 2), (0.9, 8)])
def test_simulate_rounds_mean_converges_to_tau(alpha, k):
    rounds = simulate_rounds(alpha, k, 0.1, 20_000, generator=_gen(1234))
    assert _mean_ok(rounds.emitted, alpha, k), (rounds.tau, expected_tokens_per_pass(alpha, k))
    assert rounds.speedup == pytest.approx(rounds.tau / (1 + k * 0.1))
    # The classic slip, forgetting the correction/bonus token, misses by a full token.
    assert not _mean_ok(rounds.accepted, alpha, k)


def test_simulate_rounds_rejects_counting_every_pass():
    alpha, k, n = 0.5, 4, 20_000
    rounds = simulate_rounds(alpha, k, 0.0, n, generator=_gen(7))
    assert _freqs_ok(rounds.emitted, alpha, k)
    # The wrong variant counts every passing draft, not only the leading run: same draws,
    # mean 1 + k alpha = 3.0 instead of tau = 1.94; both checks catch it.
    passes = torch.rand(n, k, generator=_gen(7)) < alpha
    wrong = passes.long().sum(dim=1) + 1
    assert not _mean_ok(wrong, alpha, k) and not _freqs_ok(wrong, alpha, k)


def test_simulate_rounds_is_reproducible_from_the_generator():
    a = simulate_rounds(0.8, 4, 0.1, 200, generator=_gen(42))
    b = simulate_rounds(0.8, 4, 0.1, 200, generator=_gen(42))
    c = simulate_rounds(0.8, 4, 0.1, 200, generator=_gen(43))
    assert torch.equal(a.accepted, b.accepted) and not torch.equal(a.accepted, c.accepted)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(alpha=-0.1), ValueError, r"alpha must be a probability"),
    (dict(k=0), ValueError, r"k must be an int >= 1"),
    (dict(c=-1.0), ValueError, r"c \(draft cost per draft token"),
    (dict(num_rounds=0), ValueError, r"num_rounds must be an int >= 1"),
    (dict(generator=0), TypeError, r"generator must be a torch.Generator"),
])
def test_simulate_rounds_validates_inputs(kwargs, exc, match):
    args = dict(alpha=0.8, k=4, c=0.1, num_rounds=10, generator=_gen(0)) | kwargs
    with pytest.raises(exc, match=match):
        simulate_rounds(args["alpha"], args["k"], args["c"], args["num_rounds"], generator=args["generator"])


def test_fit_alpha_and_per_position_acceptance_by_hand():
    # k = 3, accepted counts 0, 1, 3, 2: trials 1, 2, 3, 3 -> alpha_hat = 6 / 9.
    r = Rounds(accepted=torch.tensor([0, 1, 3, 2]), emitted=torch.tensor([1, 2, 4, 3]), k=3)
    assert fit_alpha(r) == pytest.approx(6 / 9)
    rates, reached = per_position_acceptance(r)
    assert reached.tolist() == [4, 3, 2]
    assert rates.tolist() == pytest.approx([3 / 4, 2 / 3, 1 / 2])


def test_fit_alpha_recovers_alpha_from_simulation():
    # alpha_hat is a ratio of sums over ~n*(tau) Bernoulli trials; with 20k rounds its
    # standard error is about sqrt(a(1-a)/trials) < 0.002; 0.01 is 5+ standard errors.
    r = simulate_rounds(0.85, 4, 0.0, 20_000, generator=_gen(3))
    assert fit_alpha(r) == pytest.approx(0.85, abs=0.01)
    rates, _ = per_position_acceptance(r)
    assert torch.allclose(rates, torch.full((4,), 0.85), atol=0.02)


def test_pass_recorder_drops_the_last_pass_of_each_run():
    rec = PassRecorder()
    for emitted, acc in [([5, 6, 7], 2), ([8], 0), ([9, 10], 2)]:   # last pass cut by the budget
        rec(emitted, acc)
    rec.end_run()
    rounds = rec.rounds(k=2)
    assert rounds.accepted.tolist() == [2, 0] and rounds.emitted.tolist() == [3, 1]
    with pytest.raises(ValueError, match=r"accepted 2 drafts but k=1"):
        rec.rounds(k=1)


def test_draw_rounds_labels_and_keeps_every_mark_visible():
    from matplotlib.figure import Figure

    # Rounds: a rejection at d1, a full match, a rejection at d3 (k = 4); draw only the first 2.
    rounds = Rounds(accepted=torch.tensor([0, 4, 2]), emitted=torch.tensor([1, 5, 3]), k=4,
                    source="simulated alpha=0.85")
    ax = Figure().subplots()
    draw_rounds(rounds, ax, max_rounds=2, alpha=0.8534)
    title = ax.get_title()
    assert "first 2 of 3 rounds drawn" in title and "tau=3.00 over all 3" in title
    assert "alpha=0.85)" in title and "0.8534" not in title            # alpha rounded in the title
    assert ax.get_ylabel().startswith("round") and ax.get_xlabel() == "draft position"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "accepted draft", "rejected or aborted draft", "target's token (correction / bonus)"]
    crosses, stars = [], []
    for coll in ax.collections:                                           # scatter marks, one collection each
        (crosses if coll.get_zorder() == 4 else stars).extend(map(tuple, coll.get_offsets().tolist()))
    assert sorted(crosses) == [(0.5, 0.0), (1.5, 0.0), (2.5, 0.0), (3.5, 0.0)]  # row 1: d1..d4 rejected/aborted
    assert sorted(stars) == [(0.8, 0.0), (4.5, -1.0)]                     # beside the rejected x; on "bonus"
    assert not set(crosses) & set(stars)                                  # no star hides a cross


@pytest.mark.ladder
def test_replay_real_rounds_from_the_ladder():
    from g2c.assets import load_model
    from g2c.specdec import speculative_generate

    target, tok = load_model("StoryLM-30M", device="cpu")
    drafter, _ = load_model("StoryLM-1M", device="cpu")
    rec = PassRecorder()
    total_new = 0
    for prompt in ["Once upon a time", "Lily wanted to play with her ball."]:
        prompt_ids = tok.encode_batch_fast([prompt])[0]
        ids, stats = speculative_generate(target, drafter, prompt_ids, 24, k=4, on_pass=rec)
        rec.end_run()
        total_new += len(ids) - len(prompt_ids)
    assert sum(len(e) for e, _ in rec.passes) == total_new
    rounds = rec.rounds(k=4, c=0.05, source="StoryLM-1M -> StoryLM-30M")
    assert rounds.num_rounds == len(rec.passes) - 2
    assert 0.0 < fit_alpha(rounds) < 1.0
    assert 1.0 <= rounds.tau <= 5.0
    rates, reached = per_position_acceptance(rounds)
    assert int(reached[0]) == rounds.num_rounds


# --- part 3: batched speculative decoding (provided loop, checked row by row) ------------

def _tiny_lm(seed: int, *, max_seq_len: int = 64, vocab: int = 32):
    from g2c.transformer import TransformerLM

    g = torch.Generator().manual_seed(seed)
    model = TransformerLM(vocab, 16, 2, 2, max_seq_len, generator=g)
    with torch.no_grad():
        # At init the residual stream is mostly the token embedding, so a tied model just
        # repeats its last token. Louder blocks give varied greedy chains; a large final
        # LayerNorm gain sharpens the logits so argmax gaps dwarf float32 round-off between
        # the masked batched pass and a plain single-row pass.
        for blk in model.blocks:
            for lin in (blk.attn.qkv, blk.attn.proj, blk.mlp.fc, blk.mlp.proj):
                lin.weight.mul_(4.0)
        model.ln_final.weight.mul_(40.0)
    return model.eval()


def _noisy_copy(model, seed: int, eps: float = 0.03):
    """A drafter that agrees with the target often but not always (ragged acceptance)."""
    import copy

    drafter = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for blk in drafter.blocks:
            blk.mlp.fc.weight.add_(eps * torch.randn(blk.mlp.fc.weight.shape, generator=g))
    return drafter


def _greedy_alone(model, prompt: list[int], n: int, eos_id: int | None = None) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(torch.tensor([ids]))[0, -1].argmax())
            ids.append(nxt)
            if nxt == eos_id:
                break
    return ids


def _ragged_prompts(batch: int, seed: int, vocab: int = 32) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [1 + (5 * b + 3) % 11 for b in range(batch)]          # 4, 9, 3, 8, 2, ... ragged
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def test_ragged_forward_matches_the_plain_forward_per_row():
    from g2c.specdec.lab.batched import RaggedKV, ragged_forward

    model = _tiny_lm(0)
    prompts = _ragged_prompts(3, 1)
    width = max(len(p) for p in prompts)
    padded = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    logits = ragged_forward(model, padded, RaggedKV(model, 3))                       # (3, T, V)
    for b, p in enumerate(prompts):
        torch.testing.assert_close(logits[b, :len(p)], model(torch.tensor([p]))[0], atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("k", [1, 4])
def test_batched_speculative_equals_independent_greedy_runs(batch, k):
    from g2c.specdec.lab.batched import batched_speculative_generate

    target = _tiny_lm(1)
    prompts = _ragged_prompts(batch, 10 + batch)
    for drafter in (_noisy_copy(target, 2), _tiny_lm(2)):        # often right / mostly wrong
        res = batched_speculative_generate(target, drafter, prompts, 12, k=k)
        for b, p in enumerate(prompts):
            assert res.outputs[b].tolist() == _greedy_alone(target, p, 12), f"row {b}"
            assert sum(e for _, e in res.rounds[b]) == 12 and len(res.token_times[b]) == 12


def test_batched_speculative_rows_commit_ragged_prefixes():
    from g2c.specdec.lab.batched import batched_speculative_generate

    target = _tiny_lm(3)
    prompts = _ragged_prompts(8, 5)
    # A drafter equal to the target accepts everything: k + 1 tokens per pass, 3 passes.
    perfect = batched_speculative_generate(target, target, prompts, 15, k=4)
    assert all(r == [(4, 5)] * 3 for r in perfect.rounds) and perfect.target_passes == 3
    # A noisy copy: within one round rows accept different numbers of drafts, so their
    # committed lengths drift apart, and the outputs are still the target's.
    seen = []
    res = batched_speculative_generate(target, _noisy_copy(target, 1), prompts, 15, k=4,
                                       on_round=lambda rows, emitted, acc: seen.append(acc))
    assert [o.tolist() for o in res.outputs] == [o.tolist() for o in perfect.outputs]
    assert any(len(set(acc)) > 1 for acc in seen)
    assert res.target_passes == max(len(r) for r in res.rounds) > 3


def test_batched_speculative_stops_rows_at_eos_independently():
    from g2c.specdec.lab.batched import batched_speculative_generate

    target = _tiny_lm(5)
    drafter = _noisy_copy(target, 6)
    prompts = _ragged_prompts(6, 7)
    runs = [_greedy_alone(target, p, 20) for p in prompts]
    eos = runs[0][len(prompts[0]) + 2]                  # row 0 emits it within 3 tokens
    res = batched_speculative_generate(target, drafter, prompts, 20, k=3, eos_id=eos)
    for b, p in enumerate(prompts):
        assert res.outputs[b].tolist() == _greedy_alone(target, p, 20, eos_id=eos)
    new = [len(o) - len(p) for o, p in zip(res.outputs, prompts)]
    assert new[0] <= 3 and max(new) == 20                # rows stop independently


def test_batched_greedy_equals_independent_greedy_runs():
    from g2c.specdec.lab.batched import batched_greedy

    model = _tiny_lm(7)
    prompts = _ragged_prompts(5, 8)
    res = batched_greedy(model, prompts, 9)
    assert [o.tolist() for o in res.outputs] == [_greedy_alone(model, p, 9) for p in prompts]
    assert res.target_passes == 9


def test_batched_speculative_validates_inputs():
    from g2c.specdec.lab.batched import batched_speculative_generate

    target = _tiny_lm(1)
    with pytest.raises(ValueError, match=r"k must be an int >= 1"):
        batched_speculative_generate(target, target, [[1, 2]], 4, k=0)
    with pytest.raises(ValueError, match=r"vocab_size"):
        batched_speculative_generate(target, _tiny_lm(1, vocab=40), [[1, 2]], 4)
    with pytest.raises(ValueError, match=r"prompts\[1\] must be a non-empty 1-D"):
        batched_speculative_generate(target, target, [[1], []], 4)
    with pytest.raises(ValueError, match=r"no sliding window"):
        batched_speculative_generate(target, target, [[1] * 40], 30, k=4)


@pytest.mark.ladder
def test_batched_speculative_on_the_ladder_equals_greedy():
    from g2c.assets import load_model
    from g2c.specdec.lab.batched import batched_speculative_generate

    target, tok = load_model("StoryLM-30M", device="cpu")
    drafter, _ = load_model("StoryLM-1M", device="cpu")
    prompts = tok.encode_batch_fast(["Once upon a time", "Tom had a red ball. He", "The sun was"])
    res = batched_speculative_generate(target, drafter, prompts, 16, k=4)
    for b, p in enumerate(prompts):
        assert res.outputs[b].tolist() == _greedy_alone(target, p, 16)
    assert res.target_passes < 16                      # the 1M drafter earns its keep


@pytest.mark.parametrize("k", range(1, 7))
def test_batched_speculative_equals_plain_decoding_at_the_window_edge(k):
    """The shared window-edge rule (``g2c.specdec.draft_room``): a round drafts
    min(k, window - longest active context) tokens for every row, none (a plain step) when a
    context fills the window. With a model whose next token depends on every visible id
    (``SumModLM``: sum mod 7, window 8) every row equals plain greedy decoding up to the
    longest prompt + output = window + 1, for every k; one token more is refused, like
    ``batched_greedy`` (no sliding window). Before, the loop refused any run with
    prompt + budget + k + 1 > window."""
    from specdec_mocks import SumModLM, windowed_greedy

    from g2c.specdec.lab.batched import batched_greedy, batched_speculative_generate

    target, drafter = SumModLM(max_seq_len=8), SumModLM(max_seq_len=8)
    prompts = [[1, 2], [3], [4, 5, 6]]
    n = 8 + 1 - 3                                          # the longest row's last context fills the window
    want = [windowed_greedy(target, p, n) for p in prompts]
    res = batched_speculative_generate(target, drafter, prompts, n, k=k)
    assert [o.tolist() for o in res.outputs] == want
    assert all(a == e - 1 for rounds in res.rounds for a, e in rounds[:-1])    # a perfect drafter: no rejection
    assert [o.tolist() for o in batched_greedy(target, prompts, n).outputs] == want
    for run in (lambda: batched_speculative_generate(target, drafter, prompts, n + 1, k=k),
                lambda: batched_greedy(target, prompts, n + 1)):
        with pytest.raises(ValueError, match=r"max_seq_len \+ 1 = 9 .*no sliding window"):
            run()
