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
folder must not exist yet (one module, one folder). It adds a whole module or nothing: every
generated Python file is compiled before anything is written, each file is written atomically,
and after the generators ran the new scaffold must compile and its test file must collect; if any
step fails (or you press Ctrl-C) every file it created is removed and the registry and the
records it touched are put back, and it says so. Edited exercises elsewhere in the checkout are
left alone (the scaffold generator names them) and do not stop it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from g2c.course.files import check_output_path, write_problem, write_text_atomic  # noqa: E402

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
    plain = title
    title = title.replace("\\", "\\\\").replace('"', '\\"')  # inside the docstrings below: no early close
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
            f"# {module_id}: {plain}\n\n## Before you start\n\n"
            f"- **Have done** the modules it needs (the answer key stands in "
            f"for those you have not edited).\n- **You write** `scale` in `g2c/{package}/{file}.py`.\n- **Grade** with "
            f"`./test.sh {module_id}`; `python scripts/pristine_counts.py {module_id}` prints what passes on the "
            "untouched scaffold.\n\n## The question\n\nWhat problem does this module solve, in one paragraph?\n\n"
            "## The idea\n\nThe concept, with the maths and its source (paper, section).\n\n"
            f"## What you build\n\n| exercise | file | tests |\n|---|---|---|\n"
            f"| `scale` | `g2c/{package}/{file}.py` | `{paths['test']}` |\n\n"
            f"## Grade it\n\n```bash\n./test.sh {module_id}\n```\n\n"
            "## Pitfalls\n\n- ...\n\n"
            "## What to expect\n\nOne sentence per measured result, linking its table, command and thread count in "
            "docs/performance.md.\n\n"
            "## Reading\n\n- ...\n"),
        "notebook_source": (
            "# %% [markdown]\n"
            f"# # {plain}\n#\n# Lesson: `{lesson}`. `./notebook.sh {module_id}` runs it on your own code, with the\n"
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
    if not title.strip() or any(ord(c) < 32 or c == "\x7f" for c in title):
        raise ValueError(f"title {title!r}: give one line of text (no newline or control character)")
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", module_id):
        raise ValueError(f"module id {module_id!r}: use lowercase letters, digits and '-' (e.g. 16, specdec-foo)")
    registry = root / "g2c" / "course" / "registry.py"      # the id before the package, which it names by default
    text = registry.read_text(encoding="utf-8")
    if re.search(rf"""(id=|_m\(|_beyond\()["']{re.escape(module_id)}["']""", text):
        raise ValueError(f"module id {module_id!r} is already in g2c/course/registry.py: choose a new id")
    for what, name in [("file", file), *(("package", part) for part in package.split("/"))]:
        if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            hint = (" (the package defaults to the module id: pass --package NAME, e.g. --package quotes)"
                    if what == "package" else " (pass --file NAME)")
            raise ValueError(f"{what} {name!r} is not a Python identifier{hint}")
    known = re.findall(r"""(?:id=|_m\(|_beyond\()["']([a-z0-9-]+)["']""", (root / "g2c" / "course" / "registry.py")
                       .read_text(encoding="utf-8"))
    unknown = [r for r in requires if r not in known]
    if unknown:
        raise ValueError(f"--requires {','.join(unknown)}: not a module in g2c/course/registry.py "
                         f"(known: {', '.join(known)})")
    paths = plan(module_id, title, package, file, root=root)
    # names the file system takes, before a file is written (a 300-character id failed half-way, its rollback too)
    for key in ("init", "solution", "test", "lesson", "notebook_source", "scaffold", "notebook"):
        try:
            check_output_path(root / paths[key], what=f"module's {key.replace('_', ' ')}")
        except OSError as exc:
            raise ValueError(f"{exc.strerror or exc}; nothing was written (a shorter id, --package or --file)") \
                from None
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
    for key in ("init", "solution", "test", "notebook_source"):  # every generated Python file compiles
        if key in wanted:
            try:
                compile(body[key], paths[key], "exec")
            except SyntaxError as exc:
                raise ValueError(f"the generated {paths[key]} would not compile ({exc.msg}, line {exc.lineno}); "
                                 "nothing was written. Simplify the title?") from None
    entry = registry_entry(module_id, title, paths, new_init=new_init, requires=requires)
    new_registry = text.replace(END_OF_MODULES, "\n" + entry + END_OF_MODULES, 1)
    try:
        compile(new_registry, "g2c/course/registry.py", "exec")
    except SyntaxError as exc:
        raise ValueError(f"the registry entry would not compile ({exc.msg}); nothing was written") from None
    # What this run may change, to put back if any step fails: the records the generators rewrite,
    # every file it creates and every folder that does not exist yet.
    records = {rel: (root / rel).read_bytes() if (root / rel).is_file() else None
               for rel in ("g2c/course/registry.py", "solutions/generated.json", "tests/pristine.json")}
    created = [paths[k] for k in wanted] + [paths["scaffold"], paths["notebook"]]
    new_dirs = sorted({d for rel in created for d in Path(rel).parents
                       if d != Path(".") and not (root / d).exists()}, key=lambda d: len(d.parts))
    try:
        write_text_atomic(registry, new_registry)
        for key in wanted:
            write_text_atomic(root / paths[key], body[key])
            out(f"created {paths[key]}")
        steps = [[sys.executable, "scripts/scaffolds.py"]]
        if (root / "scripts" / "notebooks" / "build.py").exists():
            steps.append([sys.executable, "scripts/notebooks/build.py"])
        if record:
            steps.append([sys.executable, "scripts/contract.py", "--record", paths["test"]])
        for cmd in steps:
            out("running " + " ".join(c if c != sys.executable else "python" for c in cmd))
            done = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
            sys.stdout.write(done.stdout)
            sys.stderr.write(done.stderr)
            kept_edited = (cmd[1] == "scripts/scaffolds.py" and (root / paths["scaffold"]).is_file()
                           and "not overwritten" in done.stderr)  # a student's edited exercise, left alone
            if done.returncode != 0 and not kept_edited:
                raise RuntimeError(f"{' '.join(cmd[1:])} failed (exit {done.returncode})")
        check_generated(root, paths)
    except BaseException as exc:
        _roll_back(root, records, created, new_dirs)
        if isinstance(exc, KeyboardInterrupt):
            out(f"interrupted: module {module_id} not added; every file it had created was removed and "
                "the registry and records were put back")
            raise
        if isinstance(exc, OSError):
            raise
        raise ValueError(f"{exc}; module {module_id} not added: every file it had created was removed and the "
                         "registry and records were put back") from None
    out(f"module {module_id} added: edit {paths['solution']} and {paths['test']}, then "
        f"`python scripts/scaffolds.py`, `python scripts/contract.py --record {paths['test']}` and "
        f"`python scripts/readme_table.py --write`; grade it with ./test.sh {module_id}")
    return paths


def check_generated(root: Path, paths: dict[str, str]) -> None:
    """The new module works before success is reported: its scaffold (and package init) compiles
    and its test file collects under pytest.

    Raises:
        RuntimeError: naming the file and the last lines of the error.
    """
    for key in ("init", "scaffold"):
        path = root / paths[key]
        try:
            compile(path.read_text(encoding="utf-8"), str(path), "exec")
        except (OSError, SyntaxError) as exc:
            raise RuntimeError(f"the generated {paths[key]} does not compile: {exc}") from None
    env = {k: v for k, v in os.environ.items() if k != "G2C_APPLY_SOLUTIONS"}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           paths["test"]], cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-4:])
        raise RuntimeError(f"the generated {paths['test']} does not collect under pytest: {tail}")


def _roll_back(root: Path, records: dict[str, bytes | None], created: list[str], new_dirs: list[Path]) -> None:
    for rel in created:                       # each step on its own: one that fails never stops the rest
        with contextlib.suppress(OSError):
            (root / rel).unlink(missing_ok=True)
    for rel, data in records.items():
        if data is None:
            (root / rel).unlink(missing_ok=True)
        elif not (root / rel).is_file() or (root / rel).read_bytes() != data:
            (root / rel).write_bytes(data)
    for d in new_dirs:  # shallowest first: removing it removes what the run put inside
        shutil.rmtree(root / d, ignore_errors=True)


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
    except ValueError as exc:
        print(f"new_module: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"new_module: {write_problem(exc)}; nothing was added", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
