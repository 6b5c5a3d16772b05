"""Beyond (specdec-serving): speculation under a grammar and under load.

Part 1 pins the regex -> token automaton (provided code) on hand-checked cases. Part 2 checks the
exercise ``mask_verify_rows`` and the constrained engine: constrained speculative output equals
constrained plain decoding token for token on a grid (chain drafters, recompute and cached
targets, EOS inside the constraint), has the same law when sampled (seeded chi-square tests that
also reject the classic mistakes), and forced-token drafting raises tokens per target pass.
Part 3 checks the acceptance metrics and the collapse alarm; part 4 the load-aware controller.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from specdec_mocks import TableLM

from g2c.specdec.sampling.draft import Draft
from g2c.specdec.sampling.drafters import LMDrafter, NGramDrafter
from g2c.specdec.sampling.loop import speculative_sample
from g2c.specdec.sampling.target import CachedTarget
from g2c.specdec.serving.constrain import (
    ConstrainedDrafter,
    ConstrainedTarget,
    constrained_generate,
    constrained_speculative_sample,
    mask_verify_rows,
)
from g2c.specdec.serving.controller import (
    LoadAwareK,
    PassCosts,
    StaticBatchK,
    best_k,
    break_even_batch,
    expected_tokens,
)
from g2c.specdec.serving.metrics import AcceptanceAlarm, AcceptanceCollapse, RoundLog, acceptance_metrics
from g2c.specdec.serving.regex import DEAD, DONE, ByteDFA, TokenConstraint, parse
from g2c.transformer import TransformerLM

# A toy vocabulary small enough to enumerate every output: id 0 is EOS (no bytes).
TOY = [None, b"a", b"b", b"c", b"ab", b"ba", b"abc", b"cc"]


def _toy(pattern: str) -> TokenConstraint:
    return TokenConstraint(pattern, TOY, 0)


# --- part 1: the automaton (provided) ---------------------------------------------------------


@pytest.mark.parametrize("pattern,yes,no", [
    ("(yes|no)", [b"yes", b"no"], [b"", b"ye", b"yess", b"n"]),
    ("a[0-9]+b?", [b"a1", b"a12b"], [b"a", b"ab", b"a1bb"]),
    ("x(ab)*", [b"x", b"xab", b"xabab"], [b"xa", b"xaba"]),
    ("[^a-z]\\.", [b"A.", b"1."], [b"a.", b"A"]),
    ("\\d\\w\\s", [b"1a ", b"9_\n"], [b"a1 "]),
    ("caf\u00e9", ["caf\u00e9".encode()], [b"cafe"]),
])
def test_byte_dfa_matches_hand_cases(pattern, yes, no):
    dfa = ByteDFA.compile(pattern)
    assert all(dfa.matches(s) for s in yes)
    assert not any(dfa.matches(s) for s in no)


@pytest.mark.parametrize("pattern,match", [("(ab", "never closed"), ("ab)", "unbalanced"), ("*a", "nothing to"),
                                           ("[a", "never closed"), ("a{2}", "not supported"), ("[z-a]", "bad range"),
                                           ("\\q", "unknown escape"), ("a\\", "lone backslash")])
def test_parse_rejects_bad_patterns(pattern, match):
    with pytest.raises(ValueError, match=match):
        parse(pattern)


def test_token_constraint_masks_steps_and_forced_runs():
    c = _toy("(ab|ba)c")
    # start: "a", "ab", "b", "ba" are legal ("abc" too: it walks to the accepting end); EOS is not
    assert c.mask(c.start).nonzero().flatten().tolist() == [1, 2, 4, 5, 6]
    s = c.step(c.start, 4)                              # "ab": the rest is the literal "c"
    assert c.forced(s) == 3 and c.mask(s).nonzero().flatten().tolist() == [3]
    end = c.step(s, 3)
    assert c.accepting(end) and c.forced(end) == 0      # terminated: only EOS
    assert c.step(end, 0) == DONE and c.step(c.start, 3) == DEAD and c.step(c.start, 0) == DEAD
    assert c.mask(DONE).nonzero().flatten().tolist() == [0] == c.mask(DEAD).nonzero().flatten().tolist()


def test_token_constraint_canonical_literal_takes_one_token():
    # the literal run "abc" is written with its longest token, so it is forced as one token
    c = _toy("abc(a|b)")
    assert c.forced(c.start) == 6 and c.mask(c.start).sum().item() == 1


def test_token_constraint_allows_tokens_that_finish_a_run_and_go_on():
    # run "ab" then a branch: "ab" (its canonical token) and "abc" (the run plus a legal "c") are legal,
    # "a" (a shorter way to start the run) is not, and the state is not forced
    c = _toy("ab(a|c)")
    assert c.mask(c.start).nonzero().flatten().tolist() == [4, 6] and c.forced(c.start) is None
    assert c.accepting(c.step(c.start, 6))


def test_token_constraint_rejects_bad_input():
    with pytest.raises(ValueError, match="eos_id"):
        TokenConstraint("a", TOY, 8)
    with pytest.raises(TypeError, match="bytes"):
        TokenConstraint("a", ["a"], 0)
    with pytest.raises(ValueError, match="no token"):
        TokenConstraint("z", TOY, 0).mask(0)


# --- part 2: the masked verify rows and the constrained engine -----------------------------------


def test_mask_verify_rows_advances_the_state_row_by_row():
    c = _toy("(ab|ba)c")
    logits = torch.zeros(3, 8)
    out = mask_verify_rows(logits, c, c.start, torch.tensor([4, 3]))     # drafts "ab", "c"
    legal = torch.isfinite(out)
    assert legal[0].nonzero().flatten().tolist() == [1, 2, 4, 5, 6]      # the round's start state
    assert legal[1].nonzero().flatten().tolist() == [3]                  # after "ab": only "c"
    assert legal[2].nonzero().flatten().tolist() == [0]                  # after "abc": only EOS
    assert torch.equal(logits, torch.zeros(3, 8))                        # the input is left alone


def test_mask_verify_rows_matches_plain_masks():
    c = _toy("a(b|c)+")
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 8, generator=g)
    drafts = torch.tensor([1, 2, 5])                 # "a", "b", then "ba" leaves the language
    out = mask_verify_rows(logits, c, c.start, drafts)
    s = c.start
    for i in range(4):
        want = logits[i].masked_fill(~c.mask(s), float("-inf"))
        assert torch.equal(out[i], want)
        if i < 3:
            s = c.step(s, int(drafts[i]))
    assert s == DEAD and torch.isfinite(out[3]).nonzero().flatten().tolist() == [0]


def test_mask_verify_rows_rejects_bad_shapes():
    c = _toy("a")
    with pytest.raises(ValueError, match="logits"):
        mask_verify_rows(torch.zeros(3, 8), c, 0, torch.tensor([1]))
    with pytest.raises(TypeError, match="TokenConstraint"):
        mask_verify_rows(torch.zeros(1, 8), "a", 0, torch.tensor([], dtype=torch.long))


def _tiny_lm(vocab: int, seed: int, *, dim: int = 16, layers: int = 1, spread: float = 6.0) -> TransformerLM:
    model = TransformerLM(vocab, dim, layers, 2, 48, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.token_embed.weight.mul_(spread)
    return model.eval()


GRID_PATTERNS = [
    "(ab|ba)+c?",                   # EOS legal inside (after every "ab"/"ba"), runs on otherwise
    "c(a|b)(a|b)*(cc)?",            # EOS inside, forced "c" first
    "(abc|ba)a?",                   # a terminated constraint: EOS forced at the end
]


@pytest.mark.parametrize("pattern", GRID_PATTERNS)
@pytest.mark.parametrize("drafter_kind", ["lm", "lm-cached", "ngram", "none"])
@pytest.mark.parametrize("cached_target", [False, True])
@pytest.mark.parametrize("k", [1, 3])
def test_constrained_speculative_equals_constrained_greedy(pattern, drafter_kind, cached_target, k):
    c = _toy(pattern)
    target, draft_model = _tiny_lm(8, 1), _tiny_lm(8, 2, dim=8)
    prompt = torch.tensor([1, 2, 3])
    want = constrained_generate(target, prompt, 12, c, temperature=0.0)
    drafter = {"lm": lambda: LMDrafter(draft_model), "lm-cached": lambda: LMDrafter(draft_model, use_cache=True),
               "ngram": lambda: NGramDrafter(), "none": lambda: None}[drafter_kind]()
    for forced in (True, False):
        got, stats = constrained_speculative_sample(CachedTarget(target) if cached_target else target, drafter,
                                                    prompt, 12, c, forced=forced, k=k, temperature=0.0)
        assert got.tolist() == want.tolist(), (pattern, drafter_kind, forced)
        assert stats.generated == len(want) - len(prompt)
    out = want[len(prompt):].tolist()
    text = b"".join(TOY[t] for t in out if t != 0)
    if out[-1] == 0:                                  # finished: the text matches the whole pattern
        assert c.dfa.matches(text)


def test_constrained_speculative_equals_constrained_greedy_on_the_course_tokenizer():
    from g2c.assets import load_tokenizer

    tok = load_tokenizer("StoryTokenizer")
    c = TokenConstraint.from_tokenizer(" The answer is( yes| no)\\. [A-Z][a-z]+( [a-z]+)*\\.", tok)
    target, draft_model = _tiny_lm(tok.vocab_size, 3), _tiny_lm(tok.vocab_size, 4, dim=8)
    prompt = torch.tensor(tok.encode("Tom asked a question."))
    want = constrained_generate(target, prompt, 30, c, temperature=0.0)
    for drafter in (LMDrafter(draft_model, use_cache=True), None):
        got, stats = constrained_speculative_sample(CachedTarget(target), drafter, prompt, 30, c, k=4,
                                                    temperature=0.0)
        assert got.tolist() == want.tolist()
    assert tok.decode(want[len(prompt):].tolist()).startswith(" The answer is")


def test_forced_token_drafting_raises_tokens_per_pass():
    # a constraint made mostly of literal runs: forced drafts are accepted whatever the model says
    c = _toy("abcabc(a|b)abcabcba(a|b)abcabc")
    target = _tiny_lm(8, 5)
    prompt = torch.tensor([3])
    runs = {}
    for forced in (False, True):
        ids, stats = constrained_speculative_sample(target, None, prompt, 40, c, forced=forced, k=4, temperature=0.0)
        runs[forced] = (ids.tolist(), stats)
    assert runs[True][0] == runs[False][0]
    plain, fast = runs[False][1], runs[True][1]
    assert plain.target_passes == plain.generated          # no drafter: one token per pass
    assert fast.drafter.drafter_calls == 0 and fast.drafter.forced_tokens > 0
    # 9 tokens (6 literal runs + 2 choices + EOS) in: forced runs of up to 4 per pass
    assert fast.generated / fast.target_passes >= 1.5 * plain.generated / plain.target_passes


# --- the law under sampling: chi-square against the exact law, by enumeration ---------------------


def _exact_law(table: torch.Tensor, constraint: TokenConstraint, prompt_last: int, n: int) -> dict:
    """P(new tokens) of plain constrained sampling at T = 1 under a TableLM, every path of <= n tokens."""
    law: dict[tuple, float] = {}

    def walk(path, last, state, prob):
        if len(path) == n or (path and path[-1] == constraint.eos_id):
            law[tuple(path)] = law.get(tuple(path), 0.0) + prob
            return
        p = torch.softmax(table[last].double().masked_fill(~constraint.mask(state), float("-inf")), -1)
        for t in p.nonzero().flatten().tolist():
            walk(path + [t], t, constraint.step(state, t), prob * float(p[t]))

    walk([], prompt_last, constraint.start, 1.0)
    return law


def _chi_square_p(counts: dict, law: dict, runs: int) -> float:
    """p-value of Pearson's chi-square, outcomes with expected count < 5 pooled into one bin."""
    stat, dof, small_exp, small_obs = 0.0, -1, 0.0, 0
    for key, p in law.items():
        e = p * runs
        if e < 5:
            small_exp += e
            small_obs += counts.get(key, 0)
            continue
        stat += (counts.get(key, 0) - e) ** 2 / e
        dof += 1
    small_obs += sum(v for key, v in counts.items() if key not in law)     # outcomes outside the law
    if small_exp > 0 or small_obs:
        e = max(small_exp, 1e-9)
        stat += (small_obs - e) ** 2 / e
        dof += 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


