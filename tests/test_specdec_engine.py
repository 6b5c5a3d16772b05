"""The engine's equivalence matrix (issue 28): every speculative entry point, pinned.

Each old entry point (``speculative_generate_cached``, ``mtp_generate_cached``,
``tree_speculative_generate``, ``lineage_generate``, ``speculative_generate_stateful``,
``speculative_sample`` with each shipped drafter) runs on a sampled matrix: drafters,
recompute and cached targets, T = 0 and a sampled T with a fixed generator, k 1..6, and
prompt + budget from window - 3 to window + 3 on the ``SumModLM`` window mock (a context-sensitive
rule, so every window decision shows), plus a small random ``TransformerLM`` and a small
``RecurrentLM``. A run is recorded as its ids, its ``SpecStats`` counters (target passes,
drafted, accepted, generated) and its ``on_pass`` stream.

Two contracts:

* **Pinned:** each record equals the one recorded in ``tests/specdec_engine_pins.json``
  (recorded at ``9c58ccc``, before the loops became presets of one engine). This is what
  proves a preset still does what its old loop did, counters and callbacks included. A drift
  that was decided on purpose is re-recorded with
  ``python tests/test_specdec_engine.py --record`` and named in the lesson.
* **Oracle:** every greedy run equals plain decoding token for token (module 16's
  ``cached_generate`` for cached targets, module 11's ``generate`` for recompute targets,
  ``plain_greedy`` for a recurrent target), cut after ``eos_id``.

The matrix is sampled (a fixed ``random.Random``), tiny models keep it to seconds.
"""

from __future__ import annotations

import functools
import json
import random
import sys
from pathlib import Path

if __name__ == "__main__":          # recording: the pins are the answer key's behaviour
    from g2c.course.hook import use_solutions
    use_solutions("all")

import pytest  # noqa: E402
import torch  # noqa: E402
from specdec_mocks import SumModLM  # noqa: E402
from test_specdec_cached import _lm  # noqa: E402

from g2c.kvcache import cached_generate  # noqa: E402
from g2c.sampling import generate  # noqa: E402
from g2c.specdec import MTPHead  # noqa: E402

PINS = Path(__file__).parent / "specdec_engine_pins.json"


# -- the models ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _model(name: str):
    """Tiny models, built once: SumModLM window mocks (V = 7, window 8) and random LMs (V = 32)."""
    if name == "sum":                 # the target: next = sum of the visible ids mod 7
        return SumModLM(7, max_seq_len=8, margin=3.0).eval()
    if name == "sum-draft":           # a drafter that agrees often, not always
        return SumModLM(7, max_seq_len=8, modulus=6, margin=3.0).eval()
    if name == "lm":
        return _lm(2, max_seq_len=12)
    if name == "lm-draft":
        return _lm(3, dim=8, layers=1, max_seq_len=12)
    if name == "lm4":                 # four blocks: EAGLE-3 fuses three of them
        return _lm(2, layers=4, max_seq_len=12)
    if name.startswith("rnn-"):
        from g2c.recurrent import RecurrentLM, fan_in_init_
        layout = name[4:]
        m = RecurrentLM(16, 16, len(layout), 2, layout=layout, max_seq_len=12)
        return fan_in_init_(m, generator=torch.Generator().manual_seed(0)).eval()
    if name.startswith("rnn-draft-"):
        raise AssertionError(name)
    raise AssertionError(name)


@functools.lru_cache(maxsize=None)
def _rnn_draft(layout: str):
    from g2c.recurrent import perturbed_twin
    return perturbed_twin(_model("rnn-" + layout), sigma=0.6, generator=torch.Generator().manual_seed(1)).eval()


