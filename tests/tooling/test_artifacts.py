"""Shipped artifacts (g2c/assets/artifacts.py, provided code): verification, atomic writes, loading.

The first part works on a temporary artifacts root; the ``ladder`` tests check the real
StoryLM ladder under ``artifacts/`` (they skip without it, see tests/conftest.py).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from g2c.assets import artifacts
from g2c.assets.artifacts import (
    DRAFTERS,
    ArtifactMissingError,
    ChecksumError,
    artifact_dir,
    canonical_name,
    drafter_names,
    load_model,
    load_tokenizer,
    model_names,
    verify_artifact,
    write_artifact,
)


def flip_byte(path, offset: int = -1) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.fixture
def root(tmp_path):
    return tmp_path / "artifacts"


@pytest.fixture
def with_tokenizer(root):
    """A tmp root holding a copy of the shipped StoryTokenizer (the models need it)."""
    shutil.copytree(artifact_dir("StoryTokenizer"), artifact_dir("StoryTokenizer", root))
    return root


def tiny_model(vocab_size: int = 4096):
    from g2c.transformer import TransformerLM

    return TransformerLM(vocab_size, 16, 2, 2, 32, generator=torch.Generator().manual_seed(0))


def install_tiny_model(root, name: str = "StoryLM-1M", model=None) -> torch.nn.Module:
    model = model or tiny_model()
    cfg = {"vocab_size": model.vocab_size, "embedding_dim": 16, "num_layers": 2, "num_heads": 2,
           "max_seq_len": 32, "hidden_dim": model.hidden_dim, "tokenizer": "StoryTokenizer"}
    staging = root.parent / "staging"
    staging.mkdir(exist_ok=True)
    artifacts.save_model_file(model, staging / "model.safetensors")
    write_artifact(name, {"model.safetensors": staging / "model.safetensors",
                          "config.json": json.dumps(cfg).encode()},
                   {"name": name, "kind": "model", "val_loss": 9.0}, root=root)
    return model


# -- names -----------------------------------------------------------------------------------

def test_canonical_name_is_case_insensitive():
    assert canonical_name("storylm-30m") == "StoryLM-30M"
    assert canonical_name(" STORYTOKENIZER ") == "StoryTokenizer"


def test_canonical_name_unknown_lists_names():
    with pytest.raises(ValueError, match="StoryLM-1M, StoryLM-5M, StoryLM-30M, StoryLM-1M-distilled, .*"
                       "StoryLM-30M-EAGLE, StoryLM-30M-Medusa, StoryLM-30M-EAGLE3, StoryLM-30M-Block, StoryTokenizer"):
        canonical_name("StoryLM-2M")


def test_artifact_dir_layout(root):
    assert artifact_dir("storylm-5m", root) == root / "models" / "StoryLM-5M"
    assert artifact_dir("StoryTokenizer", root) == root / "tokenizers" / "StoryTokenizer"


# -- write and verify ------------------------------------------------------------------------

def test_write_artifact_then_verify(root):
    dest = write_artifact("StoryLM-1M", {"model.safetensors": b"weights", "config.json": b"{}"},
                          {"name": "StoryLM-1M", "val_loss": 3.0}, root=root)
    assert dest == root / "models" / "StoryLM-1M"
    manifest = verify_artifact("storylm-1m", root)
    assert manifest["val_loss"] == 3.0
    assert manifest["files"]["model.safetensors"] == artifacts.sha256_file(dest / "model.safetensors")
    assert sorted(p.name for p in dest.parent.iterdir()) == ["StoryLM-1M"]  # no temp folder left


def test_write_artifact_copies_paths(root, tmp_path):
    src = tmp_path / "w.bin"
    src.write_bytes(b"\x00\x01" * 100)
    dest = write_artifact("StoryLM-5M", {"model.safetensors": src}, {}, root=root)
    assert (dest / "model.safetensors").read_bytes() == src.read_bytes()


def test_verify_flipped_byte_raises_checksum_error(root):
    dest = write_artifact("StoryLM-1M", {"model.safetensors": b"weights" * 10}, {}, root=root)
    flip_byte(dest / "model.safetensors", 3)
    with pytest.raises(ChecksumError, match=r"model\.safetensors.*Run \./checkpoints\.sh to restore it"):
        verify_artifact("StoryLM-1M", root)


def test_verify_missing_artifact_names_checkpoints_sh(root):
    with pytest.raises(ArtifactMissingError, match=r"StoryLM-30M is missing.*run \./checkpoints\.sh"):
        verify_artifact("StoryLM-30M", root)


def test_verify_missing_file_names_checkpoints_sh(root):
    dest = write_artifact("StoryLM-1M", {"model.safetensors": b"w", "config.json": b"{}"}, {}, root=root)
    (dest / "config.json").unlink()
    with pytest.raises(ArtifactMissingError, match=r"config\.json is missing: run \./checkpoints\.sh"):
        verify_artifact("StoryLM-1M", root)


def test_verify_garbled_manifest_is_a_checksum_error(root):
    dest = write_artifact("StoryLM-1M", {"model.safetensors": b"w"}, {}, root=root)
    (dest / "manifest.json").write_text("{not json")
    with pytest.raises(ChecksumError, match=r"manifest\.json is corrupted.*--force"):
        verify_artifact("StoryLM-1M", root)


def test_verify_unknown_name_lists_names(root):
    with pytest.raises(ValueError, match="known: StoryLM-1M"):
        verify_artifact("GPT-2", root)


@pytest.mark.parametrize("fname", ["../escape.txt", "sub/file", "/tmp/abs", ".hidden", "manifest.json", ""])
def test_write_artifact_refuses_a_name_leaving_the_folder(root, fname):
    with pytest.raises(ChecksumError, match=r"unsafe file name .*plain files inside its own folder"):
        write_artifact("StoryLM-1M", {fname: b"x"}, {}, root=root)
    assert not (root.parent / "escape.txt").exists() and not artifact_dir("StoryLM-1M", root).exists()


def test_verify_refuses_a_manifest_entry_leaving_the_folder(root):
    write_artifact("StoryLM-1M", {"model.safetensors": b"w"}, {}, root=root)
    folder = artifact_dir("StoryLM-1M", root)
    (root / "outside.txt").write_bytes(b"o")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["../../outside.txt"] = artifacts.sha256_file(root / "outside.txt")
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ChecksumError, match=r"unsafe file name '\.\./\.\./outside\.txt'"):
        verify_artifact("StoryLM-1M", root)


def test_write_artifact_keeps_files_the_manifest_does_not_own(root):
    write_artifact("StoryLM-1M", {"model.safetensors": b"v1", "old.bin": b"o"}, {}, root=root)
    folder = artifact_dir("StoryLM-1M", root)
    (folder / "notes.txt").write_text("mine")
    write_artifact("StoryLM-1M", {"model.safetensors": b"v2"}, {}, root=root, force=True)
    assert (folder / "notes.txt").read_text() == "mine"  # the user's
    assert not (folder / "old.bin").exists()  # owned by the old manifest, not the new one
    assert (folder / "model.safetensors").read_bytes() == b"v2"


def test_write_artifact_refuses_to_overwrite_verified(root):
    write_artifact("StoryLM-1M", {"model.safetensors": b"old"}, {}, root=root)
    with pytest.raises(FileExistsError, match="--force"):
        write_artifact("StoryLM-1M", {"model.safetensors": b"new"}, {}, root=root)
    assert (artifact_dir("StoryLM-1M", root) / "model.safetensors").read_bytes() == b"old"
    write_artifact("StoryLM-1M", {"model.safetensors": b"new"}, {}, root=root, force=True)
    assert (artifact_dir("StoryLM-1M", root) / "model.safetensors").read_bytes() == b"new"
    assert sorted(p.name for p in artifact_dir("StoryLM-1M", root).parent.iterdir()) == ["StoryLM-1M"]


def test_write_artifact_replaces_a_corrupted_one_without_force(root):
    dest = write_artifact("StoryLM-1M", {"model.safetensors": b"old"}, {}, root=root)
    flip_byte(dest / "model.safetensors")
    write_artifact("StoryLM-1M", {"model.safetensors": b"new"}, {}, root=root)
    assert verify_artifact("StoryLM-1M", root)["files"]["model.safetensors"]


def test_write_artifact_failure_leaves_no_artifact(root, tmp_path):
    with pytest.raises(FileNotFoundError):
        write_artifact("StoryLM-1M", {"model.safetensors": b"w", "config.json": tmp_path / "absent.json"}, {},
                       root=root)
    assert not artifact_dir("StoryLM-1M", root).exists()
    assert list(artifact_dir("StoryLM-1M", root).parent.iterdir()) == []  # the temp folder is gone too


# -- loading ---------------------------------------------------------------------------------

def test_load_tokenizer_from_root(with_tokenizer):
    tok = load_tokenizer("storytokenizer", root=with_tokenizer)
    assert tok.vocab_size == 4096 and tok.eot_id is not None


def test_load_tokenizer_corrupted_raises(with_tokenizer):
    flip_byte(artifact_dir("StoryTokenizer", with_tokenizer) / "tokenizer.json", 100)
    with pytest.raises(ChecksumError, match=r"Run \./checkpoints\.sh to restore it"):   # a plain run repairs it
        load_tokenizer(root=with_tokenizer)


def test_load_model_roundtrips_a_tiny_model(with_tokenizer):
    model = install_tiny_model(with_tokenizer)
    loaded, tok = load_model("storylm-1m", device="cpu", root=with_tokenizer)
    assert tok.vocab_size == loaded.vocab_size == 4096
    assert not loaded.training
    got, want = loaded.state_dict(), model.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == torch.float32
        # stored as float16, loaded as float32: exactly the float16 rounding of the original
        torch.testing.assert_close(got[k], want[k].half().float(), rtol=0, atol=0)


def test_load_model_auto_device_is_usable(with_tokenizer):
    install_tiny_model(with_tokenizer)
    loaded, _ = load_model("StoryLM-1M", root=with_tokenizer)
    assert loaded.token_embed.weight.device.type in ("cpu", "cuda", "mps")


def test_load_model_missing_names_checkpoints_sh(with_tokenizer):
    with pytest.raises(ArtifactMissingError, match=r"\./checkpoints\.sh"):
        load_model("StoryLM-5M", root=with_tokenizer)


def test_load_model_flipped_weight_byte_raises(with_tokenizer):
    install_tiny_model(with_tokenizer)
    flip_byte(artifact_dir("StoryLM-1M", with_tokenizer) / "model.safetensors")
    with pytest.raises(ChecksumError, match=r"Run \./checkpoints\.sh to restore it"):
        load_model("StoryLM-1M", root=with_tokenizer)


def test_load_model_unknown_name_lists_names(with_tokenizer):
    with pytest.raises(ValueError, match="StoryLM-1M, StoryLM-5M, StoryLM-30M, StoryLM-1M-distilled, "
                       "StoryLM-5M-MTP, StoryLM-30M-MTP, StoryLM-30M-EAGLE, StoryLM-30M-Medusa, StoryLM-30M-EAGLE3, "
                       "StoryLM-30M-Block$"):
        load_model("StoryLM-100M", root=with_tokenizer)


def test_load_model_refuses_the_tokenizer_name(with_tokenizer):
    # The list of valid names in the error shows models only, so the tokenizer is refused too.
    with pytest.raises(ValueError, match="unknown model 'StoryTokenizer'; models: StoryLM-1M"):
        load_model("StoryTokenizer", root=with_tokenizer)


def test_load_model_vocab_mismatch_raises(with_tokenizer):
    install_tiny_model(with_tokenizer, model=tiny_model(vocab_size=300))
    with pytest.raises(ValueError, match="tokenizer has 4096 ids but the model 300"):
        load_model("StoryLM-1M", device="cpu", root=with_tokenizer)


# -- the shipped ladder ----------------------------------------------------------------------

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def manifests():
    return {name: verify_artifact(name) for name in model_names()}


@pytest.mark.ladder
@pytest.mark.parametrize("name", model_names())
def test_ladder_model_loads_verifies_and_generates(name):
    from g2c.sampling import generate

    model, tok = load_model(name, device="cpu")
    assert model.vocab_size == tok.vocab_size == 4096
    ids = tok.encode_batch_fast([PROMPT])[0]
    out = generate(model, ids, 20, temperature=0.0)
    assert out.tolist()[:len(ids)] == ids
    assert len(ids) < len(out) <= len(ids) + 20
    assert tok.decode(out.tolist()).startswith(PROMPT)
    # greedy decoding is deterministic
    assert generate(model, ids, 20, temperature=0.0).tolist() == out.tolist()


@pytest.mark.ladder
def test_ladder_shares_one_tokenizer(manifests):
    tokenizer_sha = verify_artifact("StoryTokenizer")["files"]["tokenizer.json"]
    assert {m["data"]["tokenizer_sha256"] for m in manifests.values()} == {tokenizer_sha}
    assert {m["config"]["tokenizer"] for m in manifests.values()} == {"StoryTokenizer"}


@pytest.mark.ladder
def test_ladder_validation_losses_are_ordered(manifests):
    losses = [manifests[name]["val_loss"] for name in model_names()]
    assert losses[0] > losses[1] > losses[2], dict(zip(model_names(), losses))


@pytest.mark.ladder
def test_ladder_manifests_record_the_recipe(manifests):
    for name, m in manifests.items():
        assert m["name"] == name and m["kind"] == "model"
        for key in ("recipe", "data", "seed", "tokens_seen", "train_loss", "val_loss", "commit"):
            assert key in m, (name, key)
        assert set(m["files"]) == {"model.safetensors", "config.json"}


@pytest.mark.ladder
def test_ladder_corrupted_copy_is_rejected(root):
    shutil.copytree(artifact_dir("StoryTokenizer"), artifact_dir("StoryTokenizer", root))
    shutil.copytree(artifact_dir("StoryLM-1M"), artifact_dir("StoryLM-1M", root))
    load_model("StoryLM-1M", device="cpu", root=root)  # the intact copy loads
    flip_byte(artifact_dir("StoryLM-1M", root) / "model.safetensors", -100)
    with pytest.raises(ChecksumError, match=r"model\.safetensors.*Run \./checkpoints\.sh to restore it"):
        load_model("StoryLM-1M", device="cpu", root=root)


@pytest.mark.parametrize("device, match", [("tpu", "unknown device 'tpu'"), ("nonsense", "unknown device"),
                                           *([] if torch.cuda.is_available() else [("cuda", "not available")])])
def test_load_model_refuses_unknown_or_unavailable_devices(device, match):
    with pytest.raises(ValueError, match=match):
        artifacts._device(device)


# -- the shipped drafters (g2c/assets/recipes/drafters.py) ---------------------------------------------

@pytest.fixture(scope="module")
def drafter_manifests():
    return {name: verify_artifact(name) for name in drafter_names()}


def _val_windows(n: int = 4, context: int = 128):
    """(n, context) token ids of the first validation stories, read from the shipped corpus
    (CI runs the tests before ./datasets.sh prepares data/)."""
    from g2c.assets.artifacts import corpus_path, load_story_tokenizer
    from g2c.assets.data import is_validation, read_stories

    tok = load_story_tokenizer()
    ids: list[int] = []
    for story in read_stories(corpus_path()):
        if is_validation(story):
            ids += tok.encode(story) + [tok.eot_id]
            if len(ids) >= n * context:
                break
    return torch.tensor(ids[:n * context]).view(n, context)


@pytest.mark.ladder
def test_drafters_load_on_their_base(drafter_manifests):
    from g2c.specdec import MTPHead
    from g2c.specdec.lineage import BlockHead, Eagle3Head, MedusaHeads
    from g2c.specdec.sampling.eagle import FeatureDrafter
    from g2c.transformer import TransformerLM

    kinds = {"lm": TransformerLM, "mtp": MTPHead, "eagle": FeatureDrafter, "medusa": MedusaHeads,
             "eagle3": Eagle3Head, "block": BlockHead}
    for name, m in drafter_manifests.items():
        assert m["drafter"] == DRAFTERS[name]["kind"] and m["base"] == DRAFTERS[name]["base"], name
        model, tok = load_model(name, device="cpu")
        assert isinstance(model, kinds[m["drafter"]]), name
        assert tok.vocab_size == 4096
        if m["drafter"] != "lm":
            assert model.base.embedding_dim == verify_artifact(m["base"])["config"]["embedding_dim"]
            assert not model.base.training and not model.training


@pytest.mark.ladder
def test_a_drafters_only_root_loads_on_the_shipped_base(root):
    """A budgeted retraining's tree (runs/budget-<T>/) holds drafters only: their base comes from
    artifacts/, verified; a corrupted drafter copy in the tree is still refused."""
    shutil.copytree(artifact_dir("StoryLM-5M-MTP"), artifact_dir("StoryLM-5M-MTP", root))
    head, tok = load_model("StoryLM-5M-MTP", device="cpu", root=root)
    shipped, _ = load_model("StoryLM-5M", device="cpu")
    assert tok.vocab_size == 4096
    assert all(torch.equal(a, b) for a, b in zip(head.base.state_dict().values(), shipped.state_dict().values()))
    flip_byte(artifact_dir("StoryLM-5M-MTP", root) / "model.safetensors", -100)
    with pytest.raises(ChecksumError, match=r"model\.safetensors"):
        load_model("StoryLM-5M-MTP", device="cpu", root=root)


@pytest.mark.ladder
def test_drafter_manifests_record_their_recipe(drafter_manifests):
    from g2c.assets.recipes.drafters import DRAFTER_RECIPES

    for name, m in drafter_manifests.items():
        recipe = {k: m["recipe"][k] for k in DRAFTER_RECIPES[name]}
        assert recipe == DRAFTER_RECIPES[name], name            # the code reproduces the artifact
        assert 0 < m["best_step"] <= m["steps"] <= DRAFTER_RECIPES[name]["steps"]
        assert m["history"][0]["step"] == 0 and ("val_agree" in m["val"] or "val_agree_1" in m["val"]) \
            and m["wall_time_s"] > 0
        assert set(m["files"]) == {"model.safetensors", "config.json"}


@pytest.mark.ladder
def test_distilled_drafter_is_closer_to_the_target():
    """Distillation's point, measured on held-out windows (4 x 128 validation tokens): the
    argmax of StoryLM-1M-distilled agrees with StoryLM-30M's more often than StoryLM-1M's does
    (measured 0.78 vs 0.57), and even more often than the 4x larger StoryLM-5M's (0.65); its
    1 - TV, the acceptance rate of a sampled draft at T = 1, is higher too (0.82 vs 0.65 and
    0.72). The margins asserted (0.1 over StoryLM-1M, any over StoryLM-5M) are far below the
    measured gaps, and a drafter trained on the data alone (StoryLM-1M itself) fails them."""
    x = _val_windows()
    target, _ = load_model("StoryLM-30M", device="cpu")
    with torch.no_grad():
        p = torch.softmax(target(x), -1)
        scores = {}
        for name in ("StoryLM-1M", "StoryLM-5M", "StoryLM-1M-distilled"):
            q = torch.softmax(load_model(name, device="cpu")[0](x), -1)
            scores[name] = (float((q.argmax(-1) == p.argmax(-1)).float().mean()),
                            float(1 - 0.5 * (p - q).abs().sum(-1).mean()))
    distilled = scores["StoryLM-1M-distilled"]
    for i in (0, 1):
        assert distilled[i] > scores["StoryLM-1M"][i] + 0.1, scores
        assert distilled[i] > scores["StoryLM-5M"][i], scores


@pytest.mark.ladder
def test_eagle_drafter_on_the_target_is_lossless_and_accepted():
    from g2c.kvcache import cached_generate
    from g2c.specdec.sampling.eagle import EagleDrafter
    from g2c.specdec.sampling.loop import speculative_sample

    head, tok = load_model("StoryLM-30M-EAGLE", device="cpu")
    prompt = _val_windows(1, 16)[0]
    out, stats = speculative_sample(head.base, EagleDrafter(head), prompt, 32, k=4, temperature=0.0,
                                    use_cache=True)
    assert out.tolist() == cached_generate(head.base, prompt, 32, temperature=0.0).tolist()
    assert stats.tokens_per_pass > 1.8, stats            # an untrained head gets 1.0


def test_load_model_refuses_a_tokens_only_ablation(root):
    """A ``--variant tokens`` EAGLE head (issue 29's ablation, trained with zeros for the features) is
    measured, not served: load_model refuses it by name before loading anything else."""
    from g2c.assets.artifacts import load_model

    cfg = {"kind": "eagle", "base": "StoryLM-30M", "inputs": "tokens", "tokenizer": "StoryTokenizer"}
    write_artifact("StoryLM-30M-EAGLE", {"model.safetensors": b"weights", "config.json": json.dumps(cfg).encode()},
                   {"name": "StoryLM-30M-EAGLE", "kind": "model"}, root=root)
    with pytest.raises(ValueError, match="trained on tokens only"):
        load_model("StoryLM-30M-EAGLE", root=root)
    cfg["inputs"] = "FEATURES"                                 # an unknown value is named as such
    write_artifact("StoryLM-30M-EAGLE", {"model.safetensors": b"weights", "config.json": json.dumps(cfg).encode()},
                   {"name": "StoryLM-30M-EAGLE", "kind": "model"}, root=root, force=True)
    with pytest.raises(ValueError, match="says inputs='FEATURES', which this version does not know"):
        load_model("StoryLM-30M-EAGLE", root=root)
