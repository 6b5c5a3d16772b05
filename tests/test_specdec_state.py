"""Beyond (specdec-state): recurrent state under speculation.

The oracle is plain decoding: ``plain_greedy`` feeds one token per pass through the
recurrent form (and appends K/V rows in hybrid models). After EVERY speculative round, for
every strategy, the committed recurrent state and the visible K/V rows must equal plain
decoding's after the same tokens, and the emitted tokens must equal plain greedy decoding.

Models are tiny and untrained (``fan_in_init_``): losslessness and state costs do not
depend on training, only acceptance does, and the drafters below set acceptance directly.

Tolerance: states are compared with |a - b| <= 1e-5 + 1e-5 |b|. The chunked and recurrent
forms sum the same O(T) float32 terms in a different order; with entries of order 1 the
rounding difference is a few ulps (float32 eps = 1.2e-7) per term, about 1e-6 here, while a
commit one position off changes the state by 1e-1 or more (``test_advanced_state_is_not_the_boundary``).
"""

from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from g2c.recurrent import (
    DecodeState,
    RecomputeTransaction,
    RecurrentLM,
    ReplayTransaction,
    SnapshotTransaction,
    fan_in_init_,
    gla_chunk,
    gla_fold,
    gla_recurrent,
    greedy_drafter,
    make_transaction,
    perturbed_twin,
    plain_greedy,
    readout_flops,
    speculative_generate_stateful,
    update_flops,
)

STRATEGIES = ["snapshot", "replay", "recompute"]
LAYOUTS = ["RRR", "RAR"]          # the recurrent LM and a hybrid (attention in the middle)
V, D, H = 48, 32, 4
PROMPT = [1, 2, 3]
NUM_NEW = 24


def assert_state_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


@functools.lru_cache(maxsize=None)
def model(layout: str, seed: int = 0) -> RecurrentLM:
    m = RecurrentLM(V, D, len(layout), H, layout=layout, max_seq_len=64)
    return fan_in_init_(m, generator=torch.Generator().manual_seed(seed)).eval()


@functools.lru_cache(maxsize=None)
def reference(layout: str, seed: int = 0, prompt: tuple[int, ...] = tuple(PROMPT), num_new: int = NUM_NEW):
    """Plain greedy ids and, per length N, the states/KV rows after ids[:N-1] (the newest not yet fed)."""
    snaps = {}

    def on_token(state, ids):
        snaps[len(ids)] = ({i: s.clone() for i, s in state.states.items()},
                           {i: tuple(t.clone() for t in rows) for i, rows in state.kv_rows().items()})

    ids = plain_greedy(model(layout, seed), list(prompt), num_new, on_token=on_token)
    return ids, snaps


def noisy_oracle(ref: torch.Tensor, flip: float, seed: int):
    """Drafts the target's own greedy tokens, each replaced by a random id with probability ``flip``."""
    g = torch.Generator().manual_seed(seed)

    def draft(ctx, k):
        n = len(ctx)
        out = torch.cat([ref[n:n + k], torch.zeros(k, dtype=torch.long)])[:k]
        swap = torch.rand(k, generator=g) < flip
        out[swap] = torch.randint(0, V, (int(swap.sum()),), generator=g)
        return out
    return draft


def check_against_reference(layout: str, seed: int, snaps):
    """An ``on_round`` callback asserting committed state and K/V rows equal plain decoding's."""
    def on_round(txn, ids):
        states, kv = snaps[len(ids)]
        assert txn.length == len(ids) - 1
        committed = txn.committed_state()
        assert committed.keys() == states.keys()
        for i in states:
            assert_state_close(committed[i], states[i])
        for i, (k_ref, v_ref) in kv.items():
            k_rows, v_rows = txn.committed_kv()[i]
            assert k_rows.shape == k_ref.shape, f"layer {i}: K/V pointer {k_rows.shape[2]}, expected {k_ref.shape[2]}"
            assert_state_close(k_rows, k_ref)
            assert_state_close(v_rows, v_ref)
    return on_round


def tracked(txn):
    """Record (positions kept, block length) of every speculative commit on ``txn`` (not the prefill)."""
    txn.commits = []
    orig = txn.commit

    def commit(num_accepted):
        if hasattr(txn, "prefill_costs"):
            txn.commits.append((num_accepted + 1, txn._block.shape[1]))
        orig(num_accepted)
    txn.commit = commit
    return txn


