"""``bench/serving_lab.py --quick`` (the CI smoke run of the specdec-lab serving lab)."""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest

from g2c.course import REPO_ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("g2c_bench_serving_lab", REPO_ROOT / "bench" / "serving_lab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_serving_lab_exports_prompt_sets(tmp_path):
    bench = _bench()
    assert bench.main(["--export-prompts", str(tmp_path / "p")]) == 0
    for name, texts in bench.PROMPT_SETS.items():
        lines = (tmp_path / f"p-{name}.jsonl").read_text().splitlines()
        assert [json.loads(x)["prompt"] for x in lines] == texts


def test_fp32_intensity_is_half_b_times_k_plus_one_without_kv():
    bench = _bench()
    assert bench.fp32_intensity(30_000_000, 8, 4, 0, 1000) == pytest.approx(20.0)


@pytest.mark.ladder
def test_serving_lab_quick_writes_csv_and_plots(tmp_path):
    bench = _bench()
    assert bench.main(["--quick", "--batches", "1,2", "--ks", "2", "--new-tokens", "4", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "serving_lab.csv")))
    assert len(rows) == 2 * 2 * 2          # prompt sets x batches x {plain, k=2}
    for r in rows:
        assert float(r["throughput_tok_s"]) > 0 and r["threads"] == "1"
        if r["config"] == "plain":
            assert float(r["tau"]) == 1.0 and float(r["speedup"]) == 1.0
        else:
            assert 1.0 <= float(r["tau"]) <= 3.0
    assert (tmp_path / "speedup_vs_batch.png").stat().st_size > 0
    assert (tmp_path / "itl_hist.png").stat().st_size > 0
