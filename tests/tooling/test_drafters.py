"""The drafter recipes' machinery (g2c/assets/recipes/drafters.py, g2c/assets/recipes/features.py) on tiny data.

The shipped drafters themselves are checked in tests/tooling/test_artifacts.py (ladder marker).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

from g2c.assets.recipes import features as F
from g2c.assets.recipes.drafters import DRAFTER_RECIPES, _kl_terms, _lr
from g2c.transformer import TransformerLM


def test_kl_terms_on_a_worked_example():
    """p = (0.5, 0.5), q = (0.9, 0.1): KL(p || q) = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1) = 0.5108,
    TV = 0.4 so the sampled acceptance 1 - TV = 0.6; the argmaxes differ only if p's tie breaks
    the other way, so agreement is checked on a clear case."""
    p = torch.tensor([[[0.5, 0.5]]]).log()
    q = torch.tensor([[[0.9, 0.1]]]).log()
    out = _kl_terms(q, p, torch.tensor([[1]]))
    assert math.isclose(float(out["kl"]), 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(5), rel_tol=1e-5)
    assert math.isclose(float(out["accept"]), 0.6, rel_tol=1e-5)
    assert math.isclose(float(out["ce"]), -math.log(0.1), rel_tol=1e-5)
    same = _kl_terms(q, q, torch.tensor([[0]]))
    assert float(same["kl"]) == pytest.approx(0.0, abs=1e-6)
    assert float(same["agree"]) == 1.0 and float(same["accept"]) == pytest.approx(1.0)


def test_lr_schedule_warms_up_then_decays_to_min():
    r = DRAFTER_RECIPES["StoryLM-30M-EAGLE"]
    assert _lr(0, r) == pytest.approx(r["max_lr"] / r["warmup_steps"])
    assert _lr(r["warmup_steps"], r) == pytest.approx(r["max_lr"])
    assert _lr(r["steps"], r) == pytest.approx(r["min_lr"])
    lrs = [_lr(s, r) for s in range(r["warmup_steps"], r["steps"] + 1, 50)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """A tiny TransformerLM, a 70-token stream and a features folder in tmp_path."""
    model = TransformerLM(32, 16, 2, 2, 16, generator=torch.Generator().manual_seed(0)).eval()
    stream = np.random.default_rng(0).integers(0, 32, 70).astype(np.uint16)
    monkeypatch.setattr(F, "load_token_stream", lambda split: stream)
    monkeypatch.setattr(F, "verify_artifact", lambda name: {"files": {"model.safetensors": "abc"}})
    monkeypatch.setattr(F, "FEATURES_DIR", tmp_path / "features")
    return model, stream


def test_target_features_are_the_models_states_per_window(tiny):
    model, stream = tiny
    feats = F.target_features(model, "Tiny", "train", context=16, batch_size=3, progress=False)
    assert feats.num_windows == 4 and feats.ids.tolist() == stream[:64].tolist()       # the tail is dropped
    x = feats.ids.view(4, 16)
    with torch.no_grad():
        want = model.hidden_states(x)                                                   # (4, 16, D)
    ids, states = feats.batch(torch.tensor([2, 0, 3]))                                # any order
    assert ids.tolist() == x[[2, 0, 3]].tolist()
    torch.testing.assert_close(states, want[[2, 0, 3]], atol=2e-3, rtol=2e-3)          # float16 storage


def test_target_features_resume_and_redo_on_new_weights(tiny, tmp_path, monkeypatch):
    model, _ = tiny
    F.target_features(model, "Tiny", "train", context=16, batch_size=8, progress=False)
    record_path = tmp_path / "features" / "Tiny" / "train-ctx16.json"
    states_path = tmp_path / "features" / "Tiny" / "train-ctx16.f16"
    full = np.fromfile(states_path, dtype=np.float16).copy()
    # A run killed after 2 windows: rows past them are garbage, the record says 2.
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "done": 2}))
    mm = np.memmap(states_path, dtype=np.float16, mode="r+", shape=(64, 16))
    mm[32:] = 7.0
    mm.flush()
    del mm
    F.target_features(model, "Tiny", "train", context=16, batch_size=8, progress=False)
    assert np.array_equal(np.fromfile(states_path, dtype=np.float16), full)
    assert json.loads(record_path.read_text())["done"] == 4
    # Other weights (another sha256): everything is recomputed.
    other = TransformerLM(32, 16, 2, 2, 16, generator=torch.Generator().manual_seed(1)).eval()
    monkeypatch.setattr(F, "verify_artifact", lambda name: {"files": {"model.safetensors": "def"}})
    F.target_features(other, "Tiny", "train", context=16, batch_size=8, progress=False)
    assert not np.array_equal(np.fromfile(states_path, dtype=np.float16), full)


def test_target_features_validates_context(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match=r"context must be in \[2, max_seq_len=16\]"):
        F.target_features(model, "Tiny", "train", context=17, progress=False)


def test_layer_features_keep_the_chosen_blocks_then_the_final_state(tiny):
    """The lineage drafters' data: row i holds block outputs in the order asked, then the final state."""
    model, stream = tiny
    feats = F.layer_features(model, "Tiny", "train", (1, 0), context=16, max_windows=3, batch_size=2,
                             progress=False)
    assert feats.num_windows == 3 and feats.layers == (1, 0)
    x = feats.ids.view(3, 16)
    with torch.no_grad():
        h = model.token_embed.weight[x] + model.pos_embed.weight[torch.arange(16)]
        outs = []
        for blk in model.blocks:
            h = blk(h)
            outs.append(h)
        want = torch.stack([outs[1], outs[0], model.ln_final(h)], dim=2)              # (3, 16, 3, D)
    ids, states = feats.batch(torch.tensor([2, 0]))
    assert ids.tolist() == x[[2, 0]].tolist() and states.shape == (2, 16, 3, model.embedding_dim)
    torch.testing.assert_close(states, want[[2, 0]], atol=3e-3, rtol=3e-3)             # float16 storage
    with pytest.raises(ValueError, match=r"layers \(5,\) must lie in \[0, 2\)"):
        F.layer_features(model, "Tiny", "train", (5,), context=16, progress=False)


def test_layer_features_read_the_first_windows_of_a_larger_finished_cache(tiny):
    """Drafters of one budget round it up to their own whole steps (3,920 windows for EAGLE at 1M tokens,
    3,908 for EAGLE-3): a finished cache of more windows of the same stream, layers and weights serves a
    smaller request (its first windows, no second pass); an unfinished or other-layer cache does not."""
    model, _ = tiny
    big = F.layer_features(model, "Tiny", "train", (1,), context=16, max_windows=4, batch_size=2, progress=False)
    lines = []
    small = F.layer_features(model, "Tiny", "train", (1,), context=16, max_windows=2, batch_size=2, progress=False,
                             log=lines.append)
    assert small.num_windows == 2 and any("the first 2 windows of train-layers1-ctx16-w4.f16" in line for line in lines)
    assert np.array_equal(np.asarray(small.states), np.asarray(big.states)[:32])
    assert not list((F.FEATURES_DIR / "Tiny").glob("*-w2.*"))                     # no second pass
    other = F.layer_features(model, "Tiny", "train", (0,), context=16, max_windows=2, batch_size=2, progress=False)
    assert other.layers == (0,) and list((F.FEATURES_DIR / "Tiny").glob("train-layers0-ctx16-w2.f16"))
    record = F.FEATURES_DIR / "Tiny" / "train-layers1-ctx16-w4.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "done": 3}))   # an interrupted pass
    F.layer_features(model, "Tiny", "train", (1,), context=16, max_windows=3, batch_size=2, progress=False)
    assert list((F.FEATURES_DIR / "Tiny").glob("train-layers1-ctx16-w3.f16"))       # not read: computed