# -- the recurrence: two forms, one answer (provided code) -----------------------------------------


def _random_inputs(B=2, Hh=3, T=7, d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, Hh, T, d, generator=g) for _ in range(3))
    log_a = torch.nn.functional.logsigmoid(torch.randn(B, Hh, T, generator=g) + 1.0)
    state = torch.randn(B, Hh, d, d, generator=g)
    return q, k, v, log_a, state


def test_gla_chunk_matches_recurrent_form():
    q, k, v, log_a, state = _random_inputs()
    o_rec, s_rec = gla_recurrent(q, k, v, log_a, state)
    o_chk, s_chk = gla_chunk(q, k, v, log_a, state)
    assert_state_close(o_chk, o_rec)
    assert_state_close(s_chk, s_rec)


def test_gla_recurrent_matches_hand_computed_step():
    q, k, v, log_a, state = _random_inputs(B=1, Hh=1, T=1, d=2)
    a = log_a[0, 0, 0].exp()
    s1 = a * state[0, 0] + torch.outer(k[0, 0, 0], v[0, 0, 0])
    o, s = gla_recurrent(q, k, v, log_a, state)
    assert_state_close(s[0, 0], s1)
    assert_state_close(o[0, 0, 0], q[0, 0, 0] @ s1)


def test_gla_chunk_queries_at_the_end_match_the_full_block():
    q, k, v, log_a, state = _random_inputs(T=9)
    o_full, _ = gla_chunk(q, k, v, log_a, state)
    o_tail, s = gla_chunk(q[:, :, -3:], k, v, log_a, state, return_state=False)
    assert s is None
    assert_state_close(o_tail, o_full[:, :, -3:])


def test_gla_fold_is_the_recurrent_state_and_empty_fold_is_identity():
    q, k, v, log_a, state = _random_inputs()
    assert_state_close(gla_fold(state, k, v, log_a), gla_recurrent(q, k, v, log_a, state)[1])
    assert gla_fold(state, k[:, :, :0], v[:, :, :0], log_a[:, :, :0]) is state


def test_gla_rejects_bad_shapes():
    q, k, v, log_a, state = _random_inputs()
    with pytest.raises(ValueError, match="log_a must be"):
        gla_chunk(q, k, v, log_a[:, :, :-1], state)
    with pytest.raises(ValueError, match="state must be"):
        gla_chunk(q, k, v, log_a, state[:, :, :-1])
    with pytest.raises(ValueError, match="Tq <= T"):
        gla_chunk(torch.cat([q, q], dim=2), k, v, log_a, state)


def test_flop_counts_by_hand():
    assert update_flops(2, 4, 3) == 3 * 2 * 16 * 3
    # 2 queries at the end of 3 keys: pairs 2 + 3 = 5.
    assert readout_flops(1, 4, 2, 3) == 2 * 16 * 2 + 4 * 4 * 5


def test_recurrent_lm_rejects_bad_arguments():
    with pytest.raises(ValueError, match="layout must be 3 letters"):
        RecurrentLM(V, D, 3, H, layout="RX R")
    with pytest.raises(ValueError, match="not divisible"):
        RecurrentLM(V, 30, 2, H)
    with pytest.raises(ValueError, match="num_layers must be an int >= 1"):
        RecurrentLM(V, D, 0, H)
    m = RecurrentLM(V, D, 2, H, layout="RA", max_seq_len=4)
    with pytest.raises(ValueError, match=r"integer ids of shape \(B, T\)"):
        m(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="exceeds max_seq_len=4"):
        m(torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="one query per position"):
        q, k, v, log_a, state = _random_inputs()
        gla_recurrent(q[:, :, 1:], k, v, log_a, state)


def test_perturbed_twin_with_zero_sigma_is_a_copy():
    m = model("RAR")
    twin = perturbed_twin(m, sigma=0.0, generator=torch.Generator().manual_seed(1))
    for (name, p), (_, q) in zip(m.named_parameters(), twin.named_parameters()):
        assert torch.equal(p, q), name
    with pytest.raises(ValueError, match="sigma"):
        perturbed_twin(m, sigma=-1.0, generator=torch.Generator())


