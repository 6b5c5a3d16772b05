#!/usr/bin/env python3
"""Write docs/models.md (the StoryLM model card) from the shipped manifests.

    python scripts/model_card.py          # reads artifacts/, runs greedy generation, writes docs/models.md

Every number comes from the artifacts' manifest.json files; the continuations are produced
now, greedily (temperature 0), by the shipped float16 weights loaded into float32. The
training curves (docs/img/ladder-curves.png, docs/img/drafter-curves.png) are drawn from the
manifests' validation histories with matplotlib, and the drafter benchmark table is the
file ``bench/specdec.py --out docs/bench/specdec-drafters.md`` wrote (included as is).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import g2c
from g2c.assets.artifacts import artifact_dir, drafter_names, load_model, model_names, verify_artifact
from g2c.course.files import atomic_path, write_text_atomic

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


def drafter_row(name: str, m: dict) -> str:
    """One row of the drafters table from a drafter manifest."""
    v = m["val"]
    if m["drafter"] == "lm":
        score = f"KL {v['val_kl']:.3f} nats, 1 - TV {v['val_accept']:.3f}, data CE {v['val_ce']:.3f}"
    elif m["drafter"] == "mtp":
        score = f"two-ahead loss {v['val_loss']:.3f}"
    elif m["drafter"] == "eagle":
        score = f"SmoothL1 {v['val_reg']:.3f}, CE {v['val_cls']:.3f}"
    else:                                              # the lineage drafters: weighted soft cross-entropy
        score = f"weighted CE {v['val_loss']:.3f}"
    return (f"| {name} | {m['drafter']} | {m['base']} | {m['parameters']:,} | {m['tokens_seen']:,} | "
            f"{equal_budget(name)} | {m['epochs']} | {m['steps']} (best {m['best_step']}) | {score} | {agreement(v)} | "
            f"{m['wall_time_s'] / 60:.1f} min |")


def budget_texts(drafters: dict) -> tuple[str, str, str, str]:
    """The model card's sentences on stopping, training windows, best checks and the one budget, read
    from the drafter manifests (so they stay true when an artifact is replaced)."""
    from g2c.assets.recipes.drafters import EQUAL_BUDGET_TOKENS, STATE_READERS

    readers = [n for n in STATE_READERS if n in drafters]
    others = [n for n in readers if drafters[n]["tokens_seen"] != EQUAL_BUDGET_TOKENS]
    early = [n for n, m in drafters.items() if m["recipe"].get("patience") is not None]
    stopping = (f"{', '.join(early)} stop after 3 checks without improvement; " if early else "") + (
        "the others run every step of their budget." if len(early) < len(drafters) else "")
    windows = [f"{n} {drafters[n]['train_windows']:,}" for n in readers if "train_windows" in drafters[n]]
    windows_text = ("  Training windows read (256 tokens each): " + "; ".join(windows) + "." if windows else "")
    last = [n for n, m in drafters.items() if m["best_step"] == m["steps"]]
    if len(last) == len(drafters):
        best_text = ("Every drafter's best check was its last: validation was still improving, if slowly, when "
                     "each run reached its `steps` (the curves flatten after a few hundred steps for the heads). "
                     "More steps would still help.")
    else:
        best_text = ("Best check at the last step: " + (", ".join(last) or "none") + "; earlier: "
                     + ", ".join(f"{n} (step {drafters[n]['best_step']} of {drafters[n]['steps']})"
                                 for n in drafters if n not in last) + ".")
    if not others:
        one_budget_text = (f"Every shipped drafter that reads StoryLM-30M's states ({', '.join(readers)}) was "
                           f"trained at ONE budget, EAGLE's {EQUAL_BUDGET_TOKENS:,} target tokens (the \"tokens "
                           "seen\" column above), so the table above compares methods, not budgets.")
    else:
        budgets = "a budget" if len(others) == 1 else "budgets"
        one_budget_text = (f"{', '.join(others)} shipped at {budgets} other than EAGLE's {EQUAL_BUDGET_TOKENS:,} "
                           "tokens (the \"tokens seen\" column above), so the table above compares budgets as "
                           "much as methods there.")
    return stopping, windows_text, best_text, one_budget_text


def equal_budget(name: str) -> str:
    """The steps of a retrain at EAGLE's budget (``--budget equal``, issue 29), for the drafters that read
    the target's states; "-" for the others."""
    from g2c.assets.recipes.drafters import EQUAL_BUDGET_TOKENS, STATE_READERS, budgeted_recipe

    if name not in STATE_READERS:
        return "-"
    return f"{budgeted_recipe(name, EQUAL_BUDGET_TOKENS)['steps']} steps"