def test_layer_features_seed_a_larger_pass_with_a_smaller_finished_cache(tiny, monkeypatch):
    """A larger budget after a smaller one (1.5M tokens after 1M): the smaller finished pass's windows
    are copied into the new cache and only the windows past it are computed; the result equals a pass
    from scratch (float16 rows, bit for bit). A smaller cache of other weights seeds nothing."""
    model, _ = tiny
    scratch = np.asarray(F.layer_features(model, "Tiny", "train", (1,), context=16, max_windows=3, batch_size=2,
                                          progress=False).states).copy()
    for path in (F.FEATURES_DIR / "Tiny").glob("train-layers1-*"):
        path.unlink()
    F.layer_features(model, "Tiny", "train", (1,), context=16, max_windows=2, batch_size=2, progress=False)
    computed, lines = [], []
    real = F._cached_states

    def counting(*args, **kwargs):                         # wrap compute: count the windows actually computed
        compute = args[8]

        def counted(x):
            computed.append(x.shape[0])
            return compute(x)
        return real(*args[:8], counted, *args[9:], **kwargs)
    monkeypatch.setattr(F, "_cached_states", counting)
    grown = F.layer_features(model, "Tiny", "train", (1,), context=16, max_windows=3, batch_size=2, progress=False,
                             log=lines.append)
    assert sum(computed) == 1 and any("the first 2 windows copied from train-layers1-ctx16-w2.f16" in line
                                      for line in lines)
    size = (F.FEATURES_DIR / "Tiny" / "train-layers1-ctx16-w2.f16").stat().st_size      # kept, and named as spare
    assert lines[-1] == (f"features: train-layers1-ctx16-w2.f16: redundant now, its windows are the first of "
                         f"train-layers1-ctx16-w3.f16 (which serves every smaller budget); delete it (and its "
                         f".json) to free {size / 1e9:.2f} GB")
    assert np.array_equal(np.asarray(grown.states), scratch)
    assert json.loads((F.FEATURES_DIR / "Tiny" / "train-layers1-ctx16-w3.json").read_text())["done"] == 3
    (F.FEATURES_DIR / "Tiny" / "train-layers1-ctx16-w3.json").unlink()             # now other weights:
    monkeypatch.setattr(F, "verify_artifact", lambda name: {"files": {"model.safetensors": "other"}})
    computed.clear()
    F.layer_features(model, "Tiny", "train", (1,), context=16, max_windows=3, batch_size=2, progress=False)
    assert sum(computed) == 3                                                       # no seed: every window


def test_target_continuations_are_the_models_greedy_text(tiny):
    """The self-distillation text (the Block drafter's ``self`` variant): each window keeps its first
    corpus tokens, and every later token is the model's argmax given the window so far (checked against
    the teaching path's full forward, not the fast cached path that wrote it); cached and resumed like
    the state caches; a prompt that leaves nothing to continue is refused by name."""
    model, stream = tiny
    ids, n = F.target_continuations(model, "Tiny", "train", context=16, prompt_tokens=4, max_windows=3,
                                    batch_size=2, progress=False)
    assert n == 3 and ids.dtype == torch.int64 and ids.shape == (48,)
    assert ids.tolist() != stream[:48].tolist()                         # not the corpus (the test could fail)
    with torch.no_grad():
        for w in range(3):
            window = ids[w * 16:(w + 1) * 16]
            assert window[:4].tolist() == stream[w * 16:w * 16 + 4].tolist()
            assert window[4:].tolist() == model(window[None, :-1])[0, 3:].argmax(-1).tolist()
    path = F.FEATURES_DIR / "Tiny" / "train-greedy-p4-ctx16-w3.i32"
    record = json.loads(path.with_suffix(".json").read_text())
    assert record["done"] == 3 and record["prompt_tokens"] == 4 and record["decoding"] == "greedy"
    path.with_suffix(".json").write_text(json.dumps({**record, "done": 2}))       # killed after 2 windows
    mm = np.memmap(path, dtype=np.int32, mode="r+", shape=(48,))
    mm[32:] = 0
    mm.flush()
    del mm
    again, _ = F.target_continuations(model, "Tiny", "train", context=16, prompt_tokens=4, max_windows=3,
                                      batch_size=2, progress=False)
    assert again.tolist() == ids.tolist()
    for bad in (0, 16, True, 2.0, (), (4, 16), [4]):
        with pytest.raises(ValueError, match=r"prompt_tokens must be an int in \[1, context - 1 = 15\]"):
            F.target_continuations(model, "Tiny", "train", context=16, prompt_tokens=bad, progress=False)


def test_target_continuations_seed_a_larger_text_with_a_smaller_finished_one(tiny, monkeypatch):
    """A larger budget of the ``self`` variant after a smaller one: the smaller finished text's windows
    are copied in and only the windows past it are decoded; the result equals a text from scratch. A
    text of other prompt lengths seeds nothing."""
    model, _ = tiny
    scratch, _ = F.target_continuations(model, "Tiny", "train", context=16, prompt_tokens=4, max_windows=3,
                                        batch_size=2, progress=False)
    for path in (F.FEATURES_DIR / "Tiny").glob("train-greedy-p4-*"):
        path.unlink()
    F.target_continuations(model, "Tiny", "train", context=16, prompt_tokens=4, max_windows=2, batch_size=2,
                           progress=False)
    F.target_continuations(model, "Tiny", "train", context=16, prompt_tokens=5, max_windows=1, batch_size=2,
                           progress=False)
    decoded, lines = [], []
    real = F._cached_states

    def counting(*args, **kwargs):                         # wrap compute: count the windows actually decoded
        compute = args[8]

        def counted(x, first):
            decoded.append(x.shape[0])
            return compute(x, first)
        return real(*args[:8], counted, *args[9:], **kwargs)
    monkeypatch.setattr(F, "_cached_states", counting)
    grown, n = F.target_continuations(model, "Tiny", "train", context=16, prompt_tokens=4, max_windows=3,
                                      batch_size=2, progress=False, log=lines.append)
    assert n == 3 and sum(decoded) == 1
    assert any("the first 2 windows copied from train-greedy-p4-ctx16-w2.i32" in line for line in lines)
    assert grown.tolist() == scratch.tolist()
    decoded.clear()
    F.target_continuations(model, "Tiny", "train", context=16, prompt_tokens=5, max_windows=3, batch_size=2,
                           progress=False)
    assert sum(decoded) == 2                                   # the p5 text of 1 window seeds the p5 text only


