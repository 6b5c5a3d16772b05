"""The lessons stay readable and true (issue 54, item 6): every Beyond lesson opens its work with a
"Before you start", no lesson states the untouched scaffold's test counts by hand (they went stale; the
lessons point to ``scripts/pristine_counts.py``, which reads the recorded contract), and every relative
link between the docs (lessons, ``docs/performance.md``, ``docs/changelog.md``) reaches a file and, with a
``#fragment``, a heading of that file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from g2c.course import MODULES, REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import pristine_counts  # noqa: E402

BEYOND = sorted((REPO_ROOT / "docs" / "beyond").glob("*.md"))
DOCS = sorted({*(REPO_ROOT / "docs").rglob("*.md"), REPO_ROOT / "README.md"})
LINK = re.compile(r"\]\(([^)\s]+)\)")
# "34 tests pass ... and 43 fail", "(1 pass, 19 fail on the scaffold)": a count of the untouched scaffold
COUNT = re.compile(r"\b(\d+) (?:tests? )?pass(?:es)?\b[^.;]{0,60}?\b(\d+) fail")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.+)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_the_count_script_reads_the_recorded_contract():
    record = json.loads(pristine_counts.PRISTINE.read_text(encoding="utf-8"))
    for m in MODULES:
        rows = pristine_counts.counts(m.id, record)
        assert [r[0] for r in rows] == list(m.tests)
        assert all((p, f) == (record[t]["passed"], record[t]["failed"]) for t, p, f in rows)
    # the seed's contract, stated in its lesson, is what the record holds
    assert pristine_counts.counts("specdec", record)[0] == ("tests/test_specdec.py", 5, 15)
    fake = {t: {"passed": 2, "failed": 3} for m in MODULES for t in m.tests}
    assert pristine_counts.render("specdec", fake).splitlines()[-1].startswith("  total: 6 pass, 9 fail")


def test_the_count_script_refuses_an_unknown_module_and_a_missing_record():
    with pytest.raises(KeyError, match="specdec-sampling"):
        pristine_counts.counts("specdec-sampler")
    with pytest.raises(LookupError, match="contract.py --record"):
        pristine_counts.counts("specdec", {})
    run = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "pristine_counts.py"), "nope"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "no module 'nope'" in run.stderr


def test_no_lesson_states_scaffold_counts_by_hand():
    bad = []
    for m in MODULES:
        for n, line in enumerate((REPO_ROOT / m.lesson).read_text(encoding="utf-8").splitlines(), 1):
            for hit in COUNT.finditer(line):
                if (m.id, hit.groups()) != ("specdec", ("5", "15")):   # the seed's fixed contract
                    bad.append(f"{m.lesson}:{n}: {hit.group(0)!r}")
    assert not bad, "say `python scripts/pristine_counts.py ID` instead:\n" + "\n".join(bad)


def test_the_count_pattern_catches_the_stale_phrasings():
    for text in ("(1 pass, 19 fail on the untouched scaffold", "34 tests pass (the provided code) and 43 fail",
                 "(12 pass, 13 fail on the scaffold)"):
        assert COUNT.search(text), text


@pytest.mark.parametrize("lesson", BEYOND, ids=lambda p: p.name)
def test_every_beyond_lesson_has_a_before_you_start(lesson):
    text = lesson.read_text(encoding="utf-8")
    assert "\n## Before you start\n" in text, f"{lesson.name} has no '## Before you start'"
    section = text.split("\n## Before you start\n", 1)[1].split("\n## ", 1)[0]
    module = next((m for m in MODULES if m.lesson == f"docs/beyond/{lesson.name}"), None)
    if module is not None:
        assert f"./test.sh {module.id}" in section, f"{lesson.name}: 'Before you start' names no grading command"


def test_every_relative_link_between_the_docs_resolves():
    bad = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                if target.startswith(("http://", "https://", "mailto:")):
                    continue
                path, _, fragment = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                rel = doc.relative_to(REPO_ROOT)
                if not dest.exists():
                    bad.append(f"{rel}:{n}: {target} (no such file)")
                elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
                    bad.append(f"{rel}:{n}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_the_anchor_rule_matches_github():
    assert slug("Is verification free here? The decode roofline and module 16's fast path (issue 23)") == \
        "is-verification-free-here-the-decode-roofline-and-module-16s-fast-path-issue-23"
    assert slug("One loop: `speculative_sample`") == "one-loop-speculative_sample"
