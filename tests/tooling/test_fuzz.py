"""Standing fuzz pass (issue 31): generated bad input into every public entry point of the catalogue.

``tests/tooling/test_bad_inputs.py`` lists each bad-input class by hand; this file generates them
(hypothesis, derandomized by the ``g2c`` profile of tests/conftest.py, so every run feeds the same
cases) and holds every entry point to one rule:

* a GOOD input (by the construction of the case) gives a correct result: a token in [0, V), an
  accepted count in [0, k], a path through the tree, a loop output of prompt + at most the budget
  tokens, all in [0, V);
* a BAD input gives a CLEAR error: a ``ValueError``, ``TypeError`` or ``IndexError`` with a one-line,
  non-empty message, raised by g2c's own code: the innermost traceback frame lies in a file
  under ``g2c/`` or ``solutions/`` (so ``torch.rand``'s argument parser, ``max()`` of an empty
  sequence or a tensor index error from inside torch all fail the test, as does any other
  exception type), never a result (a silent wrong answer).

What is generated: probability and score tables of every dtype (float32/64/16, bfloat16, int64,
int32, bool), broken (NaN, infinite, negative, unnormalised, raw logits) or of the wrong shape
(0-d, 1-D, empty, a wrong row count, 3-D), on the CPU or on the fake accelerator of
``tests/device_mocks.py`` (which raises on a device mistake such as a float64 tensor created on
the device); token ids (negative, >= V, floats, bools); counts (0, negative, floats, bools, None,
strings, huge); generators (None, a torch.Generator, an int seed). Each test runs a few dozen
examples (seconds), so the pass stays in the normal suite.
"""

from __future__ import annotations

import math
import traceback
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from test_bad_inputs import OUTPUT_OPTIONS  # at import time: a @given test may not import a module of @given tests
from trial_bad_inputs import late_write, run_script

from g2c.course import REPO_ROOT

