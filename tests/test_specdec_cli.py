"""Beyond (specdec): ``python -m g2c.specdec`` edge cases, without the ladder.

``load_model`` is replaced by table-lookup models (``tests/specdec_mocks.py``) and a
one-character-per-token tokenizer, so every case runs in milliseconds. Errors must be one
line on stderr naming what the user typed (``-k``, ``--max-new-tokens``, ``--device``, the
prompt), with a non-zero exit; harmless cases (no new tokens, a cropped prompt) say so.
"""

from __future__ import annotations

import pytest
import torch
from specdec_mocks import TableLM, chain_table

import g2c.assets.artifacts
from g2c.specdec.__main__ import main

ALPHABET = "abcdefgh"                                  # id i <-> ALPHABET[i]; 0 ('a') is end-of-text


class CharTokenizer:
    eot_id = 0

    def encode(self, text: str) -> list[int]:
        return [ALPHABET.index(c) for c in text if c in ALPHABET]

    def decode(self, ids) -> str:
        return "".join(ALPHABET[int(i)] for i in ids)


@pytest.fixture
def fake_ladder(monkeypatch):
    # Target chain b -> c -> d -> ... -> h -> b (never 'a', the end-of-text); window 8.
    table = chain_table([2, 2, 3, 4, 5, 6, 7, 1], generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(g2c.assets.artifacts, "load_model",
                        lambda name, device="auto": (TableLM(table, max_seq_len=8), CharTokenizer()))
    # A CPU-only machine whatever runs the tests.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def run(capsys, *argv):
    rc = main(["--color", "never", "--device", "cpu", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("device", ["mps", "cuda", "tpu"])
def test_cli_unavailable_device_is_one_line(fake_ladder, capsys, device):
    rc, out, err = run(capsys, "bcd", "--device", device)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and f"--device {device}:" in err and "Traceback" not in err


def test_cli_zero_new_tokens_is_not_a_missing_report(fake_ladder, capsys):
    rc, out, err = run(capsys, "bcd", "--max-new-tokens", "0")
    assert rc == 0 and err == ""
    assert out.splitlines()[0] == "bcd"
    assert "no new tokens: --max-new-tokens is 0" in out and "on_pass" not in out


def test_cli_long_prompt_says_it_is_cropped(fake_ladder, capsys):
    rc, out, err = run(capsys, "bcdefghbcdefgh", "--max-new-tokens", "3")   # 14 tokens, window 8
    assert rc == 0
    assert "the prompt is 14 tokens but the models read only the last 8" in err
    assert out.splitlines()[0].startswith("bcdefghbcdefgh")


def test_cli_fast_needs_the_kv_cache(fake_ladder, capsys):
    rc, out, err = run(capsys, "bcd", "--fast")              # table models: no KV cache to run fused
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and "--fast runs the target's KV-cached passes fused" in err
    rc, _, err = run(capsys, "bcd", "--fast", "--no-cache")
    assert rc == 1 and err.count("\n") == 1 and "drop --no-cache" in err
    rc, _, err = run(capsys, "bcd", "--fast", "--drafter", "mtp")    # an MTP head needs a TransformerLM target
    assert rc == 1 and err.count("\n") == 1 and "it needs TransformerLM models" in err and "--no-cache" not in err


@pytest.mark.parametrize("argv, expected", [
    (["bcd", "-k", "0"], "-k 0: draft at least one token"),
    (["bcd", "--drafter", "mtp", "--mtp-steps", "0"], "--mtp-steps 0: train the head for at least 1 step"),
    (["bcd", "--mtp-steps", "5"], "--mtp-steps 5 trains the head of --drafter mtp; --drafter StoryLM-1M-distilled "
                                  "trains nothing"),
    (["bcd", "--width", "1000"], "--width 1000: the EAGLE-2 expansion width is 1 (a chain) to 32"),
    (["bcd", "--max-new-tokens", "-1"], "--max-new-tokens -1: "),
    (["", "--max-new-tokens", "3"], "the prompt is empty"),
    (["   ", "--max-new-tokens", "3"], "the prompt is empty (only whitespace)"),  # a fresh trial: it ran
    (["bcd", "--device", "gpu"], "--device gpu: not a device name; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"),
    (["bcd", "--device", "cuda"], "--device cuda: CUDA is not available on this machine"),
    (["bcd", "--device", "mps"], "--device mps: MPS (Apple's GPU) is not available on this machine"),
    (["bcd", "--device", "xla"], "--device xla: the course runs on 'cpu', 'cuda' and 'mps', not 'xla'"),
    (["bcd", "-k", "5000"], "-k 5000: at most "),      # one rule for every route (it ran with some drafters)
    (["bcd", "--temperature", "-1"], "--temperature -1.0: use 0 for greedy"),
    (["bcd", "--temperature", "inf"], "--temperature inf: use 0 for greedy"),
    (["bcd", "--top-k", "0"], "--top-k 0: keep at least one token"),
    (["bcd", "--top-p", "1.5"], "--top-p 1.5: the nucleus mass is in (0, 1]"),
    (["bcd", "--top-p", "1e-46", "--temperature", "1"], "--top-p 1e-46 rounds to 0 in float32"),
    (["bcd", "--controller", "heuristic", "-k", "20"], "-k 20 with --controller heuristic: -k is the adaptive "
                                                        "controller's first draft length, and it adapts within 1..16"),
    (["bcd", "--repetition-penalty", "0"], "--repetition-penalty 0.0: use a finite value > 0"),
    (["bcd", "--stop", ""], "--stop '': an empty stop text"),
    (["bcd", "--top-k", "5", "--top-p", "0.5"], "--top-k and --top-p shape sampled draws; greedy decoding "
                                                 "(--temperature 0, the default) always takes the top token"),
    (["bcd", "--top-p", "0.5", "--temperature", "0"], "--top-p shapes sampled draws; greedy"),
])
def test_cli_bad_arguments_name_what_the_user_typed(fake_ladder, capsys, argv, expected):
    rc, out, err = run(capsys, *argv)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and expected in err
    assert "prompt_ids" not in err and "max_new_tokens" not in err


@pytest.mark.parametrize("argv, expected", [
    (["", "--max-new-tokens", "3"], "the prompt is empty"),
    (["bcd", "--device", "gpu"], "--device gpu: not a device name"),
    (["bcd", "--device", ""], "--device '': not a device name"),
    (["bcd", "-k", "0"], "-k 0: draft at least one token"),
    # a second trial: these were named only after "not written yet"; the names and the ladder's window show them
    (["bcd", "--target", "StoryLM-30M", "--drafter", "StoryLM-5M-MTP"],
     "--drafter StoryLM-5M-MTP drafts from StoryLM-5M's hidden states; use --target StoryLM-5M"),
    (["bcd", "--target", "StoryLM-5M", "--drafter", "StoryLM-30M-EAGLE"], "use --target StoryLM-30M"),
    (["bcd", "-k", "1000"], "-k 1000: at most 254 draft tokens (or tree nodes) fit the models' 256-token window"),
])
def test_cli_checks_the_arguments_before_any_course_code_runs(fake_ladder, capsys, monkeypatch, argv, expected):
    """A fresh clone (module 03's resolve_device unwritten) answered an empty prompt or --device gpu with
    "part of it is not written yet", exit 2: a mistake in what the user typed is named first, whatever is written."""
    import g2c.nn

    def unwritten(*args, **kwargs):
        raise NotImplementedError("module 03: resolve_device in g2c/nn/device.py is not implemented yet")

    monkeypatch.setattr(g2c.nn, "resolve_device", unwritten)
    rc, out, err = run(capsys, *argv)
    assert rc == 1 and out == "" and err.count("\n") == 1 and expected in err, err
    assert "not written yet" not in err
    rc, _, err = run(capsys, "bcd", "--max-new-tokens", "2")         # the same stub does stop a run
    assert rc == 2 and "not written yet" in err


def test_cli_notes_a_drafter_that_is_the_target(fake_ladder, capsys):
    # a trial: --target StoryLM-1M-distilled (the default drafter) ran with 100% acceptance and no remark
    rc, out, err = run(capsys, "bcd", "--target", "StoryLM-1M", "--drafter", "storylm-1m", "--max-new-tokens", "3")
    assert rc == 0 and "note: --drafter and --target are both StoryLM-1M: every draft is accepted" in err, err
    rc, out, err = run(capsys, "bcd", "--target", "StoryLM-5M", "--drafter", "StoryLM-1M", "--max-new-tokens", "3")
    assert rc == 0 and "note:" not in err, err


def test_cli_controls_stop_and_report_logprobs(fake_ladder, capsys):
    """The chain b -> c -> ... -> h -> b: "--stop fg" ends the text right after the 'g' that completes it,
    and --logprobs prints one log-probability per new token (the table target is peaked: near 0)."""
    rc, out, err = run(capsys, "bcd", "--max-new-tokens", "12", "--stop", "fg", "--logprobs")
    assert rc == 0 and "Traceback" not in err
    lines = out.splitlines()
    assert lines[0].replace("[", "").replace("]", "") == "bcdefg"
    values = [float(x) for x in next(x for x in lines if x.startswith("logprobs")).split(":")[1].split()]
    assert len(values) == 3 and all(-0.1 < v <= 0.0 for v in values)
    assert any(x.startswith("mean ") and "perplexity" in x for x in lines)


def test_cli_seed_outside_the_generator_range_is_named(fake_ladder, capsys):
    """A helper's trial: --seed 99999999999999999999 printed torch's "Overflow when unpacking long long"."""
    for bad, why in ((str(2**63), "is above 2**63 - 1"),
                     ("99999999999999999999", "is above 2**63 - 1; a seed is an int in [0, 2**63 - 1]"),
                     ("-1", "-1 is below 0"), ("x", "'x' is not an integer")):
        with pytest.raises(SystemExit) as ended:
            run(capsys, "bcd", "--seed", bad)
        err = capsys.readouterr().err
        assert ended.value.code == 2 and "argument --seed: " in err and why in err
    rc, out, _ = run(capsys, "bcd", "--seed", str(2**63 - 1), "--temperature", "1", "--max-new-tokens", "2")
    assert rc == 0 and out.startswith("bcd")


def test_cli_mistyped_model_is_refused_first_with_the_closest_name(monkeypatch, capsys):
    """A student trial: with module 03 unwritten, ``--drafter StoryLM-1M-distiled`` reported the unwritten
    module (the target loads first) and the typo only once 03 was done, with exit 1 where every other
    usage error exits 2. The name is now checked as the flag is read, before anything loads."""
    def unwritten(name, device="auto"):
        raise NotImplementedError("module 03: resolve_device in g2c/nn/device.py is not implemented yet")

    monkeypatch.setattr(g2c.assets.artifacts, "load_model", unwritten)
    for flag, typed, closest in (("--drafter", "StoryLM-1M-distiled", "'StoryLM-1M-distilled'"),
                                 ("--drafter", "ngarm", "'ngram'"), ("--target", "storylm-30", "'StoryLM-30M'")):
        with pytest.raises(SystemExit) as ended:
            run(capsys, "bcd", flag, typed)
        err = capsys.readouterr().err
        assert ended.value.code == 2 and f"argument {flag}: unknown model {typed!r} (did you mean {closest}" in err
        assert "module 03" not in err
    with pytest.raises(SystemExit):
        run(capsys, "bcd", "--target", "ngram")                 # the keywords are drafters only
    err = capsys.readouterr().err
    line = err.splitlines()[-1]
    assert "argument --target: unknown model 'ngram'" in line and "mtp" not in line and ", ngram" not in line
    rc, _, err = run(capsys, "bcd", "--drafter", "NGRAM", "--max-new-tokens", "2")   # any case, then it loads
    assert rc == 2 and "module 03" in err


def test_cli_marks_accepted_drafts_line_by_line():
    """An accepted draft run that crosses a line break is bracketed (or coloured) on each line,
    so no mark spans two lines of the story."""
    from g2c.specdec.__main__ import GREEN, RESET, render

    class Chars:                                 # token i decodes to the i-th character of the alphabet
        alphabet = "ab.\nCd"

        def decode(self, ids):
            return "".join(self.alphabet[i] for i in ids)

    passes = [([1, 2, 3, 4, 5], 4), ([0], 0)]    # 'b.\nC' accepted, 'd' the target's, then 'a'
    assert render(Chars(), [0], passes, color=False) == "[b.]\n[C]da"          # the continuation after 'a'
    assert render(Chars(), [0], passes, color=True) == f"{GREEN}b.{RESET}\n{GREEN}C{RESET}da"
    assert render(Chars(), [0], [([3, 1], 1)], color=False) == "\nb"          # a lone newline: no empty []