def _prompt(vocab: int, n: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# -- one run -----------------------------------------------------------------------------------
def _record(ids, stats, passes) -> dict:
    return {"ids": [int(t) for t in ids],
            "counters": [stats.target_passes, stats.drafted, stats.accepted, stats.generated],
            "passes": passes}


def _on_pass(passes):
    return lambda emitted, accepted: passes.append([[int(t) for t in emitted], int(accepted)])


def _sample_drafter(kind: str, target, sample: bool):
    from g2c.specdec.sampling.drafters import LMDrafter, NGramDrafter
    from g2c.specdec.sampling.eagle import EagleDrafter, FeatureDrafter, MTPDrafter
    if kind == "lm":
        return LMDrafter(_model("lm-draft" if target is _model("lm") else "sum-draft"), sample=sample)
    if kind == "lm-cached":
        return LMDrafter(_model("lm-draft" if target is _model("lm") else "sum-draft"), sample=sample,
                         use_cache=True)
    if kind == "ngram":
        return NGramDrafter()
    head_seed = _gen(0)
    if kind in ("mtp", "mtp-cached"):      # one MTP drafter; "mtp-cached" keeps the pins of its cached cases
        return MTPDrafter(MTPHead(target, generator=head_seed).eval(), sample=sample)
    if kind == "eagle":
        return EagleDrafter(FeatureDrafter(target, generator=head_seed).eval(), sample=sample)
    raise AssertionError(kind)


def _lineage_drafter(kind: str, target):
    from g2c.specdec.lineage import (
        BlockDrafter,
        BlockHead,
        Eagle3Drafter,
        Eagle3Head,
        EagleTreeDrafter,
        MedusaDrafter,
        MedusaHeads,
    )
    from g2c.specdec.sampling.eagle import FeatureDrafter
    g = _gen(0)
    if kind == "medusa":
        heads = MedusaHeads(target, 3)
        with torch.no_grad():
            heads.weight.normal_(0, 0.3, generator=g)
        return MedusaDrafter(heads)
    if kind == "eagle-chain":
        return EagleTreeDrafter(FeatureDrafter(target, generator=g).eval())
    if kind == "eagle2":
        return EagleTreeDrafter(FeatureDrafter(target, generator=g).eval(), width=3)
    if kind == "eagle-static":
        return EagleTreeDrafter(FeatureDrafter(target, generator=g).eval(), shape="static")
    if kind == "eagle3":
        return Eagle3Drafter(Eagle3Head(target, generator=g).eval(), width=2)
    if kind == "block":
        return BlockDrafter(BlockHead(target, block_size=4, generator=g).eval())
    raise AssertionError(kind)


def run_case(case: dict) -> dict:
    """Run one case of the matrix with its old entry point; the record it produced."""
    entry, model = case["entry"], case["model"]
    passes: list = []
    on_pass = _on_pass(passes)
    if entry == "speculative_generate_cached":
        from g2c.specdec.sampling.cached import speculative_generate_cached
        target = _model(model)
        drafter = _model("lm-draft" if model == "lm" else "sum-draft")
        ids, stats = speculative_generate_cached(target, drafter, case["prompt"], case["budget"], k=case["k"],
                                                 eos_id=case.get("eos"), on_pass=on_pass)
    elif entry == "mtp_generate_cached":
        from g2c.specdec.sampling.cached import mtp_generate_cached
        base = _model(model)
        head = MTPHead(base, generator=_gen(0)).eval()
        ids, stats = mtp_generate_cached(base, head, case["prompt"], case["budget"], eos_id=case.get("eos"),
                                         on_pass=on_pass)
    elif entry == "tree_speculative_generate":
        from g2c.specdec.trees import tree_speculative_generate
        target = _model(model)
        drafter = _model("lm-draft" if model == "lm" else "sum-draft")
        ids, stats = tree_speculative_generate(target, drafter, case["prompt"], case["budget"], tree=case["tree"],
                                               num_nodes=case["k"], width=2 if case["tree"] == "dynamic" else None,
                                               temperature=case["T"],
                                               generator=_gen(5), eos_id=case.get("eos"), on_pass=on_pass,
                                               use_cache=case["cached"])
    elif entry == "lineage_generate":
        from g2c.specdec.lineage import lineage_generate
        target = _model(model)
        drafter = _lineage_drafter(case["drafter"], target)
        ids, stats = lineage_generate(target, drafter, case["prompt"], case["budget"], num_nodes=case["k"],
                                      temperature=case["T"], generator=_gen(5), eos_id=case.get("eos"),
                                      acceptance=case.get("acceptance", "exact"), on_pass=on_pass)
    elif entry == "speculative_generate_stateful":
        from g2c.recurrent import greedy_drafter, speculative_generate_stateful
        target = _model(model)
        ids, stats, _ = speculative_generate_stateful(target, greedy_drafter(_rnn_draft(model[4:])), case["prompt"],
                                                      case["budget"], k=case["k"], strategy=case["strategy"],
                                                      eos_id=case.get("eos"))
        # this loop has no on_pass: its stream is rebuilt from the records the preset must keep
        passes = None
    elif entry == "speculative_sample":
        from g2c.specdec.sampling.loop import speculative_sample
        target = _model(model)
        drafter = _sample_drafter(case["drafter"], target, case["T"] > 0)
        ids, stats = speculative_sample(target, drafter, case["prompt"], case["budget"], k=case["k"],
                                        temperature=case["T"], generator=_gen(5), eos_id=case.get("eos"),
                                        on_pass=on_pass, use_cache=case["cached"])
    else:
        raise AssertionError(entry)
    return _record(ids.tolist(), stats, passes)


# -- the matrix ---------------------------------------------------------------------------------
def _lengths(window: int, rng: random.Random, vocab: int, seed: int, n: int = 3):
    """(prompt, budget) pairs with prompt + budget in window - 3 .. window + 3."""
    out = []
    for _ in range(n):
        total = window + rng.randint(-3, 3)
        plen = rng.randint(1, min(total - 1, window))
        out.append((_prompt(vocab, plen, seed + total * 31 + plen), total - plen))
    return out


def build_matrix() -> list[dict]:
    rng = random.Random(28)
    cases: list[dict] = []

    def add(**case):
        cases.append(case)

    # speculative_generate_cached: greedy, two models, k 1..6 (window >= k + 2 on the mock)
    for model, window, vocab in (("sum", 8, 7), ("lm", 12, 32)):
        for k in range(1, 7):
            for prompt, budget in _lengths(window, rng, vocab, k, n=2 if model == "sum" else 1):
                add(entry="speculative_generate_cached", model=model, k=k, T=0.0, prompt=prompt, budget=budget,
                    cached=True, eos=rng.choice([None, None, 3]))
    # mtp_generate_cached: k = 1, lengths around the window of a small LM
    for prompt, budget in _lengths(12, rng, 32, 100, n=4):
        add(entry="mtp_generate_cached", model="lm4", k=1, T=0.0, prompt=prompt, budget=budget, cached=True)
    # tree_speculative_generate: shapes x cached x T
    for model, window, vocab in (("sum", 8, 7), ("lm", 12, 32)):
        for tree in ("chain", "static", "dynamic"):
            for cached in (False, True):
                for T in (0.0, 0.8):
                    k = rng.randint(1, 6)
                    (prompt, budget), = _lengths(window, rng, vocab, 200 + k, n=1)
                    add(entry="tree_speculative_generate", model=model, tree=tree, k=k, T=T, prompt=prompt,
                        budget=budget, cached=cached, eos=rng.choice([None, None, 3]))
    # lineage_generate: every lineage drafter, T 0 and 0.8, typical acceptance once per drafter
    for drafter in ("medusa", "eagle-chain", "eagle2", "eagle-static", "eagle3", "block"):
        for T, acceptance in ((0.0, "exact"), (0.8, "exact"), (0.8, "typical")):
            k = rng.randint(1, 6)
            (prompt, budget), = _lengths(12, rng, 32, 300 + k, n=1)
            add(entry="lineage_generate", model="lm4", drafter=drafter, k=k, T=T, acceptance=acceptance,
                prompt=prompt, budget=budget, cached=True)
    # speculative_generate_stateful: recurrent and hybrid layouts, three transactions
    for layout in ("RR", "RA"):
        for strategy in ("snapshot", "replay", "recompute"):
            k = rng.randint(1, 6)
            window = 12
            total = window + rng.randint(-3, 1)            # a recurrent target refuses > window + 1
            plen = rng.randint(1, 6)
            add(entry="speculative_generate_stateful", model="rnn-" + layout, strategy=strategy, k=k, T=0.0,
                prompt=_prompt(16, plen, 400 + k), budget=total - plen, cached=True, eos=rng.choice([None, 3]))
    # speculative_sample: every chain drafter, recompute and cached targets, T 0 and 0.8
    for drafter in ("lm", "lm-cached", "ngram", "mtp", "mtp-cached", "eagle"):
        for cached in (False, True):
            if drafter == "mtp" and cached:
                continue                                    # the "mtp-cached" cases run it cached
            for T in (0.0, 0.8):
                models = (("sum", 8, 7), ("lm", 12, 32)) if drafter in ("lm", "lm-cached", "ngram") \
                    else (("lm", 12, 32),)
                for model, window, vocab in models:
                    k = rng.randint(1, 6)
                    (prompt, budget), = _lengths(window, rng, vocab, 500 + k, n=1)
                    add(entry="speculative_sample", model=model, drafter=drafter, k=k, T=T, prompt=prompt,
                        budget=budget, cached=cached, eos=rng.choice([None, None, 3]))
    return cases


def case_id(case: dict) -> str:
    keys = ("entry", "model", "drafter", "tree", "strategy", "acceptance", "k", "T", "cached", "budget")
    return "-".join(str(case[key]) for key in keys if key in case) + "-p" + str(len(case["prompt"]))


MATRIX = build_matrix()
IDS = [case_id(c) for c in MATRIX]


@functools.lru_cache(maxsize=1)
def _pins() -> dict:
    return json.loads(PINS.read_text())


def test_matrix_ids_are_unique_and_pinned():
    assert len(set(IDS)) == len(IDS)
    assert set(IDS) == set(_pins()), "the matrix changed: re-record (python tests/test_specdec_engine.py --record)"


_RUNS: dict[str, dict] = {}


def _run(case: dict) -> dict:
    """``run_case``, once per case per session (the pin and the oracle tests share it)."""
    key = case_id(case)
    if key not in _RUNS:
        _RUNS[key] = run_case(case)
    return _RUNS[key]


@pytest.mark.parametrize("case", MATRIX, ids=IDS)
def test_entry_point_matches_its_pin(case):
    assert _run(case) == _pins()[case_id(case)]


def _plain(case: dict) -> list[int]:
    """Plain greedy decoding with the same target, window policy and eos."""
    model = _model(case["model"])
    prompt, budget, eos = case["prompt"], case["budget"], case.get("eos")
    if case["entry"] == "speculative_generate_stateful":
        from g2c.recurrent import plain_greedy
        out = plain_greedy(model, prompt, budget).tolist()
    elif case["cached"]:
        out = cached_generate(model, torch.tensor(prompt), budget, temperature=0.0).tolist()
    else:
        out = generate(model, torch.tensor(prompt), budget, temperature=0.0).tolist()
    if eos is not None and eos in out[len(prompt):]:
        out = out[:len(prompt) + out[len(prompt):].index(eos) + 1]
    return out


GREEDY = [c for c in MATRIX if c["T"] == 0.0]


@pytest.mark.parametrize("case", GREEDY, ids=[case_id(c) for c in GREEDY])
def test_greedy_entry_point_equals_plain_decoding(case):
    assert _run(case)["ids"] == _plain(case)



# -- the fast backend: the same engine configuration on fast_model(target) ----------------------------
FAST = [c for c in MATRIX if c["model"] in ("lm", "lm4") and c["cached"]]


def _on_fast_target(case, monkeypatch, dtype):
    """Make ``_model(case["model"])`` return its fast copy (drafters and heads stay built on the
    teaching model: the identity checks compare ``unwrap``); the fast copy."""
    from g2c.kvcache import fast_model
    fast = fast_model(_model(case["model"]), dtype=dtype)
    real = _model.__wrapped__

    def swapped(name):
        return fast if name == case["model"] else real(name)

    monkeypatch.setattr(sys.modules[__name__], "_model", swapped)
    return fast


@pytest.mark.parametrize("case", FAST, ids=[case_id(c) for c in FAST])
def test_fast_target_runs_the_same_engine_configuration(case, monkeypatch):
    """Module 16's fast backend (``fast_model``, fp32) behind every cached entry point of the matrix:
    LM, n-gram, MTP, EAGLE chain drafters, trees, and every lineage drafter (the heads read the
    fast target's states through the same trunk, ``forward_rows`` with kept layers and tree masks),
    greedy and sampled with the same generator: the same ids, counters and on_pass stream as the
    teaching target. The tiny models' logits are peaked, so argmax gaps and the sampled draws'
    margins stay far above the 1e-5 the two backends may differ by."""
    _on_fast_target(case, monkeypatch, torch.float32)
    assert run_case(case) == _run(case)


FAST_GREEDY = [c for c in FAST if c["T"] == 0.0]


@pytest.mark.parametrize("case", FAST_GREEDY, ids=[case_id(c) for c in FAST_GREEDY])
def test_bfloat16_fast_target_is_lossless_against_itself(case, monkeypatch):
    """bfloat16 weight products make their own model (its logits differ from fp32 by rounding);
    every greedy cached entry point on it emits exactly plain cached decoding ON IT, token for token."""
    fast16 = _on_fast_target(case, monkeypatch, torch.bfloat16)
    assert fast16.dtype == torch.bfloat16
    assert run_case(case)["ids"] == _plain(case)


def test_every_drafter_declares_what_it_reads():
    """One drafter protocol: every shipped drafter says what it reads of the target (tokens, the final
    state, or chosen layers), and a drafter that reads states is handed them the way it says."""
    from g2c.specdec.lineage import TreeDrafter
    from g2c.specdec.sampling.drafters import Drafter, check_reads
    from g2c.specdec.sampling.target import CachedTarget, RecomputeTarget
    from g2c.specdec.trees import LMTreeDrafter
    lm, lm4 = _model("lm"), _model("lm4")
    for kind in ("lm", "lm-cached", "ngram", "mtp", "mtp-cached", "eagle"):
        drafter = _sample_drafter(kind, lm, False)
        assert drafter.reads == (("final_state",) if kind.startswith(("mtp", "eagle")) else ("tokens",)), kind
        assert check_reads(drafter) == drafter.reads and not hasattr(drafter, "wants_target_hidden"), kind
    for kind in ("medusa", "eagle-chain", "eagle2", "eagle-static", "eagle3", "block"):
        inner = _lineage_drafter(kind, lm4)
        target = CachedTarget(lm4, layers=inner.target_layers)
        assert isinstance(inner, TreeDrafter) and isinstance(inner, Drafter), kind       # one protocol
        assert inner.bind(target, num_nodes=4, max_new_tokens=8) is inner
        assert check_reads(inner) == ("layers", tuple(inner.target_layers)), kind
        assert (len(inner.target_layers) > 0) == (kind in ("eagle3", "block")), kind
    tree = LMTreeDrafter(_model("lm-draft"), RecomputeTarget(lm), shape="chain", num_nodes=2, max_new_tokens=6)
    assert tree.reads == ("tokens",)


if __name__ == "__main__" and "--record" in sys.argv:
    PINS.write_text(json.dumps({case_id(c): run_case(c) for c in MATRIX}, separators=(",", ":")) + "\n")
    print(f"recorded {len(MATRIX)} runs in {PINS}")


# -- the controls through the tree presets (item 6): penalty, stops, logprobs --------------------------
CONTROL_RUNS = ["tree-chain", "tree-static", "tree-dynamic", "tree-static-cached", "medusa", "eagle-chain",
                "eagle2", "eagle3", "block", "eagle2-fast"]


def _controlled_run(name: str, prompt: list[int], n: int, **controls):
    from g2c.specdec.lineage import lineage_generate
    from g2c.specdec.trees import tree_speculative_generate
    if name.startswith("tree-"):
        shape = name.split("-")[1]
        return tree_speculative_generate(_model("lm"), _model("lm"), prompt, n, tree=shape, num_nodes=5,
                                         width=2 if shape == "dynamic" else None,
                                         temperature=0.0, use_cache=name.endswith("cached"), **controls)
    target = _model("lm4") if name in ("eagle3", "block") else _model("lm")
    drafter = _lineage_drafter(name.removesuffix("-fast"), target)
    if name.endswith("-fast"):
        from g2c.kvcache import fast_model
        target = fast_model(target)
    return lineage_generate(target, drafter, prompt, n, num_nodes=5, temperature=0.0, **controls)


@pytest.mark.parametrize("name", CONTROL_RUNS)
def test_controls_through_every_tree_preset(name):
    """Greedy with a repetition penalty: every tree preset emits module 11's
    ``generate(..., repetition_penalty=...)`` token for token (each tree row penalised with its own
    path), ``stats.logprobs`` equals one full forward pass, and a stop id cuts where plain decoding
    stops. The LM tree presets draft with the target's own weights (unpenalised), so paths are
    accepted until the penalty flips an argmax: the rows' histories decide real acceptances."""
    model = _model("lm4") if name in ("eagle3", "block") else _model("lm")
    prompt, n, theta = [5, 11, 5], 8, 1.8
    plain = generate(model, prompt, n, temperature=0.0, repetition_penalty=theta)[len(prompt):].tolist()
    ids, stats = _controlled_run(name, prompt, n, repetition_penalty=theta, logprobs=True)
    assert ids[len(prompt):].tolist() == plain
    if name.startswith("tree-"):
        assert 0 < stats.accepted < stats.drafted
    full = torch.log_softmax(model(ids.unsqueeze(0))[0].float(), dim=-1)
    want = full[torch.arange(len(prompt) - 1, len(ids) - 1), ids[len(prompt):]]
    torch.testing.assert_close(torch.tensor(stats.logprobs), want, atol=1e-4, rtol=1e-4)
    ids, stats = _controlled_run(name, prompt, n, repetition_penalty=theta, stop_ids=[plain[5]])
    assert ids[len(prompt):].tolist() == plain[:plain.index(plain[5]) + 1]


def _tree_counts(seed: int, theta: float, runs: int = 1200):
    from collections import Counter

    from specdec_mocks import TableLM
    from test_specdec_sampling import DRAFT_ROWS, TARGET_ROWS

    from g2c.specdec.trees import tree_speculative_generate
    target, drafter = TableLM(torch.tensor(TARGET_ROWS)), TableLM(torch.tensor(DRAFT_ROWS))
    g = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(runs):
        out, _ = tree_speculative_generate(target, drafter, [1, 3], 3, tree="static", choices=[(0,), (1,), (0, 0),
                                           (1, 0)], temperature=1.0, generator=g, draft_mode="sample",
                                           repetition_penalty=theta)
        counts[tuple(out[2:].tolist())] += 1
    return counts


def test_tree_penalty_is_lossless_and_remembers_the_round(monkeypatch):
    """Sampled tree drafts (two branches of depth 2) with a penalty: the first three tokens follow
    plain penalised sampling (chi-square bound of test_specdec_sampling.py, 1200 seeded runs: X² ≈ 69
    against a bound of 116); a penalty that forgets the nodes accepted earlier in the same round
    is rejected by the same check (X² ≈ 341)."""
    from specdec_mocks import TableLM
    from test_specdec_controls import THETA, _exact_penalised
    from test_specdec_sampling import TARGET_ROWS, _chi_square_ok

    import g2c.specdec.sampling.controls as controls
    from g2c.specdec.sampling.drafters import Sampler
    exact = _exact_penalised(TableLM(torch.tensor(TARGET_ROWS)), [1, 3], 3, Sampler(1.0), THETA)
    ok, stat, bound = _chi_square_ok(_tree_counts(4, THETA), exact)
    assert ok, f"X²={stat:.1f} > {bound:.1f}"
    monkeypatch.setattr(controls, "row_histories", lambda draft: [[] for _ in range(len(draft) + 1)])
    ok, stat, bound = _chi_square_ok(_tree_counts(4, THETA), exact)
    assert not ok, f"a penalty blind to this round's nodes passed: X²={stat:.1f} <= {bound:.1f}"


def test_each_tree_row_is_penalised_with_its_own_path():
    """Row by row: the row after node j is module 11's penalty over the context and the path
    root -> j, not the nodes before j in the flattened order (a chain's histories), which a
    sampled check at this size cannot tell apart (their laws differ by little)."""
    from g2c.sampling.warpers import apply_repetition_penalty
    from g2c.specdec.sampling.controls import ControlledTarget, row_histories
    from g2c.specdec.sampling.target import Target
    from g2c.specdec.trees import DraftTree

    class Rows(Target):                      # every row the same raw logits: only the penalty differs
        model = _model("lm")

        def score(self, context_ids, draft):
            return torch.linspace(-2.0, 3.0, 32).repeat(len(draft) + 1, 1), None

    draft = DraftTree(torch.tensor([4, 5, 9, 1]), torch.tensor([-1, -1, 0, 1]))   # 0 -> 2, 1 -> 3
    assert row_histories(draft) == [[], [4], [5], [4, 9], [5, 1]]
    context = torch.tensor([7, 7, 2])
    rows, _ = ControlledTarget(Rows(), repetition_penalty=2.0).score(context, draft)
    raw = torch.linspace(-2.0, 3.0, 32)
    for row, path in zip(rows, [[], [4], [5], [4, 9], [5, 1]]):
        torch.testing.assert_close(row, apply_repetition_penalty(raw, torch.tensor([7, 7, 2] + path), 2.0))
    assert not torch.equal(rows[2], apply_repetition_penalty(raw, torch.tensor([7, 7, 2, 4]), 2.0))   # flat order


# -- the behaviour lock (issue 54, item 7) -------------------------------------------------------------
# Every shipped drafter, run through the engine on a cached target: the target is scored through the
# trunk (module 16's forward_rows) exactly once per round, after one prefill, and a drafter that reads
# the target's states gets them from the engine (its commit's target_hidden), never from a pass of its
# own. Counted by behaviour, not by name: a second target pass in a round, a drafter that runs the
# target itself, or a head that drafts without the engine's states fails here. (Tree drafters still pull
# their states from the tree target they are bound to: issue 54, item 3.)
CHAIN_DRAFTERS = ("lm-cached", "ngram", "mtp", "eagle")
TREE_DRAFTERS = ("lm-chain", "lm-static", "lm-dynamic", "medusa", "eagle-chain", "eagle2", "eagle-static",
                 "eagle3", "block")


def _count_trunk_passes(model, calls: list):
    """Count ``model``'s trunk passes: ``forward_rows`` hands a model with its own ``forward_rows`` (a
    fast backend) every pass; this one records the block length and runs the teaching trunk."""
    from g2c.kvcache import forward as trunk

    def own(ids, cache, **kw):
        calls.append(int(ids.shape[1]))
        del model.forward_rows
        try:
            return trunk.forward_rows(model, ids, cache, **kw)
        finally:
            model.forward_rows = own

    model.forward_rows = own


@pytest.mark.parametrize("kind", CHAIN_DRAFTERS + TREE_DRAFTERS)
def test_every_drafter_scores_the_target_once_per_round_through_the_trunk(kind):
    from g2c.specdec.lineage import lineage_generate
    from g2c.specdec.sampling.loop import speculative_sample
    from g2c.specdec.trees import tree_speculative_generate

    target = _lm(2, layers=4, max_seq_len=40)            # the whole run stays inside the window: no re-prefill
    prompt, budget = _prompt(32, 5, 11), 14
    calls, passes, hidden = [], [], []
    if kind in CHAIN_DRAFTERS:
        from g2c.specdec.sampling.drafters import LMDrafter
        drafter = (LMDrafter(_lm(3, dim=8, layers=1, max_seq_len=40), use_cache=True) if kind == "lm-cached"
                   else _sample_drafter(kind, target, False))
        inner = drafter.commit

        def commit(ids, num_accepted, *, target_hidden=None):
            hidden.append(None if target_hidden is None else tuple(target_hidden.shape))
            return inner(ids, num_accepted, target_hidden=target_hidden)

        drafter.commit = commit
        _count_trunk_passes(target, calls)
        ids, stats = speculative_sample(target, drafter, prompt, budget, k=3, temperature=0.0,
                                        on_pass=_on_pass(passes), use_cache=True)
    elif kind.startswith("lm-"):
        _count_trunk_passes(target, calls)
        ids, stats = tree_speculative_generate(target, _lm(3, dim=8, layers=1, max_seq_len=40), prompt, budget,
                                               tree=kind[3:], num_nodes=4, width=2 if kind == "lm-dynamic" else None,
                                               temperature=0.0, on_pass=_on_pass(passes), use_cache=True)
    else:
        drafter = _lineage_drafter(kind, target)
        _count_trunk_passes(target, calls)
        ids, stats = lineage_generate(target, drafter, prompt, budget, num_nodes=4, temperature=0.0,
                                      on_pass=_on_pass(passes))
    del target.forward_rows
    assert ids.tolist()[:5] == prompt and len(ids) == 5 + budget
    assert stats.target_passes == len(passes) >= 2
    assert calls[0] == 4 and len(calls) == 1 + len(passes), (kind, calls, len(passes))   # prefill, then 1 a round
    assert stats.drafted > 0, kind                         # every drafter drafted: the rounds were real
    if kind in ("mtp", "eagle"):                           # the heads read the target's states: from the engine
        assert len(hidden) == len(passes) and all(h is not None and h[0] >= 1 for h in hidden), hidden
    elif kind in CHAIN_DRAFTERS:
        assert hidden == [None] * len(passes)              # a token drafter is handed no states