def agreement(v: dict) -> str:
    """The top-1 agreement, or one per head / unrolled step / block slot ("0.37/0.24/...")."""
    if "val_agree" in v:
        return f"{v['val_agree']:.3f}"
    per = [v[k] for k in sorted((k for k in v if k.startswith("val_agree_")), key=lambda k: int(k.rsplit("_", 1)[1]))]
    return "/".join(f"{a:.2f}" for a in per)


def plot_curves(manifests: dict, drafters: dict) -> None:
    """docs/img/ladder-curves.png and docs/img/drafter-curves.png from the manifests' histories."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img = ROOT / "docs" / "img"
    img.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, m in manifests.items():
        h = m["history"]
        ax.plot([r["step"] for r in h], [r["val_loss"] for r in h], marker="o", label=name)
    ax.set_xlabel("optimizer step (16 x 256 tokens)")
    ax.set_ylabel("validation loss (nats)")
    ax.set_title("StoryLM ladder: validation loss during training")
    ax.legend()
    fig.tight_layout()
    with atomic_path(img / "ladder-curves.png") as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, m in drafters.items():
        key = "val_agree" if "val_agree" in m["history"][-1] else "val_agree_1"     # lineage: first position
        h = [r for r in m["history"] if key in r]
        axes[0].plot([r["step"] for r in h], [r[key] for r in h], marker="o", label=name)
        first = h[0]["val_score"]
        axes[1].plot([r["step"] for r in h], [r["val_score"] / first for r in h], marker="o", label=name)
    axes[0].set_ylabel("val top-1 agreement with the target")
    axes[1].set_ylabel("val training objective / its value at step 0")
    for ax in axes:
        ax.set_xlabel("optimizer step (16 x 256 tokens)")
        ax.legend(fontsize=8)
    fig.suptitle("Drafters: validation during training (best weights kept)")
    fig.tight_layout()
    with atomic_path(img / "drafter-curves.png") as tmp:
        fig.savefig(tmp, dpi=100)
    plt.close(fig)


BUDGETS = ROOT / "docs" / "bench" / "budgets"
MANIFEST_KEYS = ("name", "drafter", "tokens_seen", "epochs", "steps", "recipe", "val", "wall_time_s")


def record_budget(run_root: Path, copy: bool = True) -> Path:
    """Copy the manifests (not the weights) of a budgeted retraining (``runs/budget-<T>/``, from
    ``./checkpoints.sh --train NAME --budget T``) to ``docs/bench/budgets/budget-<T>/`` (same layout:
    ``models/<Name>/manifest.json``), the record the model card's "At one budget" table reads (a
    manifest recorded before under the same name is replaced). ``copy=False`` only checks.

    Raises:
        FileNotFoundError: ``run_root`` is not a folder, or holds no ``models/<Name>/manifest.json``.
        ValueError: ``run_root`` is not named ``budget-<T>`` or ``budget-<T>-<variant>`` (the card's
            tables read the budget from the name), it is the record itself, or a manifest is not a
            training manifest (not JSON, or missing a key the card's table reads: ``MANIFEST_KEYS``;
            ``scripts/agreement_figure.py`` names a manifest without a history when it reads one).
            Nothing is copied unless every manifest passes.
    """
    import re
    import shutil

    run_root = Path(run_root).resolve()
    if not re.fullmatch(r"budget-\d+(-[A-Za-z0-9]+)?", run_root.name):
        raise ValueError(f"{run_root}: not a budgeted run's folder (runs/budget-<T> or runs/budget-<T>-<variant>, "
                         "from ./checkpoints.sh --train NAME --budget T)")
    dest = BUDGETS / run_root.name
    if dest.resolve() == run_root:
        raise ValueError(f"{run_root} is the record itself; record the run's folder (runs/{run_root.name})")
    if not run_root.is_dir():
        raise FileNotFoundError(f"{run_root}: no such folder (./checkpoints.sh --train NAME --budget T installs "
                                "into runs/budget-<T>[-<variant>]/)")
    found = sorted(run_root.glob("models/*/manifest.json"))
    if not found:
        raise FileNotFoundError(f"{run_root}: no models/<Name>/manifest.json (run ./checkpoints.sh --train NAME "
                                "--budget T first)")
    for path in found:                                   # every manifest checked before one is copied
        try:
            m = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not a JSON manifest ({err})") from None
        missing = [k for k in MANIFEST_KEYS if not isinstance(m, dict) or k not in m]
        if missing:
            raise ValueError(f"{path}: not a drafter's training manifest (missing {', '.join(missing)})")
    if not copy:
        return dest
    for path in found:
        (dest / "models" / path.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest / "models" / path.parent.name / "manifest.json")
    return dest


def training_windows(manifest: dict) -> str:
    """The training windows a budgeted run read: the recipe asks for ceil(budget / context) windows
    (``features_windows``), the split caps it (a budget past one epoch re-reads windows). The trainer
    records the windows it read (``train_windows``); manifests older than that state them in the
    recipe's ``data`` line ("the first N train windows")."""
    import re

    if "train_windows" in manifest:
        return str(manifest["train_windows"])
    recipe = manifest.get("recipe", {})
    found = re.search(r"first (\d+) train windows", recipe.get("data", ""))
    return found.group(1) if found else str(recipe.get("features_windows", "-"))


