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
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

from g2c.assets.artifacts import (
    canonical_name,
    is_verified,
    load_tokenizer,
    model_state_to_bytes,
    verify_artifact,
    write_artifact,
)
from g2c.assets.data import DATA_DIR, load_split_text, load_token_stream, tokenize_splits
from g2c.course import REPO_ROOT
from g2c.course.files import write_text_atomic

RUNS_DIR = REPO_ROOT / "runs"

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
    """The commit checked out in the repository (recorded in manifests), or ``"unknown"`` outside git."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> str:
    """A one-line description of this machine and torch's thread count, for manifests."""
    return f"{platform.machine()} {platform.processor() or ''}, {torch.get_num_threads()} torch threads".strip()


BF16_ENV = "G2C_BF16_AUTOCAST"


def bf16_autocast_is_fast(device) -> bool:
    """Whether bfloat16 autocast makes training faster on ``device`` (it is slower where the hardware
    lacks bfloat16 products). The recipes train under bfloat16 autocast only where this is True.

    - CUDA: ``torch.cuda.is_bf16_supported()``.
    - CPU: oneDNN's bfloat16 kernels, which need AVX-512 (BW, VL, DQ) or ARM's BF16 extension
      (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``). Without them (an AVX2-only CPU) torch emulates
      the products: one (2048 x 256) @ (256 x 1024) product on one AVX2 core took 1,690 ms under
      bfloat16 autocast against 32 ms in float32 (torch 2.13, AMD EPYC), and a block-drafter step
      55 s instead of 2.6 s in float32 (one thread).
    - any other device (MPS): False (the recipes train on CPU or CUDA).

    The environment variable ``G2C_BF16_AUTOCAST`` (``1`` or ``0``) overrides the check, e.g. to rerun
    a recipe in the precision its manifest records (``recipe.bf16_autocast``) on another machine.

    Args:
        device: a ``torch.device`` or its name.

    Raises:
        ValueError: ``G2C_BF16_AUTOCAST`` set to anything but ``1`` or ``0`` (the message names it).
    """

    forced = os.environ.get(BF16_ENV)
    if forced is not None:
        if forced.strip() not in ("0", "1"):
            raise ValueError(f"{BF16_ENV} must be 1 (train under bfloat16 autocast) or 0 (float32), got {forced!r}")
        return forced.strip() == "1"
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if kind != "cpu":
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):         # a build without oneDNN: no bfloat16 kernels either
        return False


