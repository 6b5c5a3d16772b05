"""Training recipes for the StoryTokenizer and the StoryLM ladder (``./checkpoints.sh --train``).

Everything runs on the course's own code with the reference solutions applied
(``G2C_APPLY_SOLUTIONS=all``): ``TransformerLM``, ``AdamW``, ``cosine_with_warmup``,
``Trainer``. The only speed switch is torch's fused attention kernel
(``TransformerLM.set_fused_attention``), tested equal to the course attention.

Runs are resumable: ``runs/<Name>/trainer.pt`` is rewritten every few hundred steps, and
a restarted run continues from it bit-identically.
"""

from __future__ import annotations

import json
import platform
import subprocess
import time
from pathlib import Path

import torch

from g2c.assets.artifacts import (
    MODEL_NAMES,
    artifact_dir,
    canonical_name,
    load_tokenizer,
    model_state_to_bytes,
    verify_artifact,
    write_artifact,
)
from g2c.assets.data import DATA_DIR, load_split_text, load_token_stream, tokenize_splits
from g2c.course import REPO_ROOT

RUNS_DIR = REPO_ROOT / "runs"
VOCAB_SIZE = 4096

# One recipe per model. The drafters see 600 steps x 16 x 256 = 2.46M tokens (about 1.55 epochs
# of the ~1.58M-token training split), the 30M target 700 steps (1.8 epochs): the CPU budget of
# the run that built the shipped ladder. At under two epochs overfitting is mild, so no dropout;
# the weights kept are those with the best validation loss anyway. The learning rate shrinks as
# the model grows.
RECIPES: dict[str, dict] = {
    "StoryLM-1M": dict(batch_size=16, context=256, max_steps=600, warmup_steps=40, max_lr=3e-3, min_lr=3e-4,
                       weight_decay=0.1, dropout=0.0, eval_every=100, seed=1),
    "StoryLM-5M": dict(batch_size=16, context=256, max_steps=600, warmup_steps=40, max_lr=2e-3, min_lr=2e-4,
                       weight_decay=0.1, dropout=0.0, eval_every=100, seed=5),
    "StoryLM-30M": dict(batch_size=16, context=256, max_steps=700, warmup_steps=40, max_lr=1.5e-3, min_lr=1.5e-4,
                        weight_decay=0.1, dropout=0.0, eval_every=100, seed=30),
}
TRAIN_LOSS_TOKENS = 131_072  # the train loss in a manifest is measured on this prefix of the train stream


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    return f"{platform.machine()} {platform.processor() or ''}, {torch.get_num_threads()} torch threads".strip()


def train_tokenizer(*, force: bool = False, log=print) -> Path:
    """Train the StoryTokenizer on the training split and install it as an artifact."""
    from g2c.tokenizer import BPETokenizer

    stories = load_split_text("train")
    data_manifest = json.loads((DATA_DIR / "manifest.json").read_text())
    t0 = time.time()
    tok = BPETokenizer.train(stories, vocab_size=VOCAB_SIZE)
    wall = time.time() - t0
    manifest = {
        "name": "StoryTokenizer", "kind": "tokenizer",
        "recipe": {"algorithm": "byte-level BPE (tokenizers library BpeTrainer)", "vocab_size": VOCAB_SIZE,
                   "special_tokens": ["<|endoftext|>"], "pre_tokenizer": "ByteLevel(add_prefix_space=False)"},
        "data": {"split": "train", "stories": data_manifest["train_stories"], "source": data_manifest["source"],
                 "split_rule": data_manifest["split_rule"]},
        "seed": None, "wall_time_s": round(wall, 1), "machine": machine(), "commit": git_commit(),
    }
    dest = write_artifact("StoryTokenizer", {"tokenizer.json": tok.to_tokenizers().to_str().encode()}, manifest,
                          force=force)
    log(f"checkpoints: StoryTokenizer trained in {wall:.1f}s -> {dest}")
    return dest