def precision(manifest: dict) -> str:
    """How a run trained: "bf16" (bfloat16 autocast) or "fp32" (float32: a CPU without bfloat16 kernels,
    ``g2c.assets.recipes.ladder.bf16_autocast_is_fast``); manifests from before the choice existed
    trained under bfloat16 autocast."""
    return "fp32" if manifest.get("recipe", {}).get("bf16_autocast") is False else "bf16"


def budget_section() -> str:
    """The "At one budget" tables: one per recorded budget, its drafters' validation agreement."""
    out = []
    budgets = sorted({int(p.name.split("-")[1]) for p in BUDGETS.glob("budget-*")})
    for budget in budgets:             # a variant's tree (budget-<T>-<variant>/) joins its budget's table
        rows = []
        folders = [BUDGETS / f"budget-{budget}"] + sorted(BUDGETS.glob(f"budget-{budget}-*"))
        for path in [p for folder in folders for p in sorted(folder.glob("models/*/manifest.json"))]:
            m = json.loads(path.read_text())
            variant = m["recipe"].get("variant")
            label = m["name"] if variant is None else f"{m['name']}, variant {variant}"
            if variant is None and m["recipe"].get("text", "corpus") != "corpus":   # a recipe's own text
                label += f", text {m['recipe']['text']}"
            rows.append(f"| {label} | {m['drafter']} | {m['tokens_seen']:,} | {m['epochs']} | {m['steps']} | "
                        f"{training_windows(m)} | {agreement(m['val'])} | "
                        f"{m['wall_time_s'] / 60:.1f} min | {precision(m)} |")
        out.append(f"#### budget-{budget} ({budget:,} target tokens each)\n\n"
                   "| drafter | kind | tokens seen | epochs | steps | training windows | agreement | wall time | "
                   "precision |\n"
                   "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    return "\n\n".join(out)


def parse_args(argv):
    import argparse

    parser = argparse.ArgumentParser(
        prog="model_card.py", description="Write docs/models.md (the StoryLM model card) from the shipped manifests, "
        "or record a budgeted retraining's manifests for its 'At one budget' table.")
    parser.add_argument("--record-budget", nargs="+", metavar="RUN_ROOT", type=Path,
                        help="copy the manifests of runs/budget-<T>/ (from ./checkpoints.sh --train NAME --budget T) "
                        "to docs/bench/budgets/budget-<T>/, then stop (run again without it to rewrite the card)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)        # --help, or a bad flag: exit before any work
    if args.record_budget:
        try:
            for run_root in args.record_budget:              # every folder checked before one is copied
                record_budget(run_root, copy=False)
            for run_root in args.record_budget:
                print(f"model_card: recorded {record_budget(run_root)}")
        except (OSError, ValueError) as err:
            print(f"model_card: {err}", file=sys.stderr)
            return 1
        print("model_card: run python scripts/model_card.py (no flags, a few minutes) to rewrite docs/models.md")
        return 0
    os.environ.setdefault("G2C_QUIET", "1")
    g2c.use_solutions(os.environ.get(g2c.course.SOLUTIONS_ENV) or "all")
    tok_manifest = verify_artifact("StoryTokenizer")
    manifests = {name: verify_artifact(name) for name in model_names()}
    drafters = {name: verify_artifact(name) for name in drafter_names()}
    rows = [model_row(name, m) for name, m in manifests.items()]
    samples = [row for name in manifests for row in sample_rows(name)]
    names = model_names() + drafter_names() + ("StoryTokenizer",)
    size_mb = sum(f.stat().st_size for n in names for f in artifact_dir(n).iterdir()) / 2**20
    plot_curves(manifests, drafters)
    bench = ROOT / "docs" / "bench" / "specdec-drafters.md"
    bench_text = (bench.read_text() if bench.is_file()
                  else "(run `python bench/specdec.py --out docs/bench/specdec-drafters.md`)")
    text = render(tok_manifest, manifests, rows, samples, size_mb, drafters, bench_text, budget_section())
    write_text_atomic(ROOT / "docs" / "models.md", text)
    print(text)
    return 0


def size_row(name: str, m: dict) -> str:
    """One row of the sizes table: float16 on disk, float32 once loaded."""
    weights = artifact_dir(name) / "model.safetensors"
    return (f"| {name} | {m['parameters']:,} | {weights.stat().st_size / 2**20:.1f} MiB | "
            f"{m['parameters'] * 4 / 2**20:.1f} MiB |")


def render(tok_manifest: dict, manifests: dict, rows: list[str], samples: list[str], size_mb: float,
           drafters: dict, bench_text: str, budgets: str = "") -> str:
    """The model card's markdown."""
    sizes = [size_row(name, m) for name, m in {**manifests, **drafters}.items()]
    drafter_rows = [drafter_row(name, m) for name, m in drafters.items()]
    stopping_text, windows_text, best_text, one_budget_text = budget_texts(drafters)
    first = next(iter(manifests.values()))
    machine = list(manifests.values())[-1]["machine"]
    return f"""# StoryLM model card

The StoryLM ladder: three GPT-2-shaped `TransformerLM`s (CONVENTIONS §4) that share one
tokenizer, trained by the course's own code on the course's TinyStories training split.
StoryLM-1M and -5M are cheap drafters; StoryLM-30M is the target of the speculative
decoding module. Seven more drafters learned from the ladder ship beside it (see
[Drafters](#drafters)). All model and tokenizer artifacts together take {size_mb:.1f} MiB
(weights stored as float16 safetensors, loaded into float32).

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
drawn uniformly from the training stream, bfloat16 autocast (the recipes use it only on a CPU
with bfloat16 kernels, AVX-512 or ARM BF16, or a CUDA GPU: on an AVX2 CPU torch emulates it tens of
times slower than float32, so a retrain there runs in float32 and says so; each manifest records
`bf16_autocast`), torch's fused attention kernel
(same maths as the course attention, tested equal), validation every 100 steps, weights with
the best validation loss kept. Machine: {machine.replace(" ,", ",")} (the project's 2-core
AMD EPYC VM, no GPU). Each manifest also records the seed, the full validation history and
the code commit.

![validation loss of the ladder during training](img/ladder-curves.png)

Every run's best validation loss came at its last step: the ladder is under-trained, and more
steps would still lower it. It was not trained further in the drafter session (see below):
StoryLM-30M is the target every module's recorded numbers were measured against, and the
CPU budget went to the drafters.

## Drafters

Learned from the ladder by `g2c/assets/recipes/drafters.py` (recipes `DRAFTER_RECIPES`), each on
the frozen base's final states over the training split (`g2c/assets/recipes/features.py`: one
forward pass of the base, 256-token windows). Validation: the first 64 validation windows
during training, the whole validation split for the numbers below; the weights with the best
validation objective are kept; {stopping_text}
"Agreement" is the fraction of validation positions where the drafter's argmax equals the
target's (for MTP: the head's guess for t+2 against the target's own pick there), the
teacher-forced proxy of greedy acceptance; for the lineage drafters one number per head
(Medusa: the token 2, 3, 4, 5 ahead), per unrolled step (EAGLE-3) or per block slot (Block).
"Tokens seen" counts target tokens (steps x batch x 256); "at the equal budget" is the step count of a
retrain at EAGLE's 5,734,400 tokens (`./checkpoints.sh --train NAME --budget equal`, issue 29: every
drafter that reads the target's states, on every training window, all steps run).

| drafter | kind | serves | parameters | tokens seen | at the equal budget | epochs | steps | validation objective \
| agreement | wall time |
|---|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(drafter_rows)}

- **StoryLM-1M-distilled** (`lm`): StoryLM-1M's architecture, started from its weights, trained
  on 0.9 x KL(p_30M || q) + 0.1 x data cross-entropy (forward KL at temperature 1; DistillSpec,
  Zhou et al. 2024). "1 - TV" is the expected acceptance rate of a sampled draft at T = 1.
- **StoryLM-5M-MTP, StoryLM-30M-MTP** (`mtp`): the course's `MTPHead` (one block + the tied
  unembedding) on the frozen base (Gloeckle et al. 2024).
- **StoryLM-30M-EAGLE** (`eagle`): `g2c.specdec.sampling.eagle.FeatureDrafter`: fuse(h_t, emb(x_t+1)) ->
  one block -> predicted h_t+1, decoded by StoryLM-30M's unembedding; loss SmoothL1 + 0.1 x CE
  with U(-0.1, 0.1) input noise (Li et al., EAGLE, ICML 2024, §4).
- **StoryLM-30M-Medusa** (`medusa`, module specdec-lineage): four `MedusaHeads` (a residual SiLU
  block each, then StoryLM-30M's tied unembedding) on the frozen final state, distilled towards
  the target's own distributions, head i weighted 0.8^(i-1) (Cai et al., Medusa, ICML 2024, §2).
- **StoryLM-30M-EAGLE3** (`eagle3`): `Eagle3Head`: blocks 2, 4, 6 of StoryLM-30M fused by a linear
  layer, one causal block, trained on tokens only with a 3-step training-time test (EAGLE-3, 2025).
- **StoryLM-30M-Block** (`block`): `BlockHead`: 8 fused context rows + the anchor + 8 mask slots,
  two blocks, one pass per block; random anchors, slot j weighted exp(-(j-1)/4) (after DFlash, 2026).
  It learns from the target's own text: each training window keeps its first 32 corpus tokens and
  the other 224 are StoryLM-30M's greedy continuation (self-distillation, as Medusa-2 section 2.3.2
  and DFlash train), so its agreement is on that text's validation windows, not the corpus (on the
  corpus its slot 1 agrees 0.59; the lineage lesson compares both).
{windows_text}

{best_text}

`load_model("StoryLM-30M-EAGLE")` returns the head with its base loaded (`head.base`).

![drafters: validation during training](img/drafter-curves.png)

### At one budget

{one_budget_text} The tables below retrain every drafter that
reads the target's states at ONE budget (`./checkpoints.sh --train NAME --budget T`: all steps
run, the same first T / 256 training windows for every drafter, one feature pass; MTP and EAGLE
read only the final states of that cache); `python scripts/model_card.py --record-budget
runs/budget-<T>` records their manifests in `docs/bench/budgets/`, and the card, rewritten by
`python scripts/model_card.py`, tables them here. Agreement as above (EAGLE: one number, its first
draft step; EAGLE-3: per unrolled step; Medusa: per head; Block: per slot). A row "variant V" is a
paper design or an ablation trained at the same budget (`--variant V`, issue 29; the lineage
lesson's "The paper designs and the ablations"): Block kv injects the features into every draft
layer's keys and values (DFlash), on the corpus; Block rows with no variant and no text learned
from the corpus (the recipe until the shipped block drafter became self-distilled; `--variant
corpus` now reproduces them), a row "text greedy" from the shipped recipe's text; every "self" row
(Block, Medusa, EAGLE, EAGLE3) learns from the target's own greedy continuation of each window
after its first 32 tokens (self-distillation, the shipped block drafter's text), Block mixed from
the same after 32 to 224 corpus tokens in turn (their agreement is on that text's validation
windows, not the corpus: the lesson compares them on both); EAGLE3 ttt1 / ttt7 unroll 1 / 7
training-time-test steps (the recipe: 3); EAGLE tokens reads zeros instead of the target's
features. "Precision" is how the run trained: bf16 (bfloat16 autocast, on a 2-core AVX-512 VM) or
fp32 (a 2-core AVX2 VM, where bfloat16 autocast would have been about 50 times slower); wall times
are comparable only within one precision.

{budgets or "(no budgeted retraining recorded yet)"}

### Measured against StoryLM-30M

{bench_text.strip()}

## Greedy continuations

Greedy (temperature 0), {NEW_TOKENS} new tokens at most, stopping at `<|endoftext|>`; ⏎ marks a newline.

| model | prompt + continuation |
|---|---|
{chr(10).join(samples)}

## Reproduce

```bash
./setup.sh
./datasets.sh                             # the shipped TinyStories sample, offline
./checkpoints.sh --train --force          # tokenizer, StoryLM-1M, -5M, -30M, then the drafters
python bench/specdec.py --out docs/bench/specdec-drafters.md   # the drafter table
python scripts/model_card.py              # rewrites this page
./checkpoints.sh                          # verifies every artifact (sha256)
```

Training resumes from `runs/<Name>/trainer.pt` (drafters: `runs/<Name>/drafter.pt`; the base's
stored states are reused from `runs/features/`) if interrupted (drop `--force` to keep a
verified artifact). With a GPU the same command runs on CUDA (`device="auto"`).
"""


if __name__ == "__main__":
    sys.exit(main())
