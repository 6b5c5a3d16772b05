"""One source for every selector and grading command printed anywhere.

Every ``G2C_APPLY_SOLUTIONS=VALUE`` and ``--apply VALUE`` in the README, the lessons, CONTRIBUTING,
the notebook sources and the course's own code is checked against the registry: it parses, and when
the same line runs a module's tests or notebook, it does not apply that module's answer key (unless
the line says it runs the answer key on purpose) and it covers what the module needs. Every
``./test.sh ID``, ``./notebook.sh ID`` and ``prereqs ID`` names a registry id. Generated text (the
scaffolds' messages, the README table and graph, the CLI advice) is tested where it is generated.
"""

from __future__ import annotations

import re

import pytest

from g2c.course import MODULES, REPO_ROOT, module_ids, parse_selection, prerequisites

SOURCES = sorted({*REPO_ROOT.glob("*.md"), *(REPO_ROOT / "docs").rglob("*.md"),
                  *(REPO_ROOT / "solutions" / "notebooks").glob("*.py"), *(REPO_ROOT / "g2c").rglob("*.py"),
                  *(REPO_ROOT / "scripts").rglob("*.py"), *(REPO_ROOT / "bench").glob("*.py"),
                  REPO_ROOT / "test.sh", REPO_ROOT / "notebook.sh"})
SELECTOR = re.compile(r"(?:G2C_APPLY_SOLUTIONS=|--apply[ =])((?:\d|all\b|specdec)[0-9a-z,\-]*)")
COMMAND = re.compile(r"(?:\./test\.sh|\./notebook\.sh|g2c\.course prereqs|g2c\.course grade)"
                     r"\s+(\d[\w-]*|specdec[\w-]*)")
ON_PURPOSE = ("answer key", "reference", "all solutions", "every solution")


def _lines():
    for path in SOURCES:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            yield path.relative_to(REPO_ROOT).as_posix(), n, line


def _module_of_line(line: str):
    """The module a line runs: a test file it names, or ./notebook.sh ID / ./test.sh ID."""
    for m in MODULES:
        if any(t in line for t in m.tests) or re.search(rf"(?:notebook|test)\.sh {re.escape(m.id)}(?![\w-])", line):
            return m
    return None


def test_sources_are_scanned():
    assert len(SOURCES) > 50 and any(p.name == "README.md" for p in SOURCES)


def selector_problems(lines) -> list[str]:
    """What is wrong with the selectors in ``lines`` ((file, line number, text) triples)."""
    bad = []
    for rel, n, line in lines:
        for value in SELECTOR.findall(line):
            try:
                chosen = parse_selection(value)
            except ValueError as exc:
                bad.append(f"{rel}:{n}: {value!r} does not parse ({exc})")
                continue
            m = _module_of_line(line)
            if m is None:
                continue
            if m.id in chosen and not any(w in line.lower() for w in ON_PURPOSE):
                bad.append(f"{rel}:{n}: {value!r} applies the answer key of module {m.id}, which the line runs")
            missing = [i for i in prerequisites(m.id) if i not in chosen]
            if missing and value not in ("0", "") and m.id not in chosen:
                bad.append(f"{rel}:{n}: {value!r} for module {m.id} misses its prerequisites {missing}")
    return bad


def test_every_printed_selector_parses_and_never_applies_the_module_it_runs():
    bad = selector_problems(_lines())
    assert not bad, "\n".join(bad)


def test_every_grading_and_notebook_command_names_a_registry_module():
    ids = set(module_ids())
    bad = [f"{rel}:{n}: {value!r}" for rel, n, line in _lines() for value in COMMAND.findall(line)
           if value not in ids and value not in {"ID", "tests"} and not value.startswith(("tests", "-"))]
    assert not bad, "commands naming no module:\n" + "\n".join(bad)


def test_every_lesson_names_its_grading_command():
    for m in MODULES:
        text = (REPO_ROOT / m.lesson).read_text(encoding="utf-8")
        assert f"./test.sh {m.id}" in text, f"{m.lesson} does not say how to grade module {m.id}"


def test_a_lesson_header_that_lists_test_files_lists_all_of_them():
    # a fresh student's trial: the lineage lesson's header named two of the three files ./test.sh ran
    bad = []
    for m in MODULES:
        head = "\n".join((REPO_ROOT / m.lesson).read_text(encoding="utf-8").splitlines()[:12])
        if "tests/test_" in head:
            bad += [f"{m.lesson}: {t}" for t in m.tests if t not in head]
    assert not bad, "lesson headers missing a test file ./test.sh ID runs:\n" + "\n".join(bad)


@pytest.mark.parametrize("line, ok", [
    ("G2C_APPLY_SOLUTIONS=01-16 .venv/bin/python -m pytest tests/test_kvcache.py", False),   # replaces 16
    ("G2C_APPLY_SOLUTIONS=01-11 .venv/bin/python -m pytest tests/test_kvcache.py", True),
    ("G2C_APPLY_SOLUTIONS=03 .venv/bin/python -m pytest tests/test_transformer.py", False),  # misses 05, 07, 08
    ("./notebook.sh 09 --apply 09   # the answer key, on purpose", True),
    ("G2C_APPLY_SOLUTIONS=01-99x pytest", False),                                            # does not parse
])
def test_the_selector_check_rejects_the_classic_mistakes(line, ok):
    assert (selector_problems([("x.md", 1, line)]) == []) is ok
