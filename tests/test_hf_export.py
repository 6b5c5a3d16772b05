"""``python -m g2c.assets.export --hf DIR NAME``: a Hugging Face folder that round-trips offline.

The oracle for the logits is an independent functional GPT-2 forward written here with
torch.nn.functional on the artifact's own safetensors (so these tests check provided
tooling and pass without any exercise solved); the oracle for the ids is the
``tokenizers`` library on the shipped ``tokenizer.json``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from g2c.assets.artifacts import artifact_dir, load_tokenizer
from g2c.assets.export import export_hf, main

STORIES = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.",
    "Tom and his dog went to the park. They saw a big, red ball!\n\n\"Can I play?\" asked Tom.",
    "The end.<|endoftext|>One day, a cat named Max found a shiny key under the tree.",
    "  Two  spaces,\ttabs and   more spaces... 123 + 456 = 579?",
    "Émilie a mangé une crème brûlée — naïve café, 日本語, emoji 🐶.",
    "",
]


def _reference_logits(state: dict[str, torch.Tensor], cfg: dict, ids: torch.Tensor) -> torch.Tensor:
    """GPT-2 forward from the course's parameter names: (B, T) -> (B, T, V) float32."""
    w = {k: v.float() for k, v in state.items()}
    D, H = cfg["embedding_dim"], cfg["num_heads"]
    B, T = ids.shape
    x = w["token_embed.weight"][ids] + w["pos_embed.weight"][:T]                       # (B, T, D)
    for i in range(cfg["num_layers"]):
        p = f"blocks.{i}."
        h = F.layer_norm(x, (D,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        q, k, v = F.linear(h, w[p + "attn.qkv.weight"], w[p + "attn.qkv.bias"]).split(D, dim=-1)
        q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))       # (B, H, T, D/H)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // H)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, D)
        x = x + F.linear(y, w[p + "attn.proj.weight"], w[p + "attn.proj.bias"])
        h = F.layer_norm(x, (D,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
        x = x + F.linear(F.gelu(F.linear(h, w[p + "mlp.fc.weight"], w[p + "mlp.fc.bias"])),
                         w[p + "mlp.proj.weight"], w[p + "mlp.proj.bias"])
    x = F.layer_norm(x, (D,), w["ln_final.weight"], w["ln_final.bias"], 1e-5)
    return x @ w["token_embed.weight"].t()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "StoryLM-30M"
    export_hf("StoryLM-30M", out)
    return out


@pytest.fixture(scope="module")
def hf_model(exported):
    import transformers  # the dev extra; a hard requirement of these tests

    return transformers.AutoModelForCausalLM.from_pretrained(str(exported), local_files_only=True).eval()


@pytest.fixture(scope="module")
def hf_tokenizer(exported):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(exported), local_files_only=True)


@pytest.mark.ladder
def test_export_writes_the_hf_folder(exported):
    names = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    cfg = json.loads((exported / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["architectures"] == ["GPT2LMHeadModel"]
    shape = (cfg["n_embd"], cfg["n_layer"], cfg["n_head"], cfg["n_positions"], cfg["vocab_size"])
    assert shape == (512, 9, 8, 256, 4096)
    assert cfg["eos_token_id"] == 0 and cfg["tie_word_embeddings"] is True
    tok_cfg = json.loads((exported / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "<|endoftext|>" and tok_cfg["model_max_length"] == 256
    assert (exported / "tokenizer.json").read_bytes() == \
        (artifact_dir("StoryTokenizer") / "tokenizer.json").read_bytes()


@pytest.mark.ladder
def test_export_logits_match_the_course_model(hf_model):
    state = load_file(str(artifact_dir("StoryLM-30M") / "model.safetensors"))
    cfg = json.loads((artifact_dir("StoryLM-30M") / "config.json").read_text())
    tok = load_tokenizer()
    rows = [ids[:48] for ids in tok.encode_batch_fast(STORIES[:4])]
    T = min(len(r) for r in rows)
    ids = torch.tensor([r[:T] for r in rows])                                             # (4, T)
    full = torch.tensor([tok.encode_batch_fast([" ".join(STORIES[:3]) * 4])[0][:256]])    # (1, 256)
    with torch.no_grad():
        for batch in (ids, full):
            ref = _reference_logits(state, cfg, batch)
            got = hf_model(batch).logits
            assert got.shape == ref.shape and got.dtype == torch.float32
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


@pytest.mark.ladder
def test_export_tokenizer_ids_match_the_story_tokenizer(hf_tokenizer):
    tok = load_tokenizer()
    expected = tok.encode_batch_fast(STORIES)
    for text, want in zip(STORIES, expected):
        got = hf_tokenizer(text, add_special_tokens=True)["input_ids"]
        assert got == want, text
        assert hf_tokenizer.decode(got) == text
    assert hf_tokenizer.eos_token_id == tok.eot_id == 0
    assert "<|endoftext|>" in STORIES[2] and 0 in expected[2]


@pytest.mark.ladder
def test_export_drafter_generates_like_greedy(tmp_path):
    import transformers

    out = export_hf("StoryLM-1M", tmp_path / "1M", dtype=torch.float16)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert hf.dtype == torch.float16
    state = load_file(str(artifact_dir("StoryLM-1M") / "model.safetensors"))
    on_disk = load_file(str(out / "model.safetensors"))
    assert torch.equal(on_disk["transformer.wte.weight"], state["token_embed.weight"])  # float16 artifact: lossless


@pytest.mark.ladder
def test_export_refuses_a_non_empty_folder(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match=r"not empty; choose another folder or pass --overwrite"):
        export_hf("StoryLM-1M", tmp_path)
    assert main(["--hf", str(tmp_path), "StoryLM-1M"]) == 1
    assert "--overwrite" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"unknown artifact 'StoryLM-2M'"):
        export_hf("StoryLM-2M", tmp_path / "new")