def test_target_continuations_take_prompt_lengths_in_turn(tiny, monkeypatch):
    """The ``mixed`` text: a tuple of prompt lengths taken in turn by groups of windows (here groups of 1,
    so one decode batch holds two lengths: the longer prompt's row keeps its corpus tokens while the
    other row is already continued)."""
    model, stream = tiny
    monkeypatch.setattr(F, "PROMPT_GROUP", 1)
    ids, n = F.target_continuations(model, "Tiny", "train", context=16, prompt_tokens=(4, 10), max_windows=3,
                                    batch_size=2, progress=False)
    assert n == 3 and (F.FEATURES_DIR / "Tiny" / "train-greedy-p4-10-ctx16-w3.i32").is_file()
    with torch.no_grad():
        for w, keep in ((0, 4), (1, 10), (2, 4)):
            window = ids[w * 16:(w + 1) * 16]
            assert window[:keep].tolist() == stream[w * 16:w * 16 + keep].tolist()
            assert window[keep:].tolist() == model(window[None, :-1])[0, keep - 1:].argmax(-1).tolist()
            assert window[keep:].tolist() != stream[w * 16 + keep:(w + 1) * 16].tolist()


def test_layer_features_over_the_models_own_text(tiny, monkeypatch):
    """``source="greedy"``: the states are the model's over its own continuations (their own cache, never
    the corpus cache of the same layers); an unknown source is refused by name."""
    model, _ = tiny
    monkeypatch.setattr(F, "GREEDY_PROMPT_TOKENS", 4)
    corpus = F.layer_features(model, "Tiny", "train", (0,), context=16, max_windows=2, batch_size=2, progress=False)
    feats = F.layer_features(model, "Tiny", "train", (0,), context=16, max_windows=2, batch_size=2, progress=False,
                             source="greedy")
    text, _ = F.target_continuations(model, "Tiny", "train", context=16, prompt_tokens=4, max_windows=2,
                                     progress=False)
    assert feats.ids.tolist() == text.tolist() != corpus.ids.tolist()
    with torch.no_grad():
        want = model.hidden_states(text.view(2, 16))                                     # the final states
    torch.testing.assert_close(feats.batch(torch.tensor([1, 0]))[1][..., -1, :], want[[1, 0]], atol=3e-3, rtol=3e-3)
    assert (F.FEATURES_DIR / "Tiny" / "train-greedy-p4-layers0-ctx16-w2.f16").is_file()
    monkeypatch.setattr(F, "MIXED_PROMPT_TOKENS", (4, 10))
    monkeypatch.setattr(F, "PROMPT_GROUP", 1)
    mixed = F.layer_features(model, "Tiny", "train", (0,), context=16, max_windows=2, batch_size=2, progress=False,
                             source="mixed")
    assert mixed.ids[:16].tolist() == feats.ids[:16].tolist()             # window 0: the same 4-token prompt
    assert mixed.ids[16:].tolist() != feats.ids[16:].tolist()             # window 1 keeps 10 corpus tokens
    assert (F.FEATURES_DIR / "Tiny" / "train-greedy-p4-10-layers0-ctx16-w2.f16").is_file()
    with pytest.raises(ValueError, match="source must be 'corpus'"):
        F.layer_features(model, "Tiny", "train", (0,), context=16, progress=False, source="target")
    monkeypatch.setattr(F, "GREEDY_PROMPT_TOKENS", 16)
    with pytest.raises(ValueError, match=r"source='greedy' keeps the first 16 corpus tokens .* needs context > 16, "
                                         r"got 16"):
        F.layer_features(model, "Tiny", "train", (0,), context=16, progress=False, source="greedy")
    with pytest.raises(ValueError, match=r"source='mixed' keeps the first 10 corpus .* needs context > 10, got 8"):
        F.layer_features(model, "Tiny", "train", (0,), context=8, progress=False, source="mixed")


def test_lineage_recipes_are_complete():
    """Every lineage drafter has a recipe with the keys its job reads, and the fusion layers of its base."""
    from g2c.assets.artifacts import DRAFTERS
    from g2c.assets.recipes.drafters import FUSION_LAYERS, LINEAGE_KINDS

    lineage = [n for n, d in DRAFTERS.items() if d["kind"] in LINEAGE_KINDS]
    assert sorted(lineage) == ["StoryLM-30M-Block", "StoryLM-30M-EAGLE3", "StoryLM-30M-Medusa"]
    for name in lineage:
        r = DRAFTER_RECIPES[name]
        assert {"steps", "batch_size", "features_windows", "seed", "val_windows"} <= set(r)
        assert FUSION_LAYERS[r["base"]] == (2, 4, 6)          # fusion_layers(9), checked in test_specdec_lineage


# -- one budget (issue 29) -------------------------------------------------------------------------
def test_budget_gives_the_steps_and_is_recorded():
    """A budget in target tokens seen: steps = ceil(tokens / (batch x context)), every step runs (no early
    stop), the lineage drafters read as many windows as the budget sees (capped at the split); EAGLE's
    shipped budget is the default 'equal'."""
    from g2c.assets.recipes.drafters import (
        DRAFTER_RECIPES,
        EQUAL_BUDGET_TOKENS,
        STATE_READERS,
        TRAINING_BUDGETS,
        budgeted_recipe,
        parse_budget,
    )

    assert EQUAL_BUDGET_TOKENS == 1400 * 16 * 256 == 5_734_400
    assert set(TRAINING_BUDGETS) == set(STATE_READERS)
    assert {TRAINING_BUDGETS[n] for n in STATE_READERS} == {EQUAL_BUDGET_TOKENS}     # one budget, shipped
    for name in STATE_READERS[:1] + STATE_READERS[2:]:       # the shipped recipe IS the budgeted one (EAGLE's
        assert budgeted_recipe(name, EQUAL_BUDGET_TOKENS) == DRAFTER_RECIPES[name], name   # defines the budget)
    r = budgeted_recipe("StoryLM-30M-Medusa", EQUAL_BUDGET_TOKENS)
    assert r["steps"] == 2800 and r["budget_tokens"] == EQUAL_BUDGET_TOKENS and r["patience"] is None
    assert r["features_windows"] == 22_400 and r["eval_every"] == 100            # more than the split: all of it
    r = budgeted_recipe("storylm-30m-eagle3", 10_000)                            # 4 x 256 per step: 10 steps
    assert r["steps"] == 10 and r["budget_tokens"] == 10_240 and r["eval_every"] == 1
    assert r["features_windows"] == 40
    assert parse_budget("5.7M") == 5_700_000 and parse_budget("200k") == 200_000
    assert parse_budget("equal") == EQUAL_BUDGET_TOKENS and parse_budget("1,024") == 1024
    assert parse_budget("5,734,400") == parse_budget("5734.4k") == 5_734_400 and parse_budget(" 1000M ") == 10**9
    # a helper's trial: a fraction of a token, misplaced commas, an exponent and a budget of days were accepted
    for bad in ("0", "-3", "lots", "nan", "", "1e20", "0.4", "1,2,3", "12,34", "1e11", "1001M", "inf", "1.5", "5,7M",
                "9" * 400, "1000000.5", "5,734,400.3", "1,234.5678k", "\u0661\u0662\u0663"):
        with pytest.raises(ValueError, match="--budget must be a positive number"):
            parse_budget(bad)
    with pytest.raises(ValueError, match="is not a drafter"):
        budgeted_recipe("StoryLM-1M", 1000)
    # one budget, one data stream: every state reader (EAGLE and MTP too) reads the same first windows
    for name in STATE_READERS:
        assert budgeted_recipe(name, 512_000)["features_windows"] == 2000, name
    assert "features_windows" not in budgeted_recipe("StoryLM-1M-distilled", 512_000)