V = 5
OWN = (str(REPO_ROOT / "g2c"), str(REPO_ROOT / "solutions"))
CLEAR = (ValueError, TypeError, IndexError)
# No shrinking: a failure is reported with the example that found it, so a failing pass (the untouched
# scaffolds of the pristine contract run, a regression) stays as fast as a passing one.
PHASES = (Phase.explicit, Phase.generate)
FAST = settings(max_examples=40, deadline=None, phases=PHASES,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def assert_clear(exc: BaseException) -> None:
    """The rule for an error: one of CLEAR, a one-line message, raised by g2c's own code."""
    assert isinstance(exc, CLEAR), f"raw {type(exc).__name__}: {exc}"
    message = str(exc)
    assert message.strip() and "\n" not in message, f"not one line: {message!r}"
    last = traceback.extract_tb(exc.__traceback__)[-1]
    assert str(Path(last.filename).resolve()).startswith(OWN), \
        f"{type(exc).__name__} raised inside {last.filename}:{last.lineno}, not by g2c's checks: {message}"


def outcome(call):
    """(result, None) or (None, the exception) of ``call()``; a clear error is checked here."""
    try:
        return call(), None
    except Exception as exc:                # noqa: BLE001 - the test classifies every exception
        return None, exc


def judge(good: bool, call, check_result) -> None:
    result, exc = outcome(call)
    if exc is not None:
        assert_clear(exc)
        assert not good, f"a good input was refused: {type(exc).__name__}: {exc}"
    else:
        assert good, f"a bad input gave a result (a silent wrong answer): {result!r:.200}"
        check_result(result)


# -- generated tables ------------------------------------------------------------------------------

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
NOT_FLOATS = (torch.int64, torch.int32, torch.bool)
SHAPES = ("good", "0-d", "1-d", "empty", "one row short", "3-d")


@st.composite
def tables(draw, rows: int, *, probs: bool, good: bool | None = None, shapes: tuple[str, ...] = SHAPES):
    """(table, good): a (rows, V) table, and whether it is valid.

    ``good=True`` draws a valid table (any float dtype); ``good=False`` one with exactly one defect
    (a dtype that is not floating point, broken values, or a wrong shape), so a test sees each
    defect alone, where a checker that misses it would return a result; None draws either."""
    if good is None:
        good = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    defect = "none" if good else draw(st.sampled_from(("dtype", "values", "shape")))
    dtype = draw(st.sampled_from(NOT_FLOATS if defect == "dtype" else FLOATS))
    broken = ("nan", "inf", "negative", "times 10", "logits") if probs else ("nan", "inf")
    damage = draw(st.sampled_from(broken)) if defect == "values" else \
        draw(st.sampled_from(("none",) if probs else ("none", "negative", "times 10", "logits")))
    shape = draw(st.sampled_from([x for x in shapes if x != "good"])) if defect == "shape" else "good"
    logits = torch.randn(rows, V, generator=torch.Generator().manual_seed(seed))
    t = torch.softmax(logits, dim=-1) if probs else logits
    if damage == "nan":
        t[rows - 1, 0] = float("nan")
    elif damage == "inf":
        t[0, V - 1] = float("inf")
        if not probs:
            t[0] = float("-inf")                          # a dead score row
    elif damage == "negative":
        t[0, 1] = -0.25
    elif damage == "times 10":
        t = t * 10
    elif damage == "logits":
        t = logits
    if dtype in NOT_FLOATS:
        t = (t * 3).to(dtype) if dtype != torch.bool else t > 0.1
    else:
        t = t.to(dtype)
    if shape == "0-d":
        t = t[0, 0]
    elif shape == "1-d":
        t = t[0]
    elif shape == "empty":
        t = t[:0]
    elif shape == "one row short":
        t = t[1:]
    elif shape == "3-d":
        t = t.unsqueeze(0)
    return t, good


def ids_strategy(k: int, good: bool | None = None):
    """(ids tensor or list, good): k draft ids; a bad draw is negative, >= V, float, bool or a list."""

    @st.composite
    def make(draw):
        ok = draw(st.booleans()) if good is None else good
        which = "good" if ok else draw(st.sampled_from(("negative", "too big", "float", "bool", "list")))
        base = draw(st.lists(st.integers(0, V - 1), min_size=k, max_size=k))
        if which == "negative":
            base[-1] = -1
        elif which == "too big":
            base[0] = V
        t = torch.tensor(base)
        if which == "float":
            return t.float(), False
        if which == "bool":
            return t > 0, False
        if which == "list":
            return base, False            # a list is not a tensor: refused with a clear error
        return t, ok
    return make()


BROKEN = st.sampled_from(("nothing", "ids", "p", "q", "generator"))   # which argument one case breaks


GENERATORS = st.sampled_from(("none", "generator", "int"))


def make_generator(kind: str):
    return {"none": None, "generator": torch.Generator().manual_seed(0), "int": 3}[kind]


DEVICES = st.sampled_from(("cpu", "accelerator"))


def on_device(device: str, *tensors):
    """Move tensors to the fake accelerator (tests/device_mocks.py) for device == "accelerator"."""
    if device == "cpu":
        return tensors
    from device_mocks import to_accel

    def move(t):                          # an accelerator holds no float64 (MPS): such a table cannot arrive
        return to_accel(t.float() if t.dtype == torch.float64 else t)
    return tuple(move(t) if isinstance(t, torch.Tensor) else t for t in tensors)


def device_mode(device: str):
    import contextlib

    if device == "cpu":
        return contextlib.nullcontext()
    from device_mocks import FakeAccelerator

    return FakeAccelerator(library_only=OWN)


# -- the flat and tree verifiers -------------------------------------------------------------------

K = 2


def _check_flat(result):
    num_accepted, token = result
    assert isinstance(num_accepted, int) and 0 <= num_accepted <= K and isinstance(token, int) and 0 <= token < V


def _check_tree(tree):
    def check(result):
        path, token = result
        assert isinstance(token, int) and 0 <= token < V
        assert all(0 <= node < tree.num_nodes for node in path)
    return check


@FAST
@given(data=st.data(), broken=BROKEN, device=DEVICES)
def test_fuzz_greedy_verify(data, broken, device):
    from g2c.specdec import greedy_verify

    draft, good_ids = data.draw(ids_strategy(K, good=broken != "ids"))
    table, good_table = data.draw(tables(K + 1, probs=False, good=broken != "p"))
    draft, table = on_device(device, draft, table)
    with device_mode(device):
        judge(good_ids and good_table, lambda: greedy_verify(draft, table), _check_flat)


@FAST
@given(data=st.data(), broken=BROKEN, device=DEVICES)
def test_fuzz_speculative_verify(data, broken, device):
    from g2c.specdec import speculative_verify

    draft, good_ids = data.draw(ids_strategy(K, good=broken != "ids"))
    p, good_p = data.draw(tables(K + 1, probs=True, good=broken != "p"))
    q, good_q = data.draw(tables(K, probs=True, good=broken != "q"))
    gen = "int" if broken == "generator" else data.draw(st.sampled_from(("none", "generator")))
    draft, p, q = on_device(device, draft, p, q)
    with device_mode(device):
        judge(good_ids and good_p and good_q and gen != "int",
              lambda: speculative_verify(draft, p, q, generator=make_generator(gen)), _check_flat)


def _tree(tokens_good):
    from g2c.specdec.trees import DraftTree

    tokens, good = tokens_good
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        return None, False
    tree, exc = outcome(lambda: DraftTree(tokens, torch.tensor([-1, 0])))
    if exc is not None:                           # a negative id is refused where the tree is built (issue 57)
        assert_clear(exc)
        assert not good
        return None, False
    return tree, good


@FAST
@given(data=st.data(), broken=BROKEN, device=DEVICES)
def test_fuzz_greedy_tree_verify(data, broken, device):
    from g2c.specdec.trees import greedy_tree_verify

    tree, good_tree = _tree(data.draw(ids_strategy(K, good=broken != "ids")))
    table, good_table = data.draw(tables(K + 1, probs=False, good=broken != "p"))
    (table,) = on_device(device, table)
    with device_mode(device):
        judge(good_tree and good_table, lambda: greedy_tree_verify(tree, table), _check_tree(tree) if tree else None)


@FAST
@given(data=st.data(), broken=BROKEN, typical=st.booleans(), device=DEVICES)
def test_fuzz_sampled_tree_verifiers(data, broken, typical, device):
    from g2c.specdec.lineage.medusa import typical_tree_verify
    from g2c.specdec.trees import DraftTree, tree_speculative_verify

    tree, good_tree = _tree(data.draw(ids_strategy(K, good=broken != "ids")))
    table, good_table = data.draw(tables(K + 1, probs=True, good=broken != "p"))
    q_table, good_q = data.draw(st.one_of(st.just((None, True)), tables(K, probs=True, good=broken != "q")))
    gen = "int" if broken == "generator" else data.draw(st.sampled_from(("none", "generator")))
    if tree is not None and q_table is not None:
        result, exc = outcome(lambda: DraftTree(tree.tokens, tree.parents, proposal_probs=q_table))
        if exc is not None:                               # a proposal table of the wrong shape
            assert_clear(exc)
            assert not good_q
            return
        tree = result
    verify = typical_tree_verify if typical else tree_speculative_verify
    (table,) = on_device(device, table)
    with device_mode(device):
        judge(good_tree and good_table and good_q and gen != "int",
              lambda: verify(tree, table, generator=make_generator(gen)), _check_tree(tree) if tree else None)


@FAST
@given(data=st.data(), broken=BROKEN,
       epsilon=st.one_of(st.floats(-1, 2), st.just("0.1"), st.none()))
def test_fuzz_typical_accept(data, broken, epsilon):
    from g2c.specdec.lineage.medusa import typical_accept

    table, good_table = data.draw(tables(3, probs=True, good=broken != "p"))
    tokens, good_ids = data.draw(ids_strategy(3, good=broken != "ids"))
    good_ids = good_ids or isinstance(tokens, list)        # typical_accept takes a list of ids too
    good_eps = isinstance(epsilon, float) and 0 < epsilon <= 1
    kwargs = {} if epsilon is None else {"epsilon": epsilon}

    def check(result):
        assert result.dtype == torch.bool and result.shape == (3,)

    judge(good_table and good_ids and (epsilon is None or good_eps), lambda: typical_accept(table, tokens, **kwargs),
          check)


# -- rank paths, layers and the calculator ---------------------------------------------------------

RANK = st.one_of(st.integers(-1, V), st.floats(0, 2), st.booleans())


@FAST
@given(paths=st.one_of(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=1), min_size=1, max_size=3)
                       .map(lambda ps: sorted({(0,)} | set(map(tuple, ps))) + [(0, 0)]),   # well-formed, often
                       st.lists(st.lists(RANK, min_size=0, max_size=3), max_size=5)),
       as_generator=st.booleans(), p=tables(3, probs=True, shapes=("good", "one row short", "0-d", "3-d")))
