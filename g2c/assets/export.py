"""Export a StoryLM to a Hugging Face model folder that ``transformers`` and serving engines load.

    python -m g2c.assets.export --hf exported/StoryLM-30M StoryLM-30M
    python -m g2c.assets.export --hf exported/StoryLM-1M StoryLM-1M      # the drafter

The folder holds::

    config.json              GPT2Config (model_type "gpt2", architectures GPT2LMHeadModel)
    generation_config.json   eos/bos = <|endoftext|> (id 0)
    model.safetensors        the weights, GPT-2 names and layouts (float32 by default)
    tokenizer.json           the StoryTokenizer, unchanged (byte-level BPE, tokenizers format)
    tokenizer_config.json    fast-tokenizer config: PreTrainedTokenizerFast, <|endoftext|> as
                             bos/eos/unk/pad, no prefix space, model_max_length = context
    special_tokens_map.json

``AutoModelForCausalLM.from_pretrained(DIR)`` and ``AutoTokenizer.from_pretrained(DIR)``
load it offline, with the course model's logits (float32 round-off) and the StoryTokenizer's
ids (``tests/test_hf_export.py``); vLLM serves it as a GPT-2 (``docs/beyond/serving-lab.md``).

The weight mapping is module 09's ``to_hf_gpt2``; ``transformers`` is needed for this tool
only (dev extra), imported lazily.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch

from g2c.course.files import check_output_path, fsync_dir, temp_name, write_problem

__all__ = ["export_hf"]


def export_hf(name: str, out_dir: str | Path, *, dtype: torch.dtype = torch.float32, root: Path | None = None,
              overwrite: bool = False) -> Path:
    """Write the Hugging Face folder of one ladder model.

    Args:
        name: ``StoryLM-1M``, ``StoryLM-5M`` or ``StoryLM-30M`` (case-insensitive).
        out_dir: the folder to write (created; must be empty or absent unless ``overwrite``).
        dtype: weight dtype on disk: ``torch.float32`` (exact logits) or ``torch.float16``
            / ``torch.bfloat16`` (half the size; the shipped artifacts are float16).
        root: artifacts root (default ``artifacts/``).
        overwrite: replace the files of an existing non-empty folder.

    Returns:
        the folder's path.

    Raises:
        ValueError: unknown model name, or a drafter that is not a language model (an MTP,
            EAGLE, Medusa or block head); dtype not a floating dtype; out_dir inside the shipped
            ``artifacts/`` (an export there would overwrite a pinned artifact).
        FileExistsError: out_dir is a non-empty folder and ``overwrite`` is False (the
            message says to pass ``--overwrite``).
        NotADirectoryError: out_dir, or a part of its path, is a file.
        PermissionError / OSError: out_dir cannot be written (read-only, a name too long, full
            disk); checked before the model is loaded (``g2c.course.files.check_output_path``)
            except for a full disk. Files are written to a temporary folder
            beside out_dir and moved in only when all are complete, so a failed export leaves
            out_dir as it was.
        ImportError: ``transformers`` is not installed (``pip install transformers``).
        ArtifactMissingError / ChecksumError: the model artifact is missing or corrupted
            (run ``./checkpoints.sh``).
    """
    from g2c.assets.artifacts import DRAFTERS, artifact_dir, canonical_name, load_model, shipped_problem
    from g2c.transformer.export import to_hf_gpt2

    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a torch floating dtype such as torch.float32, got {dtype!r}")
    name = canonical_name(name)
    if DRAFTERS.get(name, {}).get("kind", "lm") != "lm":
        raise ValueError(f"{name} is a draft head on a base model, not a language model; export a ladder model or "
                         "StoryLM-1M-distilled")
    problem = shipped_problem(out_dir)
    if problem:
        raise ValueError(problem)
    out = check_output_path(out_dir, folder=True, what="export")      # NUL, long names, files on the way, writable
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty; choose another folder or pass --overwrite")
    model, tok = load_model(name, device="cpu", root=root)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = temp_name(out)
    stage.mkdir()
    try:
        _write_hf(name, stage, model, tok, to_hf_gpt2, dtype, artifact_dir(name, root).parent.parent, artifact_dir)
        if not out.exists() or not any(out.iterdir()):
            if out.exists():
                out.rmdir()
            os.replace(stage, out)
        else:  # --overwrite into a folder with files: each complete file replaces its namesake
            for f in sorted(stage.iterdir()):
                os.replace(f, out / f.name)
        fsync_dir(out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return out


def _write_hf(name, out, model, tok, to_hf_gpt2, dtype, root, artifact_dir) -> None:
    hf = to_hf_gpt2(model)
    eot = tok.eot_id
    hf.config.bos_token_id = eot
    hf.config.eos_token_id = eot
    hf.generation_config.bos_token_id = eot
    hf.generation_config.eos_token_id = eot
    hf.config.architectures = ["GPT2LMHeadModel"]
    hf = hf.to(dtype)
    hf.save_pretrained(str(out), safe_serialization=True)
    # Older readers (vLLM before transformers 5) look for "torch_dtype" rather than "dtype".
    cfg_path = out / "config.json"
    hf_cfg = json.loads(cfg_path.read_text())
    hf_cfg.setdefault("torch_dtype", str(dtype).removeprefix("torch."))
    cfg_path.write_text(json.dumps(hf_cfg, indent=2, sort_keys=True) + "\n")

    cfg = json.loads((artifact_dir(name, root) / "config.json").read_text())
    tok_dir = artifact_dir(cfg.get("tokenizer", "StoryTokenizer"), root)
    shutil.copyfile(tok_dir / "tokenizer.json", out / "tokenizer.json")
    special = tok.special_tokens[0] if tok.special_tokens else None
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_prefix_space": False,
        "bos_token": special, "eos_token": special, "unk_token": special, "pad_token": special,
        "model_max_length": model.max_seq_len,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": special, "eos_token": special, "unk_token": special, "pad_token": special}, indent=2) + "\n")
    for f in out.iterdir():
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m g2c.assets.export", description=__doc__.split("\n\n")[0])
    from g2c.assets.cli import output_dir

    parser.add_argument("--hf", metavar="DIR", required=True, type=output_dir(),
                        help="output folder (one model per folder; not inside artifacts/)")
    parser.add_argument("name", help="StoryLM-1M, StoryLM-5M or StoryLM-30M")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    parser.add_argument("--overwrite", action="store_true", help="replace files in a non-empty DIR")
    args = parser.parse_args(argv)
    from g2c.assets.artifacts import ArtifactError

    try:
        out = export_hf(args.name, args.hf, dtype=getattr(torch, args.dtype), overwrite=args.overwrite)
    except (FileExistsError, ArtifactError) as e:        # ArtifactMissingError is a FileNotFoundError: not a write
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # read-only, full disk, a file on the way
        print(f"error: {write_problem(e, args.hf)}", file=sys.stderr)
        return 1
    except (ValueError, ImportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nerror: interrupted; {args.hf} is as it was (files move in only when all are written)",
              file=sys.stderr)
        return 130
    files = ", ".join(sorted(p.name for p in out.iterdir()))
    print(f"wrote {out}: {files}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
