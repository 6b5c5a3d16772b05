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
        requires: ids of the modules whose exercise code this one runs (its lesson's "Before you
            start"), each earlier in the registry. What a module needs is the transitive closure
            (``prerequisites``), computed, never typed; a tooling test runs every module's tests
            with exactly that closure solved.
    """

    id: str
    title: str
    files: tuple[str, ...]
    lesson: str
    notebook: str
    tests: tuple[str, ...] = ()
    requires: tuple[str, ...] = ()

    @property
    def number(self) -> int | None:
        """The numeric part of the id (``"03b"`` -> 3), or None for ids like ``specdec``."""
        m = re.match(r"^(\d+)", self.id)
        return int(m.group(1)) if m else None

    @property
    def beyond(self) -> bool:
        """A Beyond module (no number): outside the numbered course, nothing numbered imports it."""
        return self.number is None

    @property
    def slug(self) -> str:
        """The notebook's file stem without the id, e.g. ``"nn"``."""
        return Path(self.notebook).stem.split("-", 1)[1]


def _m(id: str, title: str, files: list[str], slug: str, requires: list[str], *,
       tests: list[str] | None = None) -> CourseModule:
    """A numbered module: lesson ``docs/modules/<id>-<slug>.md``, notebook ``notebooks/clean/<id>-<slug>.ipynb``."""
    return CourseModule(
        id=id,
        title=title,
        files=tuple(files),
        lesson=f"docs/modules/{id}-{slug}.md",
        notebook=f"notebooks/clean/{id}-{slug}.ipynb",
        tests=tuple(tests) if tests else (f"tests/test_{slug.replace('-', '_')}.py",),
        requires=tuple(requires),
    )


def _beyond(id: str, title: str, package: str, names: list[str], notebook_slug: str, requires: list[str], *,
            tests: list[str]) -> CourseModule:
    """A Beyond module after the seed's: it owns one folder, ``package`` (every ``names`` file in it)."""
    return CourseModule(
        id=id,
        title=title,
        files=tuple(f"{package}/{n}.py" for n in names),
        lesson=f"docs/beyond/{id}.md",
        notebook=f"notebooks/clean/{id}-{notebook_slug}.ipynb",
        tests=tuple(tests),
        requires=tuple(requires),
    )


MODULES: tuple[CourseModule, ...] = (
    _m("03", "Neural-network building blocks",
       ["g2c/nn/__init__.py", "g2c/nn/module.py", "g2c/nn/layers.py", "g2c/nn/device.py",
        "g2c/nn/timing.py"], "nn", []),
    _m("03b", "Training controls: AdamW, gradient clipping, warmup + cosine",
       ["g2c/training/__init__.py", "g2c/training/adamw.py", "g2c/training/clip.py",
        "g2c/training/schedule.py"], "training", []),
    _m("04", "Byte-level BPE tokenizer",
       ["g2c/tokenizer/__init__.py", "g2c/tokenizer/bpe.py"], "tokenizer", []),
    _m("05", "Token embeddings and learned positions",
       ["g2c/embeddings/__init__.py", "g2c/embeddings/embeddings.py"], "embeddings", ["03"]),
    _m("06", "Next-token prediction: cross-entropy and perplexity",
       ["g2c/lm/__init__.py", "g2c/lm/loss.py"], "lm", ["04"]),
    _m("07", "Causal self-attention",
       ["g2c/attention/__init__.py", "g2c/attention/causal.py"], "causal-attention", ["03"]),
    _m("08", "Multi-head attention",
       ["g2c/attention/multihead.py"], "multihead-attention", ["07"]),
    _m("09", "Transformer block and TransformerLM",
       ["g2c/transformer/__init__.py", "g2c/transformer/block.py", "g2c/transformer/model.py",
        "g2c/transformer/config.py", "g2c/transformer/export.py"], "transformer", ["05", "08"]),
    _m("09b", "Pretraining objective: batches, loss, stream splits",
       ["g2c/pretraining/__init__.py", "g2c/pretraining/objective.py"], "pretraining", ["06", "09"]),
    _m("10", "The trainer loop and checkpoints",
       ["g2c/pretraining/trainer.py"], "trainer", ["03b", "09b"]),
    _m("11", "Sampling: temperature, top-k, top-p, repetition penalty, generate",
       ["g2c/sampling/__init__.py", "g2c/sampling/model.py", "g2c/sampling/warpers.py",
        "g2c/sampling/generate.py"], "sampling", ["04", "09"]),
    _m("16", "KV cache and incremental decoding",
       ["g2c/kvcache/__init__.py", "g2c/kvcache/cache.py", "g2c/kvcache/forward.py", "g2c/kvcache/generate.py",
        "g2c/kvcache/ragged.py", "g2c/kvcache/fast.py", "g2c/kvcache/step.py"], "kv-cache", ["11"],
       tests=["tests/test_kvcache.py", "tests/test_kvcache_ragged.py", "tests/test_kvcache_fast.py",
              "tests/test_kvcache_step.py"]),
    # The seed's Beyond module keeps the seed's files where the seed puts them (g2c/specdec/*.py);
    # theory.py (the speed-up law every later Beyond module uses) sits with them.
    CourseModule(
        id="specdec",
        title="Beyond: speculative decoding and multi-token prediction",
        files=("g2c/specdec/__init__.py", "g2c/specdec/verify.py", "g2c/specdec/generate.py",
               "g2c/specdec/mtp.py", "g2c/specdec/theory.py", "g2c/specdec/__main__.py"),
        lesson="docs/beyond/specdec.md",
        notebook="notebooks/clean/specdec-draft-and-verify.ipynb",
        tests=("tests/test_specdec.py", "tests/test_specdec_properties.py", "tests/test_specdec_mtp.py"),
        requires=("03b", "09", "11"),
    ),
    _beyond("specdec-sampling", "Beyond: the sampled speculative loop, drafters and dynamic k",
            "g2c/specdec/sampling", ["__init__", "cached", "controllers", "controls", "draft", "drafters", "eagle",
                                     "target", "loop"],
            "loop", ["16", "specdec"],
            tests=["tests/test_specdec_cached.py", "tests/test_specdec_sampling.py",
                   "tests/test_specdec_sampling_cached.py", "tests/test_specdec_eagle.py",
                   "tests/test_specdec_cli.py", "tests/test_specdec_controls.py"]),
    _beyond("specdec-trees", "Beyond: tree drafts and tree verification",
            "g2c/specdec/trees", ["__init__", "tree", "attention", "builders", "verify"],
            "draft-trees", ["16", "specdec", "specdec-sampling"], tests=["tests/test_specdec_trees.py"]),
    _beyond("specdec-lab", "Beyond: the speculative-decoding calculator, Be the Verifier, and the serving lab",
            "g2c/specdec/lab", ["__init__", "simulate", "batched"], "verifier", ["16", "specdec"],
            tests=["tests/test_specdec_lab.py", "tests/test_bench_serving_lab.py"]),
    _beyond("specdec-state", "Beyond: recurrent state under speculation",
            "g2c/recurrent", ["__init__", "scan", "model", "transaction", "snapshot", "replay", "recompute",
                              "generate"], "transactions", ["16", "specdec", "specdec-sampling"],
            tests=["tests/test_specdec_state.py"]),
    _beyond("specdec-lineage", "Beyond: the draft lineage (Medusa, EAGLE-2, EAGLE-3, block drafting)",
            "g2c/specdec/lineage", ["__init__", "protocol", "loop", "medusa", "eagle2", "eagle3", "block"],
            "draft-lineage", ["16", "specdec", "specdec-sampling", "specdec-trees", "specdec-state"],
            tests=["tests/test_specdec_lineage.py", "tests/test_bench_lineage.py", "tests/test_specdec_engine.py",
                   "tests/test_specdec_fast_heads.py"]),
    CourseModule(
        id='specdec-serving',
        title='Beyond: speculation under load and under a grammar',
        files=('g2c/specdec/serving/__init__.py', 'g2c/specdec/serving/regex.py', 'g2c/specdec/serving/constrain.py',
               'g2c/specdec/serving/metrics.py', 'g2c/specdec/serving/controller.py',
               'g2c/specdec/serving/batched.py'),
        lesson='docs/beyond/specdec-serving.md',
        notebook='notebooks/clean/specdec-serving-load-and-grammar.ipynb',
        tests=('tests/test_specdec_serving.py', 'tests/test_specdec_serving_batched.py'),
        requires=('16', 'specdec', 'specdec-sampling', 'specdec-lab',),
    ),
)


def module_ids() -> list[str]:
    """All module ids in course order."""
    return [m.id for m in MODULES]


def get_module(module_id: str) -> CourseModule:
    """Look up a module by id (case-insensitive; a one-digit number is zero-padded: ``"6"`` is ``"06"``,
    ``"9b"`` is ``"09b"``).

    Raises:
        ValueError: the id is not in the registry; the message lists the valid ids.
    """
    wanted = str(module_id).strip().lower()
    padded = "0" + wanted if re.fullmatch(r"[0-9][a-z]?", wanted) else wanted   # "6" is 06, "9b" is 09b
    for m in MODULES:
        if m.id in (wanted, padded):
            return m
    raise ValueError(f"unknown course module id {module_id!r}{did_you_mean(wanted, module_ids())}; "
                     f"valid ids: {', '.join(module_ids())}")


def did_you_mean(text: str, known) -> str:
    """``" (did you mean 'specdec-lineage'?)"`` naming the known name closest to a mistyped one
    (case-insensitive; difflib's similarity ratio at least 0.6, and every name within 0.05 of the best
    when several tie), or ``""`` when none is close. A name whose last (or first) dash-separated part is
    the text comes first (``"EAGLE"`` -> ``'StoryLM-30M-EAGLE'``); an empty or one-character text is never
    matched by similarity alone."""
    import difflib

    lowered = {str(k).lower(): str(k) for k in known}
    text = str(text).strip().lower()
    if not text:
        return ""
    parts = [k for k in lowered if k.endswith("-" + text) or k.startswith(text + "-")]   # EAGLE: StoryLM-30M-EAGLE
    if parts and len(parts) <= 3:
        return f" (did you mean {' or '.join(repr(lowered[k]) for k in parts)}?)"
    if len(text) < 2:                              # one character is close to too many names
        return ""
    scored = sorted(((difflib.SequenceMatcher(None, text, k).ratio(), k) for k in lowered), reverse=True)
    if not scored or scored[0][0] < 0.6:
        return ""
    close = [k for r, k in scored[:3] if r >= scored[0][0] - 0.05]
    return f" (did you mean {' or '.join(repr(lowered[k]) for k in close)}?)"


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
        ``"all"`` or ``"1"``     -> every module (``all`` may also be an item of a list: ``all,``)
        ``"09,11,specdec"``      -> a comma list of ids and/or ranges
        ``"01-11"``              -> every id whose leading number n satisfies 1 <= n <= 11
                                    (lettered ids such as 03b and 09b included; the ends
                                    need not be registry ids themselves)

    Raises:
        ValueError: an item is neither a known id, ``all`` nor a numeric range; a range that runs
            backwards; ``1`` inside a list; the message lists the valid ids and the grammar. (A range
            between modules, ``12-15``, selects none: the ends need not be ids.)
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
        if item == "all":                     # 'all,' or 'all,09': every module (an item of a list too)
            chosen.update(module_ids())
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
        if item == "1":
            raise ValueError("G2C_APPLY_SOLUTIONS: '1' means every module only on its own; in a list, name the "
                             f"modules (valid ids: {', '.join(module_ids())}) or use 'all'")
        raise ValueError(
            f"G2C_APPLY_SOLUTIONS: unknown module id {item!r}. Valid ids: {', '.join(module_ids())}. "
            "Use 'all', a comma list such as '09,11,specdec', or a range such as '01-11'."
        )
    return [i for i in module_ids() if i in chosen]


def prerequisites(module_id: str) -> list[str]:
    """The ids of every module ``module_id`` builds on: the transitive closure of ``requires``, in course order.

    This is what grading applies the answer key to (minus the modules the student edited), and
    what the module's tests and notebook may use besides the module itself.

    Raises:
        ValueError: unknown id (the message lists the valid ids).
    """
    seen: set[str] = set()
    todo = list(get_module(module_id).requires)
    while todo:
        i = todo.pop()
        if i not in seen:
            seen.add(i)
            todo.extend(get_module(i).requires)
    return [i for i in module_ids() if i in seen]


def dependents(module_id: str) -> list[str]:
    """The ids of every module that builds on ``module_id`` (directly or not), in course order."""
    target = get_module(module_id).id
    return [m.id for m in MODULES if target in prerequisites(m.id)]


def grading_selection(module_id: str, worked: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The modules whose answer key grading ``module_id`` applies: its prerequisites the student has not edited.

    Never the graded module, never a module in ``worked`` (the student's own code stays theirs).
    """
    own = set(worked) | {get_module(module_id).id}
    return [i for i in prerequisites(module_id) if i not in own]


def selector_for(ids: list[str]) -> str:
    """The shortest ``G2C_APPLY_SOLUTIONS`` value that selects exactly ``ids`` (ranges where they fit).

    ``["03", "03b", ..., "11"]`` -> ``"01-11"``; ``["05", "08"]`` -> ``"05,08"``; ``[]`` -> ``""``.
    """
    wanted = [i for i in module_ids() if i in set(ids)]
    best = ",".join(wanted)
    numbers = sorted({m.number for m in MODULES if m.number is not None})
    for lo in numbers:
        for hi in numbers:
            if hi <= lo:
                continue
            covered = parse_selection(f"{lo:02d}-{hi:02d}")
            if not set(covered) <= set(wanted):
                break
            rest = [i for i in wanted if i not in covered]
            candidate = ",".join([f"{lo:02d}-{hi:02d}", *rest])
            if len(candidate) < len(best):
                best = candidate
    assert parse_selection(best) == wanted, (ids, best)
    return best


def prerequisites_selector(module_id: str) -> str:
    """The shortest ``G2C_APPLY_SOLUTIONS`` value that selects exactly the prerequisites of ``module_id``.

    It applies the reference solutions of everything the module builds on and keeps the
    student's own code for the module itself (``python -m g2c.course prereqs ID`` prints it).
    Students never need it: ``./test.sh ID`` grades with it, minus the modules they edited.

    Raises:
        ValueError: unknown id.
    """
    return selector_for(prerequisites(module_id))


def check_graph() -> None:
    """Raise ValueError unless every ``requires`` names an earlier module (so the graph has no cycle).

    Also checks that ids and owned files are unique.
    """
    ids = module_ids()
    if len(set(ids)) != len(ids):
        raise ValueError("registry: duplicate module ids")
    files = [f for m in MODULES for f in m.files]
    if len(set(files)) != len(files):
        raise ValueError("registry: a file is owned by two modules")
    for pos, m in enumerate(MODULES):
        for r in m.requires:
            if r not in ids[:pos]:
                raise ValueError(f"registry: module {m.id} requires {r!r}, which is not an earlier module id")


check_graph()
