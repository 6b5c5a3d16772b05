"""The drafter recipes' machinery (g2c/assets/recipes/drafters.py, g2c/assets/recipes/features.py) on tiny data.

The shipped drafters themselves are checked in tests/tooling/test_artifacts.py (ladder marker).
"""

from __future__ import annotations

import json
import math

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
