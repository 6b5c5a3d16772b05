"""The package layout: course packages show the course, tooling lives apart, the ladder is defined once."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from g2c.assets.artifacts import artifact_dir, model_names
from g2c.assets.ladder import RECIPES
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


def _imports(path: Path) -> list[str]:
    """Absolute dotted names imported by a file (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    pkg_parts = path.relative_to(REPO_ROOT).with_suffix("").parts[:-1]
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
