"""The course map: one ordered registry of modules.

This is the single source of truth for module ids, titles, the files each module owns,
its lesson and its notebook. Solution selection (``G2C_APPLY_SOLUTIONS``), the notebook
launcher, the scaffold generator and checks all read it.

Every path is relative to the repository root. A file is owned by exactly one module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
SOLUTIONS_ROOT = REPO_ROOT / "solutions"
# The student's switch: which modules load the answer key instead of the scaffolds.
SOLUTIONS_ENV = "G2C_APPLY_SOLUTIONS"


@dataclass(frozen=True)
class CourseModule:
    """One course module.

    Attributes:
        id: short id such as ``"03"``, ``"03b"`` or ``"specdec"``.
        title: human title.
        files: repo-relative paths of the ``g2c/`` files the module owns.
        lesson: repo-relative path of the lesson (markdown).
        notebook: repo-relative path of the clean notebook.
        tests: repo-relative paths of the test files that own the module's contract
            (``tests/test_<slug>.py`` for the numbered modules).
    """

    id: str
    title: str
    files: tuple[str, ...]
    lesson: str
    notebook: str
    tests: tuple[str, ...] = ()

    @property
    def number(self) -> int | None:
        """The numeric part of the id (``"03b"`` -> 3), or None for ids like ``specdec``."""
        m = re.match(r"^(\d+)", self.id)
        return int(m.group(1)) if m else None

    @property
    def slug(self) -> str:
        """The notebook's file stem without the id, e.g. ``"nn"``."""
        return Path(self.notebook).stem.split("-", 1)[1]


def _m(id: str, title: str, files: list[str], slug: str, lesson_dir: str = "modules",
       tests: list[str] | None = None) -> CourseModule:
    return CourseModule(
        id=id,
        title=title,
        files=tuple(files),
        lesson=(f"docs/{lesson_dir}/{id}-{slug}.md" if lesson_dir == "modules"
                else f"docs/{lesson_dir}/{slug}.md"),
        notebook=f"notebooks/clean/{id}-{slug}.ipynb",
        tests=tuple(tests) if tests else (f"tests/test_{slug.replace('-', '_')}.py",),
    )


MODULES: tuple[CourseModule, ...] = (
    _m("03", "Neural-network building blocks",
       ["g2c/nn/__init__.py", "g2c/nn/module.py", "g2c/nn/layers.py", "g2c/nn/device.py",
        "g2c/nn/timing.py"], "nn"),
    _m("03b", "Training controls: AdamW, gradient clipping, warmup + cosine",
       ["g2c/training/__init__.py", "g2c/training/adamw.py", "g2c/training/clip.py",
        "g2c/training/schedule.py"], "training"),
    _m("04", "Byte-level BPE tokenizer",
       ["g2c/tokenizer/__init__.py", "g2c/tokenizer/bpe.py"], "tokenizer"),
    _m("05", "Token embeddings and learned positions",
       ["g2c/embeddings/__init__.py", "g2c/embeddings/embeddings.py"], "embeddings"),
    _m("06", "Next-token prediction: cross-entropy and perplexity",
       ["g2c/lm/__init__.py", "g2c/lm/loss.py"], "lm"),
    _m("07", "Causal self-attention",
       ["g2c/attention/__init__.py", "g2c/attention/causal.py"], "causal-attention"),
    _m("08", "Multi-head attention",
       ["g2c/attention/multihead.py"], "multihead-attention"),
    _m("09", "Transformer block and TransformerLM",
       ["g2c/transformer/__init__.py", "g2c/transformer/block.py", "g2c/transformer/model.py",
        "g2c/transformer/config.py", "g2c/transformer/export.py"], "transformer"),
    _m("09b", "Pretraining objective: batches, loss, stream splits",
       ["g2c/pretraining/__init__.py", "g2c/pretraining/objective.py"], "pretraining"),
    _m("10", "The trainer loop and checkpoints",
       ["g2c/pretraining/trainer.py"], "trainer"),
    _m("11", "Sampling: temperature, top-k, top-p, repetition penalty, generate",
       ["g2c/sampling/__init__.py", "g2c/sampling/model.py", "g2c/sampling/warpers.py",
        "g2c/sampling/generate.py"], "sampling"),
    _m("16", "KV cache and incremental decoding",
       ["g2c/kvcache/__init__.py", "g2c/kvcache/cache.py", "g2c/kvcache/forward.py", "g2c/kvcache/generate.py",
        "g2c/kvcache/ragged.py", "g2c/kvcache/speculative.py", "g2c/kvcache/fast.py"], "kv-cache",
       tests=["tests/test_kvcache.py", "tests/test_kvcache_ragged.py", "tests/test_kvcache_speculative.py",
              "tests/test_kvcache_fast.py"]),
    CourseModule(
        id="specdec",
        title="Beyond: speculative decoding and multi-token prediction",
        files=("g2c/specdec/__init__.py", "g2c/specdec/verify.py", "g2c/specdec/generate.py",
               "g2c/specdec/mtp.py", "g2c/specdec/__main__.py"),
        lesson="docs/beyond/specdec.md",
        notebook="notebooks/clean/specdec-draft-and-verify.ipynb",
        tests=("tests/test_specdec.py", "tests/test_specdec_properties.py", "tests/test_specdec_mtp.py",
               "tests/test_specdec_cli.py"),
    ),
    CourseModule(
        id="specdec-sampling",
        title="Beyond: the sampled speculative loop, drafters and dynamic k",
        files=("g2c/specdec/drafters.py", "g2c/specdec/loop.py", "g2c/specdec/controllers.py",
               "g2c/specdec/eagle.py"),
        lesson="docs/beyond/specdec-sampling.md",
        notebook="notebooks/clean/specdec-sampling-loop.ipynb",
        tests=("tests/test_specdec_sampling.py", "tests/test_specdec_sampling_cached.py",
               "tests/test_specdec_eagle.py"),
    ),
    CourseModule(
        id="specdec-trees",
        title="Beyond: tree drafts and tree verification",
        files=("g2c/specdec/trees.py", "g2c/specdec/tree_attention.py", "g2c/specdec/tree_verify.py"),
        lesson="docs/beyond/specdec-trees.md",
        notebook="notebooks/clean/specdec-trees-draft-trees.ipynb",
        tests=("tests/test_specdec_trees.py",),
    ),
    CourseModule(
        id="specdec-lab",
        title="Beyond: the speculative-decoding calculator, Be the Verifier, and the serving lab",
        files=("g2c/specdec/theory.py", "g2c/specdec/simulate.py", "g2c/specdec/batched.py"),
        lesson="docs/beyond/specdec-lab.md",
        notebook="notebooks/clean/specdec-lab-verifier.ipynb",
        tests=("tests/test_specdec_lab.py", "tests/test_bench_serving_lab.py"),
    ),
    CourseModule(
        id="specdec-state",
        title="Beyond: recurrent state under speculation",
        files=("g2c/recurrent/__init__.py", "g2c/recurrent/scan.py", "g2c/recurrent/model.py",
               "g2c/recurrent/transaction.py", "g2c/recurrent/snapshot.py", "g2c/recurrent/replay.py",
               "g2c/recurrent/recompute.py", "g2c/recurrent/generate.py"),
        lesson="docs/beyond/specdec-state.md",
        notebook="notebooks/clean/specdec-state-transactions.ipynb",
        tests=("tests/test_specdec_state.py",),
    ),
)