# -- the model: stateful decoding equals the whole-sequence pass (needs modules 03, 07-09) ------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_stepwise_decoding_matches_forward(layout):
    m = model(layout)
    ids = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = m(ids)[0]                                   # chunked form / course Block
        steps = DecodeState(m).feed(ids[0])                # recurrent form / K/V rows
    torch.testing.assert_close(steps, full, atol=1e-4, rtol=1e-5)  # logits of size ~20: a few float32 ulps
    assert len(set(plain_greedy(m, PROMPT, NUM_NEW).tolist())) > 4, "the untrained target's chain must vary"


# -- transactions: commit and rollback (the exercises) --------------------------------------------


def _prefilled(strategy, layout, **kw):
    txn = make_transaction(model(layout), strategy, **kw)
    txn.prefill(torch.tensor(PROMPT[:-1]))
    return txn


def _plain_after(layout, tokens):
    state = DecodeState(model(layout))
    state.feed(tokens)
    return state


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_commit_lands_on_the_boundary(strategy, layout):
    block = torch.tensor([PROMPT[-1], 7, 11, 13, 17])                   # last emitted + 4 drafts
    for j in range(block.numel()):
        txn = _prefilled(strategy, layout)
        txn.begin()
        txn.advance(block)
        txn.commit(j)
        ref = _plain_after(layout, PROMPT[:-1] + block[:j + 1].tolist())
        assert txn.length == len(PROMPT) + j
        for i, s in txn.committed_state().items():
            assert_state_close(s, ref.states[i])
        for i, (k_rows, _) in txn.committed_kv().items():
            assert k_rows.shape[2] == txn.length
            assert_state_close(k_rows, ref.kv_rows()[i][0])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rollback_restores_the_round_start(strategy, layout):
    txn = _prefilled(strategy, layout)
    before = txn.committed_state()
    txn.begin()
    txn.advance(torch.tensor([PROMPT[-1], 5, 6]))
    txn.rollback()
    assert txn.length == len(PROMPT) - 1
    for i, s in txn.committed_state().items():
        assert_state_close(s, before[i])
    assert all(k.shape[2] == txn.length for k, _ in txn.committed_kv().values())
    # The transaction keeps working after a rollback.
    txn.begin()
    txn.advance(torch.tensor([PROMPT[-1], 5]))
    txn.commit(1)
    ref = _plain_after(layout, PROMPT + [5])
    for i, s in txn.committed_state().items():
        assert_state_close(s, ref.states[i])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_hybrid_commits_kv_and_state_at_one_boundary(strategy):
    ref, snaps = reference("RAR")
    txn = make_transaction(model("RAR"), strategy)
    ids, _, _ = speculative_generate_stateful(model("RAR"), noisy_oracle(ref, 0.4, 0), PROMPT, NUM_NEW, k=3,
                                              strategy=txn, on_round=check_against_reference("RAR", 0, snaps))
    assert ids.tolist() == ref.tolist()
    assert txn.kv.length == txn.length


def test_advanced_state_is_not_the_boundary():
    """Teeth: the state after the whole block differs from the accepted boundary's by far more
    than the tolerance, so a commit that forgets to roll back the rejected drafts fails."""
    snap = _prefilled("snapshot", "RRR")
    snap.begin()
    snap.advance(torch.tensor([PROMPT[-1], 7, 11, 13]))
    ref = _plain_after("RRR", PROMPT + [7])
    gap = max(float((snap.state[i] - ref.states[i]).abs().max()) for i in ref.states)
    assert gap > 1e-2


def test_replay_folds_when_the_buffer_fills():
    ref, snaps = reference("RRR")
    txn = tracked(ReplayTransaction(model("RRR"), capacity=6))
    ids, _, _ = speculative_generate_stateful(model("RRR"), noisy_oracle(ref, 0.2, 1), PROMPT, NUM_NEW, k=4,
                                              strategy=txn, on_round=check_against_reference("RRR", 0, snaps))
    assert ids.tolist() == ref.tolist()
    assert txn.costs.folds >= 2
    assert txn.costs.bytes_copied == 0
    assert txn.costs.model_passes == txn.costs.rounds
    assert 0 < txn.num_logged <= 6