def test_fuzz_medusa_tree(paths, as_generator, p):
    from g2c.specdec.lineage.medusa import medusa_tree

    table, good_table = p
    K = table.shape[0] if table.dim() == 2 else 0
    good_table = good_table or (table.dim() == 2 and table.dtype in FLOATS and table.shape[0] == 2 and
                                bool(torch.isfinite(table.float()).all()) and bool((table >= 0).all()) and
                                bool(((table.float().sum(-1) - 1).abs() < 1e-2).all()))  # any K heads is good
    paths = [tuple(c) for c in paths]
    ints = all(isinstance(r, int) and not isinstance(r, bool) for c in paths for r in c)
    good_paths = ints and all(c and min(c) >= 0 and max(c) < V and len(c) <= K for c in paths) and \
        all((len(a), a) < (len(b), b) for a, b in zip(paths, paths[1:])) and \
        all(c[:-1] in set(paths) for c in paths if len(c) > 1)
    given_paths = (c for c in paths) if as_generator else paths

    def check(tree):
        assert tree.num_nodes == len(paths) and all(0 <= t < V for t in tree.tokens.tolist())

    judge(good_paths and good_table, lambda: medusa_tree(table, given_paths), check)


COUNTS = st.one_of(st.integers(-3, 12), st.floats(allow_nan=True), st.booleans(), st.none(), st.text(max_size=2),
                   st.just(10**12))