class _SampledTableDrafter:
    """Samples each draft from softmax(table[last]) masked by the constraint; reports q rows
    masked (truthful) or unmasked (the mistake of masking the draft but not its q)."""

    def __init__(self, table, constraint, *, report_masked: bool, mask: bool = True):
        self.table, self.c, self.report_masked, self.mask = table, constraint, report_masked, mask
        self.vocab_size = table.shape[0]

    def start(self, prompt_ids, *, sampler, generator):
        self.g, self.n0 = generator, len(prompt_ids)

    def propose(self, context_ids, k):
        state = self.c.walk(self.c.start, context_ids[self.n0:])
        last, ids, rows = int(context_ids[-1]), [], []
        for _ in range(k):
            raw = torch.softmax(self.table[last], -1)
            masked = raw.masked_fill(~self.c.mask(state), 0.0) if self.mask else raw
            masked = masked / masked.sum()
            t = int(torch.multinomial(masked, 1, generator=self.g))
            ids.append(t)
            rows.append(masked if self.report_masked else raw)
            state, last = self.c.step(state, t), t
        return Draft(torch.tensor(ids), torch.stack(rows))

    def commit(self, context_ids, num_accepted, *, target_hidden=None):
        pass


class _StuckTarget(ConstrainedTarget):
    """The mistake of masking every verify row with the round's start state."""

    def score(self, context_ids, draft_ids):
        state = self._catch_up(context_ids)
        logits, hidden = self.inner.score(context_ids, draft_ids)
        legal = self.constraint.mask(state)
        return logits.masked_fill(~legal, float("-inf")), hidden


