"""Training recipes for the shipped drafters (``./checkpoints.sh --train StoryLM-30M-EAGLE``).

Seven artifacts, all learned from a frozen ladder model's view of the TinyStories training
split (``g2c.assets.recipes.features``: one forward pass of the base, its final states kept on disk;
the lineage drafters Medusa, EAGLE-3 and the block drafter are described in docs/models.md):

``StoryLM-1M-distilled``
    StoryLM-1M's architecture and tokenizer, started from StoryLM-1M's weights and trained
    against StoryLM-30M's next-token distributions: the loss is
    ``kd_weight * KL(p_30M || q_1M) + (1 - kd_weight) * CE(data)`` (forward KL at
    temperature 1). DistillSpec (Zhou et al., ICLR 2024, §3-4) frames the drafter's job as
    matching the target, not the data: the acceptance rate of a sampled draft is
    1 - TV(p, q) (Leviathan et al. 2023, Corollary 3.6), and they compare forward KL, reverse
    KL, JSD and TVD with fixed vs on-policy data; forward KL on fixed data is the simplest
    of their settings and the one used here (see docs/models.md for what was not tried).
``StoryLM-30M-MTP``, ``StoryLM-5M-MTP``
    The course's ``MTPHead`` (Gloeckle et al. 2024, §3.2) on the frozen StoryLM-30M / -5M,
    trained on the base's stored states (StoryLM-5M-MTP until validation stops improving;
    StoryLM-30M-MTP for EAGLE's budget, as every drafter that reads StoryLM-30M's states).
``StoryLM-30M-EAGLE``
    ``g2c.specdec.sampling.eagle.FeatureDrafter`` on the frozen StoryLM-30M, trained with
    ``eagle_loss`` (Li et al., ICML 2024, §4.2: SmoothL1 on the next feature + 0.1 x
    cross-entropy against the target's distribution, input features with U(-0.1, 0.1) noise).

Every run keeps the weights with the best validation score (checked every ``eval_every``
steps on the first ``val_windows`` validation windows), stops early after ``patience``
checks without improvement (``patience`` None: every step of the budget runs), and is
resumable: ``runs/<Name>/drafter.pt`` is rewritten at every check. Runs use the reference
solutions (``./checkpoints.sh --train`` applies them).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from g2c.assets.artifacts import (
    DRAFTERS,
    artifact_dir,
    canonical_name,
    load_model,
    load_story_tokenizer,
    model_state_to_bytes,
    write_artifact,
)
from g2c.assets.recipes import features as _features
from g2c.assets.recipes.features import Features, FinalStates, layer_features, target_features
from g2c.assets.recipes.ladder import RUNS_DIR, bf16_autocast_is_fast, git_commit, machine, precision_note

__all__ = ["DRAFTER_RECIPES", "EQUAL_BUDGET_TOKENS", "RECIPE_VARIANTS", "STATE_READERS", "TRAINING_BUDGETS",
           "budgeted_recipe", "parse_budget", "recipe_budget", "train_drafter"]

# The budget: StoryLM-1M-distilled and StoryLM-5M-MTP ran on the project's 2-core CPU beside the others,
# so their step counts are what fitted into an afternoon and early stopping decides when they are done.
# Every drafter that reads StoryLM-30M's states (STATE_READERS) ships at ONE budget, EAGLE's 5,734,400
# target tokens (issue 29): its recipe is budgeted_recipe(name, EQUAL_BUDGET_TOKENS), every step run.
# The block drafter learns from the target's own greedy text (text="greedy", self-distillation as
# Medusa-2 section 2.3.2 and DFlash train): at this budget it reached tau 3.56 at B = 8 against 2.63 on
# the corpus (docs/beyond/specdec-lineage.md); its variant "corpus" is the former recipe.
DRAFTER_RECIPES: dict[str, dict] = {
    "StoryLM-1M-distilled": dict(teacher="StoryLM-30M", init="StoryLM-1M", steps=800, batch_size=16, max_lr=1e-3,
                                 min_lr=1e-4, warmup_steps=30, kd_weight=0.9, eval_every=100, patience=3,
                                 val_windows=64, seed=101),
    "StoryLM-30M-MTP": dict(base="StoryLM-30M", steps=1400, batch_size=16, max_lr=1e-3, min_lr=1e-4,
                            warmup_steps=30, eval_every=100, patience=None, val_windows=64, seed=130,
                            budget_tokens=5_734_400, features_windows=22400),
    "StoryLM-5M-MTP": dict(base="StoryLM-5M", steps=800, batch_size=16, max_lr=1e-3, min_lr=1e-4,
                           warmup_steps=30, eval_every=100, patience=3, val_windows=64, seed=105),
    "StoryLM-30M-EAGLE": dict(base="StoryLM-30M", steps=1400, batch_size=16, max_lr=1e-3, min_lr=1e-4,
                              warmup_steps=30, w_cls=0.1, noise=0.1, eval_every=100, patience=3,
                              val_windows=64, seed=230),
    # The lineage (specdec-lineage): trained on the states of StoryLM-30M's blocks 2, 4, 6 and its final
    # state over the first `features_windows` training windows (g2c.assets.recipes.features.layer_features).
    "StoryLM-30M-Medusa": dict(base="StoryLM-30M", num_medusa_heads=4, decay=0.8, steps=2800, batch_size=8,
                               max_lr=2e-3, min_lr=2e-4, warmup_steps=20, eval_every=100, patience=None,
                               val_windows=32, features_windows=22400, seed=240, budget_tokens=5_734_400),
    "StoryLM-30M-EAGLE3": dict(base="StoryLM-30M", ttt_steps=3, decay=0.8, steps=5600, batch_size=4,
                               max_lr=1e-3, min_lr=1e-4, warmup_steps=30, eval_every=100, patience=None,
                               val_windows=32, features_windows=22400, seed=250, budget_tokens=5_734_400),
    "StoryLM-30M-Block": dict(base="StoryLM-30M", block_size=8, context_rows=8, num_blocks=2,
                              anchors_per_window=12, gamma=4.0, steps=2800, batch_size=8, max_lr=1e-3,
                              min_lr=1e-4, warmup_steps=30, eval_every=100, patience=None, val_windows=32,
                              features_windows=22400, seed=260, budget_tokens=5_734_400, text="greedy"),
}
LINEAGE_KINDS = ("medusa", "eagle3", "block")
FUSION_LAYERS = {"StoryLM-30M": (2, 4, 6)}   # = g2c.specdec.lineage.fusion_layers(9)

# -- one budget (issue 29) ------------------------------------------------------------------------
# A drafter's training budget is counted in TARGET TOKENS SEEN: steps x batch_size x context (every
# window is `context` tokens of the base's states). The recipes above are the ones that reproduce the
# shipped artifacts (tests/tooling/test_artifacts.py pins them), every state reader at EAGLE's; a budgeted
# run (`./checkpoints.sh --train NAME --budget TOKENS`, or `--budget equal` for EAGLE's) derives the
# steps from the budget, runs all of them (no early stop: equal budgets), keeps the best-validation
# weights, and learns from every window of the training split.
CONTEXT = 256
STATE_READERS = ("StoryLM-30M-MTP", "StoryLM-30M-EAGLE", "StoryLM-30M-Medusa", "StoryLM-30M-EAGLE3",
                 "StoryLM-30M-Block")


# Variants (issue 29, items 2 and 4): a paper's design or an ablation, as a named change to one drafter's
# recipe. A variant trains only at a budget, beside the plain drafter at the same budget, and installs
# into runs/budget-<T>-<variant>/ (`./checkpoints.sh --train NAME --budget 512k --variant kv`).
RECIPE_VARIANTS = {
    "StoryLM-30M-Block": {"kv": {"injection": "kv", "text": "corpus"},  # DFlash: features into every layer's
                          #                                         K/V (measured against the corpus recipe)
                          "self": {"text": "greedy"},             # the target's own greedy text (= the recipe's)
                          "mixed": {"text": "mixed"},             # ... after corpus prompts of 32..224 tokens
                          "corpus": {"text": "corpus"}},          # the corpus windows (the recipe until stop 50)
    "StoryLM-30M-EAGLE3": {"ttt1": {"ttt_steps": 1},              # no training-time test (one step)
                           "ttt7": {"ttt_steps": 7},              # the reference training's 7 steps
                           "self": {"text": "greedy"}},
    "StoryLM-30M-EAGLE": {"tokens": {"feature_inputs": False},    # the same head on tokens only
                          "self": {"text": "greedy"}},
    "StoryLM-30M-Medusa": {"self": {"text": "greedy"}},           # Medusa-2's self-distillation (section 2.3.2)
}


def recipe_budget(recipe: dict) -> int:
    """Target tokens a recipe's full run sees: steps x batch_size x context."""
    return recipe["steps"] * recipe["batch_size"] * recipe.get("context", CONTEXT)


