"""EAGLE-style feature drafting (``g2c.specdec.sampling.eagle``): the head, its loss, and its cached
drafter behind the speculative loop.

Needs module 16 and specdec-sampling solved (``G2C_APPLY_SOLUTIONS=01-16,specdec,specdec-sampling``
or ``all``) for the loop tests; the head and loss tests run on the provided code alone.

Oracles:
* losslessness: greedy output equals plain greedy decoding of the target, token for token,
  with the target cached or not;
* the drafter's incremental cache: after every ``commit`` the drafter's next feature equals
  ``FeatureDrafter`` run from scratch over the target's TRUE states of the whole committed
  context (a drafter that forgot to roll back its speculative rows, or fed a state to the
  wrong position, fails it: ``test_forgotten_rollback_is_caught``);
* cached vs uncached target: the same drafts and counters (greedy) and the same sequence
  draw for draw (sampled, same seed), as for the LM drafters.

Tiny random ``TransformerLM`` s (V = 32) keep every test to a fraction of a second.
"""

from __future__ import annotations

import pytest
import torch
from test_specdec_cached import V, _lm, _prompt

from g2c.kvcache import cached_generate
from g2c.sampling import generate
from g2c.specdec import MTPHead
from g2c.specdec.sampling.drafters import LMDrafter
from g2c.specdec.sampling.eagle import EagleDrafter, FeatureDrafter, MTPDrafter, eagle_loss
from g2c.specdec.sampling.loop import speculative_sample


def _head(target, seed: int = 0, scale: float = 1.0) -> FeatureDrafter:
    head = FeatureDrafter(target, generator=torch.Generator().manual_seed(seed)).eval()
    with torch.no_grad():
        head.fuse.weight.mul_(scale)
    return head


def _spec(target, drafter, n=30, *, use_cache, seed=0, **kw):
    passes = []
    ids, stats = speculative_sample(target, drafter, kw.pop("prompt", _prompt()), n, use_cache=use_cache,
                                    generator=torch.Generator().manual_seed(seed),
                                    on_pass=lambda e, a: passes.append((list(e), a)), **kw)
    return ids.tolist(), (stats.target_passes, stats.drafted, stats.accepted, stats.generated), passes


_TRAINED = {}


def _trained_head(target) -> FeatureDrafter:
    """A head trained for 60 steps on the target's own greedy continuations (about a second):
    it agrees with the target often enough that drafts get accepted."""
    if id(target) not in _TRAINED:
        from g2c.training import AdamW

        g = torch.Generator().manual_seed(11)
        prompts = torch.randint(0, V, (8, 4), generator=g)
        ids = torch.stack([generate(target, p, 40, temperature=0.0) for p in prompts])          # (8, 44)
        with torch.no_grad():
            states = target.hidden_states(ids)
        head = _head(target).train()
        opt = AdamW(head.parameters(), lr=3e-3, weight_decay=0.0)
        for _ in range(60):
            out = eagle_loss(head, states, ids, generator=g)
            opt.zero_grad()
            out["loss"].backward()
            opt.step()
        _TRAINED[id(target)] = (target, head.eval())
    return _TRAINED[id(target)][1]


class _CheckedEagle(EagleDrafter):
    """Compares the drafter's incremental state with a from-scratch run after every commit."""

    checks = 0

    def commit(self, context_ids, num_accepted, *, target_hidden=None):
        super().commit(context_ids, num_accepted, target_hidden=target_hidden)
        if self._out is None or len(context_ids) > self.window:
            return
        base = self.head.base
        states = base.hidden_states(context_ids[:-1].unsqueeze(0))                       # (1, N-1, D)
        want = self.head(states, context_ids[1:].unsqueeze(0))[0, -1]                    # predicts h_{N-1}
        torch.testing.assert_close(self._out[1], want, atol=1e-4, rtol=1e-4)
        type(self).checks += 1


