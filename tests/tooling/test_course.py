"""The course registry and the G2C_APPLY_SOLUTIONS selector grammar (CONVENTIONS §1-2)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from g2c.course import MODULES, REPO_ROOT, get_module, module_for_file, module_ids, parse_selection

NUMBERED_UP_TO_11 = ["03", "03b", "04", "05", "06", "07", "08", "09", "09b", "10", "11"]


# --- selector grammar -------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["all", "ALL", "1", " all "])
def test_parse_selection_all_selects_every_module(spec):
    assert parse_selection(spec) == module_ids()


@pytest.mark.parametrize("spec", ["", "0", None, "   ", " 0 "])
def test_parse_selection_empty_or_zero_selects_nothing(spec):
    assert parse_selection(spec) == []


def test_parse_selection_list_returns_course_order():
    assert parse_selection("specdec,11,09") == ["09", "11", "specdec"]


def test_parse_selection_list_ignores_whitespace_and_duplicates():
    assert parse_selection(" 03b , 03,03 ,, ") == ["03", "03b"]


def test_parse_selection_range_01_11_includes_lettered_ids():
    assert parse_selection("01-11") == NUMBERED_UP_TO_11
    assert "specdec" not in parse_selection("01-11")


def test_parse_selection_range_with_non_id_ends():
    assert parse_selection("3-9") == ["03", "03b", "04", "05", "06", "07", "08", "09", "09b"]
    assert parse_selection("12-15") == []
    assert parse_selection("12-99") == ["16"]


def test_parse_selection_range_with_whitespace():
    assert parse_selection(" 07 - 08 ") == ["07", "08"]


def test_parse_selection_mixes_ranges_and_ids():
    assert parse_selection("specdec, 09-09") == ["09", "09b", "specdec"]


@pytest.mark.parametrize("spec", ["bogus", "03,bogus", "3", "03c", "a-b"])
def test_parse_selection_unknown_id_lists_valid_ids(spec):
    with pytest.raises(ValueError, match=r"Valid ids: 03, 03b, 04.*specdec"):
        parse_selection(spec)


def test_parse_selection_reversed_range_is_an_error():
    with pytest.raises(ValueError, match=r"start > end"):
        parse_selection("11-03")


# --- registry invariants ----------------------------------------------------------------

def test_registry_ids_unique_and_ordered():
    ids = module_ids()
    assert len(ids) == len(set(ids))
    numbered = [m for m in MODULES if m.number is not None]
    assert [m.number for m in numbered] == sorted(m.number for m in numbered)
    assert ids[:len(NUMBERED_UP_TO_11)] == NUMBERED_UP_TO_11


def test_registry_each_file_owned_once():
    owners: dict[str, str] = {}
    for m in MODULES:
        for f in m.files:
            assert f not in owners, f"{f} owned by both {owners[f]} and {m.id}"
            owners[f] = m.id
            assert f.startswith("g2c/") and f.endswith(".py"), f


def test_registry_every_solution_file_is_owned():
    for sol in sorted((REPO_ROOT / "solutions" / "g2c").rglob("*.py")):
        rel = sol.relative_to(REPO_ROOT / "solutions").as_posix()
        assert module_for_file(rel) is not None, f"solutions/{rel} is owned by no module in g2c/course/registry.py"


def test_registry_lesson_and_notebook_paths_shaped_right():
    for m in MODULES:
        assert re.fullmatch(rf"notebooks/clean/{re.escape(m.id)}-[a-z0-9-]+\.ipynb", m.notebook), m.notebook
        assert re.fullmatch(r"docs/(modules|beyond)/[a-z0-9-]+\.md", m.lesson), m.lesson
        if m.number is not None:
            assert m.lesson == f"docs/modules/{m.id}-{m.slug}.md"
        assert m.title


def test_get_module_is_case_insensitive():
    assert get_module("03B").id == "03b"
    assert get_module(" specdec ").id == "specdec"
    assert get_module("6").id == "06" and get_module("3b").id == "03b" and get_module("9B").id == "09b"


def test_did_you_mean_names_the_close_ids_and_stays_quiet_otherwise():
    from g2c.course.registry import did_you_mean

    names = ["StoryLM-30M", "StoryLM-30M-EAGLE", "StoryLM-30M-EAGLE3", "StoryLM-30M-Medusa"]
    assert did_you_mean("eagle", names) == " (did you mean 'StoryLM-30M-EAGLE'?)"      # a name's last part
    assert did_you_mean("StoryLM-30M-Medusaa", names) == " (did you mean 'StoryLM-30M-Medusa'?)"
    assert did_you_mean("", names) == "" and did_you_mean("x", names) == "" and did_you_mean("zzzz", names) == ""
    with pytest.raises(ValueError, match=r"unknown course module id 'specdek' \(did you mean 'specdec'\?\)"):
        get_module("specdek")


def test_get_module_unknown_id_lists_valid_ids():
    with pytest.raises(ValueError, match=r"valid ids: 03, 03b.*specdec"):
        get_module("99")


def test_module_for_file_accepts_backslashes():
    assert module_for_file("g2c\\nn\\layers.py").id == "03"
    assert module_for_file("g2c/course/registry.py") is None
    assert Path(REPO_ROOT / "g2c" / "course" / "registry.py").is_file()


def test_readme_module_table_matches_registry():
    import importlib.util

    script = REPO_ROOT / "scripts" / "readme_table.py"
    spec = importlib.util.spec_from_file_location("g2c_readme_table", script)
    readme_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(readme_table)
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert readme_table.readme_with_table(text) == text, (
        "README module table is stale: run `python scripts/readme_table.py --write`"
    )
    for m in MODULES:
        assert f"| {m.id} | {m.title} |" in text
        assert f"`./test.sh {m.id}`" in text                    # the one grading command per module
    assert "```mermaid" in text and "m_16 --> m_11" in text      # the module graph, generated
    contributing = (REPO_ROOT / "docs" / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert readme_table.contributing_with_layers(contributing) == contributing, (
        "docs/CONTRIBUTING.md layer map is stale: run `python scripts/readme_table.py --write`")


def test_registry_graph_requires_earlier_modules_and_closure_is_computed(monkeypatch):
    from g2c.course import registry

    assert registry.prerequisites("16") == ["03", "04", "05", "07", "08", "09", "11"]
    assert registry.dependents("specdec") == ["specdec-sampling", "specdec-trees", "specdec-lab", "specdec-state",
                                              "specdec-lineage", "specdec-serving"]
    assert registry.prerequisites("specdec-lineage")[-5:] == ["16", "specdec", "specdec-sampling", "specdec-trees",
                                                             "specdec-state"]
    assert registry.grading_selection("16", ["09", "16"]) == ["03", "04", "05", "07", "08", "11"]
    bad = (*registry.MODULES[:2], registry.CourseModule("zz", "Z", ("g2c/zz.py",), "l", "n", (), ("specdec",)))
    monkeypatch.setattr(registry, "MODULES", bad)
    with pytest.raises(ValueError, match="module zz requires 'specdec', which is not an earlier module id"):
        registry.check_graph()


def test_share_cores_gives_parallel_processes_one_share_each_and_keeps_a_chosen_value(monkeypatch):
    """Side-by-side pytest/kernel processes must not each start a thread per core (the oversubscription
    that made the fake-device step 3-4x slower): share_cores sets OMP_NUM_THREADS for the children."""
    from g2c.course import progress
    from g2c.course.progress import share_cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(progress, "CGROUP_CPU_MAX", "/nonexistent/cpu.max")          # no container quota
    monkeypatch.setattr(progress, "CGROUP_V1_QUOTA", ("/nonexistent/q", "/nonexistent/p"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert share_cores(1) == 0 and "OMP_NUM_THREADS" not in os.environ    # one process: torch's default
    assert share_cores(3) == 2 and os.environ["OMP_NUM_THREADS"] == "2"   # 8 cores // 3 jobs
    assert share_cores(8) == 2                                             # already set: kept
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert share_cores(4) == 5 and os.environ["OMP_NUM_THREADS"] == "5"   # the user's choice wins
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert share_cores(16) == 1 and os.environ["OMP_NUM_THREADS"] == "1"  # never below one thread


@pytest.mark.parametrize("v2, v1, cores", [
    (None, None, 8),                          # no cgroup files: the affinity mask
    ("max 100000\n", None, 8),                # v2, no limit
    ("150000 100000\n", None, 2),             # docker --cpus=1.5: rounded up
    ("50000 100000\n", None, 1),              # half a CPU: still one
    ("3200000 100000\n", None, 8),            # a quota above the mask: the mask
    ("garbage\n", None, 8),                   # unreadable: no cap
    (None, ("200000", "100000"), 2),          # cgroup v1 quota / period
    (None, ("-1", "100000"), 8),              # v1, no limit
])
def test_usable_cores_caps_the_affinity_mask_by_a_container_quota(tmp_path, monkeypatch, v2, v1, cores):
    """A container limited to 2 CPUs on a 64-core host still lists 64 cores in its affinity mask; ./test.sh
    would start 8 workers and oversubscribe it. usable_cores reads the cgroup quota (v2 cpu.max, else v1)."""
    from g2c.course import progress

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    v2_path, q, p = tmp_path / "cpu.max", tmp_path / "quota", tmp_path / "period"
    if v2 is not None:
        v2_path.write_text(v2, encoding="ascii")
    if v1 is not None:
        q.write_text(v1[0] + "\n", encoding="ascii")
        p.write_text(v1[1] + "\n", encoding="ascii")
    monkeypatch.setattr(progress, "CGROUP_CPU_MAX", str(v2_path))
    monkeypatch.setattr(progress, "CGROUP_V1_QUOTA", (str(q), str(p)))
    monkeypatch.setattr(progress, "PROC_CGROUP", str(tmp_path / "no-proc-cgroup"))
    assert progress.usable_cores() == cores


@pytest.mark.parametrize("root, nested, cores", [
    ("max 100000\n", {"user.slice": "200000 100000\n"}, 2),                    # a slice's quota, no namespace
    ("max 100000\n", {"user.slice": "400000 100000\n",
                      "user.slice/job.scope": "100000 100000\n"}, 1),         # the tightest along the path
    ("300000 100000\n", {"user.slice": "max 100000\n"}, 3),                    # the root's quota still counts
    ("max 100000\n", {}, 8),                                                   # no nested files: no cap
])
def test_usable_cores_reads_the_quota_of_its_own_cgroup_path(tmp_path, monkeypatch, root, nested, cores):
    """A process limited by a systemd slice or a batch job (no cgroup namespace) sees the host's root
    cpu.max with no limit; its quota is in the cpu.max of its own cgroup (/proc/self/cgroup) or an
    ancestor, and the tightest one counts."""
    from g2c.course import progress

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    (tmp_path / "cpu.max").write_text(root, encoding="ascii")
    for rel, text in nested.items():
        (tmp_path / rel).mkdir(parents=True, exist_ok=True)
        (tmp_path / rel / "cpu.max").write_text(text, encoding="ascii")
    (tmp_path / "proc-cgroup").write_text("1:cpu:/\n0::/user.slice/job.scope\n", encoding="ascii")
    monkeypatch.setattr(progress, "CGROUP_CPU_MAX", str(tmp_path / "cpu.max"))
    monkeypatch.setattr(progress, "PROC_CGROUP", str(tmp_path / "proc-cgroup"))
    monkeypatch.setattr(progress, "CGROUP_V1_QUOTA", ("/nonexistent/q", "/nonexistent/p"))
    assert progress.usable_cores() == cores
