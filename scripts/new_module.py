#!/usr/bin/env python3
"""Add a course module in one command: registry entry, answer key, scaffold, test file,
lesson stub and notebook source, then the freshness and contract records.

    python scripts/new_module.py 16 "KV cache and incremental decoding" --package kvcache --requires 11
    python scripts/new_module.py specdec-medusa "Beyond: Medusa heads" --requires 16,specdec

A numeric id (``16``, ``12b``) gets ``docs/modules/<id>-<slug>.md``; any other id is a Beyond
module with ``docs/beyond/<id>.md`` and its own folder: ``specdec-NAME`` becomes the sub-package
``g2c/specdec/NAME/`` (``--package`` overrides, e.g. ``recurrent``), owned whole by the module. The
notebook is ``notebooks/clean/<id>-<slug>.ipynb``, built from ``solutions/notebooks/<id>-<slug>.py``.
``--requires`` names the modules it builds on (each already in the registry); grading and the
notebook apply their answer key to the ones a student has not edited.

It refuses to touch an id or a file that already exists (nothing is overwritten); a Beyond module's
folder must not exist yet (one module, one folder).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "g2c" / "course" / "registry.py"
END_OF_MODULES = "\n)\n\n\ndef module_ids()"


def slugify(title: str) -> str:
    """``"Beyond: KV cache & decoding"`` -> ``"kv-cache-decoding"`` (without a leading "beyond")."""
    words = re.findall(r"[a-z0-9]+", title.lower())
    return "-".join(w for w in words if w != "beyond")[:40].strip("-") or "module"


def is_numbered(module_id: str) -> bool:
    return re.fullmatch(r"\d+[a-z]?", module_id) is not None


def default_package(module_id: str) -> str:
    """``specdec-medusa`` -> ``specdec/medusa`` (a sub-package of the seed's); other ids -> the id as a package."""
    if not is_numbered(module_id) and module_id.startswith("specdec-"):
        return "specdec/" + module_id.removeprefix("specdec-").replace("-", "_")
    return module_id.replace("-", "_")


def plan(module_id: str, title: str, package: str, file: str, *, root: Path = ROOT) -> dict[str, str]:
    """Repo-relative paths of the files the module consists of."""
    numeric = is_numbered(module_id)
    slug = slugify(title)
    stem = f"{module_id}-{slug}"
    return {
        "init": f"g2c/{package}/__init__.py",
        "solution": f"solutions/g2c/{package}/{file}.py",
        "scaffold": f"g2c/{package}/{file}.py",
        "test": f"tests/test_{module_id.replace('-', '_') if not numeric else package.replace('/', '_')}.py",
        "lesson": f"docs/modules/{stem}.md" if numeric else f"docs/beyond/{module_id}.md",
        "notebook": f"notebooks/clean/{stem}.ipynb",
        "notebook_source": f"solutions/notebooks/{stem}.py",
    }


def registry_entry(module_id: str, title: str, paths: dict[str, str], *, new_init: bool,
                   requires: tuple[str, ...] = ()) -> str:
    files = ([paths["init"]] if new_init else []) + [paths["scaffold"]]
    return (f"    CourseModule(\n        id={module_id!r},\n        title={title!r},\n"
            f"        files=({', '.join(repr(f) for f in files)},),\n"
            f"        lesson={paths['lesson']!r},\n        notebook={paths['notebook']!r},\n"
            f"        tests=({paths['test']!r},),\n"
            f"        requires=({''.join(repr(r) + ', ' for r in requires).rstrip(' ')}),\n    ),")


def templates(module_id: str, title: str, package: str, file: str, paths: dict[str, str]) -> dict[str, str]:
    lesson = paths["lesson"]
    dotted = package.replace("/", ".")
    return {
        "init": f'"""{title} (module {module_id})."""\n\nfrom .{file} import scale\n\n__all__ = ["scale"]\n',
        "solution": (
            f'"""Module {module_id}: {title}.\n\nShape letters: T time, D width.\n"""\n\n'
            "from __future__ import annotations\n\nimport torch\n\n__all__ = [\"scale\"]\n\n\n"
            "def scale(x: torch.Tensor, factor: float) -> torch.Tensor:\n"
            '    """An example exercise: ``x * factor``. Replace it with the module\'s first exercise.\n\n'
            "    Args:\n        x: (T, D) float32 on any device.\n        factor: a finite float.\n\n"
            "    Returns:\n        (T, D) float32 on x's device.\n\n"
            "    Raises:\n        ValueError: factor is not finite (message names \"factor\").\n\n"
            "    Steps:\n        1. Validate factor (``test_scale_rejects_non_finite_factor``).\n"
            "        2. Multiply (``test_scale_multiplies``).\n"
            '    """\n'
            "    if not torch.isfinite(torch.tensor(float(factor))):\n"
            "        raise ValueError(f\"factor must be finite, got {factor}\")\n"
            "    # BEGIN SOLUTION\n    return x * factor\n    # END SOLUTION\n"),
        "test": (
            f'"""Module {module_id}: {title}. The contract of ``g2c/{package}/{file}.py``."""\n\n'
            "from __future__ import annotations\n\nimport pytest\nimport torch\n\n"
            f"from g2c.{dotted}.{file} import scale\n\n\n"
            "def test_scale_rejects_non_finite_factor():\n"
            "    with pytest.raises(ValueError, match=\"factor\"):\n"
            "        scale(torch.ones(2, 3), float(\"nan\"))\n\n\n"
            "def test_scale_multiplies():\n"
            "    torch.testing.assert_close(scale(torch.ones(2, 3), 2.5), torch.full((2, 3), 2.5))\n"),
        "lesson": (
            f"# {module_id}: {title}\n\n## The question\n\nWhat problem does this module solve, in one paragraph?\n\n"
            "## The idea\n\nThe concept, with the maths and its source (paper, section).\n\n"
            f"## What you build\n\n| exercise | file | tests |\n|---|---|---|\n"
            f"| `scale` | `g2c/{package}/{file}.py` | `{paths['test']}` |\n\n"
            f"## Grade it\n\n```bash\n./test.sh {module_id}\n```\n\n"
            "## Pitfalls\n\n- ...\n\n"
            "## What to expect\n\nNumbers on the shipped ladder, with the command and thread count.\n\n"
            "## Reading\n\n- ...\n"),
        "notebook_source": (
            "# %% [markdown]\n"
            f"# # {title}\n#\n# Lesson: `{lesson}`. `./notebook.sh {module_id}` runs it on your own code, with the\n"
            f"# answer key for the modules it needs that you have not edited.\n\n"
            "# %%\nimport torch\n\n"
            f"from g2c.{dotted}.{file} import scale\n\n"
            "# %%\n# BEGIN SOLUTION\nresult = scale(torch.ones(2, 3), 2.0)\n# END SOLUTION\nresult\n\n"
            "# %% [markdown]\n# **Question:** What does `scale` return for a (2, 3) tensor of ones and factor 2?\n\n"
            "# %% [markdown]\n# **Answer:**\n#\n# <!-- BEGIN ANSWER -->\n# A (2, 3) tensor of twos.\n"
            "# <!-- END ANSWER -->\n#\n# <!-- BEGIN RUBRIC -->\n# Full marks: shape (2, 3) and every value 2.0.\n"
            "# <!-- END RUBRIC -->\n"),
    }


def add_module(module_id: str, title: str, package: str, file: str, *, root: Path = ROOT, record: bool = True,
               requires: tuple[str, ...] = (), out=print) -> dict[str, str]:
    """Create the module's files and registry entry under ``root``; returns the paths.

    Raises:
        ValueError: a malformed id/package/file name, an id already in the registry, or a file that
            already exists (nothing is written then).
    """
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", module_id):
        raise ValueError(f"module id {module_id!r}: use lowercase letters, digits and '-' (e.g. 16, specdec-foo)")
    for what, name in [("file", file), *(("package", part) for part in package.split("/"))]:
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            raise ValueError(f"{what} {name!r} is not a Python identifier")
    known = re.findall(r"""(?:id=|_m\(|_beyond\()["']([a-z0-9-]+)["']""", (root / "g2c" / "course" / "registry.py")
                       .read_text(encoding="utf-8"))
    unknown = [r for r in requires if r not in known]
    if unknown:
        raise ValueError(f"--requires {','.join(unknown)}: not a module in g2c/course/registry.py "
                         f"(known: {', '.join(known)})")
    registry = root / "g2c" / "course" / "registry.py"
    text = registry.read_text(encoding="utf-8")
    if re.search(rf"""(id=|_m\(|_beyond\()["']{re.escape(module_id)}["']""", text):
        raise ValueError(f"module id {module_id!r} is already in g2c/course/registry.py")
    paths = plan(module_id, title, package, file, root=root)
    new_init = not (root / paths["init"]).exists()
    if not is_numbered(module_id) and not new_init:
        raise ValueError(f"a Beyond module owns its own folder, and g2c/{package}/ exists already; "
                         f"pick a new --package (default for {module_id}: {default_package(module_id)})")
    body = templates(module_id, title, package, file, paths)
    wanted = ["solution", "test", "lesson", "notebook_source"] + (["init"] if new_init else [])
    clash = [paths[k] for k in wanted if (root / paths[k]).exists()]
    if clash:
        raise ValueError(f"refusing to overwrite existing files: {', '.join(clash)}")
    if END_OF_MODULES not in text:
        raise ValueError("cannot find the end of MODULES in g2c/course/registry.py")
    entry = registry_entry(module_id, title, paths, new_init=new_init, requires=requires)
    registry.write_text(text.replace(END_OF_MODULES, "\n" + entry + END_OF_MODULES, 1), encoding="utf-8")
    for key in wanted:
        dest = root / paths[key]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(body[key], encoding="utf-8")
        out(f"created {paths[key]}")
    steps = [[sys.executable, "scripts/scaffolds.py"]]
    if (root / "scripts" / "notebooks" / "build.py").exists():
        steps.append([sys.executable, "scripts/notebooks/build.py"])
    if record:
        steps.append([sys.executable, "scripts/contract.py", "--record", paths["test"]])
    for cmd in steps:
        out("running " + " ".join(c if c != sys.executable else "python" for c in cmd))
        subprocess.run(cmd, cwd=root, check=True)
    out(f"module {module_id} added: edit {paths['solution']} and {paths['test']}, then "
        f"`python scripts/scaffolds.py`, `python scripts/contract.py --record {paths['test']}` and "
        f"`python scripts/readme_table.py --write`; grade it with ./test.sh {module_id}")
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("id", help="module id, e.g. 16 or specdec-foo")
    ap.add_argument("title", help="human title")
    ap.add_argument("--package", help="package under g2c/ (default: specdec-NAME -> specdec/NAME, else the id "
                                      "with '-' as '_')")
    ap.add_argument("--requires", default="", help="comma list of the module ids it builds on, e.g. 16,specdec")
    ap.add_argument("--file", default="core", help="name of the first exercise file (default: core)")
    ap.add_argument("--no-record", action="store_true", help="skip recording the pristine contract")
    args = ap.parse_args(argv)
    try:
        add_module(args.id, args.title, args.package or default_package(args.id), args.file,
                   record=not args.no_record, requires=tuple(r.strip() for r in args.requires.split(",") if r.strip()))
    except (ValueError, subprocess.CalledProcessError) as exc:
        print(f"new_module: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
