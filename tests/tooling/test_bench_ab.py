"""bench/ab.py: the interleaved two-checkout comparison reads the bench's rows and refuses bad use."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _ab():
    spec = importlib.util.spec_from_file_location("bench_ab", ROOT / "bench" / "ab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_are_keyed_by_table_and_drafter():
    rows = _ab().rows_of({"tables": {"story T=0": [{"drafter": "EAGLE", "speedup_cpu": 1.7},
                                                   {"note": "no drafter: skipped"}],
                                     "dialogue T=0": [{"drafter": "EAGLE", "speedup": 1.2}]}})
    assert rows == {("story T=0", "EAGLE"): {"drafter": "EAGLE", "speedup_cpu": 1.7},
                    ("dialogue T=0", "EAGLE"): {"drafter": "EAGLE", "speedup": 1.2}}
    assert list(_ab().rows_of({"rows": [{"drafter": "x", "speedup": 2.0}]})) == [("", "x")]


@pytest.mark.parametrize("argv, words", [
    (["--a", ".", "--b", "."], "give the bench command after --"),
    (["--a", ".", "--b", ".", "--repeats", "0", "--", "bench/lineage.py"], "--repeats must be >= 1"),
    (["--a", "/nonexistent-g2c", "--b", ".", "--", "bench/lineage.py"], "has no bench/lineage.py"),
])
def test_bad_use_is_one_argparse_line(argv, words, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_:
        _ab().main(argv)
    assert exit_.value.code == 2
    assert words in capsys.readouterr().err


def test_markdown_rows_are_keyed_by_drafter_mode_and_k():
    text = ("Measured with `...`.\n\n| drafter | target | mode | k | speed-up | speed-up (CPU time) |\n"
            "|---|---|---|---|---|---|\n| LM | 30M | greedy | 4 | 2.10x | 2.20x |\n"
            "| LM | 30M | sampled | 4 | 1.50x | 1.60x |\n\n(note)\n")
    assert _ab().rows_of_markdown(text) == {
        ("", "LM greedy k=4"): {"drafter": "LM greedy k=4", "speedup": 2.10, "speedup_cpu": 2.20},
        ("", "LM sampled k=4"): {"drafter": "LM sampled k=4", "speedup": 1.50, "speedup_cpu": 1.60}}
    assert _ab().rows_of_markdown("no table here") == {}