def test_replay_prefills_a_prompt_longer_than_its_buffer():
    prompt = list(range(3, 18))                                      # 15 tokens, capacity 6
    txn = ReplayTransaction(model("RAR"), capacity=6)
    logits = txn.prefill(prompt)
    ref = _plain_after("RAR", prompt)
    assert logits.shape == (15, V) and txn.length == 15
    for i, s in txn.committed_state().items():
        assert_state_close(s, ref.states[i])


# -- the accounting ------------------------------------------------------------------------------


def _run_tracked(strategy, layout, flip, k=4, seed=0):
    ref, _ = reference(layout)
    txn = tracked(make_transaction(model(layout), strategy))
    ids, stats, _ = speculative_generate_stateful(model(layout), noisy_oracle(ref, flip, seed), PROMPT, NUM_NEW,
                                                  k=k, strategy=txn)
    assert ids.tolist() == ref.tolist()
    partial = sum(n < T for n, T in txn.commits)
    return txn, stats, partial


def test_snapshot_copies_one_state_per_round_and_one_more_per_rejection():
    txn, stats, partial = _run_tracked("snapshot", "RAR", flip=0.4)
    m = model("RAR")
    assert 0 < partial < txn.costs.rounds
    assert txn.costs.rounds == stats.target_passes
    assert txn.costs.bytes_copied == m.state_nbytes() * (txn.costs.rounds + partial)
    assert txn.costs.model_passes == txn.costs.rounds
    refold = sum(n for n, T in txn.commits if n < T)
    blocks = sum(T for _, T in txn.commits)
    per_layer = update_flops(H, D // H, 1)
    assert txn.costs.update_flops == per_layer * len(m.recurrent_layers) * (blocks + refold)


def test_replay_commits_by_pointer():
    txn, stats, partial = _run_tracked("replay", "RAR", flip=0.4)
    assert partial > 0
    assert txn.costs.bytes_copied == 0
    assert txn.costs.model_passes == txn.costs.rounds
    blocks = sum(T for _, T in txn.commits)
    d = D // H
    assert txn.costs.bytes_logged == blocks * len(model("RAR").recurrent_layers) * H * (2 * d + 1) * 4


def test_recompute_reruns_exactly_the_partial_rounds():
    txn, stats, partial = _run_tracked("recompute", "RAR", flip=0.4)
    assert partial > 0
    assert txn.costs.bytes_copied == 0
    assert txn.costs.model_passes == txn.costs.rounds + partial


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_perfect_drafter_never_rolls_back(strategy):
    # NUM_NEW = 24 = 4 full rounds of k + 1 = 5 tokens, then a last round of k = 4 drafts whose
    # bonus token falls outside the budget: only that round commits less than its block.
    txn, stats, partial = _run_tracked(strategy, "RRR", flip=0.0)
    assert stats.accepted == stats.drafted
    assert [n == T for n, T in txn.commits] == [True] * 4 + [False]
    assert txn.costs.model_passes == txn.costs.rounds + (strategy == "recompute")
    if strategy == "snapshot":
        assert txn.costs.bytes_copied == model("RRR").state_nbytes() * (txn.costs.rounds + 1)


# -- the protocol and input errors ---------------------------------------------------------------


def test_transaction_protocol_errors():
    txn = SnapshotTransaction(model("RRR"))
    with pytest.raises(RuntimeError, match="needs begin"):
        txn.advance([1, 2])
    with pytest.raises(RuntimeError, match="no open round"):
        txn.rollback()
    txn.begin()
    with pytest.raises(RuntimeError, match="while a round is open"):
        txn.begin()
    with pytest.raises(RuntimeError, match="advanced block"):
        txn.commit(0)
    with pytest.raises(ValueError, match="integer token ids"):
        txn.advance(torch.tensor([1.0, 2.0]))
    txn.advance([1, 2, 3])
    with pytest.raises(RuntimeError, match="twice"):
        txn.advance([1])
    with pytest.raises(ValueError, match=r"num_accepted must be an int in \[0, 2\]"):
        txn.commit(3)
    with pytest.raises(RuntimeError, match="inside an open round"):
        txn.committed_state()
    small = ReplayTransaction(model("RRR"), capacity=2)
    small.begin()
    with pytest.raises(ValueError, match="does not fit a buffer of capacity=2"):
        small.advance([1, 2, 3])
    with pytest.raises(ValueError, match="capacity must be an int >= 1"):
        ReplayTransaction(model("RRR"), capacity=0)
    with pytest.raises(ValueError, match="unknown state strategy 'log'"):
        make_transaction(model("RRR"), "log")
    with pytest.raises(TypeError, match="needs a RecurrentLM"):
        RecomputeTransaction(object())


def test_speculative_generate_stateful_validates_inputs():
    m = model("RAR")
    draft = greedy_drafter(m)
    with pytest.raises(ValueError, match="k must be"):
        speculative_generate_stateful(m, draft, PROMPT, 4, k=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate_stateful(m, draft, PROMPT, -1)
    with pytest.raises(ValueError, match="max_seq_len=64"):
        speculative_generate_stateful(m, draft, PROMPT, 64)
    with pytest.raises(ValueError, match="exactly k"):
        speculative_generate_stateful(m, lambda ctx, k: torch.tensor([1]), [5], 4, k=3)


# -- the property: lossless in tokens and state, whatever the drafter -----------------------------


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategy=st.sampled_from(STRATEGIES), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2),
       k=st.integers(1, 6), drafter=st.sampled_from(["oracle", "twin"]), flip=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
       draft_seed=st.integers(0, 10**6), capacity=st.integers(7, 12), num_new=st.integers(1, NUM_NEW))
