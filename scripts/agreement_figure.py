#!/usr/bin/env python3
r"""Validation agreement against target tokens seen, one line per drafter and budget.

    python scripts/agreement_figure.py           # the shipped drafters -> runs/agreement-vs-tokens.png
    python scripts/agreement_figure.py --out docs/img/agreement-vs-tokens.png   # the lesson's figure
    python scripts/agreement_figure.py --root runs/budget-5734400 --out runs/agreement.png
                                                               # plus the drafters of a budgeted retrain
    python scripts/agreement_figure.py --only StoryLM-30M-EAGLE --only StoryLM-30M-EAGLE3 \
        --root docs/bench/budgets/budget-512000 --root docs/bench/budgets/budget-1000000 \
        --root docs/bench/budgets/budget-1500000 --out runs/eagle.png
                                                               # EAGLE against EAGLE-3 over the recorded budgets

Reads the training histories the recipes log at every validation check (``manifest.json`` of each
drafter under ``artifacts/`` and under every ``--root``; a run still in progress: ``--run
runs/<Name>-budget<T>/drafter.pt``). Tokens seen at a check = step x batch_size x context (256
unless the recipe says otherwise). Agreement is the first position's: ``val_agree`` (EAGLE, MTP, the
distilled LM) or ``val_agree_1`` (Medusa's head 1, EAGLE-3's step 1, the block drafter's slot 1);
``--position k`` plots the k-th (heads, unrolled steps, slots) where a drafter has one.

EAGLE-3's claim is about how a drafter scales with data: the figure shows each curve over the tokens
it saw, whichever way it comes out; compare drafters at the same x.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE_READERS = ("StoryLM-30M-MTP", "StoryLM-30M-EAGLE", "StoryLM-30M-Medusa", "StoryLM-30M-EAGLE3",
                 "StoryLM-30M-Block")


def agreement_key(entry: dict, position: int) -> str | None:
    """The history key of the agreement at ``position`` (1-based), or None."""
    if f"val_agree_{position}" in entry:
        return f"val_agree_{position}"
    if position == 1 and "val_agree" in entry:
        return "val_agree"
    return None


def curve(history: list[dict], recipe: dict, position: int) -> list[tuple[int, float]]:
    """[(tokens seen, agreement)] of one training history."""
    per_step = recipe["batch_size"] * recipe.get("context", 256)
    points = []
    for h in history:
        key = agreement_key(h, position)
        if key is not None:
            points.append((h.get("tokens_seen", h["step"] * per_step), h[key]))
    return points


def collect(roots: list[Path], runs: list[Path], position: int, names: tuple[str, ...] = STATE_READERS,
            only: bool = False) -> dict[str, list[tuple[int, float]]]:
    """label -> curve, from the manifests under each root (models/<Name>/manifest.json) and run checkpoints
    (every run, or with ``only`` those of ``names``: ``--only``).

    Raises:
        ValueError: a manifest or checkpoint that is not a training record with a history (named)."""
    curves = {}
    for root in roots:
        for name in names:
            path = root / "models" / name / "manifest.json"
            if path.is_file():
                try:
                    m = json.loads(path.read_text())
                    points = curve(m["history"], m["recipe"], position)
                except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
                    raise ValueError(f"{path}: not a training manifest with a history ({type(err).__name__}: "
                                     f"{err})") from None
                label = name if root == ROOT / "artifacts" else f"{name} ({root.name})"
                curves[label] = points
    for run in runs:
        import torch

        from g2c.assets.recipes.drafters import DRAFTER_RECIPES

        if not run.is_file():
            raise ValueError(f"{run}: not a file (give the run's drafter.pt)")
        name = run.parent.name.split("-budget")[0]
        if name not in DRAFTER_RECIPES:
            raise ValueError(f"{run}: cannot tell which drafter it trains: a run's folder is runs/<Name> or "
                             f"runs/<Name>-budget<T> (Name one of {', '.join(sorted(DRAFTER_RECIPES))})")
        if only and name not in names:                             # --only filters the runs too
            continue
        try:
            history = torch.load(run, map_location="cpu", weights_only=False)["history"]
            points = curve(history, DRAFTER_RECIPES[name], position)
        except Exception as err:                                   # a pickle of anything can fail any way
            raise ValueError(f"{run}: not a drafter checkpoint with a history ({type(err).__name__})") from None
        curves[f"{run.parent.name} (in progress)"] = points
    return {k: v for k, v in curves.items() if v}


def label_order(label: str) -> tuple[str, float]:
    """(drafter name, budget in tokens) of a curve's label: ``"NAME (budget-<T>[-variant])"`` -> (NAME, T);
    a shipped drafter (no root in its label) sorts last, as budget infinity."""
    name, _, root = label.partition(" (")
    digits = root.removeprefix("budget-").split("-")[0].rstrip(")")
    return name, float(digits) if digits.isdigit() else float("inf")


def main(argv=None) -> int:
    from g2c.assets.cli import count, output_file

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, action="append", default=[],
                    help="an artifacts-like tree (runs/budget-<T>) whose drafters to add; repeatable")
    ap.add_argument("--run", type=Path, action="append", default=[], help="a run's drafter.pt (in progress)")
    ap.add_argument("--no-shipped", action="store_true", help="leave out the shipped drafters (artifacts/)")
    ap.add_argument("--position", type=count(1), default=1, help="draft position (head / step / slot), default 1")
    ap.add_argument("--only", action="append", default=[], metavar="NAME", choices=STATE_READERS,
                    help="plot only this drafter (repeatable; default: every state reader)")
    ap.add_argument("--out", type=output_file(as_path=True), default=ROOT / "runs" / "agreement-vs-tokens.png",
                    help="the PNG to write (default runs/agreement-vs-tokens.png, outside git; the lesson's "
                    "figures are written with --out docs/img/...)")
    args = ap.parse_args(argv)
    roots = ([] if args.no_shipped else [ROOT / "artifacts"]) + args.root
    missing = [str(p) for p in [*args.root, *args.run] if not p.exists()]
    if missing:
        print(f"agreement_figure.py: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 1
    names = tuple(args.only) or STATE_READERS
    empty = [str(r) for r in args.root if not any((r / "models" / n / "manifest.json").is_file() for n in names)]
    if empty:
        print(f"agreement_figure.py: no drafter's manifest (models/<Name>/manifest.json, Name one of "
              f"{', '.join(names)}) under {', '.join(empty)}", file=sys.stderr)
        return 1
    if args.out.suffix.lower() != ".png":
        print(f"agreement_figure.py: --out writes a PNG: give a .png name, got {args.out}", file=sys.stderr)
        return 2
    try:
        curves = collect(roots, args.run, args.position, names, bool(args.only))
        lower = collect(roots, args.run, 1, names, bool(args.only)) if args.position > 1 else curves
    except ValueError as err:
        print(f"agreement_figure.py: {err}", file=sys.stderr)
        return 1
    if args.position > 1:                       # a drafter with one position (EAGLE, MTP) has no curve here
        left_out = sorted(set(lower) - set(curves))
        if curves and left_out:
            print(f"agreement_figure.py: left out (no position {args.position}): {', '.join(left_out)}",
                  file=sys.stderr)
        elif left_out:
            print(f"agreement_figure.py: no drafter here has a position {args.position} (found with position 1: "
                  f"{', '.join(left_out)}); try a smaller --position", file=sys.stderr)
            return 1
    if not curves:
        print("agreement_figure.py: no training history found (train a drafter, or drop --no-shipped)",
              file=sys.stderr)
        return 1
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    order = {label: label_order(label) for label in curves}            # label -> (drafter, budget)
    drafters = sorted({name for name, _ in order.values()})            # one colour per drafter,
    budgets = {name: sorted({b for n, b in order.values() if n == name}) for name in drafters}
    styles = ["--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3))]   # one per budget root;
    for label, points in sorted(curves.items(), key=lambda item: order[item[0]]):     # the shipped: solid, wide
        xs, ys = zip(*points)
        name, budget = order[label]
        shipped = " (" not in label                               # artifacts/: no root, no run in its label
        rank = budgets[name].index(budget)
        ax.plot(xs, ys, marker="o", ms=3, label=label, color=f"C{drafters.index(name) % 10}",
                linestyle="-" if shipped else styles[rank % len(styles)], linewidth=2.4 if shipped else 1.3,
                alpha=1.0 if shipped else 0.85)
        print(f"{label}: {len(points)} checks, last at {xs[-1]:,} tokens: agreement {ys[-1]:.3f}")
    ax.set_xscale("symlog", linthresh=1e5)
    ax.set_xlabel("target tokens seen in training")
    ax.set_ylabel(f"validation top-1 agreement (position {args.position})")
    ax.set_title("Drafter agreement against training budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    from g2c.course.files import atomic_path

    try:                                        # all or nothing: a failed write leaves the old figure
        with atomic_path(args.out) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
    except OSError as err:
        blocker = next((p for p in args.out.parents if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file, not a folder" if blocker is not None else (err.strerror or str(err))
        print(f"agreement_figure.py: cannot write {args.out}: {why}", file=sys.stderr)
        return 1
    finally:
        plt.close(fig)
    print(f"figure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