@FAST
@given(num_layers=COUNTS)
def test_fuzz_fusion_layers(num_layers):
    from g2c.specdec.lineage.eagle3 import fusion_layers

    good = isinstance(num_layers, int) and not isinstance(num_layers, bool) and num_layers >= 3

    def check(layers):
        assert len(set(layers)) == 3 and all(0 <= i < num_layers for i in layers)

    judge(good, lambda: fusion_layers(num_layers), check)


REALS = st.one_of(st.floats(-1, 2), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                  st.text(max_size=2), st.floats(0, 1).map(torch.tensor), st.just(torch.tensor([0.5, 0.5])))


def _real(x):
    if isinstance(x, torch.Tensor):
        return float(x) if x.numel() == 1 else None
    return None if isinstance(x, bool) or not isinstance(x, (int, float)) else float(x)


def _int(x):
    return x if isinstance(x, int) and not isinstance(x, bool) else None


@FAST
@given(alpha=REALS, k=COUNTS, c=REALS, k_min=COUNTS)
def test_fuzz_calculator_and_controller(alpha, k, c, k_min):
    from g2c.specdec import theory
    from g2c.specdec.sampling import controllers

    a, kk, cc, lo = _real(alpha), _int(k), _real(c), _int(k_min)
    good_a = a is not None and 0 <= a <= 1
    good_c = cc is not None and math.isfinite(cc) and cc >= 0
    small_k = kk is not None and kk <= 64                     # the k of a huge-count case is only type-checked

    def check_tau(tau):
        assert 1.0 <= tau <= kk + 1 + 1e-9

    if small_k or kk is None:
        judge(good_a and kk is not None and kk >= 0, lambda: theory.expected_tokens_per_pass(alpha, k), check_tau)
    good_range = lo is not None and kk is not None and 1 <= lo <= kk
    if (lo is None or lo <= 64) and (kk is None or kk <= 64):
        judge(good_a and good_c and good_range,
              lambda: controllers.optimal_k(alpha, c, k_min=k_min, k_max=k), lambda best: lo <= best <= kk)


@FAST
@given(parents=st.lists(st.one_of(st.integers(-2, 3), st.floats(-1, 1)), max_size=4),
       accept=st.lists(REALS, max_size=4))
def test_fuzz_tree_expected_tokens(parents, accept):
    from g2c.specdec.theory import tree_expected_tokens

    ps = [_int(p) for p in parents]
    acc = [_real(a) for a in accept]
    good = len(ps) == len(acc) and all(p is not None and -1 <= p < i for i, p in enumerate(ps)) and \
        all(a is not None and 0 <= a <= 1 for a in acc)
    if good:
        mass: dict[int, float] = {}
        for p, a in zip(ps, acc):
            mass[p] = mass.get(p, 0.0) + a
        good = all(m <= 1 + 1e-9 for m in mass.values())
    judge(good, lambda: tree_expected_tokens(parents, accept), lambda tau: tau >= 1.0)


# -- the loops: every loop of the catalogue x generated prompts, budgets, knobs --------------------

PROMPTS = st.one_of(st.lists(st.integers(-1, 17), min_size=0, max_size=3),
                    st.lists(st.floats(0, 3), min_size=1, max_size=2), st.just("12"), st.none())