LAW_PATTERN = "(a|b|ab)(c|ba)*"
LAW_RUNS, LAW_N = 1500, 3


def _law_setup():
    g = torch.Generator().manual_seed(11)
    target_table = torch.randn(8, 8, generator=g) * 1.5
    draft_table = torch.randn(8, 8, generator=g) * 1.5
    c = _toy(LAW_PATTERN)
    return TableLM(target_table), target_table, draft_table, c


def _sample_counts(make_target, make_drafter, seed: int = 0) -> dict:
    target, table, draft_table, c = _law_setup()
    g = torch.Generator().manual_seed(seed)
    counts: dict[tuple, int] = {}
    for _ in range(LAW_RUNS):
        ids, _ = speculative_sample(make_target(target, c), make_drafter(draft_table, c), torch.tensor([3]), LAW_N,
                                   k=3, temperature=1.0, generator=g, eos_id=0)
        key = tuple(ids[1:].tolist())
        counts[key] = counts.get(key, 0) + 1
    return counts


def _law():
    target, table, _, c = _law_setup()
    return _exact_law(table, c, 3, LAW_N)


def test_constrained_speculative_sampling_has_the_plain_law():
    law = _law()
    assert abs(sum(law.values()) - 1) < 1e-9 and len(law) > 10
    counts = _sample_counts(lambda t, c: ConstrainedTarget(t, c),
                            lambda d, c: ConstrainedDrafter(_SampledTableDrafter(d, c, report_masked=True, mask=False),
                                                            c))
    # seeded: the correct loop gives p = 0.24 here (80 outcomes, 1500 runs); the three mutants below
    # give p < 1e-60, so the thresholds 1e-3 / 1e-6 sit far from both
    assert _chi_square_p(counts, law, LAW_RUNS) > 1e-3