def test_final_states_read_the_last_row_of_the_layer_cache(tiny):
    """A budgeted EAGLE/MTP run reads the final states out of the layer-feature cache the lineage drafters
    fill, so all of them learn from the same windows: the same numbers as the final-state cache."""
    model, _ = tiny
    layered = F.layer_features(model, "Tiny", "train", (0,), context=16, max_windows=3, batch_size=2, progress=False)
    final = F.target_features(model, "Tiny", "train", context=16, batch_size=2, progress=False)
    view = F.FinalStates(layered)
    assert view.num_windows == 3 and view.context == 16
    windows = torch.tensor([2, 0])
    ids, states = view.batch(windows)
    want_ids, want = final.batch(windows)
    assert torch.equal(ids, want_ids) and states.shape == (2, 16, 16)
    torch.testing.assert_close(states, want)                       # both float16 copies of the same states
    assert not torch.equal(states, layered.batch(windows)[1][:, :, 0])   # not block 0's output


@pytest.fixture
def tiny_run(tiny, monkeypatch, tmp_path):
    """train_drafter on a tiny 7-block base (Medusa, blocks 2, 4, 6 read), 16-token windows, no artifacts."""
    import g2c.assets.artifacts as artifacts
    import g2c.assets.data as data
    from g2c.assets.recipes import drafters as D

    base = TransformerLM(32, 16, 7, 2, 16, generator=torch.Generator().manual_seed(0)).eval()
    written = []
    monkeypatch.setattr(D, "load_model", lambda name, **kw: (base, None))
    monkeypatch.setattr(D, "load_story_tokenizer", lambda: None)
    monkeypatch.setattr(data, "tokenize_splits", lambda tok, log=print: None)
    monkeypatch.setattr(artifacts, "is_verified", lambda name, root=None: False)
    monkeypatch.setattr(D, "write_artifact", lambda name, files, manifest, **kw: written.append((files, manifest))
                        or tmp_path / "out")
    recipe = {**D.DRAFTER_RECIPES["StoryLM-30M-Medusa"], "context": 16, "batch_size": 2, "val_windows": 2}
    monkeypatch.setitem(D.DRAFTER_RECIPES, "StoryLM-30M-Medusa", recipe)
    return D, written


def test_budgeted_run_resumes_to_the_same_weights(tiny_run, monkeypatch, tmp_path):
    """An uninterrupted run and one stopped (Ctrl-C) after step 3, then rerun: the same weights, bit for bit;
    the manifest records the budget, the tokens seen and the validation agreement at every check."""
    D, written = tiny_run
    budget = 6 * 2 * 16                                                          # 6 steps of 2 x 16 tokens
    monkeypatch.setattr(D, "RUNS_DIR", tmp_path / "whole")
    D.train_drafter("StoryLM-30M-Medusa", budget=budget, progress=False, log=lambda *a: None)

    def stop(step):
        if step == 3:
            raise KeyboardInterrupt

    lines = []
    monkeypatch.setattr(D, "RUNS_DIR", tmp_path / "interrupted")
    with pytest.raises(KeyboardInterrupt):
        D.train_drafter("StoryLM-30M-Medusa", budget=budget, progress=False, log=lines.append, on_step=stop)
    assert any("holds step 3" in line and "resume" in line for line in lines)
    assert len(written) == 1
    D.train_drafter("StoryLM-30M-Medusa", budget=budget, progress=False, log=lines.append)
    assert any("resuming StoryLM-30M-Medusa at step 3" in line for line in lines)
    (whole, m1), (resumed, m2) = written
    assert whole["model.safetensors"] == resumed["model.safetensors"]
    assert m1["history"] == m2["history"] and m1["steps"] == m2["steps"] == 6
    assert m1["recipe"]["budget_tokens"] == m1["tokens_seen"] == budget
    assert m1["epochs"] == pytest.approx(budget / (4 * 16), abs=0.01)             # the 4-window split, repeated
    assert m1["train_windows"] == 4 < m1["recipe"]["features_windows"] == 12       # read, against asked for
    assert any("epochs of the 4 training windows" in line for line in lines)     # and it says so
    assert [h["tokens_seen"] for h in m1["history"]] == [0, 32, 64, 96, 128, 160, 192]
    assert all("val_agree_1" in h for h in m1["history"])


def test_one_budget_installs_every_drafter_in_one_tree(tiny_run, monkeypatch, tmp_path):
    """``--budget 100`` rounds up to each drafter's whole steps (Medusa: 2 x 16 tokens a step here), but
    installs under runs/budget-100/, the budget asked for, so one --budget gives one tree to compare."""
    D, _ = tiny_run
    roots = []
    monkeypatch.setattr(D, "write_artifact", lambda name, files, manifest, **kw: roots.append(
        (kw.get("root"), manifest["tokens_seen"])) or tmp_path / "out")
    monkeypatch.setattr(D, "RUNS_DIR", tmp_path / "runs")
    D.train_drafter("StoryLM-30M-Medusa", budget=100, progress=False, log=lambda *a: None)
    (root, seen), = roots
    assert root == tmp_path / "runs" / "budget-100" and seen == 4 * 2 * 16               # 128 >= 100


def test_budgeted_eagle_learns_from_the_layer_cache(tiny_run, monkeypatch, tmp_path):
    """EAGLE at a budget trains on the final states of the same layer-feature windows as Medusa, EAGLE-3
    and the block drafter (one feature pass; the manifest says where its data came from)."""
    D, written = tiny_run
    recipe = {**D.DRAFTER_RECIPES["StoryLM-30M-EAGLE"], "context": 16, "batch_size": 2, "val_windows": 2}
    monkeypatch.setitem(D.DRAFTER_RECIPES, "StoryLM-30M-EAGLE", recipe)
    monkeypatch.setattr(D, "RUNS_DIR", tmp_path / "eagle")
    D.train_drafter("StoryLM-30M-EAGLE", budget=4 * 2 * 16, progress=False, log=lambda *a: None)
    (_, manifest), = written
    assert manifest["tokens_seen"] == 128 and manifest["recipe"]["features_windows"] == 8
    assert "final states (from the cache of blocks 2, 4, 6 and final states)" in manifest["recipe"]["data"]
    assert list((F.FEATURES_DIR / "StoryLM-30M").glob("train-layers2-4-6-ctx16-w*.f16"))


def test_checkpoints_budget_refuses_what_it_cannot_do(capsys):
    """--budget without --train, or for a model that is not a drafter: one line, exit 2, nothing trained."""
    from g2c.assets import checkpoints

    assert checkpoints.main(["--budget", "5k"]) == 2
    assert "--budget goes with --train NAME" in capsys.readouterr().err
    assert checkpoints.train(["StoryLM-1M"], force=False, root=None, budget=1000) == 2
    err = capsys.readouterr().err
    assert "--budget retrains drafters only" in err and "(not StoryLM-1M)" in err and len(err.splitlines()) == 1


