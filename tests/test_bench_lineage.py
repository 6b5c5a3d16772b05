"""``bench/lineage.py --quick`` (the smoke run of the specdec-lineage benchmark) on the shipped drafters."""

from __future__ import annotations

import importlib.util
import json

import pytest

from g2c.course import REPO_ROOT


def _bench():
    spec = importlib.util.spec_from_file_location("g2c_bench_lineage", REPO_ROOT / "bench" / "lineage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with_windows(head_name: str):
    """(the bench module, StoryLM-30M, the shipped head) with the validation split tokenised (what
    ./datasets.sh does, offline, on a fresh clone): the measurement-only modes read its windows."""
    from g2c.assets.artifacts import load_model
    from g2c.assets.data import DATA_DIR, prepare, tokenize_splits

    bench = _bench()
    if not (DATA_DIR / "val.txt").is_file():
        prepare(log=lambda line: None)
    tokenize_splits(bench.load_story_tokenizer(), log=lambda line: None)
    return bench, load_model("StoryLM-30M")[0], load_model(head_name)[0]


def test_prompt_sets_are_story_endings_and_dialogue(tmp_path):
    bench = _bench()
    from g2c.assets import load_story_tokenizer
    from g2c.assets.data import prepare

    prepare(out_dir=tmp_path, log=lambda line: None)                  # the shipped sample, offline
    tok = load_story_tokenizer()
    sets = bench.prompt_sets(tok, 3, data_dir=tmp_path)
    assert list(sets) == ["story endings", "dialogue"]
    for prompts in sets.values():
        assert len(prompts) == 3 and all(1 <= len(p) <= 160 for p in prompts)
    assert all(tok.decode(p.tolist()).endswith(', "') for p in sets["dialogue"])


@pytest.mark.ladder
def test_lineage_quick_runs_every_row_losslessly(tmp_path):
    bench = _bench()
    out = tmp_path / "lineage.json"
    assert bench.main(["--quick", "--prompts", "1", "--new-tokens", "8", "--threads", "1", "--json", str(out),
                       "--figure", str(tmp_path / "lineage.png")]) == 0
    data = json.loads(out.read_text())
    rows = [r["drafter"] for r in data["tables"]["story endings T=0.0"]]
    assert rows == [r[0] for r in bench.ROWS]
    for name, table in data["tables"].items():
        for r in table:
            assert r["tau"] >= 1.0 and r["spec_tps"] > 0
            assert r["lossless"] == ("1/1" if name.endswith("T=0.0") else "-"), (name, r["drafter"])
    assert set(data["cost_curves"]) >= {"Block (one pass)", "EAGLE (chain)"}
    sampled = {r["drafter"]: r for r in data["sampled_drafts"]}             # issue 29: tau with sampled drafts
    assert set(sampled) == {r[0] for r in bench.ROWS if r[2] in bench.LINEAGE_KINDS}
    assert all(r["greedy"] >= 1.0 and r["top"] >= 1.0 and r["sample"] >= 1.0 for r in sampled.values())
    assert all(r["draws"] == 1 and r["sample_range"] == [r["sample"]] * 2 for r in sampled.values())   # --quick: 1
    eagle = next(r for r in data["tables"]["story endings T=0.0"] if r["drafter"] == "EAGLE")
    assert eagle["tokens_seen"] == "5,734,400"
    assert (tmp_path / "lineage.png").stat().st_size > 10_000


@pytest.mark.ladder
def test_lineage_fast_greedy_only_times_every_row(tmp_path):
    """--fast: every row's target and drafter on the fast path, plus plain cached decoding on it; the
    speed-ups stay over plain cached decoding on the teaching path; each row's time is split into
    the target's passes, the drafter and the rest (shares of its wall time)."""
    bench = _bench()
    out = tmp_path / "fast.json"
    assert bench.main(["--fast", "--greedy-only", "--quick", "--prompts", "1", "--new-tokens", "8", "--threads", "1",
                       "--rows", "StoryLM-1M,Medusa,EAGLE static tree,MTP", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["fast"] is True and list(data["tables"]) == ["story endings T=0.0"]
    rows = {r["drafter"]: r for r in data["tables"]["story endings T=0.0"]}
    assert list(rows) == ["plain cached (fast path)", "StoryLM-1M", "Medusa", "EAGLE static tree", "MTP"]
    assert rows["plain cached (fast path)"]["tau"] == 1.0 and rows["plain cached (fast path)"]["time_split"] is None
    for name, r in rows.items():
        assert r["lossless"] == "1/1", name                  # the fast path emits plain greedy decoding's tokens
        if r["time_split"] is not None:
            target, draft, verify, other = r["time_split"]
            assert target > 0 and draft > 0 and verify > 0, name
            assert target + draft + verify + other == pytest.approx(1.0) and other < 0.5, name


def test_verify_clock_times_the_engines_walk_and_puts_it_back():
    """VerifyClock wraps the drafts' acceptance walks (Draft.accept for chains, DraftTree.accept for trees)
    for one run and restores them, also when the run raises."""
    bench = _bench()
    import torch

    from g2c.specdec.sampling.draft import Draft
    from g2c.specdec.sampling.drafters import Sampler
    from g2c.specdec.sampling.loop import verify_round
    from g2c.specdec.trees import DraftTree

    originals = (Draft.accept, DraftTree.accept)
    logits = torch.zeros(3, 5)
    logits[:, 2] = 1.0
    with bench.VerifyClock() as clock:
        assert Draft.accept is not originals[0] and DraftTree.accept is not originals[1]
        assert Draft(torch.tensor([2, 2])).accept(logits, verify_round, sampler=Sampler(0.0, None, None)) == (2, 2)
    assert (Draft.accept, DraftTree.accept) == originals and clock.seconds > 0
    with pytest.raises(RuntimeError), bench.VerifyClock():
        raise RuntimeError("a row failed")
    assert (Draft.accept, DraftTree.accept) == originals


@pytest.mark.ladder
def test_lineage_packed_min_rows_needs_fast_and_is_restored(tmp_path, capsys):
    """--packed-min-rows picks the fast path's float32 kernel for one run: refused without --fast, and the
    course's own choice (g2c.kvcache.fast.PACKED_MIN_ROWS) is back afterwards."""
    import torch

    from g2c.kvcache import fast

    bench = _bench()
    with pytest.raises(SystemExit) as info:
        bench.main(["--greedy-only", "--packed-min-rows", "4"])
    assert info.value.code == 2 and "add --fast" in capsys.readouterr().err
    before = dict(fast.PACKED_MIN_ROWS)
    assert bench.main(["--fast", "--greedy-only", "--quick", "--prompts", "1", "--new-tokens", "4", "--threads", "1",
                       "--rows", "MTP", "--packed-min-rows", "4", "--json", str(tmp_path / "p.json")]) == 0
    assert fast.PACKED_MIN_ROWS == before and before[torch.float32] == 2


@pytest.mark.ladder
def test_ttt_agreement_and_draft_vocabulary_measure_the_shipped_eagle3():
    """--ttt-agreement-only and --draft-vocab-only (issue 29): step 1 does not depend on how many steps are
    unrolled after it (the training-time-test mask; only the positions counted differ); a draft
    vocabulary of every token covers every target pick and agrees as the unrestricted head does; a
    smaller one covers less and never agrees more."""
    bench, target, head = _with_windows("StoryLM-30M-EAGLE3")
    one, three = bench.ttt_agreement(target, head, steps=1, windows=1), bench.ttt_agreement(target, head, steps=3,
                                                                                              windows=1)
    # 255 positions unroll one step, 253 three: the same step-1 hits, up to the 2 positions dropped
    assert len(one) == 1 and len(three) == 3 and one[0] == pytest.approx(three[0], abs=2 / 253)
    assert 0.3 < three[0] < 1.0
    small, full = bench.draft_vocab(target, head, sizes=(64,), steps=3, windows=1, repeats=3)
    assert small["size"] == 64 and full["size"] == target.vocab_size and full["coverage"] == 1.0
    assert full["agree"] == pytest.approx(three, abs=1e-6)
    assert small["coverage"] < 1.0 and all(s <= f + 1e-9 for s, f in zip(small["agree"], full["agree"]))
    assert small["unembed_ms"] > 0 and "logits" not in vars(head)           # the head's own method is back


@pytest.mark.ladder
def test_block_agreement_reads_the_corpus_and_the_targets_own_text(tmp_path, monkeypatch):
    """--block-agreement-only (issue 29, the self-distillation variant): one row per text, a value per slot;
    the greedy text is the target's own (its next token is the target's argmax past the corpus prompt),
    and it is cached under runs/features (here tmp_path), never over the corpus."""
    from g2c.assets.recipes import features

    monkeypatch.setattr(features, "FEATURES_DIR", tmp_path / "features")
    bench, target, head = _with_windows("StoryLM-30M-Block")
    out = bench.block_agreement(target, head, windows=1)
    assert list(out) == ["corpus", "greedy 32", "greedy 160"] and all(len(row) == head.block_size
                                                                      for row in out.values())
    assert all(0.0 <= a <= 1.0 for row in out.values() for a in row) and out["corpus"] != out["greedy 32"]
    assert out["corpus"][0] > 0.4 and out["greedy 32"][0] > 0.4   # a trained head's slot 1 (0.59, 0.84 on 16)
    text, n = features.target_continuations(target, "StoryLM-30M", "val", max_windows=1, progress=False)
    assert n == 1 and (tmp_path / "features" / "StoryLM-30M" / "val-greedy-p32-ctx256-w1.i32").is_file()
    import torch
    with torch.no_grad():
        picks = target(text[None, :-1])[0].argmax(-1)
    assert picks[31:].tolist() == text[32:].tolist()


@pytest.mark.ladder
def test_sampled_drafts_pool_several_draws_per_prompt(tmp_path, capsys):
    """--sampled-drafts-only --draws 2: tau at T > 0 pools two generations per prompt (different generator
    seeds), and the table gives the range of one draw's tau around the pooled value."""
    bench = _bench()
    out = tmp_path / "sampled.json"
    assert bench.main(["--sampled-drafts-only", "--rows", "Medusa", "--prompts", "1", "--new-tokens", "12",
                       "--no-sweep", "--threads", "1", "--draws", "2", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["sampled_drafts"]
    assert row["drafter"] == "Medusa" and row["draws"] == 2
    for mode in ("top", "sample"):
        lo, hi = row[f"{mode}_range"]
        assert 1.0 <= lo <= row[mode] <= hi, (mode, row)
    assert "2 draws per prompt pooled" in capsys.readouterr().out
    # the disk refuses the json: one line, exit 1, the table printed (a file where a folder should be)
    (tmp_path / "afile").write_text("")
    assert bench.save_json(tmp_path / "afile" / "x.json", {"a": 1}) == 1
    assert "could not write" in capsys.readouterr().err


def test_measurement_only_modes_are_exclusive_and_pick_their_row(capsys):
    """--ttt-agreement-only, --draft-vocab-only, --medusa-joint-only: one at a time, each defaults --rows to its
    own row (so no other drafter is loaded) and refuses options it would ignore, before loading anything."""
    bench = _bench()
    assert bench.parse_args(["--ttt-agreement-only"]).rows == "EAGLE-3"
    assert bench.parse_args(["--draft-vocab-only"]).rows == "EAGLE-3"
    assert bench.parse_args(["--medusa-joint-only"]).rows == "Medusa"
    assert bench.parse_args(["--block-agreement-only"]).rows == "Block"
    assert bench.parse_args(["--sampled-drafts-only"]).rows.split(",") == [
        r[0] for r in bench.ROWS if r[2] in bench.LINEAGE_KINDS]                    # no small LM loaded for nothing
    assert bench.parse_args(["--ttt-agreement-only", "--rows", "Medusa,EAGLE-3"]).rows == "Medusa,EAGLE-3"
    for argv, message in ((["--ttt-agreement-only", "--draft-vocab-only"], "are separate measurements"),
                          (["--ttt-agreement-only", "--rows", "Medusa"], "measures the EAGLE-3 row: add it to --rows"),
                          (["--medusa-joint-only", "--rows", "EAGLE"], "measures the Medusa row"),
                          (["--block-agreement-only", "--rows", "EAGLE-3"], "measures the Block row"),
                          (["--block-agreement-only", "--temperature", "0.5"], "--temperature does not apply"),
                          (["--draft-vocab-only", "--json", "out.json"], "--json does not apply to it"),
                          (["--ttt-agreement-only", "--fast"], "--fast does not apply to it"),
                          (["--sampled-drafts-only", "--figure", "f.png"], "--figure does not apply to it"),
                          (["--greedy-only", "--draws", "3"], "--greedy-only prints no such table"),
                          (["--medusa-joint-only", "--draws", "2"], "--medusa-joint-only prints no such table"),
                          (["--sampled-drafts-only", "--draws", "0"], "--draws"),
                          (["--sampled-drafts-only", "--rows", "StoryLM-1M,Medusa"], "StoryLM-1M is not one"),
                          # a helper's trial: each of these was accepted and ignored in silence
                          (["--sampled-drafts-only", "--greedy-only"], "--greedy-only contradicts it"),
                          (["--ttt-agreement-only", "--temperature", "0.5"], "--temperature does not apply to it"),
                          (["--draft-vocab-only", "--seed", "3"], "--seed does not apply to it"),
                          (["--medusa-joint-only", "--prompts", "2"], "--prompts does not apply to it"),
                          # a second trial: these were still accepted and ignored, and --draft-dtype said
                          # "add --fast", which the mode then refused
                          (["--block-agreement-only", "--new-tokens", "8"], "--new-tokens does not apply to it"),
                          (["--block-agreement-only", "--no-sweep"], "--no-sweep does not apply to it"),
                          (["--ttt-agreement-only", "--greedy-only"], "--greedy-only does not apply to it"),
                          (["--medusa-joint-only", "--quick"], "--quick does not apply to it"),
                          (["--block-agreement-only", "--draft-dtype", "bfloat16"],
                           "reads the drafters in float32 on the teaching path: --draft-dtype does not apply"),
                          (["--rows", "StoryLM-1M", "--drafters", "docs/bench/budgets/budget-512000"],
                           "no row in --rows StoryLM-1M uses one")):
        with pytest.raises(SystemExit) as info:
            bench.parse_args(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and message in err, (argv, err)


def test_a_drafter_missing_from_a_budget_tree_names_the_command_that_trains_it_there(tmp_path):
    """--drafters runs/budget-<T>[-<variant>] without a row's drafter: the message gives the --budget (and
    --variant) command that installs it in THAT tree, not ./checkpoints.sh (which installs artifacts/)."""
    bench = _bench()
    root = tmp_path / "budget-512000-kv"
    (root / "models" / "StoryLM-30M-Block").mkdir(parents=True)
    self_root = tmp_path / "budget-512000-self"
    (self_root / "models" / "StoryLM-30M-Block").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"holds no StoryLM-30M-EAGLE3 .*--train StoryLM-30M-EAGLE3 "
                                                r"--budget 512000 --variant self, or choose rows of the drafters it "
                                                r"holds \(StoryLM-30M-Block\) with --rows"):
        bench.load_heads(None, ["StoryLM-30M-EAGLE3"], self_root)
    # a helper's trial: Medusa has no variant kv, and the hint said to train it with --variant kv
    with pytest.raises(FileNotFoundError, match=r"holds no StoryLM-30M-Medusa .*has no variant 'kv', so it cannot "
                                                r"be trained there: choose rows of the drafters it holds"):
        bench.load_heads(None, ["StoryLM-30M-Medusa"], root)
    with pytest.raises(FileNotFoundError, match=r"--train StoryLM-30M-EAGLE --budget 1000000, or give a folder"):
        bench.load_heads(None, ["StoryLM-30M-EAGLE"], tmp_path / "budget-1000000")


@pytest.mark.ladder
def test_a_budget_folder_without_weights_or_with_the_wrong_ones_is_named(tmp_path, capsys):
    """A helper's trial: --drafters docs/bench/budgets/budget-<T> (manifests only, by design) said "run
    ./checkpoints.sh to install it", which repairs artifacts/ only; a folder holding another drafter's weights
    was a raw KeyError. Both name the folder and the command that helps."""
    import shutil

    from g2c.assets.artifacts import load_model

    bench = _bench()
    with pytest.raises(FileNotFoundError, match=r"StoryLM-30M-EAGLE holds a manifest but no weights \(docs/bench/"
                                                r"budgets/ keeps only the manifests\): give the run's own folder"):
        bench.load_heads(None, ["StoryLM-30M-EAGLE"], REPO_ROOT / "docs" / "bench" / "budgets" / "budget-512000")
    wrong = tmp_path / "budget-7" / "models" / "StoryLM-30M-EAGLE"
    shutil.copytree(REPO_ROOT / "artifacts" / "models" / "StoryLM-30M-MTP", wrong)
    target, _ = load_model("StoryLM-30M")
    with pytest.raises(ValueError, match=r"budget-7/models/StoryLM-30M-EAGLE does not load as StoryLM-30M-EAGLE "
                                         r"\(.*\); retrain it there with ./checkpoints.sh --train StoryLM-30M-EAGLE"):
        bench.load_heads(target, ["StoryLM-30M-EAGLE"], tmp_path / "budget-7")
    folder = str(REPO_ROOT / "docs" / "bench" / "budgets" / "budget-512000")
    assert bench.parse_args(["--drafters", folder]).drafters
    with pytest.raises(SystemExit):                       # the CLI's --drafter is not taken for --drafters
        bench.parse_args(["--drafter", folder])
    assert "unrecognized arguments: --drafter" in capsys.readouterr().err
