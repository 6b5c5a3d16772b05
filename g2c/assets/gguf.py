"""Export a StoryLM (or the LM drafter) to GGUF, the file format llama.cpp runs.

    python -m g2c.assets.gguf StoryLM-30M runs/gguf/StoryLM-30M.gguf                 # llama.cpp's converter
    python -m g2c.assets.gguf StoryLM-1M-distilled runs/gguf/StoryLM-1M-distilled.gguf
    python -m g2c.assets.gguf StoryLM-1M runs/gguf/StoryLM-1M.gguf --via writer      # no llama.cpp needed
    python -m g2c.assets.gguf --check runs/gguf/StoryLM-30M.gguf StoryLM-30M         # read back, compare logits

Two routes to the same file layout (llama.cpp's ``gpt2`` architecture):

* ``--via converter`` (default when ``bench/setup_llamacpp.py`` has unpacked llama.cpp): the
  model is exported to a Hugging Face GPT-2 folder (``g2c.assets.export.export_hf``, module
  09's ``to_hf_gpt2``); ``config.json`` gets GPT-2's ``n_ctx`` (the converter reads it; recent
  ``transformers`` only write ``n_positions``); then llama.cpp's vendored
  ``convert_hf_to_gguf.py`` runs in a subprocess whose ``TextModel.get_vocab_base_pre`` is
  replaced by one returning ``"gpt-2"``: the converter recognises pre-tokenizers by hashing
  the token ids of a test string, and refuses the StoryTokenizer's unknown hash although its
  pre-tokenizer IS GPT-2's (byte-level, GPT-2 regex, no prefix space). No file is edited.
* ``--via writer``: the ``gguf`` package's ``GGUFWriter`` (``pip install gguf``, in the dev
  extra) writes the same tensors and tokenizer metadata directly from the course model. CI
  tests this route (no llama.cpp, no network).

Layout (GGUF lists dimensions fastest-first; numpy shapes below are row-major):
``token_embd.weight`` (V, D), ``position_embd.weight`` (T, D), per block ``blk.N.attn_norm``
and ``blk.N.ffn_norm`` (weight, bias: (D,)), ``blk.N.attn_qkv`` ((3D, D), (3D,)),
``blk.N.attn_output`` ((D, D), (D,)), ``blk.N.ffn_up`` ((4D, D), (4D,)), ``blk.N.ffn_down``
((D, 4D), (D,)), ``output_norm`` (weight, bias); no ``output.weight``: the unembedding is tied,
and llama.cpp's GPT-2 loader then reads ``token_embd`` (the converter writes it so too). The course
``Linear.weight`` is (out, in), which is exactly the GGUF row-major layout, so no transpose.

``read_gguf`` reads a file back into a ``TransformerLM`` (``check_gguf`` compares its logits
with the artifact's: float32 files agree within 1e-4, float16 files within 2e-2 relative to
the largest logit).

Raises (CLI: one line on stderr, exit 1): unknown model names, a missing llama.cpp tree for
``--via converter`` (run ``python bench/setup_llamacpp.py``), a converter failure, a GGUF
file that is not a ``gpt2`` model.
"""

from __future__ import annotations

import argparse
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from g2c.course.files import atomic_path, check_output_path, clean_leftovers, write_problem

__all__ = ["check_gguf", "export_gguf", "gguf_tensors", "llama_cpp_source", "read_gguf", "write_gguf"]

ROOT = Path(__file__).resolve().parents[2]
OUTTYPES = ("f32", "f16", "bf16")