def test_model_card_records_a_budget_and_tables_it(tmp_path, monkeypatch):
    """``scripts/model_card.py --record-budget runs/budget-<T>`` copies the manifests (not the weights) and
    the card's "At one budget" table reads them: one row per drafter, its agreement and budget."""
    import importlib.util

    from g2c.course import REPO_ROOT

    spec = importlib.util.spec_from_file_location("g2c_model_card", REPO_ROOT / "scripts" / "model_card.py")
    card = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(card)
    monkeypatch.setattr(card, "BUDGETS", tmp_path / "budgets")
    run = tmp_path / "runs" / "budget-2048"
    with pytest.raises(FileNotFoundError, match="budget-2048: no such folder"):
        card.record_budget(run)
    run.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="--budget T first"):
        card.record_budget(run)
    (run / "models" / "StoryLM-30M-Medusa").mkdir(parents=True)
    (run / "models" / "StoryLM-30M-Medusa" / "model.safetensors").write_bytes(b"weights")
    manifest = {"name": "StoryLM-30M-Medusa", "drafter": "medusa", "tokens_seen": 2048, "epochs": 1.0, "steps": 1,
                "recipe": {"features_windows": 8}, "val": {"val_agree_1": 0.25, "val_agree_2": 0.125},
                "wall_time_s": 90.0}
    (run / "models" / "StoryLM-30M-Medusa" / "manifest.json").write_text(json.dumps(manifest))
    assert card.main(["--record-budget", str(run), str(tmp_path / "runs" / "budget-5")]) == 1   # all or nothing
    assert not (tmp_path / "budgets").exists()
    assert card.main(["--record-budget", str(run)]) == 0
    copied = tmp_path / "budgets" / "budget-2048" / "models" / "StoryLM-30M-Medusa"
    assert sorted(p.name for p in copied.iterdir()) == ["manifest.json"]          # the record, not the weights
    section = card.budget_section()
    assert "#### budget-2048 (2,048 target tokens each)" in section
    assert "| StoryLM-30M-Medusa | medusa | 2,048 | 1.0 | 1 | 8 | 0.25/0.12 | 1.5 min | bf16 |" in section
    # a recipe whose own text is not the corpus (the shipped block drafter's) says so without a variant
    block = {**manifest, "name": "StoryLM-30M-Block", "drafter": "block", "recipe": {"text": "greedy"}}
    (run / "models" / "StoryLM-30M-Block").mkdir()
    (run / "models" / "StoryLM-30M-Block" / "manifest.json").write_text(json.dumps(block))
    assert card.main(["--record-budget", str(run)]) == 0
    assert "| StoryLM-30M-Block, text greedy | block | 2,048 |" in card.budget_section()
    assert card.precision({"recipe": {"bf16_autocast": False}}) == "fp32"        # a float32 retrain (AVX2 CPU)
    # past one epoch the recipe asks for more windows than the split has; the card shows the ones read
    old = {"recipe": {"features_windows": 11720, "data": "StoryLM-30M's outputs of blocks 2, 4, 6 and final "
                      "states over the first 6179 train windows of 256 tokens"}}
    assert card.training_windows(old) == "6179"                                  # read from the data line
    assert card.training_windows({**old, "train_windows": 6000}) == "6000"       # the trainer's record first
    assert card.training_windows({"recipe": {"features_windows": 8}}) == "8" and card.training_windows({}) == "-"