def precision_note(bf16: bool, device) -> str:
    """The log line that says which precision a recipe trains in, and why.

    When ``G2C_BF16_AUTOCAST`` is set it names the variable as the reason (the hardware check did not
    decide); otherwise it gives the hardware's answer from ``bf16_autocast_is_fast``.
    """
    where = torch.device(device)
    forced = os.environ.get(BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return f"{'bfloat16 autocast' if bf16 else 'float32'} on {where}: forced by {BF16_ENV}={forced}"
    if bf16:
        return f"bfloat16 autocast on {where}"
    return (f"float32 on {where}: it has no bfloat16 products (bfloat16 autocast would be "
            f"tens of times slower here; {BF16_ENV}=1 forces it)")


def train_tokenizer(*, force: bool = False, log=print) -> Path:
    """Train the StoryTokenizer on the training split and install it as an artifact."""
    from g2c.tokenizer import BPETokenizer

    stories = load_split_text("train")
    data_manifest = json.loads((DATA_DIR / "manifest.json").read_text())
    t0 = time.time()
    tok = BPETokenizer.train(stories, vocab_size=vocab_size())
    wall = time.time() - t0
    manifest = {
        "name": "StoryTokenizer", "kind": "tokenizer",
        "recipe": {"algorithm": "byte-level BPE (tokenizers library BpeTrainer)", "vocab_size": vocab_size(),
                   "special_tokens": ["<|endoftext|>"], "pre_tokenizer": "ByteLevel(add_prefix_space=False)"},
        "data": {"split": "train", "stories": data_manifest["train_stories"], "source": data_manifest["source"],
                 "split_rule": data_manifest["split_rule"]},
        "seed": None, "wall_time_s": round(wall, 1), "machine": machine(), "commit": git_commit(),
    }
    dest = write_artifact("StoryTokenizer", {"tokenizer.json": tok.to_tokenizers().to_str().encode()}, manifest,
                          force=force)
    log(f"checkpoints: StoryTokenizer trained in {wall:.1f}s -> {dest}")
    return dest


def vocab_size() -> int:
    """The ladder's vocabulary size (every ``LADDER`` entry shares the StoryTokenizer)."""
    from g2c.transformer import LADDER

    sizes = {cfg.vocab_size for cfg in LADDER.values()}
    assert len(sizes) == 1, f"LADDER entries disagree on vocab_size: {sizes}"
    return sizes.pop()


def _check_can_train(name: str, force: bool):
    """The ``LADDER`` config for ``name``; refuses to overwrite a verified artifact without ``force``.

    Raises:
        ValueError: ``name`` is not a ladder model or has no recipe. FileExistsError: already installed.
    """
    from g2c.transformer import LADDER

    name = canonical_name(name)
    if name not in LADDER or name not in RECIPES:
        raise ValueError(f"{name} is not a ladder model with a recipe; models: {', '.join(LADDER)}")
    if not force and is_verified(name):
        raise FileExistsError(f"{name} is already installed and verified; pass --force to retrain it")
    return LADDER[name]


def _run_training(name: str, trainer, config, *, force: bool, progress: bool, log) -> float:
    """Resume from ``runs/<name>/trainer.pt`` if present, train to ``max_steps`` with
    ``Trainer.fit``'s own checkpointing, and return the accumulated wall time in seconds."""
    run_dir = RUNS_DIR / name
    ckpt, wall_file = run_dir / "trainer.pt", run_dir / "wall.json"
    wall_before = 0.0
    if ckpt.exists() and not force:
        trainer.load_checkpoint(ckpt)
        wall_before = float(json.loads(wall_file.read_text())["wall_time_s"]) if wall_file.exists() else 0.0
        log(f"checkpoints: resuming {name} at step {trainer.step}")
    log(f"checkpoints: training {name} ({trainer.model.num_parameters():,} parameters) for {config.max_steps} "
        f"steps of {config.batch_size}x{config.context} tokens on {trainer.device}")
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    while trainer.step < config.max_steps:   # chunks of 100 steps, so the wall time survives a kill too
        trainer.fit(min(100, config.max_steps - trainer.step), progress=progress, checkpoint_path=ckpt)
        write_text_atomic(wall_file, json.dumps({"wall_time_s": wall_before + time.time() - t0}))
    return wall_before + time.time() - t0


def _manifest(name: str, cfg, model, trainer, config, counts: dict, *, val_loss: float, train_loss: float,
              wall: float) -> tuple[dict, dict]:
    """(config.json, manifest.json) contents for a trained model."""
    best_step = min((h for h in trainer.history if "val_loss" in h), key=lambda h: h["val_loss"])["step"]
    tokens_seen = trainer.step * config.batch_size * config.context
    config_json = {**cfg.to_dict(), "tokenizer": "StoryTokenizer"}
    manifest = {
        "name": name, "kind": "model", "parameters": model.num_parameters(),
        "config": config_json,
        "recipe": {**RECIPES[name], "optimizer": "g2c.training.AdamW (no decay on biases, gains, positions)",
                   "schedule": "linear warmup + cosine (g2c.training.cosine_with_warmup)",
                   "grad_clip": config.grad_clip, "betas": list(config.betas), "bf16_autocast": config.bf16,
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
    return config_json, manifest


def train_model(name: str, *, force: bool = False, progress: bool = True, log=print) -> Path:
    """Train one StoryLM with its recipe and install the best-validation weights as an artifact.

    Steps: check the name and any installed copy; tokenize the splits; build the model from
    ``LADDER``; train (resumable); evaluate the float16-rounded best weights; write the artifact.

    Raises:
        ValueError: not a ladder model. FileExistsError: already installed (pass ``force``).
        FileNotFoundError: the data or the tokenizer is missing (run ./datasets.sh, ./checkpoints.sh).
    """
    from g2c.pretraining import TrainConfig, Trainer, stream_loss

    name = canonical_name(name)
    cfg = _check_can_train(name, force)
    counts = tokenize_splits(load_tokenizer("StoryTokenizer"), log=log)
    train_ids, val_ids = load_token_stream("train"), load_token_stream("val")
    recipe = dict(RECIPES[name])
    dropout = recipe.pop("dropout")
    from g2c.nn.device import resolve_device

    bf16 = bf16_autocast_is_fast(resolve_device("auto"))         # float32 where bfloat16 is emulated (AVX2)
    config = TrainConfig(**recipe, bf16=bf16, device="auto")
    model = cfg.build(generator=torch.Generator().manual_seed(config.seed), dropout=dropout)
    model.set_fused_attention(True)
    trainer = Trainer(model, train_ids, val_ids, config)
    log(f"checkpoints: {name} trains in {precision_note(bf16, trainer.device)}")
    wall = _run_training(name, trainer, config, force=force, progress=progress, log=log)
    # Final weights: the best validation checkpoint, stored in float16 and measured as stored.
    model.load_state_dict(trainer.best_state)
    model.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})
    model.eval()
    val_loss = stream_loss(model, val_ids, context=config.context)
    train_loss = stream_loss(model, train_ids[:TRAIN_LOSS_TOKENS + 1], context=config.context)
    config_json, manifest = _manifest(name, cfg, model, trainer, config, counts, val_loss=val_loss,
                                      train_loss=train_loss, wall=wall)
    dest = write_artifact(name, {"model.safetensors": model_state_to_bytes(model),
                                 "config.json": (json.dumps(config_json, indent=2) + "\n").encode()},
                          manifest, force=True)
    log(f"checkpoints: {name} val loss {val_loss:.4f} (train {train_loss:.4f}) after {wall / 60:.1f} min -> {dest}")
    return dest