EQUAL_BUDGET_TOKENS = recipe_budget(DRAFTER_RECIPES["StoryLM-30M-EAGLE"])     # 5,734,400
TRAINING_BUDGETS = {name: recipe_budget(DRAFTER_RECIPES[name]) for name in STATE_READERS}   # the shipped recipes'


MAX_BUDGET_TOKENS = 1_000_000_000          # about 630 epochs of the split: a typo, not a plan


def parse_budget(text) -> int:
    """``--budget``: a token count (``5734400``, ``5,734,400``, ``5.7M``, ``200k``) or ``equal``
    (EAGLE's budget).

    Raises:
        ValueError: not a whole count of tokens from 1 to ``MAX_BUDGET_TOKENS`` (1,000M: about 630
            epochs of the split, days of CPU), a ``k``/``M`` count or ``equal``; a fraction of a token
            (``0.4``), misplaced thousands commas (``1,2,3``) and exponents (``1e11``) are refused by
            name ("--budget must be a positive number").
    """
    import re
    from decimal import Decimal

    t = str(text).strip().lower().replace("_", "")
    if t == "equal":
        return EQUAL_BUDGET_TOKENS
    if re.fullmatch(r"[0-9]{1,3}(,[0-9]{3})+(\.[0-9]*)?[km]?", t):         # 5,734,400: thousands groups only
        t = t.replace(",", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(t[-1:], 1)
    number = t[:-1] if scale > 1 else t
    # exact decimal arithmetic: 5.7M is 5,700,000 tokens, 1000000.5 is half a token too many (no float rounding)
    tokens = Decimal(number) * scale if re.fullmatch(r"[0-9]{1,30}(\.[0-9]*)?|\.[0-9]{1,30}", number) else Decimal(0)
    if not 1 <= tokens <= MAX_BUDGET_TOKENS or tokens != tokens.to_integral_value():
        raise ValueError(f"--budget must be a positive number of target tokens, whole, at most "
                         f"{MAX_BUDGET_TOKENS // 1_000_000:,}M (5734400, 5,734,400, 5.7M, 200k) or 'equal' "
                         f"(EAGLE's {EQUAL_BUDGET_TOKENS:,}), got {text!r}")
    return int(tokens)


def budgeted_recipe(name: str, tokens: int, variant: str | None = None) -> dict:
    """The recipe of ``name`` at a budget of ``tokens`` target tokens seen.

    steps = ceil(tokens / (batch_size x context)) (so the budget actually seen, ``budget_tokens``,
    rounds up to whole steps); ``patience`` None (every step runs: equal budgets); at least 10
    validation checks (``eval_every`` <= steps / 10); every state reader (MTP and EAGLE included, which
    read only the final states of the same cache) reads as many training windows as the budget sees
    tokens (``features_windows`` = ceil(tokens / context), capped at the split by
    ``layer_features``: EAGLE's budget reads every window, 4.7 times over; a laptop's 200k tokens
    computes 782 windows of features, not the whole split's 5 GB).

    ``variant`` (a key of ``RECIPE_VARIANTS[name]``) applies that variant's changes and records
    ``variant`` in the recipe.

    Raises:
        ValueError: ``name`` has no recipe, tokens < 1, or ``name`` has no such variant (the message
            lists the variants there are).
    """
    name = canonical_name(name)
    if name not in DRAFTER_RECIPES:
        raise ValueError(f"{name} is not a drafter; drafters: {', '.join(DRAFTER_RECIPES)}")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"budget must be a positive int of target tokens, got {tokens!r}")
    r = dict(DRAFTER_RECIPES[name])
    if variant is not None:
        known = RECIPE_VARIANTS.get(name, {})
        typed, variant = variant, variant.strip().lower() if isinstance(variant, str) else variant  # "KV" is "kv"
        if variant not in known:
            import difflib

            close = difflib.get_close_matches(variant, list(known), n=1) if isinstance(variant, str) else []
            raise ValueError(f"{name} has no variant {typed!r}"
                             + (f" (did you mean {close[0]!r}?)" if close else "") + "; its variants: "
                             + (", ".join(known) if known else "none") + "; every variant: "
                             + "; ".join(f"{n}: {', '.join(v)}" for n, v in RECIPE_VARIANTS.items()))
        r.update(known[variant], variant=variant)
    per_step = r["batch_size"] * r.get("context", CONTEXT)
    steps = -(-tokens // per_step)
    r.update(steps=steps, budget_tokens=steps * per_step, patience=None,
             eval_every=max(1, min(r["eval_every"], -(-steps // 10))),
             warmup_steps=min(r["warmup_steps"], max(1, steps // 10)))
    if name in STATE_READERS:       # every state reader learns from the same first windows (one feature pass)
        r["features_windows"] = -(-r["budget_tokens"] // r.get("context", CONTEXT))
    return r


def _lr(step: int, r: dict) -> float:
    """The recipe's learning rate at ``step``: the course's warmup + cosine schedule."""
    from g2c.training import cosine_with_warmup

    return cosine_with_warmup(step, warmup_steps=r["warmup_steps"], max_steps=r["steps"], max_lr=r["max_lr"],
                              min_lr=r["min_lr"])


def _kl_terms(student_logits: torch.Tensor, teacher_logits: torch.Tensor, targets: torch.Tensor) -> dict:
    """Forward KL(p_teacher || q_student), data CE, argmax agreement and 1 - TV, per position means."""
    logq = torch.log_softmax(student_logits.float(), -1)
    logp = torch.log_softmax(teacher_logits.float(), -1)
    p = logp.exp()
    kl = (p * (logp - logq)).sum(-1).mean()
    ce = torch.nn.functional.cross_entropy(logq.reshape(-1, logq.shape[-1]), targets.reshape(-1))
    with torch.no_grad():
        agree = (logq.argmax(-1) == logp.argmax(-1)).float().mean()
        accept = 1 - 0.5 * (p - logq.exp()).abs().sum(-1).mean()
    return {"kl": kl, "ce": ce, "agree": agree, "accept": accept}


class _Job:
    """What differs between the three kinds: the trainable module, a batch's loss terms, the
    score that picks the best weights (lower is better), and the artifact's config."""

    def __init__(self, name: str, recipe: dict, device) -> None:
        from g2c.specdec import MTPHead
        from g2c.specdec.sampling.eagle import FeatureDrafter

        self.name, self.recipe, self.kind = name, recipe, DRAFTERS[name]["kind"]
        self.bf16 = bf16_autocast_is_fast(device)          # float32 where bfloat16 is emulated (an AVX2 CPU)
        gen = torch.Generator().manual_seed(recipe["seed"])
        base_name = recipe.get("base") or recipe["teacher"]
        self.base, _ = load_model(base_name, device=device)
        self.base.set_fused_attention(True)
        self.base_name = base_name
        if self.kind == "lm":
            self.module, _ = load_model(recipe["init"], device=device)
            self.module.set_fused_attention(True)
        elif self.kind == "mtp":
            self.module = MTPHead(self.base, generator=gen)
            self.module.block.attn.fused = True
        elif self.kind == "eagle":
            self.module = FeatureDrafter(self.base, generator=gen)
            self.module.block.attn.fused = True
        else:
            from g2c.specdec.lineage import BlockHead, Eagle3Head, MedusaHeads

            layers = FUSION_LAYERS[base_name]
            if self.kind == "medusa":
                self.module = MedusaHeads(self.base, recipe["num_medusa_heads"], generator=gen)
            elif self.kind == "eagle3":
                self.module = Eagle3Head(self.base, layers, generator=gen)
            else:
                self.module = BlockHead(self.base, layers, block_size=recipe["block_size"],
                                        context_rows=recipe["context_rows"], num_blocks=recipe["num_blocks"],
                                        injection=recipe.get("injection", "rows"), generator=gen)

    def terms(self, ids: torch.Tensor, states: torch.Tensor, *, train: bool, generator=None) -> dict:
        from g2c.specdec import mtp_loss
        from g2c.specdec.sampling.eagle import eagle_loss

        r = self.recipe
        if self.kind == "lm":
            with torch.no_grad():
                teacher = self.base.unembed(states[:, :-1])                            # (B, T-1, V)
            out = _kl_terms(self.module(ids[:, :-1]), teacher, ids[:, 1:])
            out["loss"] = r["kd_weight"] * out["kl"] + (1 - r["kd_weight"]) * out["ce"]
            out["score"] = out["kl"]
            return out
        if self.kind == "mtp":
            logits = self.module(states[:, :-1], ids[:, 1:])                             # (B, T-1, V)
            loss = mtp_loss(logits, ids)
            with torch.no_grad():
                target_next = self.base.unembed(states[:, 1:-1]).argmax(-1)             # the target's own t+2 pick
                agree = (logits[:, :-1].argmax(-1) == target_next).float().mean()
            return {"loss": loss, "agree": agree, "score": loss}
        if self.kind == "eagle":
            out = eagle_loss(self.module, states, ids, w_cls=r["w_cls"], noise=r["noise"] if train else 0.0,
                             generator=generator, feature_inputs=r.get("feature_inputs", True))
        else:
            from g2c.specdec.lineage import block_loss, eagle3_loss, medusa_loss

            if self.kind == "medusa":
                out = medusa_loss(self.module, states[:, :, -1], decay=r["decay"])
            elif self.kind == "eagle3":
                out = eagle3_loss(self.module, states, ids, steps=r["ttt_steps"], decay=r["decay"])
            else:
                out = block_loss(self.module, states, ids, anchors_per_window=r["anchors_per_window"],
                                 gamma=r["gamma"], generator=generator if train else torch.Generator().manual_seed(0))
        out["score"] = out["loss"]
        return out

    def config(self) -> dict:
        if self.kind == "lm":
            return json.loads((artifact_dir(self.recipe["init"]) / "config.json").read_text())
        if self.kind in LINEAGE_KINDS:
            return {"kind": self.kind, "base": self.base_name, **self.module.config(),
                    "vocab_size": self.base.vocab_size, "tokenizer": "StoryTokenizer"}
        cfg = {"kind": self.kind, "base": self.base_name, "dim": self.base.embedding_dim,
               "num_heads": self.base.num_heads, "hidden_dim": self.base.hidden_dim,
               "vocab_size": self.base.vocab_size, "tokenizer": "StoryTokenizer"}
        if not self.recipe.get("feature_inputs", True):
            cfg["inputs"] = "tokens"          # the ablation: load_model refuses to serve it
        return cfg


@torch.no_grad()
def _evaluate(job: _Job, val: Features, num_windows: int, batch_size: int) -> dict:
    job.module.eval()
    sums, count = {}, 0
    for start in range(0, min(num_windows, val.num_windows), batch_size):
        windows = torch.arange(start, min(start + batch_size, num_windows, val.num_windows))
        ids, states = val.batch(windows, job.base.token_embed.weight.device)
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=job.bf16):
            out = job.terms(ids, states, train=False)
        for k, v in out.items():
            sums[k] = sums.get(k, 0.0) + float(v) * len(windows)
        count += len(windows)
    job.module.train()
    return {f"val_{k}": v / count for k, v in sums.items()}


def _train_steps(job, r: dict, train, val, opt, gen, params, ckpt: Path, bar, name: str, log, on_step,
                 state: dict) -> None:
    """The training loop from ``state["step"]`` to ``r["steps"]`` (or early stop), checkpointing at every
    validation check; ``state`` is updated in place (a Ctrl-C leaves it at the last finished step)."""
    from g2c.pretraining.trainer import save_checked
    from g2c.training import clip_grad_norm_

    patience = r["patience"] if r["patience"] is not None else float("inf")
    while state["step"] < r["steps"] and state["bad_checks"] < patience:
        step = state["step"]
        opt.lr = _lr(step, r)
        windows = torch.randint(0, train.num_windows, (r["batch_size"],), generator=gen)
        ids, states = train.batch(windows, job.base.token_embed.weight.device)
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=job.bf16):
            out = job.terms(ids, states, train=True, generator=gen)
        opt.zero_grad()
        out["loss"].backward()
        clip_grad_norm_(params, 1.0)
        opt.step()
        step = state["step"] = step + 1
        bar.update(1)
        bar.set_postfix(loss=f"{float(out['loss'].detach()):.3f}")
        if step % r["eval_every"] == 0 or step == r["steps"]:
            metrics = _evaluate(job, val, r["val_windows"], r["batch_size"])
            state["history"].append({"step": step, "tokens_seen": step * r["batch_size"] * train.context,
                                     "train_loss": round(float(out["loss"].detach()), 5),
                                     **{k: round(v, 5) for k, v in metrics.items()}})
            if metrics["val_score"] < state["best"] - 1e-4:
                state["best"], state["bad_checks"] = metrics["val_score"], 0
                state["best_state"] = {k: v.clone() for k, v in job.module.state_dict().items()}
            else:
                state["bad_checks"] += 1
            log(f"\ndrafters: {name} step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
            save_checked({"module": job.module.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                          "step": step, "history": state["history"], "best": state["best"],
                          "best_state": state["best_state"],
                          "wall": state["wall_before"] + time.time() - state["t0"],
                          "bad_checks": state["bad_checks"]}, ckpt)
            state["saved"] = step
        if on_step is not None:
            on_step(step)


def budget_root(tokens: int, variant: str | None = None) -> Path:
    """Where a budgeted run installs its artifact (an ``artifacts/``-like tree; ``load_model(name, root=...)``):
    ``runs/budget-<tokens>/`` for the budget asked for (``--budget 1M``: ``runs/budget-1000000/``, whatever
    whole number of steps each drafter rounds it up to); a variant's ``runs/budget-<tokens>-<variant>/``."""
    return RUNS_DIR / (f"budget-{tokens}" if variant is None else f"budget-{tokens}-{variant}")


def train_drafter(name: str, *, force: bool = False, progress: bool = True, log=print, budget: int | None = None,
                  on_step=None, variant: str | None = None) -> Path:
    """Train one drafter with its recipe and install the best-validation weights as an artifact.

    Args:
        name: a drafter with a recipe (``DRAFTER_RECIPES``).
        force: retrain from step 0 although an artifact (or a checkpoint) exists.
        progress: tqdm bars.
        budget: target tokens to see (``budgeted_recipe``); None runs the shipped recipe and installs into
            ``artifacts/``; a budget trains in ``runs/<Name>-budget<T>/`` and installs into
            ``runs/budget-<T>/`` (``budget_root``), never over the shipped artifact.
        on_step: ``on_step(step)`` after each finished step (and its checkpoint, if one was due); tests
            interrupt a run from it.
        variant: with a budget, one of ``RECIPE_VARIANTS[name]`` (a paper design or an ablation; any
            case); trains in ``runs/<Name>-budget<S>-<variant>/`` (S: the budget rounded up to whole
            steps) and installs into ``runs/budget-<T>-<variant>/`` (T: the budget asked for).

    The run is resumable: ``runs/<Name>[-budget<T>]/drafter.pt`` is rewritten at every validation check
    (every ``eval_every`` steps); after Ctrl-C the same command resumes from the last check, and ends
    with the same weights as an uninterrupted run (``tests/tooling/test_drafters.py``). Each check logs
    the validation metrics (agreement included) into the history the manifest keeps
    (``scripts/agreement_figure.py`` plots them against tokens seen).

    Raises:
        ValueError: ``name`` is not a drafter; a bad budget; a variant without a budget or unknown to
            ``name``. FileExistsError: installed and verified (pass ``force``).
        ArtifactMissingError: its base/teacher is not installed (run ./checkpoints.sh).
        FileNotFoundError: the data is not prepared (run ./datasets.sh).
    """
    from tqdm.auto import tqdm

    from g2c.assets.artifacts import is_verified
    from g2c.assets.data import tokenize_splits
    from g2c.pretraining.trainer import load_checked
    from g2c.training import AdamW

    name = canonical_name(name)
    if name not in DRAFTER_RECIPES:
        raise ValueError(f"{name} is not a drafter; drafters: {', '.join(DRAFTER_RECIPES)}")
    if variant is not None and budget is None:
        raise ValueError(f"a variant ({variant!r}) trains at a budget only, beside the plain drafter at the same "
                         "budget: add --budget TOKENS")
    r = DRAFTER_RECIPES[name] if budget is None else budgeted_recipe(name, budget, variant)
    variant = r.get("variant")                                     # the canonical spelling (lower case)
    # the folder is named after the budget asked for, so every drafter of one --budget lands in one tree
    # (each rounds up to its own whole steps: r["budget_tokens"], recorded in its manifest)
    root = None if budget is None else budget_root(budget, variant)
    if not force and is_verified(name, root):
        raise FileExistsError(f"{name} is already installed and verified{'' if root is None else f' in {root}'}; "
                              "pass --force to retrain it")
    tokenize_splits(load_story_tokenizer(), log=log)
    device = "cpu" if not torch.cuda.is_available() else "cuda"
    job = _Job(name, r, device)
    text = {"corpus": "the corpus", "greedy": "the base's own greedy text",
            "mixed": "the base's own greedy text after corpus prompts of several lengths"}
    log(f"drafters: {name}: {r['steps']:,} steps of {r['batch_size']}x{r.get('context', CONTEXT)} tokens "
        f"({recipe_budget(r):,} target tokens seen) on {text.get(r.get('text', 'corpus'), r.get('text'))}"
        + (f"; first the base's states over up to {r['features_windows']:,} windows (cached, resumable)"
           if "features_windows" in r else "") + " (Ctrl-C stops it; the same command resumes)")
    if job.kind in LINEAGE_KINDS or "features_windows" in r:
        # a budgeted run of any state reader (MTP and EAGLE too) reads the one layer-feature cache, so every
        # drafter at a budget learns from the same windows; MTP and EAGLE see only its final states
        layers = FUSION_LAYERS[job.base_name]
        source = r.get("text", "corpus")          # the text the windows hold (a recipe's "data" is prose)
        train = layer_features(job.base, job.base_name, "train", layers, max_windows=r["features_windows"],
                               context=r.get("context", CONTEXT), progress=progress, log=log, source=source)
        val = layer_features(job.base, job.base_name, "val", layers, max_windows=r["val_windows"],
                             context=r.get("context", CONTEXT), progress=progress, log=log, source=source)
        data = (f"{job.base_name}'s outputs of blocks {', '.join(map(str, layers))} and final states over the "
                f"first {train.num_windows} train windows of {train.context} tokens "
                + ({"corpus": "",       # the prompt lengths layer_features read (module globals, read now)
                    "greedy": f"of its own greedy text (each window's first {_features.GREEDY_PROMPT_TOKENS} "
                              "corpus tokens continued) ",
                    "mixed": "of its own greedy text (each window's first "
                             f"{'/'.join(map(str, _features.MIXED_PROMPT_TOKENS))} corpus tokens, in turn by "
                             f"{_features.PROMPT_GROUP} windows, continued) "}[source])
                + "(g2c.assets.recipes.features.layer_features)")
        if job.kind not in LINEAGE_KINDS:
            train, val = FinalStates(train), FinalStates(val)
            data = data.replace("outputs of blocks", "final states (from the cache of blocks").replace(
                " and final states over", " and final states) over")
    else:
        train = target_features(job.base, job.base_name, "train", context=r.get("context", CONTEXT),
                                progress=progress, log=log)
        val = target_features(job.base, job.base_name, "val", context=r.get("context", CONTEXT), progress=progress,
                              log=log)
        data = (f"{job.base_name}'s final states over the train split in non-overlapping "
                f"{train.context}-token windows (g2c.assets.recipes.features)")
    params = list(job.module.parameters())
    opt = AdamW(params, lr=r["max_lr"], betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(r["seed"])
    split_tokens = train.num_windows * train.context
    planned = r["steps"] * r["batch_size"] * train.context
    if planned > split_tokens:                               # the split cannot feed the budget once: say so
        log(f"drafters: {name}: a budget of {planned:,} target tokens is {planned / split_tokens:.2f} epochs of the "
            f"{train.num_windows:,} training windows ({split_tokens:,} tokens): windows repeat")
    run_dir = RUNS_DIR / (name if budget is None else f"{name}-budget{r['budget_tokens']}"
                          + ("" if variant is None else f"-{variant}"))
    run_dir.mkdir(parents=True, exist_ok=True)
    ckpt = run_dir / "drafter.pt"
    step, history, best, best_state, wall_before, bad_checks = 0, [], None, None, 0.0, 0
    if ckpt.exists() and not force:
        state = load_checked(ckpt)  # refuses a truncated or bit-flipped drafter.pt (sha256 beside it)
        job.module.load_state_dict(state["module"])
        opt.load_state_dict(state["opt"])
        gen.set_state(state["gen"])
        step, history, best, best_state = state["step"], state["history"], state["best"], state["best_state"]
        wall_before, bad_checks = state["wall"], state["bad_checks"]
        log(f"drafters: resuming {name} at step {step}")
    if step == 0:
        first = _evaluate(job, val, r["val_windows"], r["batch_size"])
        history.append({"step": 0, "tokens_seen": 0, **{k: round(v, 5) for k, v in first.items()}})
        best, best_state = first["val_score"], {k: v.clone() for k, v in job.module.state_dict().items()}
    log(f"drafters: training {name} ({sum(p.numel() for p in params):,} parameters) on {job.base_name}'s "
        f"states, up to {r['steps']} steps of {r['batch_size']}x{train.context} tokens in "
        f"{precision_note(job.bf16, device)}")
    job.module.train()
    t0 = time.time()
    bar = tqdm(total=r["steps"], initial=step, desc=name, disable=not progress)
    state = {"step": step, "history": history, "best": best, "best_state": best_state, "bad_checks": bad_checks,
             "saved": step, "wall_before": wall_before, "t0": t0}
    try:
        _train_steps(job, r, train, val, opt, gen, params, ckpt, bar, name, log, on_step, state)
    except KeyboardInterrupt:
        bar.close()
        log(f"\ndrafters: {name} interrupted at step {state['step']}; its last checkpoint ({ckpt}) holds step "
            f"{state['saved']}: run the same command again to resume from there")
        raise
    step, history, best_state = state["step"], state["history"], state["best_state"]
    bar.close()
    wall = wall_before + time.time() - t0
    job.module.load_state_dict(best_state)
    job.module.load_state_dict({k: v.half().float() for k, v in job.module.state_dict().items()})
    final = _evaluate(job, val, val.num_windows, r["batch_size"])                  # the whole val split
    best_step = min((h for h in history if "val_score" in h), key=lambda h: h["val_score"])["step"]
    config = job.config()
    tokens = step * r["batch_size"] * train.context
    manifest = {
        "name": name, "kind": "model", "drafter": DRAFTERS[name]["kind"], "base": job.base_name,
        "parameters": sum(p.numel() for p in params), "config": config,
        "recipe": {**r, "optimizer": "g2c.training.AdamW (betas 0.9, 0.95, no weight decay)",
                   "schedule": "linear warmup + cosine", "grad_clip": 1.0, "bf16_autocast": job.bf16,
                   "data": data,
                   "weights_kept": "best validation score (val_score), " + (
                       "early stop after `patience` checks" if r["patience"] is not None
                       else "every step of the budget runs"),
                   "stored_dtype": "float16"},
        "steps": step, "best_step": best_step, "tokens_seen": tokens,
        "train_windows": train.num_windows,            # the windows the run read (the split caps the recipe's ask)
        "epochs": round(tokens / (train.num_windows * train.context), 2),
        "val": {k: round(v, 4) for k, v in final.items()},
        "history": history, "wall_time_s": round(wall, 1), "machine": machine(), "commit": git_commit(),
    }
    dest = write_artifact(name, {"model.safetensors": model_state_to_bytes(job.module),
                                 "config.json": (json.dumps(config, indent=2) + "\n").encode()},
                          manifest, root=root, force=True)
    log(f"drafters: {name} best at step {best_step}: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items())
        + f" after {wall / 60:.1f} min -> {dest}")
    return dest