# -- the head and its loss -----------------------------------------------------------------------
def test_feature_drafter_shapes_and_frozen_base():
    target = _lm(2)
    head = _head(target)
    h = target.hidden_states(_prompt(6).unsqueeze(0))                                    # (1, 6, 16)
    out = head(h, _prompt(6, seed=3).unsqueeze(0))
    assert out.shape == (1, 6, 16)
    assert head.logits(out).shape == (1, 6, V)
    names = {n for n, _ in head.named_parameters()} if hasattr(head, "named_parameters") else None
    assert all(p is not target.token_embed.weight for p in head.parameters())          # base stays frozen
    assert names is None or not any(n.startswith("base") for n in names)
    with pytest.raises(ValueError, match="FeatureDrafter expects hidden"):
        head(h[0], _prompt(6).unsqueeze(0))


def test_eagle_loss_alignment():
    """A head that returns the TRUE next state has zero regression loss, agrees everywhere,
    and its classification term is the target's own entropy; shifting by one position breaks it."""
    target = _lm(2)
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(1))
    states = target.hidden_states(ids)
    head = _head(target)

    class Oracle(FeatureDrafter):
        shift = 1

        def forward(self, hidden, next_ids):       # row t must predict h_{t+1}
            return states[:, self.shift:self.shift + hidden.shape[1]]

    oracle = Oracle(target)
    out = eagle_loss(oracle, states, ids, noise=0.0)
    assert float(out["reg"].detach()) == 0.0 and float(out["agree"]) == 1.0
    p = torch.softmax(target.unembed(states[:, 1:-1]), -1)
    entropy = -(p * p.log()).sum(-1).mean()
    torch.testing.assert_close(out["cls"], entropy, atol=1e-5, rtol=1e-5)
    Oracle.shift = 0                                  # the classic off-by-one: predicting h_t itself
    wrong = eagle_loss(oracle, states, ids, noise=0.0)
    assert float(wrong["reg"].detach()) > 0.01 and float(wrong["agree"]) < 0.9
    assert float(eagle_loss(head, states, ids, noise=0.0)["reg"].detach()) > 0.01