def test_masking_only_the_target_keeps_the_law():
    # an unconstrained draft with its true q: still lossless (the rows are masked), only drafts are wasted
    counts = _sample_counts(lambda t, c: ConstrainedTarget(t, c),
                            lambda d, c: _SampledTableDrafter(d, c, report_masked=True, mask=False))
    assert _chi_square_p(counts, _law(), LAW_RUNS) > 1e-3     # p = 0.47 with this seed


def test_constrained_plain_reference_has_the_law():
    law = _law()
    target, _, _, c = _law_setup()
    g = torch.Generator().manual_seed(1)
    counts: dict[tuple, int] = {}
    for _ in range(LAW_RUNS):
        key = tuple(constrained_generate(target, torch.tensor([3]), LAW_N, c, generator=g)[1:].tolist())
        counts[key] = counts.get(key, 0) + 1
    assert _chi_square_p(counts, law, LAW_RUNS) > 1e-3


def test_law_test_rejects_masking_only_the_draft():
    counts = _sample_counts(lambda t, c: t,            # the target's rows left unmasked
                            lambda d, c: _SampledTableDrafter(d, c, report_masked=True))
    assert _chi_square_p(counts, _law(), LAW_RUNS) < 1e-6


def test_law_test_rejects_a_masked_draft_verified_against_its_unmasked_q():
    counts = _sample_counts(lambda t, c: ConstrainedTarget(t, c),
                            lambda d, c: _SampledTableDrafter(d, c, report_masked=False))
    assert _chi_square_p(counts, _law(), LAW_RUNS) < 1e-6