def llama_cpp_source(path: str | Path | None = None) -> Path | None:
    """The vendored llama.cpp tree ``bench/setup_llamacpp.py`` unpacked (``runs/llama.cpp/src``),
    or ``path``; None when it has no ``convert_hf_to_gguf.py``."""
    src = Path(path) if path is not None else ROOT / "runs" / "llama.cpp" / "src"
    return src if (src / "convert_hf_to_gguf.py").exists() else None


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """The llama.cpp ``gpt2`` tensors of a ``TransformerLM``: name -> float32 array (row-major
    shapes listed in the module docstring). Raises TypeError for a model without ``blocks``."""
    if not all(hasattr(model, n) for n in ("blocks", "token_embed", "pos_embed", "ln_final")):
        raise TypeError(f"gguf_tensors needs a TransformerLM, got {type(model).__name__}")

    def a(t: torch.Tensor) -> np.ndarray:
        return t.detach().to("cpu", torch.float32).contiguous().numpy()

    out = {"token_embd.weight": a(model.token_embed.weight), "position_embd.weight": a(model.pos_embed.weight)}
    for i, blk in enumerate(model.blocks):
        for gname, lin in (("attn_norm", blk.ln_1), ("ffn_norm", blk.ln_2), ("attn_qkv", blk.attn.qkv),
                           ("attn_output", blk.attn.proj), ("ffn_up", blk.mlp.fc), ("ffn_down", blk.mlp.proj)):
            out[f"blk.{i}.{gname}.weight"] = a(lin.weight)
            out[f"blk.{i}.{gname}.bias"] = a(lin.bias)
    out["output_norm.weight"] = a(model.ln_final.weight)
    out["output_norm.bias"] = a(model.ln_final.bias)
    return out


def _tokenizer_json(name: str = "StoryTokenizer", root: Path | None = None) -> dict:
    from g2c.assets.artifacts import artifact_dir

    return json.loads((artifact_dir(name, root) / "tokenizer.json").read_text())


def write_gguf(model, path: str | Path, *, tokenizer: dict | None = None, outtype: str = "f32",
               name: str = "StoryLM") -> Path:
    """Write ``model`` as a llama.cpp ``gpt2`` GGUF file with the ``gguf`` package's writer.

    Args:
        model: a ``TransformerLM`` (any size; hidden width must be 4 D, as llama.cpp's GPT-2 assumes).
        path: the .gguf file to write (parent folders created).
        tokenizer: a ``tokenizer.json`` dict (byte-level BPE: ``model.vocab``, ``model.merges``,
            ``added_tokens``); default the shipped StoryTokenizer's. Its vocabulary must have
            ``model.vocab_size`` entries.
        outtype: "f32" (default), "f16" or "bf16" for the 2-D weight matrices (norms and biases
            stay f32, as the converter does).
        name: ``general.name``.

    Returns:
        the path.

    Raises:
        ImportError: the ``gguf`` package is missing (``pip install gguf``).
        ValueError: outtype unknown; hidden width != 4 D; tokenizer size differs from the model's.
    """
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("write_gguf needs the gguf package: pip install gguf (it is in the dev extra)") from e
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {OUTTYPES}, got {outtype!r}")
    hidden = getattr(model, "hidden_dim", 4 * model.embedding_dim)
    if hidden != 4 * model.embedding_dim:
        raise ValueError(f"llama.cpp's gpt2 architecture assumes an MLP width of 4 D = {4 * model.embedding_dim}; "
                         f"this model has {hidden}")
    tok = tokenizer if tokenizer is not None else _tokenizer_json()
    vocab = tok["model"]["vocab"]
    if len(vocab) != model.vocab_size:
        raise ValueError(f"the tokenizer has {len(vocab)} tokens but the model's vocab_size is {model.vocab_size}")
    path = Path(path)
    with atomic_path(path) as tmp:  # a full disk or Ctrl-C leaves no partial .gguf
        w = gguf.GGUFWriter(str(tmp), "gpt2")
        try:
            _fill_writer(w, gguf, model, tok, vocab, hidden, outtype, name)
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
        finally:
            w.close()
    return path