def test_model_card_parses_its_flags_before_any_work(tmp_path, monkeypatch, capsys):
    """A helper's trial: ``--help`` and an unknown flag rebuilt the card and rewrote docs/models.md, and
    ``--record-budget`` of a missing folder was a raw traceback. Flags are parsed first; a bad run root is
    one line and exit 1; nothing is written."""
    import importlib.util

    from g2c.course import REPO_ROOT

    spec = importlib.util.spec_from_file_location("g2c_model_card", REPO_ROOT / "scripts" / "model_card.py")
    card = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(card)
    monkeypatch.setattr(card, "BUDGETS", tmp_path / "budgets")
    monkeypatch.setattr(card, "verify_artifact", lambda name: pytest.fail("the card was rebuilt"))
    for argv, code in ((["--help"], 0), (["--bogus"], 2), (["--record-budget"], 2)):
        with pytest.raises(SystemExit) as ended:
            card.main(argv)
        assert ended.value.code == code
    assert "--record-budget RUN_ROOT" in capsys.readouterr().out
    assert card.main(["--record-budget", str(tmp_path / "runs" / "budget-7")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("model_card: ") and "budget-7: no such folder" in err
    assert "--budget T installs" in err and len(err.splitlines()) == 1 and not (tmp_path / "budgets").exists()
    # a second trial: any folder was "recorded", a bad manifest copied as is (the card's rebuild then failed
    # with a raw KeyError after redrawing its figures), and the record could be "recorded" onto itself
    good = {"name": "StoryLM-30M-Medusa", "drafter": "medusa", "tokens_seen": 2048, "epochs": 1.0, "steps": 1,
            "recipe": {}, "val": {}, "history": [], "wall_time_s": 1.0}
    for folder, text, why in (("artifacts", json.dumps(good), "not a budgeted run's folder"),
                              ("budget-abc", json.dumps(good), "not a budgeted run's folder"),
                              ("budget-8", "not json", "manifest.json: not a JSON manifest"),
                              ("budget-9", "{}", "not a drafter's training manifest (missing name, drafter,"),
                              ("budget-10", json.dumps(good), None)):
        (tmp_path / "runs" / folder / "models" / "M").mkdir(parents=True)
        (tmp_path / "runs" / folder / "models" / "M" / "manifest.json").write_text(text)
        code = card.main(["--record-budget", str(tmp_path / "runs" / folder)])
        err = capsys.readouterr().err
        assert (code, why is None or why in err) == (1 if why else 0, True), (folder, err)
    assert sorted(p.name for p in (tmp_path / "budgets").iterdir()) == ["budget-10"]      # only the good one
    assert card.main(["--record-budget", str(tmp_path / "budgets" / "budget-10")]) == 1
    assert "is the record itself; record the run's folder (runs/budget-10)" in capsys.readouterr().err


# -- variants: the paper designs and the ablations (issue 29, items 2 and 4) --------------------------
def _kv_reference(head, context_states, anchor_ids, B):
    """DFlash's key/value injection written out by hand for one head: the fused features projected by
    each layer's OWN key/value maps (never by what earlier layers made of them), the anchor and B slots
    as the only queries, causal among themselves."""
    W, dim = head.context_rows, head.base.embedding_dim
    ctx = head.fc(context_states[:, -W:, :3].flatten(-2)) + head.pos_embed[:W]
    anchor = head.ln_embed(head.base.token_embed.weight[anchor_ids]).unsqueeze(1)
    x = torch.cat([anchor, head.mask_embed.expand(len(anchor_ids), B, -1)], 1) + head.pos_embed[W:W + 1 + B]
    allowed = torch.cat([torch.ones(1 + B, W, dtype=torch.bool), torch.ones(1 + B, 1 + B, dtype=torch.bool).tril()], 1)
    for blk in head.blocks:
        H, d = blk.attn.num_heads, dim // blk.attn.num_heads
        q, k, v = blk.attn.qkv(blk.ln_1(x)).split(dim, -1)
        _, kc, vc = blk.attn.qkv(blk.ln_1(ctx)).split(dim, -1)
        keys, values = torch.cat([kc, k], 1), torch.cat([vc, v], 1)
        heads = [torch.softmax((q[..., h * d:(h + 1) * d] @ keys[..., h * d:(h + 1) * d].transpose(1, 2)) / d ** 0.5
                               + torch.where(allowed, 0.0, float("-inf")), -1) @ values[..., h * d:(h + 1) * d]
                 for h in range(H)]
        x = x + blk.attn.proj(torch.cat(heads, -1))
        x = x + blk.mlp(blk.ln_2(x))
    return head.ln_out(x[:, 1:]) @ head.base.token_embed.weight.T


def test_block_head_kv_injection_feeds_the_features_to_every_layer():
    """``BlockHead(injection="kv")`` (DFlash, section 3) equals the hand-written reference above; a
    shorter block gives the same first slots; its config round-trips (the shipped "rows" head's config
    has no such key); a bad injection is refused by name."""
    from g2c.specdec.lineage import BlockHead

    base = TransformerLM(32, 16, 7, 2, 16, generator=torch.Generator().manual_seed(0)).eval()
    head = BlockHead(base, block_size=4, context_rows=3, injection="kv", generator=torch.Generator().manual_seed(1))
    states = torch.randn(2, 3, 4, 16, generator=torch.Generator().manual_seed(2))
    anchors = torch.tensor([5, 9])
    with torch.no_grad():
        got = head(states, anchors)
        torch.testing.assert_close(got, _kv_reference(head, states, anchors, 4), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(head(states, anchors, 2), got[:, :2], atol=1e-5, rtol=1e-5)
        rows = BlockHead(base, block_size=4, context_rows=3, generator=torch.Generator().manual_seed(1))
        assert not torch.allclose(rows(states, anchors), got, atol=1e-3)       # same weights, another design
    assert head.config()["injection"] == "kv" and "injection" not in rows.config()
    assert BlockHead.from_config(base, head.config()).injection == "kv"
    assert BlockHead.from_config(base, rows.config()).injection == "rows"
    for bad, error in (("keys", ValueError), ("KV", ValueError), (None, TypeError), (1, TypeError)):
        with pytest.raises(error, match="injection must be 'rows'"):                 # a wrong type: TypeError
            BlockHead(base, injection=bad)
    # bad calls are refused by name (issue 29's break-test found raw errors here)
    with torch.no_grad():
        for bad, error in ((True, TypeError), (2.0, TypeError), ("2", TypeError), (0, ValueError), (5, ValueError)):
            with pytest.raises(error, match="block_size must be an int in"):         # a wrong type: TypeError
                head(states, anchors, bad)
        with pytest.raises(ValueError, match=r"D = 16"):
            head(torch.randn(2, 3, 4, 8), anchors)
        for ids in (torch.tensor([5.0, 9.0]), torch.tensor([5, 32]), torch.tensor([-1, 0])):
            with pytest.raises(ValueError, match=r"anchor_ids must be integer token ids in \[0, 32\)"):
                head(states, ids)


def test_recipe_variants_change_one_recipe_and_install_apart(tiny_run, monkeypatch, tmp_path, capsys):
    """A variant is a named change to a budgeted recipe, recorded in it; it installs into
    runs/budget-<T>-<variant>/ and trains in its own run folder; an unknown variant or one without a
    budget is refused with the variants there are."""
    from g2c.assets import checkpoints

    D, written = tiny_run
    r = D.budgeted_recipe("StoryLM-30M-Block", 512_000, "kv")
    assert r["injection"] == "kv" and r["variant"] == "kv" and r["steps"] == 250
    assert D.budgeted_recipe("StoryLM-30M-EAGLE3", 512_000, "ttt7")["ttt_steps"] == 7
    assert D.budgeted_recipe("StoryLM-30M-EAGLE3", 512_000, "ttt1")["ttt_steps"] == 1
    assert D.budgeted_recipe("StoryLM-30M-EAGLE", 512_000, "tokens")["feature_inputs"] is False
    assert D.budgeted_recipe("StoryLM-30M-Block", 512_000, "self")["text"] == "greedy"
    assert D.budgeted_recipe("StoryLM-30M-Block", 512_000, "mixed")["text"] == "mixed"
    assert D.budgeted_recipe("StoryLM-30M-Block", 512_000, " KV ")["variant"] == "kv"       # any case, as names
    assert "variant" not in D.budgeted_recipe("StoryLM-30M-Block", 512_000)
    # the shipped block drafter learns from the target's own text; "corpus" is the former recipe, and kv
    # (measured against it) stays on the corpus
    assert D.budgeted_recipe("StoryLM-30M-Block", 512_000)["text"] == "greedy"
    assert D.budgeted_recipe("StoryLM-30M-Block", 512_000, "corpus")["text"] == "corpus"
    assert r["text"] == "corpus" and "text" not in D.budgeted_recipe("StoryLM-30M-Medusa", 512_000)
    for name in ("StoryLM-30M-Medusa", "StoryLM-30M-EAGLE", "StoryLM-30M-EAGLE3"):     # self-distillation too
        assert D.budgeted_recipe(name, 512_000, "self")["text"] == "greedy"
    with pytest.raises(ValueError, match="has no variant 'kv'; its variants: self;"):
        D.budgeted_recipe("StoryLM-30M-Medusa", 512_000, "kv")
    with pytest.raises(ValueError, match="has no variant 'self'; its variants: none"):
        D.budgeted_recipe("StoryLM-30M-MTP", 512_000, "self")
    with pytest.raises(ValueError, match=r"has no variant 'SELFF' \(did you mean 'self'\?\); its variants: kv, "):
        D.budgeted_recipe("StoryLM-30M-Block", 512_000, "SELFF")                     # as typed, and the near one
    with pytest.raises(ValueError, match="trains at a budget only"):
        D.train_drafter("StoryLM-30M-Block", variant="kv", progress=False, log=lambda *a: None)
    assert checkpoints.main(["--variant", "kv"]) == 2
    assert "--variant goes with --train NAME --budget TOKENS" in capsys.readouterr().err
    for extra in (["--variant", "kv"], ["--budget", "512k"], ["--force"]):         # --pin takes names only
        assert checkpoints.main(["--pin", "StoryLM-30M-Block", *extra]) == 2
        assert "--pin takes the NAMEs to pin and no other option" in capsys.readouterr().err
    assert checkpoints.train(["StoryLM-30M-Block"], force=False, root=None, variant="kv") == 2
    assert "--variant goes with --train NAME --budget" in capsys.readouterr().err
    assert checkpoints.train(["StoryLM-30M-Medusa"], force=False, root=None, budget=100, variant="ttt7") == 2
    assert "has no variant 'ttt7'" in capsys.readouterr().err
    assert D.budget_root(100, "kv") == D.RUNS_DIR / "budget-100-kv"
    helped = " ".join(checkpoints.build_parser().format_help().split())        # every variant is in --help
    for name, variants in D.RECIPE_VARIANTS.items():
        short = name.removeprefix("StoryLM-30M-")
        assert re.search(rf"{short}: {', '.join(variants)}[;)]", helped), (short, helped)         # the epilog
        assert re.search(rf"{short} {'/'.join(variants)}[,)]", helped), (short, helped)           # --variant
    # a tiny kv run: its recipe, config and install folder say which design it is
    recipe = {**D.DRAFTER_RECIPES["StoryLM-30M-Block"], "context": 16, "batch_size": 2, "val_windows": 2,
              "block_size": 4, "context_rows": 4, "anchors_per_window": 2}
    monkeypatch.setitem(D.DRAFTER_RECIPES, "StoryLM-30M-Block", recipe)
    roots = []
    monkeypatch.setattr(D, "write_artifact", lambda name, files, manifest, **kw: roots.append(
        (kw.get("root"), manifest, json.loads(files["config.json"]))) or tmp_path / "out")
    monkeypatch.setattr(D, "RUNS_DIR", tmp_path / "runs")
    D.train_drafter("StoryLM-30M-Block", budget=64, variant="kv", progress=False, log=lambda *a: None)
    (root, manifest, config), = roots
    assert root == tmp_path / "runs" / "budget-64-kv" and config["injection"] == "kv"
    assert manifest["recipe"]["variant"] == "kv" and (tmp_path / "runs" / "StoryLM-30M-Block-budget64-kv").is_dir()
    # a tiny self run learns from the base's own greedy text (its own feature cache), and says so
    monkeypatch.setattr(F, "GREEDY_PROMPT_TOKENS", 4)
    said = []
    D.train_drafter("StoryLM-30M-Block", budget=64, variant="self", progress=False, log=said.append)
    # a helper's trial: a budget typed 1000 times too large said nothing of its size until the text was decoded
    assert "steps of" in said[0] and "on the base's own greedy text; first the base's states" in said[0], said
    root, manifest, _ = roots[-1]
    assert root == tmp_path / "runs" / "budget-64-self" and manifest["recipe"]["text"] == "greedy"
    assert "of its own greedy text (each window's first 4 corpus tokens continued)" in manifest["recipe"]["data"]
    assert [p.name for p in (F.FEATURES_DIR / "StoryLM-30M").glob("train-greedy-p4-layers2-4-6-ctx16-w*.f16")]


def test_eagle_on_tokens_only_reads_no_features():
    """``eagle_loss(feature_inputs=False)``, the ablation of EAGLE's feature conditioning: zeros stand in
    for the input states (so the input states cannot change it), the targets are still the true next
    states and the target's next-token distribution."""
    from g2c.specdec.sampling.eagle import FeatureDrafter, eagle_loss

    base = TransformerLM(32, 16, 2, 2, 16, generator=torch.Generator().manual_seed(0)).eval()
    head = FeatureDrafter(base, generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(2)
    states, ids = torch.randn(2, 8, 16, generator=g), torch.randint(0, 32, (2, 8), generator=g)
    with torch.no_grad():
        out = eagle_loss(head, states, ids, noise=0.0, feature_inputs=False)
        pred = head(torch.zeros(2, 6, 16), ids[:, 1:-1])
        reg = torch.nn.functional.smooth_l1_loss(pred, states[:, 1:-1])
        torch.testing.assert_close(out["reg"], reg)
        other = states.clone()
        other[:, 0] += 5.0                                   # a state only ever read as an input
        torch.testing.assert_close(eagle_loss(head, other, ids, noise=0.0, feature_inputs=False)["loss"], out["loss"])
        assert not torch.allclose(eagle_loss(head, other, ids, noise=0.0)["loss"], eagle_loss(head, states, ids,
                                                                                             noise=0.0)["loss"])
        for bad in ("False", [False], 0, None):                # a truthy string would train on features
            with pytest.raises(TypeError, match="feature_inputs must be True or False"):
                eagle_loss(head, states, ids, feature_inputs=bad)


def test_model_card_tables_a_variant_with_its_budget(tmp_path, monkeypatch):
    """A variant's tree (runs/budget-<T>-<variant>/) joins its budget's table, its row labelled by the
    variant, so the paper design or the ablation reads beside the plain drafter at the same budget."""
    import importlib.util

    from g2c.course import REPO_ROOT

    spec = importlib.util.spec_from_file_location("g2c_model_card", REPO_ROOT / "scripts" / "model_card.py")
    card = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(card)
    monkeypatch.setattr(card, "BUDGETS", tmp_path / "budgets")
    for folder, variant, agree in (("budget-4096", None, 0.5), ("budget-4096-kv", "kv", 0.25)):
        run = tmp_path / "runs" / folder / "models" / "StoryLM-30M-Block"
        run.mkdir(parents=True)
        recipe = {"features_windows": 16, **({} if variant is None else {"variant": variant})}
        (run / "manifest.json").write_text(json.dumps({
            "name": "StoryLM-30M-Block", "drafter": "block", "tokens_seen": 4096, "epochs": 1.0, "steps": 2,
            "recipe": recipe, "val": {"val_agree_1": agree}, "wall_time_s": 60.0}))
        assert card.main(["--record-budget", str(tmp_path / "runs" / folder)]) == 0
    section = card.budget_section()
    assert section.count("#### budget-4096 (4,096 target tokens each)") == 1 and "####" not in section.split("\n", 1)[1]
    assert section.index("| StoryLM-30M-Block | block | 4,096 | 1.0 | 2 | 16 | 0.50 |") < section.index(
        "| StoryLM-30M-Block, variant kv | block | 4,096 | 1.0 | 2 | 16 | 0.25 |")


def test_agreement_figure_reads_the_recorded_budgets_and_keeps_only_the_named_drafters(tmp_path, capsys):
    """scripts/agreement_figure.py over the recorded budget manifests (docs/bench/budgets): ``--only``
    keeps the named drafters' curves, one per budget, each a history of (tokens seen, agreement)
    whose tokens grow with the checks and whose last point is the manifest's tokens seen."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("agreement_figure", root / "scripts" / "agreement_figure.py")
    fig = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fig)
    budgets = root / "docs" / "bench" / "budgets"
    roots = [budgets / "budget-512000", budgets / "budget-1000000"]
    curves = fig.collect(roots, [], 1, ("StoryLM-30M-EAGLE3",))
    assert sorted(curves) == ["StoryLM-30M-EAGLE3 (budget-1000000)", "StoryLM-30M-EAGLE3 (budget-512000)"]
    for label, points in curves.items():
        manifest = json.loads((budgets / label.split("(")[1].rstrip(")") / "models" / "StoryLM-30M-EAGLE3"
                               / "manifest.json").read_text())
        tokens = [t for t, _ in points]
        assert tokens == sorted(tokens) and len(tokens) >= 10 and tokens[-1] == manifest["tokens_seen"]
        assert all(0.0 < a < 1.0 for _, a in points)
    out = tmp_path / "fig.png"
    assert fig.main(["--no-shipped", "--only", "StoryLM-30M-EAGLE", "--root", str(roots[0]), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    with pytest.raises(SystemExit):                            # argparse: not a state-reading drafter
        fig.main(["--only", "StoryLM-1M"])
    # a helper's trial: an unwritable --out, a position no drafter has, and one only some have; the --out is
    # refused at parse time (issue 57: g2c.assets.cli.output_file), before any drafter is read
    (tmp_path / "file").write_text("keep")
    for bad, why in ((tmp_path / "file" / "fig.png", "file is a file, not a folder"),
                     (Path("/proc/no/fig.png"), "cannot write the output folder /proc/no: /proc takes no new files")):
        with pytest.raises(SystemExit) as info:
            fig.main(["--no-shipped", "--root", str(roots[0]), "--out", str(bad)])
        err = capsys.readouterr().err
        assert info.value.code == 2 and "argument --out: " in err and why in err, err
    assert (tmp_path / "file").read_text() == "keep" and out.stat().st_size > 1000
    two = ["--no-shipped", "--root", str(roots[0]), "--only", "StoryLM-30M-EAGLE", "--only", "StoryLM-30M-Medusa"]
    assert fig.main([*two, "--position", "9", "--out", str(out)]) == 1
    assert ("no drafter here has a position 9 (found with position 1: StoryLM-30M-EAGLE (budget-512000), "
            "StoryLM-30M-Medusa (budget-512000)); try a smaller --position") in capsys.readouterr().err
    assert fig.main([*two, "--position", "2", "--out", str(out)]) == 0
    assert "left out (no position 2): StoryLM-30M-EAGLE (budget-512000)\n" in capsys.readouterr().err
    # a second trial: broken manifests and run checkpoints were raw tracebacks; an empty --root and --only
    # over the runs were ignored in silence; --out x.svg got PNG bytes
    broken = tmp_path / "budget-1" / "models" / "StoryLM-30M-EAGLE"
    broken.mkdir(parents=True)
    (broken / "manifest.json").write_text("not json")
    (tmp_path / "run1").mkdir()
    (tmp_path / "run1" / "drafter.pt").write_text("junk")
    (tmp_path / "StoryLM-30M-EAGLE-budget5").mkdir()
    (tmp_path / "StoryLM-30M-EAGLE-budget5" / "drafter.pt").write_text("junk")
    for extra, code, why in (
            (["--root", str(tmp_path / "budget-1")], 1, "manifest.json: not a training manifest with a history "
                                                        "(JSONDecodeError"),
            (["--run", str(tmp_path / "run1" / "drafter.pt")], 1, "cannot tell which drafter it trains"),
            (["--run", str(tmp_path / "StoryLM-30M-EAGLE-budget5" / "drafter.pt")], 1,
             "not a drafter checkpoint with a history (UnpicklingError)"),
            (["--run", str(tmp_path / "StoryLM-30M-EAGLE-budget5")], 1, "not a file (give the run's drafter.pt)"),
            (["--root", str(tmp_path / "run1")], 1, "no drafter's manifest (models/<Name>/manifest.json"),
            (["--out", str(tmp_path / "fig.svg")], 2, "--out writes a PNG: give a .png name")):
        assert fig.main(["--no-shipped", "--root", str(roots[0]), "--out", str(out), *extra]) == code, extra
        assert why in capsys.readouterr().err, extra
    assert fig.main(["--no-shipped", "--root", str(roots[0]), "--only", "StoryLM-30M-Medusa", "--out", str(out),
                     "--run", str(tmp_path / "StoryLM-30M-EAGLE-budget5" / "drafter.pt")]) == 0   # not an --only
    assert not (tmp_path / "fig.svg").exists()
    # a review: a run of a drafter that is no state reader was dropped without --only; a recipe without
    # batch_size still escaped as a raw KeyError
    import torch

    (tmp_path / "StoryLM-1M-distilled").mkdir()
    torch.save({"history": [{"step": 0, "val_agree": 0.1}, {"step": 2, "val_agree": 0.3}]},
               tmp_path / "StoryLM-1M-distilled" / "drafter.pt")
    run = ["--run", str(tmp_path / "StoryLM-1M-distilled" / "drafter.pt")]
    assert fig.main(["--no-shipped", *run, "--out", str(out)]) == 0
    assert "StoryLM-1M-distilled (in progress): 2 checks" in capsys.readouterr().out
    assert fig.main(["--no-shipped", *run, "--only", "StoryLM-30M-EAGLE", "--out", str(out)]) == 1   # filtered
    capsys.readouterr()
    manifest = json.loads((roots[0] / "models" / "StoryLM-30M-EAGLE" / "manifest.json").read_text())
    del manifest["recipe"]["batch_size"]
    (broken / "manifest.json").write_text(json.dumps(manifest))
    assert fig.main(["--no-shipped", "--root", str(tmp_path / "budget-1"), "--out", str(out)]) == 1
    assert "not a training manifest with a history (KeyError: 'batch_size')" in capsys.readouterr().err
    # the legend's order: by drafter, then by budget in tokens (not by the folder name's text), shipped last
    labels = ["StoryLM-30M-EAGLE3", "StoryLM-30M-EAGLE (budget-1000000)", "StoryLM-30M-EAGLE3 (budget-512000-ttt1)",
              "StoryLM-30M-EAGLE3 (budget-1500000)", "StoryLM-30M-EAGLE (budget-512000)", "StoryLM-30M-EAGLE"]
    assert sorted(labels, key=fig.label_order) == [
        "StoryLM-30M-EAGLE (budget-512000)", "StoryLM-30M-EAGLE (budget-1000000)", "StoryLM-30M-EAGLE",
        "StoryLM-30M-EAGLE3 (budget-512000-ttt1)", "StoryLM-30M-EAGLE3 (budget-1500000)", "StoryLM-30M-EAGLE3"]


def test_recipes_train_in_bfloat16_only_where_the_hardware_has_it(tiny_run, monkeypatch, tmp_path):
    """bfloat16 autocast is emulated on a CPU without AVX-512 or ARM BF16 (an AVX2 CPU: tens of times slower
    than float32), so the recipes use it only where oneDNN has the kernels, say which they use, and record it;
    G2C_BF16_AUTOCAST=1/0 forces either (e.g. to rerun a manifest's precision), anything else is named."""
    from g2c.assets.recipes.ladder import BF16_ENV, bf16_autocast_is_fast

    D, written = tiny_run
    monkeypatch.delenv(BF16_ENV, raising=False)
    assert bf16_autocast_is_fast("cpu") is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert bf16_autocast_is_fast(torch.device("meta")) is False            # neither CPU nor CUDA: float32
    monkeypatch.setenv(BF16_ENV, "yes")
    with pytest.raises(ValueError, match=r"G2C_BF16_AUTOCAST must be 1 .* or 0 .*, got 'yes'"):
        bf16_autocast_is_fast("cpu")
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv(BF16_ENV, flag)
        monkeypatch.setattr(D, "RUNS_DIR", tmp_path / flag)
        lines = []
        D.train_drafter("StoryLM-30M-Medusa", budget=2 * 2 * 16, progress=False, log=lines.append)
        files, manifest = written[-1]
        assert manifest["recipe"]["bf16_autocast"] is (flag == "1")
        said = f"{'bfloat16 autocast' if flag == '1' else 'float32'} on cpu: forced by G2C_BF16_AUTOCAST={flag}"
        assert any(said in line for line in lines), lines
        assert not any("no bfloat16 products" in line for line in lines), lines   # the variable, not the CPU, chose
        runs[flag] = manifest["history"]
    monkeypatch.delenv(BF16_ENV)
    from g2c.assets.recipes.ladder import precision_note
    assert precision_note(False, "cpu").startswith("float32 on cpu: it has no bfloat16 products")
    assert precision_note(True, "cuda:0") == "bfloat16 autocast on cuda:0"
    assert runs["0"][0]["val_loss"] != runs["1"][0]["val_loss"]    # the flag reached the loop: the same weights
    assert runs["0"] != runs["1"]                                  # score apart in the two precisions, train apart