def test_eagle_training_lowers_the_loss():
    """Twenty AdamW steps on one batch of the target's states: the regression term falls by more
    than a third (0.44 -> 0.27 on this seed) and greedy agreement with the target rises from
    about 0.01 (chance is 1/32) to about 0.4. (The total is dominated by the classification
    term's floor, the target's own entropy, ~3.4 nats, so it is not the quantity to test.)"""
    from g2c.training import AdamW

    target = _lm(2)
    ids = torch.randint(0, V, (4, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        states = target.hidden_states(ids)
    head = _head(target).train()
    opt = AdamW(head.parameters(), lr=3e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    first = eagle_loss(head, states, ids, noise=0.0)
    for _ in range(20):
        out = eagle_loss(head, states, ids, generator=g)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
    last = eagle_loss(head, states, ids, noise=0.0)
    assert float(last["reg"].detach()) < 0.67 * float(first["reg"].detach())
    assert float(last["agree"]) > float(first["agree"]) + 0.2


# -- the drafter behind the loop ----------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("use_cache", [False, True])
def test_eagle_greedy_is_lossless_and_incremental_state_is_exact(k, use_cache):
    target = _lm(2)
    want = generate(target, _prompt(), 30, temperature=0.0).tolist()
    _CheckedEagle.checks = 0
    got, stats, _ = _spec(target, _CheckedEagle(_trained_head(target)), k=k, temperature=0.0,
                          use_cache=use_cache)
    assert got == want
    assert _CheckedEagle.checks >= stats[0] - 1          # checked after every pass
    assert 0 < stats[2] < stats[1]                        # accepted some drafts and rejected some


def test_eagle_cached_and_uncached_targets_agree():
    target = _lm(2)
    for case in (dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_k=5)):
        for seed in range(3):
            runs = [_spec(target, EagleDrafter(_head(target, scale=3.0), sample=True), use_cache=c, seed=seed,
                          k=3, **case) for c in (False, True)]
            assert runs[0] == runs[1], f"{case}, seed {seed}"


def test_eagle_past_the_window_keeps_drafting():
    """48-token window, 70 new tokens. The window-edge rule (``draft_room``): uncached, the
    loop is plain greedy decoding at any length and past the window every pass is a plain
    step (no drafts); cached, the target and the drafter both re-prefill where module 16's
    ``cached_generate`` does, so the output is ``cached_generate``'s and drafting resumes: the
    drafter resynchronises and still gets drafts accepted in the last 25 tokens, where a
    drafter fed misaligned states would not."""
    target = _lm(2)
    want = {False: generate(target, _prompt(), 70, temperature=0.0).tolist(),
            True: cached_generate(target, _prompt(), 70, temperature=0.0).tolist()}
    assert want[False][:49] == want[True][:49]          # the same while prompt + output <= window + 1
    for use_cache in (False, True):
        got, stats, passes = _spec(target, EagleDrafter(_trained_head(target)), 70, k=4, temperature=0.0,
                                   use_cache=use_cache)
        assert got == want[use_cache]
        assert stats[3] == 70 and len(got) == 75
        tail, accepted, multi = 0, 0, 0
        for emitted, num_accepted in reversed(passes):
            if tail >= 25:
                break
            tail += len(emitted)
            accepted += num_accepted
            multi += len(emitted) > 1                      # passes that emitted more than one token
        if use_cache:
            assert accepted > 0
        else:
            assert accepted == multi == 0                   # past the window: plain steps only


def test_forgotten_rollback_is_caught():
    """The classic bug: keep the speculative rows of a rejected draft in the drafter's cache."""

    class Leaky(_CheckedEagle):
        def commit(self, context_ids, num_accepted, *, target_hidden=None):
            self.cache.crop = lambda n: 0                 # never roll back
            super().commit(context_ids, num_accepted, target_hidden=target_hidden)

    target = _lm(2)
    with pytest.raises(AssertionError):
        _spec(target, Leaky(_head(target)), k=4, temperature=0.0, use_cache=True)


def test_one_mtp_drafter_serves_cached_and_recomputing_targets():
    """The one MTP drafter gives the same run from a recomputing target (the whole window's states
    each round) as from a cached one (only the committed rows' states), greedy and sampled, and
    each guess is the seed's ``mtp_propose`` on the committed context (the head's answer from
    scratch), so its own cache never drifts."""
    from g2c.specdec.mtp import mtp_propose
    target = _lm(2)
    head = MTPHead(target, generator=torch.Generator().manual_seed(0)).eval()
    for case in (dict(temperature=0.0), dict(temperature=1.0)):
        runs = [_spec(target, MTPDrafter(head, sample=True), use_cache=use_cache, k=1, **case)
                for use_cache in (False, True)]
        assert runs[0] == runs[1]
    prompt = _prompt().tolist()

    class Guesses(MTPDrafter):
        def __init__(self, head):
            super().__init__(head)
            self.seen = []

        def propose(self, context_ids, k):
            draft = super().propose(context_ids, k)
            self.seen.append((context_ids.tolist(), draft.tokens.tolist()))
            return draft

    drafter = Guesses(head)
    out, _ = speculative_sample(target, drafter, prompt, 12, k=1, temperature=0.0, use_cache=True)
    assert out.tolist() == generate(target, prompt, 12, temperature=0.0).tolist()
    assert drafter.seen[0][1] == [] and len(drafter.seen) > 2
    for context, draft in drafter.seen[1:]:
        assert draft == [mtp_propose(target, head, context[:-1])[1]]


def test_a_drafter_that_rereads_the_window_is_refused_with_use_cache():
    """The engine hands a drafter what its ``reads`` declares, and only the protocol's three forms: a
    drafter that asks for the whole window's states every round is refused by name."""
    from g2c.specdec.sampling.drafters import Drafter

    class WholeWindow(Drafter):
        reads = ("final_state", "whole_window")

    with pytest.raises(ValueError, match=r"WholeWindow\.reads must be \('tokens',\), \('final_state',\) or "
                                         r"\('layers', \(i, j, \.\.\.\)\)"):
        speculative_sample(_lm(2), WholeWindow(), _prompt(), 4, use_cache=True)


# -- the shipped EAGLE drafter from the command line ---------------------------------------------
@pytest.mark.ladder
def test_cli_runs_the_shipped_eagle_drafter(capsys):
    from g2c.specdec.__main__ import main

    rc = main(["Once upon a time", "--drafter", "StoryLM-30M-EAGLE", "--max-new-tokens", "12",
               "--color", "never", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.startswith("Once upon a time") and "target_passes=" in out


@pytest.mark.ladder
@pytest.mark.parametrize("drafter, k", [("StoryLM-30M-EAGLE", 5), ("StoryLM-1M-distilled", 4)])
def test_cli_drafter_dtype_changes_the_drafts_never_the_text(drafter, k, capsys):
    """``--draft-dtype bfloat16`` runs the drafter's products in bfloat16 (a different drafter); the target
    stays float32, so the continuation is the same text, token for token, as with the float32 drafter."""
    from g2c.specdec.__main__ import main

    texts = []
    for extra in ([], ["--draft-dtype", "bfloat16"]):
        rc = main(["Once upon a time", "--drafter", drafter, "-k", str(k), "--max-new-tokens", "24", "--fast",
                   "--color", "never", "--device", "cpu", *extra])
        out, err = capsys.readouterr()
        assert rc == 0, err
        texts.append(out.split("\n\n")[0].replace("[", "").replace("]", ""))
        assert ("drafter in bfloat16" in err) == bool(extra)
    assert texts[0] == texts[1] and len(texts[0]) > len("Once upon a time") + 40


def test_cli_drafter_dtype_needs_a_drafter_model(capsys):
    from g2c.specdec.__main__ import main

    rc = main(["Once", "--drafter", "ngram", "--draft-dtype", "bfloat16", "--device", "cpu"])
    _, err = capsys.readouterr()
    assert rc == 1 and err.count("\n") == 1
    assert "--draft-dtype bfloat16 sets the drafter model's products; --drafter ngram looks tokens up" in err


@pytest.mark.ladder
def test_cli_head_drafter_needs_its_base(capsys):
    from g2c.specdec.__main__ import main

    rc = main(["Once", "--drafter", "storylm-30m-eagle", "--target", "StoryLM-5M", "--device", "cpu"])
    _, err = capsys.readouterr()
    assert rc == 1 and err.count("\n") == 1
    assert "drafts from StoryLM-30M's hidden states; use --target StoryLM-30M" in err


def test_cli_refuses_a_head_as_the_target(capsys):
    # refused as the flag is read, before any model loads (a fresh clone said "not written yet" first)
    from g2c.specdec.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main(["Once", "--drafter", "mtp", "--target", "StoryLM-5M-MTP", "--device", "cpu"])
    _, err = capsys.readouterr()
    assert exit_.value.code == 2
    assert ("argument --target: StoryLM-5M-MTP is a draft head on StoryLM-5M's states, not a language model; "
            "use --target StoryLM-5M --drafter StoryLM-5M-MTP") in err
    with pytest.raises(SystemExit):                      # a standalone drafter LM is a language model
        main(["--target", "StoryLM-1M-distilled", "--help"])
    assert "usage:" in capsys.readouterr().out


# -- bad input: clear errors, before the first round -------------------------------------------
def test_a_head_on_a_twin_or_in_another_dtype_is_refused():
    """A head built on another model of the same shape would silently draft from the wrong
    states (acceptance 0, output still lossless); a base converted after its head was built
    leaves the head in float32. Both are refused before the first round, for either target."""
    target, twin = _lm(2), _lm(2)
    for use_cache in (False, True):
        for drafter in (MTPDrafter(MTPHead(twin, generator=torch.Generator().manual_seed(0))),
                        EagleDrafter(_head(twin))):
            with pytest.raises(ValueError, match="head .* was built on another model"):
                speculative_sample(target, drafter, _prompt(), 4, use_cache=use_cache)
    head = MTPHead(target, generator=torch.Generator().manual_seed(0))
    target.to(dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"computes in torch.float32 but its base in torch.bfloat16"):
        speculative_sample(target, MTPDrafter(head), _prompt(), 4, use_cache=True)


def test_drafter_construction_mistakes_name_the_drafter():
    target = _lm(2)
    head = MTPHead(target, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="MTPDrafter needs an MTPHead .*got NoneType"):
        MTPDrafter()
    with pytest.raises(TypeError, match=r"MTPDrafter\(head, sample=...\) takes one model, the head; sample is "
                                        "keyword-only"):
        MTPDrafter(head, True)
    with pytest.raises(TypeError, match="drafter is the class MTPDrafter: pass an instance"):
        speculative_sample(target, MTPDrafter, _prompt(), 4)
    for h in (head, _head(target)):                    # a head as the target: pass head.base
        with pytest.raises(TypeError, match=r"target is a draft head \(\w+\) on a model: pass its base \(head.base\)"):
            speculative_sample(h, MTPDrafter(head), _prompt(), 4)


def test_head_on_another_base_is_refused_before_drafting():
    target, other = _lm(2), _lm(3, dim=8, layers=1)
    for drafter in (EagleDrafter(_head(other)),
                    MTPDrafter(MTPHead(other, generator=torch.Generator().manual_seed(0)))):
        for use_cache in (False, True):
            with pytest.raises(ValueError, match=r"base with \(V, D\) = \(32, 8\), but the target has \(32, 16\)"):
                speculative_sample(target, drafter, _prompt(), 4, use_cache=use_cache)


def test_wrong_head_kind_is_a_type_error():
    target = _lm(2)
    mtp = MTPHead(target, generator=torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match="EagleDrafter needs a FeatureDrafter"):
        EagleDrafter(mtp)
    with pytest.raises(TypeError, match="MTPDrafter needs an MTPHead .*got FeatureDrafter; .*EagleDrafter"):
        MTPDrafter(_head(target))
    with pytest.raises(TypeError, match="got TransformerLM"):
        EagleDrafter(target)


def test_k_beyond_half_the_window_is_capped_not_an_overflow():
    """k = 40 in a 48-token window: the drafter drafts at most 24 per round instead of overflowing
    its cache. (Output equals plain greedy while prompt + output + draft fit the window, 19 tokens
    here; past that the target re-prefills, module 16's policy, as for any drafter.)"""
    target = _lm(2)
    want = generate(target, _prompt(), 60, temperature=0.0).tolist()
    got, stats, passes = _spec(target, EagleDrafter(_trained_head(target)), 60, k=40, temperature=0.0,
                               use_cache=True)
    assert got[:5 + 19] == want[:5 + 19] and stats[3] == 60
    assert max(len(e) - 1 for e, _ in passes) <= 24 and stats[1] > 24


def test_eagle_loss_and_head_validate_their_inputs():
    target = _lm(2)
    head = _head(target)
    ids = torch.randint(0, V, (1, 2))
    with pytest.raises(ValueError, match="T >= 3"):
        eagle_loss(head, target.hidden_states(ids), ids)
    h = target.hidden_states(_prompt(4).unsqueeze(0))
    for bad in (torch.full((1, 4), 32), torch.zeros(1, 4)):
        with pytest.raises(ValueError, match=r"integer ids in \[0, 32\)"):
            head(h, bad)


@pytest.mark.ladder
def test_cli_head_drafter_defaults_to_its_base(capsys):
    from g2c.specdec.__main__ import main

    rc = main(["Once upon a time", "--drafter", "StoryLM-5M-MTP", "-k", "4", "--max-new-tokens", "8",
               "--color", "never", "--device", "cpu"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "plain = tokens made by the target (StoryLM-5M)" in out
    assert "(an MTP head drafts 1 token per pass)" in out


def test_lm_and_mtp_drafters_refuse_an_eagle_head():
    """Each head has its drafter: wrapping an EAGLE head as an LM or MTP drafter is a TypeError
    at construction, not an AttributeError mid-loop or a silent acceptance of 0."""
    head = _head(_lm(2))
    with pytest.raises(TypeError, match="LMDrafter needs a language model"):
        LMDrafter(head)
    with pytest.raises(TypeError, match="MTPDrafter needs an MTPHead"):
        MTPDrafter(head)