def _fill_writer(w, gguf, model, tok, vocab, hidden, outtype, name) -> None:
    w.add_name(name)
    w.add_block_count(len(model.blocks))
    w.add_context_length(model.max_seq_len)
    w.add_embedding_length(model.embedding_dim)
    w.add_feed_forward_length(hidden)
    w.add_head_count(model.num_heads)
    w.add_layer_norm_eps(model.ln_final.eps)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "bf16": gguf.LlamaFileType.MOSTLY_BF16}[outtype])
    # tokenizer: GPT-2 byte-level BPE, the ids of tokenizer.json, <|endoftext|> as a control token
    special = {t["id"]: t["content"] for t in tok.get("added_tokens", []) if t.get("special")}
    by_id = {i: s for s, i in vocab.items()}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list([by_id[i] for i in range(len(vocab))])
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(len(vocab))])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]])
    if special:
        eot = min(special)
        w.add_bos_token_id(eot)
        w.add_eos_token_id(eot)
    w.add_add_bos_token(False)
    for tname, arr in gguf_tensors(model).items():
        if outtype == "f16" and arr.ndim == 2:
            arr = arr.astype(np.float16)
        elif outtype == "bf16" and arr.ndim == 2:          # bfloat16 bits (round to nearest even), as the converter
            bits = gguf.quants.quantize(np.ascontiguousarray(arr, dtype=np.float32), gguf.GGMLQuantizationType.BF16)
            w.add_tensor(tname, bits, raw_shape=bits.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
            continue
        w.add_tensor(tname, arr)


# The converter run: llama.cpp's convert_hf_to_gguf.py with the pre-tokenizer named, nothing edited.
_CONVERT = """
import runpy, sys
src = sys.argv[1]
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"   # StoryTokenizer: GPT-2's pre-tokenizer
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def export_gguf(name: str, path: str | Path, *, via: str = "auto", outtype: str = "f32",
                llama_cpp: str | Path | None = None, root: Path | None = None) -> Path:
    """Export a shipped LM (ladder model or ``StoryLM-1M-distilled``) to one GGUF file.

    Args:
        name: a ladder model or an LM drafter (``load_model`` names; head drafters are not LMs).
        path: the .gguf file to write.
        via: "converter" (llama.cpp's ``convert_hf_to_gguf.py``), "writer" (the ``gguf``
            package) or "auto" (the converter when llama.cpp is unpacked, else the writer).
        outtype: "f32", "f16" or "bf16" (bfloat16 matrices: the weights of ``load_model(...,
            dtype="bfloat16")``, rounded the same way).
        llama_cpp: the vendored llama.cpp tree (default ``runs/llama.cpp/src``).
        root: artifacts root.

    Returns:
        the path of the written file.

    Raises:
        ValueError: unknown via/outtype, or a model that is not an LM (an MTP/EAGLE head).
        FileNotFoundError: ``via="converter"`` without a llama.cpp tree (names the setup command).
        IsADirectoryError: ``path`` is a folder.
        ValueError: ``path`` inside the shipped ``artifacts/``.
        PermissionError / OSError: the output folder cannot be written, a name too long, a file on
            the way (checked before any work: ``g2c.course.files.check_output_path``).
        RuntimeError: the converter failed (its last output lines are in the message).
        OSError: a write failed (full disk); either way no partial file is left at ``path``.
    """
    from g2c.assets.artifacts import DRAFTERS, canonical_name, load_model, shipped_problem

    if via not in ("auto", "converter", "writer"):
        raise ValueError(f"via must be 'auto', 'converter' or 'writer', got {via!r}")
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {OUTTYPES}, got {outtype!r}")
    name = canonical_name(name)
    if DRAFTERS.get(name, {}).get("kind", "lm") != "lm":
        raise ValueError(f"{name} is a draft head on a base model, not a language model; llama.cpp's draft model "
                         "must be an LM (e.g. StoryLM-1M-distilled)")
    src = llama_cpp_source(llama_cpp)
    if via == "auto":
        via = "converter" if src is not None else "writer"
    problem = shipped_problem(path)
    if problem:
        raise ValueError(problem)
    if Path(path).is_dir():
        raise IsADirectoryError(f"{path} is a folder; give the .gguf file to write, e.g. "
                                f"{Path(path) / (name + '.gguf')}")
    path = check_output_path(path, what="GGUF output").resolve()     # NUL, long names, files on the way, writable
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(path.parent, log=lambda line: print(f"gguf: {line}", file=sys.stderr))
    if via == "writer":
        model, _ = load_model(name, device="cpu", root=root)
        return write_gguf(model, path, outtype=outtype, name=name)
    if src is None:
        raise FileNotFoundError("no llama.cpp tree at runs/llama.cpp/src: run python bench/setup_llamacpp.py "
                                "(or pass --via writer)")
    from g2c.assets.export import export_hf

    with tempfile.TemporaryDirectory(prefix="g2c-gguf-") as tmp:
        hf = export_hf(name, Path(tmp) / "hf", root=root)
        cfg_path = hf / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["n_ctx"] = cfg["n_positions"]            # GPT-2's context key, which the converter reads
        cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        with atomic_path(path) as out:
            cmd = [sys.executable, "-c", _CONVERT, str(src), str(hf), "--outfile", str(out), "--outtype", outtype,
                   "--model-name", name]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0 or not out.exists():
                tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
                raise RuntimeError(f"convert_hf_to_gguf.py failed (exit {done.returncode}):\n{tail}")
    return path


def read_gguf(path: str | Path):
    """Read a ``gpt2`` GGUF file back into a ``TransformerLM`` (float32, CPU, eval mode).

    Returns:
        (model, info): info has ``tensors`` {name: numpy shape as stored (row-major)},
        ``file_type`` and ``tokens`` (the vocabulary strings).

    Raises:
        ImportError: no ``gguf`` package. FileNotFoundError: no file at ``path``.
        ValueError: not a ``gpt2`` GGUF, a tensor missing, or a file the reader cannot parse
            (truncated by a full disk or an interrupted copy, or not GGUF at all): the message
            names the file and says to export it again.
    """
    import gguf

    from g2c.transformer import TransformerLM

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        reader = gguf.GGUFReader(str(path))
        raw = [(t.name, t.shape.tolist(),
                gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
                if t.tensor_type == gguf.GGMLQuantizationType.BF16 else np.asarray(t.data)) for t in reader.tensors]
    except (IndexError, ValueError, KeyError, EOFError, OverflowError, struct.error) as exc:
        raise ValueError(f"{path} is not a complete GGUF file ({type(exc).__name__}: {exc}); it was truncated "
                         "(a full disk, an interrupted copy) or is not GGUF: export it again with "
                         "python -m g2c.assets.gguf NAME OUT") from None

    def field(key):
        f = reader.fields.get(key)
        if f is None:
            raise ValueError(f"{path}: GGUF key {key!r} is missing")
        return f.contents()

    arch = field("general.architecture")
    if arch != "gpt2":
        raise ValueError(f"{path}: architecture {arch!r}; read_gguf reads llama.cpp 'gpt2' files")
    tensors = {}
    for tname, dims, data in raw:
        shape = tuple(int(d) for d in reversed(dims))        # GGUF lists dims fastest-first
        if data.size != int(np.prod(shape)):
            raise ValueError(f"{path}: tensor {tname} holds {data.size} values, its header says {shape}; the file is "
                             "truncated or damaged: export it again")
        tensors[tname] = torch.from_numpy(data.astype(np.float32).reshape(shape))
    tokens = field("tokenizer.ggml.tokens")
    V, D = tensors["token_embd.weight"].shape
    model = TransformerLM(V, D, int(field("gpt2.block_count")), int(field("gpt2.attention.head_count")),
                          int(field("gpt2.context_length")), hidden_dim=int(field("gpt2.feed_forward_length")),
                          generator=torch.Generator().manual_seed(0))
    state = {"token_embed.weight": tensors["token_embd.weight"], "pos_embed.weight": tensors["position_embd.weight"],
             "ln_final.weight": tensors["output_norm.weight"], "ln_final.bias": tensors["output_norm.bias"]}
    for i in range(len(model.blocks)):
        for cname, gname in (("ln_1", "attn_norm"), ("ln_2", "ffn_norm"), ("attn.qkv", "attn_qkv"),
                             ("attn.proj", "attn_output"), ("mlp.fc", "ffn_up"), ("mlp.proj", "ffn_down")):
            for part in ("weight", "bias"):
                key = f"blk.{i}.{gname}.{part}"
                if key not in tensors:
                    raise ValueError(f"{path}: tensor {key} is missing")
                state[f"blocks.{i}.{cname}.{part}"] = tensors[key]
    model.load_state_dict(state)
    info = {"tensors": {n: tuple(t.shape) for n, t in tensors.items()}, "tokens": tokens,
            "file_type": int(field("general.file_type")) if "general.file_type" in reader.fields else None}
    return model.eval(), info


def check_gguf(path: str | Path, model, *, num_tokens: int = 32, seed: int = 0) -> float:
    """Largest |logit difference| between the GGUF file (read back) and ``model`` on ``num_tokens``
    random ids (seeded), relative to the largest |logit|. Raises ValueError on a shape mismatch."""
    back, info = read_gguf(path)
    for attr in ("vocab_size", "embedding_dim", "num_layers", "num_heads", "max_seq_len"):
        if getattr(back, attr) != getattr(model, attr):
            raise ValueError(f"{path}: {attr} is {getattr(back, attr)} in the file but {getattr(model, attr)} "
                             "in the model")
    ids = torch.randint(0, model.vocab_size, (1, min(num_tokens, model.max_seq_len)),
                        generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        want = model(ids.to(model.token_embed.weight.device)).float().cpu()
        got = back(ids)
    return float((got - want).abs().max() / want.abs().max())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m g2c.assets.gguf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    from g2c.assets.cli import model_name, output_file

    ap.add_argument("name", nargs="?", type=model_name(), help="a ladder model or StoryLM-1M-distilled")
    ap.add_argument("out", nargs="?", type=output_file(noun=".gguf file"),
                    help="the .gguf file to write (not inside artifacts/)")
    ap.add_argument("--via", choices=("auto", "converter", "writer"), default="auto")
    ap.add_argument("--outtype", choices=OUTTYPES, default="f32")
    ap.add_argument("--llama-cpp", default=None, help="vendored llama.cpp tree (default runs/llama.cpp/src)")
    ap.add_argument("--check", metavar="GGUF", default=None,
                    help="read GGUF back and compare its logits with NAME's (no export)")
    args = ap.parse_args(argv)
    from g2c.assets.artifacts import DRAFTERS, ArtifactError, load_model

    written = None                          # the exported file, once complete (read back afterwards)
    try:
        if args.check:
            if not args.name:
                ap.error("--check GGUF needs the model NAME to compare with")
            if DRAFTERS.get(args.name, {}).get("kind", "lm") != "lm":
                ap.error(f"{args.name} is a draft head, not a language model; compare with a ladder model or "
                         "StoryLM-1M-distilled")
            model, _ = load_model(args.name, device="cpu")
            rel = check_gguf(args.check, model)
            print(f"{args.check}: logits within {rel:.2e} of {args.name} (relative to the largest logit)")
            return 0
        if not args.name or not args.out:
            ap.error("give NAME and OUT (or --check GGUF NAME)")
        out = written = export_gguf(args.name, args.out, via=args.via, outtype=args.outtype,
                                    llama_cpp=args.llama_cpp)
        model, _ = load_model(args.name, device="cpu")
        rel = check_gguf(out, model)
        print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {args.outtype}); read back: logits within "
              f"{rel:.2e} of {args.name} (relative to the largest logit)")
        return 0
    except (ValueError, FileNotFoundError, IsADirectoryError, RuntimeError, ImportError, ArtifactError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # read-only output folder, full disk
        print(f"error: {write_problem(e, args.out)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if written is not None:             # the export finished; the read-back did not
            print(f"\nerror: interrupted while reading {written} back: the file is complete but unchecked; check it "
                  f"with python -m g2c.assets.gguf --check {written} {args.name} (or delete it)", file=sys.stderr)
        else:
            print(f"\nerror: interrupted; no partial file was left at {args.out} (a previous file there is "
                  "unchanged)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