BUDGETS = st.one_of(st.integers(-1, 3), st.floats(0, 3), st.booleans(), st.none())


@pytest.fixture(scope="module")
def loops():
    from test_bad_inputs import _loops

    return _loops()


@settings(max_examples=80, deadline=None, phases=PHASES,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_every_loop(loops, data):
    from test_bad_inputs import LOOPS

    from g2c.sampling.model import check_temperature

    vocab = 16
    name = data.draw(st.sampled_from(sorted(LOOPS)))
    knobs = LOOPS[name]
    prompt, budget = data.draw(PROMPTS), data.draw(BUDGETS)
    extra = {}
    if "temperature" in knobs:
        extra["temperature"] = data.draw(st.one_of(st.floats(0, 2), st.just(float("nan")), st.just(-1.0)))
        extra["generator"] = make_generator(data.draw(GENERATORS))
    if "eos_id" in knobs:
        extra["eos_id"] = data.draw(st.one_of(st.none(), st.integers(-1, vocab), st.just(2.0)))
    good_prompt = isinstance(prompt, list) and len(prompt) > 0 and \
        all(isinstance(t, int) and 0 <= t < vocab for t in prompt)
    good_budget = isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0
    good_knobs = True
    if "temperature" in extra:
        t, _ = outcome(lambda: check_temperature(extra["temperature"]))
        good_knobs = t is not None and not isinstance(extra["generator"], int)
    eos = extra.get("eos_id")
    good_knobs = good_knobs and (eos is None or (isinstance(eos, int) and 0 <= eos < vocab))

    def check(result):
        ids = result[0] if isinstance(result, tuple) else result
        ids = getattr(ids, "outputs", ids)                # the batched loops' BatchedResult
        rows = ids if isinstance(ids, list) else [ids]
        for row in rows:
            row = row.tolist() if isinstance(row, torch.Tensor) else list(row)
            assert row[:len(prompt)] == prompt and len(row) <= len(prompt) + budget, (name, row)
            assert all(0 <= t < vocab for t in row)

    judge(good_prompt and good_budget and good_knobs, lambda: loops[name][0](prompt, budget, **extra), check)


# -- specdec-serving: the masked verify rows and the load-aware controller (the two constrained loops
# are rows of test_bad_inputs.LOOPS, so test_fuzz_every_loop above draws them too) ----------------

@FAST
@given(state=st.one_of(st.integers(-3, 4), st.floats(-1, 2), st.booleans(), st.none()),
       drafts=st.one_of(st.lists(st.integers(-1, 17), max_size=3), st.lists(st.floats(0, 3), min_size=1, max_size=2)),
       rows=st.integers(0, 4), dtype=st.sampled_from((torch.float32, torch.float16, torch.int64, torch.bool)),
       batch=COUNTS)
def test_fuzz_serving_mask_verify_rows_and_load_aware_k(state, drafts, rows, dtype, batch):
    from test_bad_inputs import _constraint, _serving_costs

    from g2c.specdec.serving import DEAD, DONE, LoadAwareK, mask_verify_rows

    vocab, c = 16, _constraint("(ab|c)+")                  # DFA states 0..2 (start, after a, accepting)
    n_states = len(c.dfa.accepting)
    good_state = isinstance(state, int) and not isinstance(state, bool) and (state in (DONE, DEAD)
                                                                            or 0 <= state < n_states)
    good_drafts = all(isinstance(t, int) and 0 <= t < vocab for t in drafts)
    good = good_state and good_drafts and rows == len(drafts) + 1 and dtype.is_floating_point
    logits = torch.zeros(rows, vocab).to(dtype)

    def check_rows(out):
        assert out.shape == (rows, vocab) and out.dtype == dtype
        s = state
        for i in range(rows):                              # row i: the legal tokens after drafts[:i], -inf elsewhere
            assert torch.equal(torch.isfinite(out[i]), c.mask(s)), (state, drafts, i)
            if i < len(drafts):
                s = c.step(s, drafts[i])

    ids = torch.tensor(drafts, dtype=torch.long if good_drafts else None)        # [] as an empty int64 tensor
    judge(good, lambda: mask_verify_rows(logits, c, state, ids), check_rows)
    b = _int(batch)
    judge(b is not None and b >= 1, lambda: LoadAwareK(_serving_costs(), clock=None).next_k(batch),
          lambda k: 0 <= k <= 8)


# -- issue 57: decodes that are not prefix-monotone, and every output path of every script ---------------

BYTES = [0x61 + i for i in range(20)] + [0xC3, 0xE2, 0x82, 0xA9, 0xAC, 0x80]   # ASCII, 2/3-byte leads, continuations


@settings(max_examples=60, deadline=None, phases=PHASES,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), k=st.integers(1, 4), tree=st.booleans(), data=st.data())
def test_fuzz_stop_strings_with_a_decode_that_is_not_prefix_monotone(seed, k, tree, data):
    """A byte-level decode shows a cut character as U+FFFD and the next byte replaces it, so the text of a
    prefix need not be a prefix of the text. Generated chains, byte tables and stop strings (a piece of some
    prefix's text, U+FFFD included): the engine and the tree preset stop on plain decoding's token, the one
    after which the decoded new text first holds a stop string (issue 57: a round's whole text was checked)."""
    from specdec_mocks import TableLM, chain_table, random_next_of

    from g2c.sampling import generate
    from g2c.specdec.sampling.drafters import LMDrafter
    from g2c.specdec.sampling.loop import speculative_sample
    from g2c.specdec.trees.verify import tree_speculative_generate

    vocab, n = 24, 14
    g = torch.Generator().manual_seed(seed)
    model = TableLM(chain_table(random_next_of(vocab, g), generator=g), max_seq_len=32)
    table = [BYTES[int(i)] for i in torch.randint(0, len(BYTES), (vocab,), generator=g)]

    def decode(ids):
        return bytes(table[int(t)] for t in ids).decode("utf-8", errors="replace")

    plain = generate(model, [0], n, temperature=0.0)[1:].tolist()
    j = data.draw(st.integers(1, n))
    text = decode(plain[:j])
    a = data.draw(st.integers(0, len(text) - 1))
    stop = data.draw(st.one_of(st.just("\ufffd"), st.just(text[a:a + data.draw(st.integers(1, 3))])))
    want = next((plain[:i + 1] for i in range(n) if stop in decode(plain[:i + 1])), plain)
    controls = {"stop_strings": [stop], "decode": decode, "temperature": 0.0}
    if tree:
        ids, _ = tree_speculative_generate(model, model, [0], n, num_nodes=k, **controls)
    else:
        ids, _ = speculative_sample(model, LMDrafter(model), [0], n, k=k, **controls)
    assert ids[1:].tolist() == want, (stop, [decode(plain[:i + 1]) for i in range(n)])