def test_law_test_rejects_rows_masked_with_the_round_start_state():
    counts = _sample_counts(lambda t, c: _StuckTarget(t, c),
                            lambda d, c: _SampledTableDrafter(d, c, report_masked=True))
    assert _chi_square_p(counts, _law(), LAW_RUNS) < 1e-6


def test_constrained_engine_rejects_bad_input():
    c = _toy("a")
    with pytest.raises(ValueError, match="vocab_size"):
        ConstrainedTarget(_tiny_lm(9, 0), c)
    with pytest.raises(TypeError, match="TokenConstraint"):
        ConstrainedDrafter(None, "a")
    with pytest.raises(ValueError, match="eos_id"):
        constrained_speculative_sample(_tiny_lm(8, 0), None, [1], 3, c, eos_id=2)


# --- part 3: acceptance metrics and the collapse alarm (provided) ---------------------------------


def test_acceptance_metrics_hand_values():
    m = acceptance_metrics([(4, 4), (4, 1), (2, 0), (0, 0), (4, 2)])
    assert m["rounds"] == 4 and m["drafted"] == 14 and m["accepted"] == 7      # the plain step is left out
    assert m["mean_acceptance_length"] == pytest.approx(1 + 7 / 4)
    assert m["per_position"] == pytest.approx([3 / 4, 2 / 4, 1 / 3, 1 / 3])   # position 2, 3: three rounds drafted them
    assert m["histogram"] == [1, 1, 1, 0, 1]                                  # acceptance lengths 1, 2, 3, 5
    assert acceptance_metrics([])["mean_acceptance_length"] == 1.0
    with pytest.raises(ValueError, match="exceeds"):
        acceptance_metrics([(1, 2)])
    for bad in ((4, 2, 1), 3, "42"):                     # a SpecStats-like triple, a bare count, a string
        with pytest.raises(ValueError, match=r"rounds\[1\] must be a \(drafted, accepted\) pair"):
            acceptance_metrics([(1, 1), bad])


def test_round_log_records_the_engine_rounds_without_changing_them():
    target, draft_model = _tiny_lm(8, 1), _tiny_lm(8, 2, dim=8)
    log = RoundLog()
    ids, stats = speculative_sample(target, LMDrafter(draft_model), [1, 2], 20, temperature=0.0,
                                    controller=log.watch(k=3))
    plain, ref = speculative_sample(target, LMDrafter(draft_model), [1, 2], 20, temperature=0.0, k=3)
    assert ids.tolist() == plain.tolist()
    m = log.metrics()
    assert len(log.rounds) == stats.target_passes and m["drafted"] == stats.drafted
    assert sum(m["histogram"]) == m["rounds"] == sum(1 for d, _ in log.rounds if d)
    assert m["accepted"] >= stats.accepted             # verified acceptances; a budget cut drops some emitted ones


def test_acceptance_alarm_warns_once_per_collapse_and_rearms():
    alarm = AcceptanceAlarm(window=4, threshold=1.25)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for a in [3, 3, 0, 0, 0, 0, 0, 0]:             # mean length 1.0 from the 6th round on
            alarm.observe(4, a)
        assert alarm.alarms == 1
        for a in [4, 4, 4, 4, 0, 0, 0, 0]:             # recovers, then collapses again
            alarm.observe(4, a)
    assert alarm.alarms == 2 and sum(issubclass(w.category, AcceptanceCollapse) for w in caught) == 2
    alarm.observe(0, 0)                                 # plain steps do not count
    with pytest.raises(ValueError, match="window"):
        AcceptanceAlarm(window=0)
    with pytest.raises(ValueError, match="threshold"):
        AcceptanceAlarm(threshold=0.5)


# --- part 4: k from load and acceptance (provided) --------------------------------------------------


def _costs(per_row: float, fixed: float = 1.0, draft: float = 0.1) -> PassCosts:
    """A machine whose pass costs fixed + per_row * rows: per_row small = memory-bound."""
    grid = (1, 2, 4, 8, 16, 32, 64)
    return PassCosts(target={b: {t: fixed + per_row * b * t for t in (1, 2, 3, 5)} for b in grid},
                     drafter={b: draft * (1 + per_row * b) for b in grid})


def test_expected_tokens_law():
    assert expected_tokens(0.5, 0) == 1.0 and expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens(1.5, 2)


