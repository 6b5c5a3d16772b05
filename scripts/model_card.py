#!/usr/bin/env python3
"""Write docs/models.md (the StoryLM model card) from the shipped manifests.

    python scripts/model_card.py          # reads artifacts/, runs greedy generation, writes docs/models.md

Every number comes from the artifacts' manifest.json files; the continuations are produced
now, greedily (temperature 0), by the shipped float16 weights loaded into float32.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import g2c
from g2c.assets.artifacts import artifact_dir, load_model, model_names, verify_artifact

ROOT = Path(__file__).resolve().parent.parent

PROMPTS = ["Once upon a time", "Tom and his dog went to the park. They", "Lily wanted to bake a cake, but"]
NEW_TOKENS = 48


def model_row(name: str, m: dict) -> str:
    """One row of the models table from a manifest."""
    c, r = m["config"], m["recipe"]
    return (f"| {name} | {c['embedding_dim']} | {c['num_layers']} | {c['num_heads']} | {m['parameters']:,} | "
            f"{m['tokens_seen']:,} | {m['epochs']} | {m['steps']} (best {m['best_step']}) | {r['max_lr']:g} | "
            f"{m['train_loss']:.3f} | {m['val_loss']:.3f} | {m['val_perplexity']:.1f} | "
            f"{m['wall_time_s'] / 60:.1f} min |")


def sample_rows(name: str) -> list[str]:
    """Greedy continuations of PROMPTS by one model (solutions must be applied: ``main`` does it)."""
    from g2c.sampling import generate

    model, tok = load_model(name, device="cpu")
    rows = []
    for p in PROMPTS:
        ids = generate(model, tok.encode(p), NEW_TOKENS, temperature=0.0, eos_id=tok.eot_id)
        rows.append(f"| {name} | {tok.decode(ids.tolist()).replace(chr(10), ' ⏎ ')} |")
    return rows


def main() -> int:
    os.environ.setdefault("G2C_QUIET", "1")
    g2c.use_solutions(os.environ.get(g2c.course.SOLUTIONS_ENV) or "all")
    tok_manifest = verify_artifact("StoryTokenizer")
    manifests = {name: verify_artifact(name) for name in model_names()}
    rows = [model_row(name, m) for name, m in manifests.items()]
    samples = [row for name in manifests for row in sample_rows(name)]
    size_mb = sum(f.stat().st_size for n in model_names() + ("StoryTokenizer",)
                  for f in artifact_dir(n).iterdir()) / 2**20
    (ROOT / "docs" / "models.md").write_text(text := render(tok_manifest, manifests, rows, samples, size_mb))
    print(text)
    return 0


def size_row(name: str, m: dict) -> str:
    """One row of the sizes table: float16 on disk, float32 once loaded."""
    weights = artifact_dir(name) / "model.safetensors"
    return (f"| {name} | {m['parameters']:,} | {weights.stat().st_size / 2**20:.1f} MiB | "
            f"{m['parameters'] * 4 / 2**20:.1f} MiB |")


def render(tok_manifest: dict, manifests: dict, rows: list[str], samples: list[str], size_mb: float) -> str:
    """The model card's markdown."""
    sizes = [size_row(name, m) for name, m in manifests.items()]
    first = next(iter(manifests.values()))
    machine = list(manifests.values())[-1]["machine"]
    return f"""# StoryLM model card

The StoryLM ladder: three GPT-2-shaped `TransformerLM`s (CONVENTIONS §4) that share one
tokenizer, trained by the course's own code on the course's TinyStories training split.
StoryLM-1M and -5M are cheap drafters; StoryLM-30M is the target of the speculative
decoding module. All artifacts together take {size_mb:.1f} MiB (weights stored as float16
safetensors, loaded into float32).

## Data and tokenizer

- Corpus: {tok_manifest['data']['stories']:,} training stories of the TinyStories sample shipped
  in `artifacts/corpora/TinyStories-sample/` (see its LICENSE.md; CDLA-Sharing-1.0), split by story hash:
  `{tok_manifest['data']['split_rule']}`.
- Tokens: {first['data']['train_tokens']:,} training, {first['data']['val_tokens']:,} validation
  (each story followed by `<|endoftext|>`).
- StoryTokenizer: byte-level BPE, vocabulary 4096 (256 bytes + merges + `<|endoftext|>`), trained
  on the training split with the `tokenizers` library.

## Models

Losses are mean next-token cross-entropy in nats, measured on the stored float16 weights:
validation over the whole validation stream in non-overlapping 256-token windows, train over
the first {first['train_loss_tokens']:,} training tokens. Perplexity = exp(validation loss).

| model | D | layers | heads | parameters | tokens seen | epochs | steps | peak lr | train loss | val loss \
| val ppl | wall time |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

### Files and sizes

Checkpoints ship as **float16** safetensors: half the size of the float32 figures you may see
quoted elsewhere (about 5, 22 and 117 MiB for the three models). `load_model` converts them to
float32, so in memory each model takes the float32 size.

| model | parameters | `model.safetensors` (float16, on disk) | in memory (float32) |
|---|---|---|---|
{chr(10).join(sizes)}

Recipe (all three): AdamW (β = 0.9, 0.95; weight decay 0.1 on matrices only), linear warmup
then cosine decay to a tenth of the peak, gradient clipping at 1.0, batches of 16 × 256 tokens
drawn uniformly from the training stream, bfloat16 autocast, torch's fused attention kernel
(same maths as the course attention, tested equal), validation every 100 steps, weights with
the best validation loss kept. Machine: {machine.replace(" ,", ",")} (the project's 2-core
AMD EPYC VM, no GPU). Each manifest also records the seed, the full validation history and
the code commit.

## Greedy continuations

Greedy (temperature 0), {NEW_TOKENS} new tokens at most, stopping at `<|endoftext|>`; ⏎ marks a newline.

| model | prompt + continuation |
|---|---|
{chr(10).join(samples)}

## Reproduce

```bash
./setup.sh
./datasets.sh                             # the shipped TinyStories sample, offline
./checkpoints.sh --train --force          # tokenizer, then StoryLM-1M, -5M, -30M
python scripts/model_card.py              # rewrites this page
./checkpoints.sh                          # verifies every artifact (sha256)
```

Training resumes from `runs/<Name>/trainer.pt` if interrupted (drop `--force` to keep a
verified artifact). With a GPU the same command runs on CUDA (`device="auto"`).
"""


if __name__ == "__main__":
    sys.exit(main())