def module_ids() -> list[str]:
    """All module ids in course order."""
    return [m.id for m in MODULES]


def get_module(module_id: str) -> CourseModule:
    """Look up a module by id (case-insensitive).

    Raises:
        ValueError: the id is not in the registry; the message lists the valid ids.
    """
    for m in MODULES:
        if m.id == module_id.strip().lower():
            return m
    raise ValueError(f"unknown course module id {module_id!r}; valid ids: {', '.join(module_ids())}")


def module_for_file(path: str) -> CourseModule | None:
    """The module that owns a repo-relative ``g2c/...`` path, or None."""
    path = path.replace("\\", "/")
    for m in MODULES:
        if path in m.files:
            return m
    return None


def parse_selection(spec: str | None) -> list[str]:
    """Parse a ``G2C_APPLY_SOLUTIONS`` selector into module ids (course order).

    Grammar (whitespace ignored):
        ``""`` or ``"0"``        -> no modules
        ``"all"`` or ``"1"``     -> every module
        ``"09,11,specdec"``      -> a comma list of ids and/or ranges
        ``"01-11"``              -> every id whose leading number n satisfies 1 <= n <= 11
                                    (lettered ids such as 03b and 09b included; the ends
                                    need not be registry ids themselves)

    Raises:
        ValueError: an item is neither a known id nor a numeric range; the message lists
            the valid ids and the grammar.
    """
    spec = (spec or "").strip().lower()
    if spec in ("", "0"):
        return []
    if spec in ("all", "1"):
        return module_ids()
    chosen: set[str] = set()
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        rng = re.fullmatch(r"(\d+)\s*-\s*(\d+)", item)
        if rng:
            lo, hi = int(rng.group(1)), int(rng.group(2))
            if lo > hi:
                raise ValueError(f"G2C_APPLY_SOLUTIONS: empty range {item!r} (start > end)")
            chosen.update(m.id for m in MODULES if m.number is not None and lo <= m.number <= hi)
            continue
        if item in module_ids():
            chosen.add(item)
            continue
        raise ValueError(
            f"G2C_APPLY_SOLUTIONS: unknown module id {item!r}. Valid ids: {', '.join(module_ids())}. "
            "Use 'all', a comma list such as '09,11,specdec', or a range such as '01-11'."
        )
    return [i for i in module_ids() if i in chosen]


def prerequisites(module_id: str) -> list[str]:
    """The ids of every module before ``module_id`` in course order (what it builds on).

    Raises:
        ValueError: unknown id (the message lists the valid ids).
    """
    ids = module_ids()
    return ids[:ids.index(get_module(module_id).id)]


def prerequisites_selector(module_id: str) -> str:
    """The shortest ``G2C_APPLY_SOLUTIONS`` value that selects exactly the modules before ``module_id``.

    It applies the reference solutions of everything the module builds on and keeps the
    student's own code for the module itself: ``"01-11"`` for specdec, ``"01-10"`` for 11,
    ``"03"`` for 03b, ``"01-08,09"`` for 09b (a range would include 09b itself), ``""`` for 03.

    Raises:
        ValueError: unknown id.
    """
    wanted = prerequisites(module_id)
    best = ",".join(wanted)
    numbers = sorted({m.number for m in MODULES if m.number is not None})
    for hi in numbers:
        covered = parse_selection(f"01-{hi:02d}")
        if not set(covered) <= set(wanted):
            break
        rest = [i for i in wanted if i not in covered]
        candidate = ",".join([f"01-{hi:02d}", *rest])
        if len(candidate) <= len(best):
            best = candidate
    assert parse_selection(best) == wanted, (module_id, best)
    return best