def test_best_k_grows_with_acceptance_and_switches_off_under_load():
    free = _costs(per_row=0.0)                 # verification free at any batch
    assert best_k(0.9, 1, free) == 8 and best_k(0.0, 1, free) == 0
    assert best_k(0.9, 1, free) >= best_k(0.6, 1, free) >= best_k(0.3, 1, free)
    loaded = _costs(per_row=0.05)
    ks = [best_k(0.7, b, loaded) for b in (1, 8, 32, 64)]
    assert ks == sorted(ks, reverse=True) and ks[0] > 0 and ks[-1] == 0
    b_even = break_even_batch(0.7, loaded)
    assert best_k(0.7, b_even, loaded) == 0 and best_k(0.7, b_even - 1, loaded) > 0
    # the exact rule at B = 1, alpha = 0.7: rate(k) = E(k) / (1.05 + 0.05 k + 0.105 k)
    rates = [expected_tokens(0.7, k) / (1 + 0.05 * (k + 1) + 0.105 * k) for k in range(9)]
    assert best_k(0.7, 1, loaded) == max(range(9), key=rates.__getitem__)


def test_load_aware_k_learns_acceptance():
    ctl = LoadAwareK(_costs(per_row=0.0), prior_alpha=0.5, decay=0.9, probe_every=None,
                     clock=None)   # remembers ~10 rounds
    for _ in range(50):
        ctl.update(drafted=4, accepted=[4, 4])           # every draft accepted
    assert ctl.alpha > 0.95 and ctl.next_k(1) == 8
    for _ in range(200):
        ctl.update(drafted=4, accepted=[0])               # nothing accepted
    assert ctl.alpha < 0.2                                # the old evidence has decayed away
    assert ctl.history == [(1, 8)]
    with pytest.raises(TypeError, match="PassCosts"):
        LoadAwareK({"B": 1})


def test_pass_costs_json_round_trip_and_interpolation():
    c = _costs(per_row=0.01)
    back = PassCosts.from_json(c.to_json())
    assert back.target == c.target and back.target_s(12, 4) == pytest.approx(1 + 0.01 * 48)


def test_lab_loop_with_a_controller_equals_plain_greedy():
    from g2c.specdec.lab.batched import batched_greedy, batched_speculative_generate

    target, draft_model = _tiny_lm(8, 1, layers=2), _tiny_lm(8, 2, dim=8)
    prompts = [[1, 2, 3], [4], [5, 6]]
    want = [o.tolist() for o in batched_greedy(target, prompts, 12).outputs]
    static = batched_speculative_generate(target, draft_model, prompts, 12, k=3)
    hooked = batched_speculative_generate(target, draft_model, prompts, 12, controller=StaticBatchK(3))
    assert [o.tolist() for o in static.outputs] == [o.tolist() for o in hooked.outputs] == want
    assert static.rounds == hooked.rounds
    plain_rounds = batched_speculative_generate(target, draft_model, prompts, 12, controller=StaticBatchK(0))
    assert [o.tolist() for o in plain_rounds.outputs] == want and plain_rounds.target_passes == 12
    log = RoundLog()
    ctl = LoadAwareK(_costs(per_row=0.02), k_max=4, clock=None)
    res = batched_speculative_generate(target, draft_model, prompts, 12, controller=log.watch(ctl))
    assert [o.tolist() for o in res.outputs] == want
    assert {b for b, _ in ctl.history} <= {1, 2, 3} and len(ctl.history) == res.target_passes
    assert sum(1 for d, _ in log.rounds if d) == sum(b for b, k in ctl.history if k)


def test_lab_controller_hook_rejects_bad_k():
    from g2c.specdec.lab.batched import batched_speculative_generate

    class Bad:
        def next_k(self, batch):
            return -1

        def update(self, **kw):
            pass

    model = _tiny_lm(8, 1)
    with pytest.raises(ValueError, match="next_k"):
        batched_speculative_generate(model, model, [[1]], 3, controller=Bad())
    with pytest.raises(TypeError, match="controller"):
        batched_speculative_generate(model, model, [[1]], 3, controller=object())


