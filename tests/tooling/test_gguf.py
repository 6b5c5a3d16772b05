"""GGUF export (``g2c.assets.gguf``): write a tiny random model with the ``gguf`` package's
writer, read it back with the ``gguf`` package's reader, check every tensor's shape and the
logits of the read-back weights against the course model.

No llama.cpp and no network: the converter route (``--via converter``) is exercised by
``bench/llamacpp.py``; both routes write the same tensor names and layouts.

Tolerance: float32 files hold the exact weights and the read-back model is the course model
class, so logits agree to float32 round-off (asserted: 1e-6 relative). float16 files round
each weight to 11 mantissa bits: logits move by ~1e-3 of their scale (asserted < 2e-2), while a
transposed or swapped tensor moves them by O(1) (the last test shows the check catches it).
"""

from __future__ import annotations

import json

import gguf  # the dev extra's GGUF reader/writer (pip install gguf)
import pytest
import torch

from g2c.assets.artifacts import artifact_dir
from g2c.assets.gguf import check_gguf, gguf_tensors, read_gguf, write_gguf
from g2c.transformer import TransformerLM

V = 4096      # the StoryTokenizer's vocabulary, so the file carries the real tokenizer


@pytest.fixture(scope="module")
def tokenizer_json():
    return json.loads((artifact_dir("StoryTokenizer") / "tokenizer.json").read_text())


def _tiny(seed: int = 0) -> TransformerLM:
    return TransformerLM(V, 16, 2, 2, 24, generator=torch.Generator().manual_seed(seed)).eval()


def test_gguf_round_trip_shapes_tokenizer_and_logits(tmp_path, tokenizer_json):
    model = _tiny()
    path = write_gguf(model, tmp_path / "tiny.gguf", tokenizer=tokenizer_json, name="tiny")
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "gpt2"
    assert reader.fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    assert reader.fields["gpt2.context_length"].contents() == 24
    back, info = read_gguf(path)
    shapes = info["tensors"]
    assert len(shapes) == 2 + 12 * 2 + 2                 # tied unembedding: no output.weight
    assert shapes["token_embd.weight"] == (V, 16) and shapes["position_embd.weight"] == (24, 16)
    assert shapes["blk.1.attn_qkv.weight"] == (48, 16) and shapes["blk.1.attn_qkv.bias"] == (48,)
    assert shapes["blk.0.ffn_up.weight"] == (64, 16) and shapes["blk.0.ffn_down.weight"] == (16, 64)
    assert "output.weight" not in shapes and shapes["output_norm.bias"] == (16,)
    assert info["tokens"][0] == "<|endoftext|>" and len(info["tokens"]) == V
    ids = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(back(ids), model(ids), rtol=1e-6, atol=1e-6)
    assert check_gguf(path, model) < 1e-6


def test_gguf_float16_is_close_and_half_the_size(tmp_path, tokenizer_json):
    model = _tiny(seed=2)
    f32 = write_gguf(model, tmp_path / "a.gguf", tokenizer=tokenizer_json)
    f16 = write_gguf(model, tmp_path / "b.gguf", tokenizer=tokenizer_json, outtype="f16")
    def weight_bytes(path):
        return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)
    assert weight_bytes(f16) < 0.6 * weight_bytes(f32)      # matrices halved; norms and biases stay f32
    assert 0 < check_gguf(f16, model) < 2e-2


def test_gguf_bfloat16_holds_the_bfloat16_models_matrices(tmp_path, tokenizer_json):
    """outtype "bf16" (llama.cpp's MOSTLY_BF16): every matrix read back equals the model's weights rounded to
    bfloat16 by torch (what load_model(..., dtype="bfloat16") holds), bit for bit; norms and biases stay f32."""
    model = _tiny(seed=5)
    f32 = write_gguf(model, tmp_path / "a.gguf", tokenizer=tokenizer_json)
    bf16 = write_gguf(model, tmp_path / "b.gguf", tokenizer=tokenizer_json, outtype="bf16")
    back, info = read_gguf(bf16)
    assert info["file_type"] == int(gguf.LlamaFileType.MOSTLY_BF16)
    for (name, got), (_, want) in zip(back.state_dict().items(), model.state_dict().items()):
        expect = want.bfloat16().float() if want.dim() == 2 else want
        assert torch.equal(got, expect), name
    def weight_bytes(path):
        return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)
    assert weight_bytes(bf16) < 0.6 * weight_bytes(f32)
    assert 0 < check_gguf(bf16, model) < 2e-2