def test_speculation_is_lossless_in_tokens_and_state(strategy, layout, seed, k, drafter, flip, draft_seed,
                                                     capacity, num_new):
    ref, snaps = reference(layout, seed)
    target = model(layout, seed)
    if drafter == "oracle":
        draft = noisy_oracle(ref, flip, draft_seed)
    else:   # a same-family drafter: the target with relative weight noise
        draft = greedy_drafter(perturbed_twin(target, sigma=flip, generator=torch.Generator().manual_seed(draft_seed)))
    kw = {"capacity": capacity} if strategy == "replay" else {}
    ids, stats, txn = speculative_generate_stateful(target, draft, PROMPT, num_new, k=k, strategy=strategy,
                                                    on_round=check_against_reference(layout, seed, snaps), **kw)
    assert ids.tolist() == ref[:len(PROMPT) + num_new].tolist()
    assert stats.generated == num_new and txn.costs.rounds == stats.target_passes


@pytest.mark.parametrize("k", range(1, 7))
def test_stateful_loop_equals_plain_decoding_at_the_window_edge(k):
    """The shared window-edge rule (``g2c.specdec.draft_room``) with attention layers (window
    8): a round drafts min(k, budget, window - context) tokens, none (a plain step) when the
    context fills the window, so the run reaches prompt + output = window + 1, the last
    token's context filling the window, and equals ``plain_greedy`` (which no longer feeds
    the newest token) for every k and strategy; one token more is refused by both (a
    recurrent state cannot slide a window). Before, both refused prompt + output > window."""
    target = fan_in_init_(RecurrentLM(V, D, 2, H, layout="RA", max_seq_len=8),
                          generator=torch.Generator().manual_seed(3)).eval()
    n = 8 + 1 - len(PROMPT)
    want = plain_greedy(target, PROMPT, n)
    assert len(want) == 9 and len(set(want[len(PROMPT):].tolist())) > 1     # a run that is not one repeated id
    perfect = lambda ctx, kk: plain_greedy(target, ctx, kk)[-kk:]          # noqa: E731
    for strategy in STRATEGIES:
        for name, draft in (("perfect", perfect), ("other model", greedy_drafter(model("RRR", 1)))):
            ids, stats, _ = speculative_generate_stateful(target, draft, PROMPT, n, k=k, strategy=strategy)
            assert ids.tolist() == want.tolist(), f"{strategy}, {name} drafter"
            if name == "perfect":
                assert stats.acceptance_rate == 1.0
        with pytest.raises(ValueError, match=r"max_seq_len=8 \+ 1"):
            speculative_generate_stateful(target, perfect, PROMPT, n + 1, k=k, strategy=strategy)
    with pytest.raises(ValueError, match=r"max_seq_len=8 \+ 1"):
        plain_greedy(target, PROMPT, n + 1)