def train_model(name: str, *, force: bool = False, progress: bool = True, log=print) -> Path:
    """Train one StoryLM with its recipe and install the best-validation weights as an artifact."""
    from g2c.pretraining import TrainConfig, Trainer, stream_loss
    from g2c.transformer import LADDER

    name = canonical_name(name)
    if name not in MODEL_NAMES:
        raise ValueError(f"{name} is not a model")
    if artifact_dir(name).exists() and not force:
        try:
            verify_artifact(name)
            raise FileExistsError(f"{name} is already installed and verified; pass --force to retrain it")
        except (FileNotFoundError, ValueError):
            pass
    tok = load_tokenizer("StoryTokenizer")
    counts = tokenize_splits(tok, log=log)
    train_ids, val_ids = load_token_stream("train"), load_token_stream("val")
    recipe = dict(RECIPES[name])
    dropout = recipe.pop("dropout")
    cfg = LADDER[name]
    config = TrainConfig(**recipe, bf16=True, device="auto")
    model = cfg.build(generator=torch.Generator().manual_seed(config.seed), dropout=dropout)
    model.set_fused_attention(True)
    trainer = Trainer(model, train_ids, val_ids, config)
    run_dir = RUNS_DIR / name
    ckpt = run_dir / "trainer.pt"
    wall_before = 0.0
    if ckpt.exists() and not force:
        trainer.load_checkpoint(ckpt)
        wall_before = float(json.loads((run_dir / "wall.json").read_text())["wall_time_s"]) \
            if (run_dir / "wall.json").exists() else 0.0
        log(f"checkpoints: resuming {name} at step {trainer.step}")
    log(f"checkpoints: training {name} ({model.num_parameters():,} parameters) for {config.max_steps} steps "
        f"of {config.batch_size}x{config.context} tokens on {trainer.device}")
    t0 = time.time()
    run_dir.mkdir(parents=True, exist_ok=True)
    while trainer.step < config.max_steps:
        trainer.fit(min(100, config.max_steps - trainer.step), progress=progress)
        trainer.save_checkpoint(ckpt)
        (run_dir / "wall.json").write_text(json.dumps({"wall_time_s": wall_before + time.time() - t0}))
    wall = wall_before + time.time() - t0
    # Final weights: the best validation checkpoint, stored in float16 and measured as stored.
    model.load_state_dict(trainer.best_state)
    model.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})
    model.eval()
    val_loss = stream_loss(model, val_ids, context=config.context)
    train_loss = stream_loss(model, train_ids[:TRAIN_LOSS_TOKENS + 1], context=config.context)
    best_step = min((h for h in trainer.history if "val_loss" in h), key=lambda h: h["val_loss"])["step"]
    tokens_seen = trainer.step * config.batch_size * config.context
    config_json = {**cfg.to_dict(), "hidden_dim": model.hidden_dim, "tokenizer": "StoryTokenizer"}
    manifest = {
        "name": name, "kind": "model", "parameters": model.num_parameters(),
        "config": config_json,
        "recipe": {**RECIPES[name], "optimizer": "g2c.training.AdamW (no decay on biases, gains, positions)",
                   "schedule": "linear warmup + cosine (g2c.training.cosine_with_warmup)",
                   "grad_clip": config.grad_clip, "betas": list(config.betas), "bf16_autocast": True,
                   "attention": "torch fused SDPA (same maths as the course attention)",
                   "weights_kept": "best validation loss (evaluated every eval_every steps)",
                   "stored_dtype": "float16"},
        "data": {"split": "train", "train_tokens": counts["train"], "val_tokens": counts["val"],
                 "tokenizer_sha256": verify_artifact("StoryTokenizer")["files"]["tokenizer.json"]},
        "seed": config.seed, "steps": trainer.step, "best_step": best_step, "tokens_seen": tokens_seen,
        "epochs": round(tokens_seen / counts["train"], 2),
        "train_loss": round(train_loss, 4), "train_loss_tokens": TRAIN_LOSS_TOKENS,
        "val_loss": round(val_loss, 4), "val_perplexity": round(float(torch.tensor(val_loss).exp()), 2),
        "history": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in h.items()}
                    for h in trainer.history if "val_loss" in h],
        "wall_time_s": round(wall, 1), "machine": machine(), "commit": git_commit(),
    }
    dest = write_artifact(name, {"model.safetensors": model_state_to_bytes(model),
                                 "config.json": (json.dumps(config_json, indent=2) + "\n").encode()},
                          manifest, force=True)
    log(f"checkpoints: {name} val loss {val_loss:.4f} (train {train_loss:.4f}) after {wall / 60:.1f} min -> {dest}")
    return dest