def test_gguf_check_catches_a_wrong_tensor(tmp_path, tokenizer_json):
    model, other = _tiny(seed=3), _tiny(seed=4)
    path = write_gguf(model, tmp_path / "m.gguf", tokenizer=tokenizer_json)
    assert check_gguf(path, other) > 0.1                 # different weights: caught
    tensors = gguf_tensors(model)
    assert (tensors["blk.0.attn_qkv.weight"] == model.blocks[0].attn.qkv.weight.detach().numpy()).all()


def test_gguf_errors(tmp_path, tokenizer_json):
    model = _tiny()
    with pytest.raises(ValueError, match="outtype must be one of"):
        write_gguf(model, tmp_path / "x.gguf", tokenizer=tokenizer_json, outtype="q4")
    small = TransformerLM(32, 16, 1, 2, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="tokenizer has 4096 tokens but the model's vocab_size is 32"):
        write_gguf(small, tmp_path / "y.gguf", tokenizer=tokenizer_json)
    wide = TransformerLM(V, 16, 1, 2, 8, hidden_dim=48, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="MLP width of 4 D"):
        write_gguf(wide, tmp_path / "z.gguf", tokenizer=tokenizer_json)
    with pytest.raises(TypeError, match="gguf_tensors needs a TransformerLM"):
        gguf_tensors(torch.nn.Linear(2, 2))


def test_export_gguf_writer_route_on_a_shipped_model(tmp_path):
    from g2c.assets.artifacts import load_model
    from g2c.assets.gguf import export_gguf

    path = export_gguf("StoryLM-1M", tmp_path / "s.gguf", via="writer")
    model, _ = load_model("StoryLM-1M", device="cpu")
    assert check_gguf(path, model) < 1e-6


def test_export_gguf_errors(tmp_path):
    from g2c.assets.gguf import export_gguf

    with pytest.raises(ValueError, match="draft head on a base model"):
        export_gguf("StoryLM-30M-MTP", tmp_path / "h.gguf", via="writer")
    with pytest.raises(ValueError, match="via must be"):
        export_gguf("StoryLM-1M", tmp_path / "v.gguf", via="pip")
    with pytest.raises(ValueError, match="outtype must be one of"):
        export_gguf("StoryLM-1M", tmp_path / "o.gguf", outtype="q8_0")
    with pytest.raises(FileNotFoundError, match="setup_llamacpp.py"):
        export_gguf("StoryLM-1M", tmp_path / "c.gguf", via="converter", llama_cpp=tmp_path)
    other = tmp_path / "llama.gguf"
    w = gguf.GGUFWriter(str(other), "llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="architecture 'llama'"):
        read_gguf(other)


_RUN_LLAMA = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("g2c_bench_llamacpp", sys.argv[1])
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
try:
    out, err = bench.run_llama([sys.argv[2]], needs=(bench._DECODED,))
    print("GOT", bench._DECODED.search(err).group(1))
except SystemExit as stop:
    print("STOP", stop)
"""


def test_llamacpp_bench_runs_a_tool_again_when_it_prints_no_statistics(tmp_path):
    """llama-speculative-simple sometimes exits 0 right after loading its draft model, without
    decoding: bench/llamacpp.py runs it again (up to LLAMA_TRIES runs) instead of stopping the
    whole bench, and names the tool when every run lacks the statistic."""
    import os
    import subprocess
    import sys

    from g2c.course import REPO_ROOT

    counter = tmp_path / "runs"
    flaky, silent = tmp_path / "flaky-tool", tmp_path / "silent-tool"
    flaky.write_text(f"#!/bin/sh\necho x >> {counter}\n"
                     f"if [ $(wc -l < {counter}) -lt 2 ]; then echo 'loading draft model' >&2; exit 0; fi\n"
                     "echo 'decoded   65 tokens in    0.305 seconds, speed:  213.2 t/s' >&2\n")
    silent.write_text("#!/bin/sh\necho 'loading draft model' >&2\n")
    for tool in (flaky, silent):
        tool.chmod(0o755)
    env = {**os.environ, "G2C_QUIET": "1"}
    bench = str(REPO_ROOT / "bench" / "llamacpp.py")
    got = subprocess.run([sys.executable, "-c", _RUN_LLAMA, bench, str(flaky)], capture_output=True, text=True,
                         env=env, cwd=REPO_ROOT)
    assert "GOT 65" in got.stdout, got.stdout + got.stderr
    assert "printed no statistics (exit 0, run 1 of 3); running it again" in got.stdout
    assert counter.read_text().count("x") == 2                      # ran twice, not three times
    stop = subprocess.run([sys.executable, "-c", _RUN_LLAMA, bench, str(silent)], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT)
    assert "STOP bench/llamacpp.py: could not read silent-tool's statistics in 3 runs" in stop.stdout, stop.stdout
    assert "loading draft model" in stop.stdout