def test_measure_costs_times_a_real_model_and_caches(tmp_path):
    model = _tiny_lm(8, 1)
    costs = PassCosts.load_or_measure(model, model, path=tmp_path / "cal.json", batches=(1, 4), tokens=(1, 3),
                                      context=8, repeats=1)
    assert (tmp_path / "cal.json").is_file() and set(costs.target) == {1, 4}
    assert costs.target[4][3] >= costs.target[4][1] > 0       # non-decreasing in T by construction
    again = PassCosts.load_or_measure(model, model, path=tmp_path / "cal.json", batches=(1, 4), tokens=(1, 3),
                                      context=8, repeats=1)
    assert again.target == costs.target                          # read from the cache, not re-measured


def test_load_aware_k_probes_while_speculation_is_off():
    ctl = LoadAwareK(_costs(per_row=0.0), prior_alpha=0.0, prior_weight=1.0, probe_every=3, clock=None)
    assert [ctl.next_k(1) for _ in range(8)] == [0, 0, 0, 1, 0, 0, 0, 1]
    with pytest.raises(ValueError, match="probe_every"):
        LoadAwareK(_costs(per_row=0.0), probe_every=0)


def test_load_aware_k_corrects_the_calibration_with_its_own_round_times():
    # calibrated: free verification (every round 1 s); measured: a drafting round takes 3 s
    now = [0.0]
    ctl = LoadAwareK(_costs(per_row=0.0, draft=0.0), k_max=4, prior_alpha=0.6, decay=1.0, probe_every=None,
                     clock=lambda: now[0])
    assert ctl.next_k(1) == 4                    # the calibration says drafting is free
    now[0] += 3.0                                # ... but the round took 3 s
    ctl.update(drafted=4, accepted=[1])
    k = ctl.next_k(1)
    assert ctl.ratio == {4: pytest.approx(3.0)} and k == 0    # E(4) at alpha ~0.5: < 2 tokens for 3x the time
    now[0] += 1.0
    ctl.next_k(1)
    assert ctl.ratio[0] == pytest.approx(1.0)
    now[0] += 100.0                              # a pause between runs: ignored
    ctl.next_k(1)
    assert ctl.ratio[0] == pytest.approx(1.0)


def test_load_aware_k_new_run_keeps_estimates_and_restarts_the_clock():
    now = [0.0]
    ctl = LoadAwareK(_costs(per_row=0.0), k_max=4, decay=1.0, probe_every=None, clock=lambda: now[0])
    ctl.next_k(1)
    ctl.update(drafted=4, accepted=[4])
    now[0] += 2.0
    ctl.next_k(1)                                # the first round took 2 s: measured
    alpha, ratio = ctl.alpha, dict(ctl.ratio)
    ctl.new_run()
    now[0] += 4.0                                # the gap before the next run (prefill etc.): not a round
    ctl.next_k(1)
    assert ctl.alpha == alpha and ctl.ratio == ratio and len(ratio) == 1


def test_a_controller_that_turns_drafting_off_gets_plain_steps():
    """k = 0 from a controller (LoadAwareK's 'nothing pays') is a plain step through the engine, not an error."""
    from g2c.sampling.generate import generate

    class Off:
        def __init__(self):
            self.rounds = []

        def next_k(self):
            return 0 if len(self.rounds) % 2 == 0 else 3        # off, on, off, ...: both kinds of round

        def update(self, *, drafted, accepted, draft_seconds, target_seconds):
            self.rounds.append(drafted)

    target, drafter = _tiny_lm(12, 0), _tiny_lm(12, 1)
    controller = Off()
    ids, stats = speculative_sample(target, LMDrafter(drafter), [1, 2], 14, controller=controller, temperature=0.0)
    assert ids.tolist() == generate(target, torch.tensor([1, 2]), 14, temperature=0.0).tolist()
    assert controller.rounds[0::2] == [0] * len(controller.rounds[0::2]) and max(controller.rounds) > 0
    assert stats.drafted == sum(controller.rounds) and stats.generated == 14


def test_an_ordinary_token_is_no_end_of_sequence():
    with pytest.raises(ValueError, match=r"eos_id 1 is an ordinary token \(its bytes b'a'\)"):
        TokenConstraint("ab", TOY, 1)                       # 'a' as EOS would end the text it must write


def test_the_alarm_refuses_more_accepted_than_drafted():
    alarm = AcceptanceAlarm(window=1)
    with pytest.raises(ValueError, match=r"accepted \(5\) exceeds drafted \(1\)"):
        alarm.observe(1, 5)
    alarm.observe(1, 1)
    assert alarm.alarms == 0