SEGMENTS = st.sampled_from(("x", "x.png", "n" * 300, "a\x00b", "", ".", "sub", "afile", "~"))


@settings(max_examples=60, deadline=None, phases=PHASES,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_every_output_option_of_every_script(tmp_path_factory, data):
    """Generated paths (under a file, through /proc and /sys, inside the shipped artifacts, a NUL, a name the
    file system refuses, empty parts, a plain good path) into every output option of every script
    (``test_bad_inputs.OUTPUT_OPTIONS``): the script refuses at parse time with one error line and exit 2,
    or it accepts, and then the write the script makes after its work (``atomic_path``) succeeds there."""
    import os

    tmp = tmp_path_factory.mktemp("out")
    (tmp / "afile").write_text("x")
    script = data.draw(st.sampled_from(sorted(OUTPUT_OPTIONS)))
    pre, option, folder = data.draw(st.sampled_from(OUTPUT_OPTIONS[script]))
    base = data.draw(st.sampled_from((str(tmp), "/proc", "/sys", str(REPO_ROOT / "artifacts" / "models"),
                                      str(tmp / "afile"))))
    path = os.path.join(base, *data.draw(st.lists(SEGMENTS, min_size=0, max_size=3)))
    if option == "--export-prompts" or (option == "--plot" and path == ""):
        return                                           # a prefix, and --plot '' (no plot): their own tests
    argv = pre + ([f"{option}={path}"] if option else [path])
    cwd = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        rc, out, err, reached = run_script(REPO_ROOT, script, argv)
    finally:
        os.chdir(cwd)
    refused = rc == 2 and not reached
    if refused:
        errors = [line for line in err.splitlines() if "error" in line]
        assert len(errors) == 1 and "Traceback" not in err, err
        return
    assert path.startswith(str(tmp)) and "\x00" not in path, f"accepted {path!r}: {out[-300:]} {err[-300:]}"
    problem = late_write(path, folder)
    assert problem is None, f"{script} {option} accepted {path!r} but the write after the work fails: {problem}"
