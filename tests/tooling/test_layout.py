"""The package layout: course packages show the course, tooling lives apart, the ladder is defined once."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from g2c.assets.artifacts import artifact_dir, model_names
from g2c.assets.recipes.ladder import RECIPES
from g2c.course import MODULES, REPO_ROOT
from g2c.transformer import LADDER, StoryLMConfig

PKG = REPO_ROOT / "g2c"
TOOLING = {"course", "assets"}


def course_packages() -> list[str]:
    return sorted(p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
                  and p.name not in TOOLING)


def test_top_of_g2c_holds_only_init_and_packages():
    files = sorted(p.name for p in PKG.iterdir() if p.is_file())
    assert files == ["__init__.py"], f"tooling or stray files at the top of g2c/: {files}"


def test_every_course_package_file_belongs_to_a_registry_module():
    owned = {f for m in MODULES for f in m.files}
    for pkg in course_packages():
        for path in (PKG / pkg).rglob("*.py"):
            rel = path.relative_to(REPO_ROOT).as_posix()
            assert rel in owned, f"{rel} is in a course package but no registry module owns it"


def _imports(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """Absolute dotted names imported by a file (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg_parts = path.relative_to(root).with_suffix("").parts[:-1]
    if pkg_parts[:1] == ("solutions",):
        pkg_parts = pkg_parts[1:]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(pkg_parts[: len(pkg_parts) - node.level + 1])
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append(mod)
            out += [f"{mod}.{a.name}" for a in node.names]
    return out


def test_course_packages_never_import_tooling():
    # Command-line front ends (``__main__.py``, run as ``python -m g2c.specdec``) load the shipped
    # artifacts and are never imported by library code, so they may use the tooling.
    bad = []
    for pkg in course_packages():
        for root in (PKG / pkg, REPO_ROOT / "solutions" / "g2c" / pkg):
            for path in root.rglob("*.py") if root.is_dir() else []:
                if path.name == "__main__.py":
                    continue
                for name in _imports(path):
                    if any(name == f"g2c.{t}" or name.startswith(f"g2c.{t}.") for t in TOOLING):
                        bad.append(f"{path.relative_to(REPO_ROOT)} imports {name}")
    assert not bad, "course code reaches into tooling:\n" + "\n".join(bad)


def test_import_scan_sees_relative_and_absolute_imports(tmp_path):
    # The scanner itself must catch both spellings, or the test above could never fail.
    f = REPO_ROOT / "g2c" / "nn" / "__init__.py"
    names = _imports(f)
    assert any(n.startswith("g2c.nn.") for n in names)


def test_model_names_come_from_the_ladder_and_recipes_cover_it():
    assert model_names() == tuple(LADDER)
    assert set(RECIPES) == set(LADDER), "every ladder entry needs a recipe and every recipe a ladder entry"


def test_storylm_config_round_trips_every_constructor_argument():
    cfg = StoryLMConfig("X", vocab_size=17, embedding_dim=8, num_layers=1, num_heads=2, max_seq_len=9,
                        dropout=0.1, hidden_dim=24)
    assert StoryLMConfig.from_dict(cfg.to_dict()) == cfg
    model = cfg.build()
    assert (model.vocab_size, model.embedding_dim, model.num_layers, model.num_heads, model.max_seq_len,
            model.hidden_dim) == (17, 8, 1, 2, 9, 24)
    assert StoryLMConfig.from_dict({**cfg.to_dict(), "tokenizer": "StoryTokenizer"}) == cfg
    with pytest.raises(ValueError, match="name"):
        StoryLMConfig.from_dict({"vocab_size": 3})
    with pytest.raises(ValueError, match="embedding_dim must be an int"):
        StoryLMConfig.from_dict({"name": "X", "embedding_dim": "8"})


@pytest.mark.ladder
@pytest.mark.parametrize("name", list(LADDER))
def test_every_ladder_model_builds_from_its_config_json_and_loads_its_weights(name):
    folder = artifact_dir(name)
    cfg = StoryLMConfig.from_dict(json.loads((folder / "config.json").read_text()))
    assert cfg.to_dict() == {**LADDER[name].to_dict()}, "the shipped config.json disagrees with LADDER"
    model = cfg.build()
    state = load_file(str(folder / "model.safetensors"))
    missing = set(model.state_dict()) ^ set(state)
    assert not missing, f"weights and model disagree on {sorted(missing)}"
    model.load_state_dict({k: v.float() for k, v in state.items()})
    assert all(torch.isfinite(p).all() for p in model.parameters())


# -- one room per module: numbered modules never import Beyond ones; a folder per Beyond module; no cycles --

def _owner_of_import(name: str):
    """The registry module that owns the file a dotted ``g2c...`` name refers to (a module, a package or a
    name inside one), or None for tooling and non-course names."""
    from g2c.course import module_for_file

    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        base = "/".join(parts[:i])
        for cand in (f"{base}.py", f"{base}/__init__.py"):
            m = module_for_file(cand)
            if m is not None:
                return m
    return None


def _module_sources(m) -> list[Path]:
    """A module's own files (scaffold and answer key) and its test files."""
    paths = [REPO_ROOT / f for f in m.files] + [REPO_ROOT / "solutions" / f for f in m.files]
    return [p for p in paths + [REPO_ROOT / t for t in m.tests] if p.is_file()]


def test_numbered_modules_never_import_a_beyond_module():
    bad = []
    for m in MODULES:
        if m.beyond:
            continue
        for path in _module_sources(m):
            for name in _imports(path):
                owner = _owner_of_import(name)
                if owner is not None and owner.beyond:
                    bad.append(f"{path.relative_to(REPO_ROOT)} (module {m.id}) imports {name} (module {owner.id})")
    assert not bad, "a numbered module reaches into the Beyond side:\n" + "\n".join(sorted(set(bad)))


def test_modules_import_only_themselves_and_their_prerequisites():
    # A module's files and tests may use code of the modules it needs (the closure of `requires`).
    # A package __init__ re-exporting its own package's files (g2c/attention/__init__.py names module 08's
    # multihead.py) is not a use.
    from g2c.course import prerequisites

    bad = []
    for m in MODULES:
        allowed = {m.id, *prerequisites(m.id)}
        for path in _module_sources(m):
            own_pkg = path.parent
            for name in _imports(path):
                owner = _owner_of_import(name)
                if owner is None or owner.id in allowed:
                    continue
                if path.name == "__init__.py" and any((REPO_ROOT / f).parent == own_pkg.relative_to(
                        REPO_ROOT / "solutions" if "solutions" in path.parts else REPO_ROOT) or
                        (REPO_ROOT / f).parent == own_pkg for f in owner.files):
                    continue
                if path.name == "__main__.py":   # a command-line front end (python -m ...), tested by its own module
                    continue
                bad.append(f"{path.relative_to(REPO_ROOT)} (module {m.id}) imports {name} (module {owner.id}, "
                           f"not among {m.id}'s prerequisites)")
    assert not bad, "add the module to `requires` or move the code:\n" + "\n".join(sorted(set(bad)))


def test_each_beyond_module_after_the_seed_owns_exactly_one_folder():
    for m in MODULES:
        if not m.beyond or m.id == "specdec":
            continue
        folders = {Path(f).parent for f in m.files}
        assert len(folders) == 1, f"module {m.id} owns files in {sorted(map(str, folders))}: one folder each"
        folder = REPO_ROOT / folders.pop()
        on_disk = {p.relative_to(REPO_ROOT).as_posix() for p in folder.glob("*.py")}
        assert on_disk == set(m.files), f"{folder.relative_to(REPO_ROOT)} holds {sorted(on_disk ^ set(m.files))} " \
                                        f"that module {m.id} does not own (or misses files it owns)"
        assert (folder / "__init__.py").is_file()


def find_import_cycle(root: Path) -> list[str]:
    """An import cycle among the modules of ``root/g2c`` (dotted names, first repeated at the end), or []."""
    graph: dict[str, set[str]] = {}
    for path in (root / "g2c").rglob("*.py"):
        mod = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        deps = set()
        for name in _imports(path, root):
            parts = name.split(".")
            for i in range(len(parts), 1, -1):
                rel = Path(*parts[:i])
                if (root / f"{rel}.py").is_file() or (root / rel / "__init__.py").is_file():
                    cand = ".".join(parts[:i])
                    # a package's __init__ importing its own submodules is how packages work, not a cycle
                    if cand != mod and not cand.startswith(mod + ".") and not mod.startswith(cand + "."):
                        deps.add(cand)
                    break
        graph[mod] = deps
    state: dict[str, int] = {}

    def visit(a: str, stack: list[str]) -> list[str]:
        state[a] = 1
        for b in sorted(graph.get(a, ())):
            if state.get(b) == 1:
                return stack[stack.index(b):] + [b]
            if b not in state:
                found = visit(b, stack + [b])
                if found:
                    return found
        state[a] = 2
        return []

    for a in sorted(graph):
        if a not in state:
            found = visit(a, [a])
            if found:
                return found
    return []


def test_no_import_cycle_inside_g2c():
    cycle = find_import_cycle(REPO_ROOT)
    assert not cycle, "import cycle inside g2c/: " + " -> ".join(cycle)


def test_import_cycle_detector_sees_a_cycle(tmp_path):
    # The check above must be able to fail: two files of one package importing each other are a cycle.
    pkg = tmp_path / "g2c" / "loopy"
    pkg.mkdir(parents=True)
    (tmp_path / "g2c" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .a import x\n")
    (pkg / "a.py").write_text("x = 1\n\n\ndef f():\n    from .b import y\n    return y\n")
    (pkg / "b.py").write_text("from .a import x\ny = x\n")
    assert find_import_cycle(tmp_path) == ["g2c.loopy.a", "g2c.loopy.b", "g2c.loopy.a"]
    (pkg / "a.py").write_text("x = 1\n")
    assert find_import_cycle(tmp_path) == []


# -- one round (issue 28) -------------------------------------------------------------------------
# A function that runs a target pass AND a verifier is a speculative round (found by the names it
# calls: a pass through a bare ``model(ids)`` escapes the scan, which is why the seed's loop passes). The house has one
# general round, the engine (specdec-sampling's ``speculative_sample``), plus the seed's two small
# loops and the lab's batched scheduler (B rows in one pass). A new decoding idea is a ``Target``, a
# draft shape or a ``Drafter`` (docs/CONTRIBUTING.md, "Where new code goes"), never a new round.
TARGET_PASSES = {"cached_hidden_states", "masked_hidden_states", "tree_forward", "tree_logits",
                 "cached_tree_forward", "target_layer_pass", "ragged_forward", "forward_rows", "hidden_states",
                 "cached_forward", "score", "extend", "advance"}
VERIFIERS = {"greedy_verify", "speculative_verify", "verify_round", "greedy_tree_verify", "tree_speculative_verify",
             "typical_tree_verify", "typical_accept", "accept"}
# specdec-serving's batched_speculative_sample is the engine's round for B rows (issue 56 item 1: one
# target pass, each row verified by the engine's verify_round with its own generator); the lab's greedy
# scheduler stays beside it because it batches the drafter's steps too (docs/beyond/specdec-serving.md).
ROUNDS = {"g2c/specdec/generate.py::speculative_generate", "g2c/specdec/mtp.py::mtp_generate",
          "g2c/specdec/sampling/loop.py::speculative_sample",
          "g2c/specdec/lab/batched.py::batched_speculative_generate",
          "g2c/specdec/serving/batched.py::batched_speculative_sample"}
# Rounds still waiting to become presets of the engine (issue 28, items 3-5): this list may only shrink.
# Empty since tree_speculative_generate and lineage_generate became presets (a DraftTree, tree targets).
NOT_YET_PRESETS: set[str] = set()


def _called_names(fn: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


def _speculative_rounds() -> set[str]:
    found = set()
    for root in (REPO_ROOT / "g2c", REPO_ROOT / "solutions" / "g2c"):
        for path in root.rglob("*.py"):
            rel = "g2c/" + str(path.relative_to(root))
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    called = _called_names(node)
                    if called & TARGET_PASSES and called & VERIFIERS:
                        found.add(f"{rel}::{node.name}")
    return found


def test_one_speculative_round_in_the_house():
    rounds = _speculative_rounds()
    extra = rounds - ROUNDS - NOT_YET_PRESETS
    assert not extra, ("these functions run a target pass and a verifier, i.e. a round of their own; make the idea "
                       "a Target, a draft shape or a Drafter of the engine (speculative_sample) instead:\n"
                       + "\n".join(sorted(extra)))
    stale = NOT_YET_PRESETS - rounds
    assert not stale, f"now presets of the engine: remove them from NOT_YET_PRESETS: {sorted(stale)}"
    assert "g2c/specdec/sampling/loop.py::speculative_sample" in rounds      # the detector sees the engine


def test_round_detector_sees_a_private_round():
    src = "def loop(t, d):\n    rows = t.score(ids, d)\n    return greedy_verify(d, rows)\n"
    assert _called_names(ast.parse(src)) >= {"score", "greedy_verify"}


# One drafter protocol (issue 28, item 4): every class in g2c/ that proposes drafts (a ``propose``) or drafts
# trees from the target's states (a ``draft``) is a subclass of the engine's ``Drafter``; no adapter
# stands between a drafter and the engine.
NOT_DRAFTERS = {"g2c.specdec.sampling.drafters.CachedScorer"}   # LMDrafter's KV-cached model: its draft() is a helper


def _drafting_classes() -> dict[str, set[str]]:
    found = {}
    for path in (REPO_ROOT / "g2c").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if methods & {"propose", "draft"}:
                    mod = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
                    found[f"{mod}.{node.name}"] = methods
    return found


def test_one_drafter_protocol():
    import importlib

    from g2c.specdec.sampling.drafters import Drafter

    classes = _drafting_classes()
    assert "g2c.specdec.lineage.block.BlockDrafter" in classes                 # the scan sees a tree drafter
    outside = []
    for qual in sorted(set(classes) - NOT_DRAFTERS):
        mod, _, name = qual.rpartition(".")
        cls = getattr(importlib.import_module(mod), name)
        if not issubclass(cls, Drafter):
            outside.append(qual)
    assert not outside, ("these classes draft but are not drafters of the engine's one protocol "
                         "(g2c.specdec.sampling.drafters.Drafter): " + ", ".join(sorted(outside)))
    assert not any("Adapter" in qual for qual in classes), "no adapter between a drafter and the engine"


def test_the_vocabulary_check_is_written_once():
    """Every speculative loop refuses a drafter of another vocabulary with ONE helper
    (``g2c.sampling.model.check_same_vocab``); only the seed's loop keeps its own copy (its file is
    the seed's and does not change). A new loop calls the helper instead of writing the message."""
    message = "differs from target vocab_size"
    found = set()
    for root in (REPO_ROOT / "g2c", REPO_ROOT / "solutions" / "g2c"):
        for path in root.rglob("*.py"):
            if message in path.read_text():
                found.add("g2c/" + str(path.relative_to(root)))
    assert found == {"g2c/sampling/model.py", "g2c/specdec/generate.py"}, sorted(found)


def test_the_window_precondition_is_written_once():
    """Every speculative loop refuses a window too small for one draft with ONE helper
    (``g2c.sampling.model.check_window``: max_seq_len >= 2; ``draft_room`` fits the drafts to any
    larger window); only the seed's loop keeps its own copy. Issue 54 found four bounds that
    disagreed (< 2, < k + 2, < 3)."""
    found = set()
    for root in (REPO_ROOT / "g2c", REPO_ROOT / "solutions" / "g2c"):
        for path in root.rglob("*.py"):
            text = path.read_text()
            if "leaves no room for a" in text or re.search(r"if (\w+\.)?max_seq_len < |if window < ", text):
                found.add("g2c/" + str(path.relative_to(root)))
    assert found == {"g2c/sampling/model.py", "g2c/specdec/generate.py"}, sorted(found)
