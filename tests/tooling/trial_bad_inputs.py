#!/usr/bin/env python3
"""A trial of bad input (issue 57): feed many bad inputs to every surface and classify each outcome.

Not a test file (pytest does not collect it: the standing guards are ``test_bad_inputs.py`` and
``test_fuzz.py``); a harness to run before and after a change, on any checkout:

    .venv/bin/python tests/tooling/trial_bad_inputs.py                 # this checkout (copied first)
    .venv/bin/python tests/tooling/trial_bad_inputs.py --repo /tmp/main-copy --list unclear,silent
    .venv/bin/python tests/tooling/trial_bad_inputs.py --only api       # one surface: api, scripts, shell, faults
    .venv/bin/python tests/tooling/trial_bad_inputs.py --only blocks    # the building blocks only (part of api)

The checkout is copied to a temporary folder first (``repo_copy.copy_repo``; nothing is written in the
real one) and every case runs there, with the answer key applied (``G2C_APPLY_SOLUTIONS=all``: bad input
is judged on the complete code). Surfaces:

* ``api``: every public function and class of the course packages, called once with good arguments (a
  control, which must succeed), then once per bad value of each argument (generated from the argument's
  kind: counts, reals, probabilities, token ids, models, generators, flags, choices, tensors);
* ``scripts``: every option of every ``bench/*.py``, ``g2c/assets`` entry point and script a student,
  teacher or author runs, with bad values (and every output path option with paths no writer can use),
  run in-process up to the point where work would start (loading a model, building a network,
  starting a process: a sentinel stops it there, counted as "accepted");
* ``shell``: ``./test.sh``, ``./notebook.sh``, ``./checkpoints.sh``, ``./datasets.sh`` and the environment
  variables the course reads, in subprocesses;
* ``faults``: damaged artifacts, edited pins, writes into the shipped artifacts, interrupted exports,
  full disks, read-only checkouts;
* ``blocks``: the api cases of the building blocks of modules 03-11 (layers, configs, training controls,
  losses, attention helpers, warpers), reported on their own line; ``--only blocks`` runs them alone.

Classes: ``clear`` (a bad input refused by a ValueError/TypeError/IndexError raised by the course's own
code, one line; a script's one ``error`` line and a nonzero exit, no traceback; and, where the case names
the cause it expects, a message that names it); ``unclear`` (anything else that stops: a raw library
error, a traceback, several lines, the wrong cause); ``silent`` (a bad input accepted: a result, exit 0,
or a script that went on to work); ``ok`` / ``refused-good`` for the good controls.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CLEAR = (ValueError, TypeError, IndexError)


@dataclass
class Case:
    surface: str
    name: str
    thunk: object            # () -> result; raises to refuse
    bad: bool | None = True    # None: either a result or a clear refusal is right (a list where a tensor is
    #                           documented, converted faithfully); an unclear error still counts
    expect: str | None = None  # a regex the error message must match (the cause)
    kind: str = "call"       # call | script | proc

    @property
    def type_error(self) -> bool:
        """A value of the wrong Python type: refused by a TypeError (the project's type rule)."""
        m = re.search(r"=([^()]*)\)$", self.name)
        return self.kind == "call" and m is not None and m.group(1) in TYPE_DESCS


@dataclass
class Outcome:
    case: Case
    cls: str                 # clear | unclear | silent | ok | refused-good
    detail: str


class Sentinel(BaseException):
    """Raised where a script would start its work (a model load, a network, a process)."""


# -- classification -----------------------------------------------------------------------------------------

def _own(path: str, repo: Path) -> bool:
    p = str(Path(path).resolve())
    return p.startswith(str(repo / "g2c")) or p.startswith(str(repo / "solutions")) or \
        p.startswith(str(repo / "bench")) or p.startswith(str(repo / "scripts"))


def judge_call(case: Case, repo: Path) -> Outcome:
    try:
        result = case.thunk()
    except Sentinel:
        return Outcome(case, "silent" if case.bad else "ok", "reached the work")
    except Exception as exc:  # noqa: BLE001 - classified below
        msg = str(exc)
        if case.bad is False:
            return Outcome(case, "refused-good", f"{type(exc).__name__}: {msg[:300]}")
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        why = []
        if not isinstance(exc, CLEAR):
            why.append(f"raw {type(exc).__name__}")
        if not msg.strip() or "\n" in msg.strip():
            why.append("not one line")
        if last is not None and not _own(last.filename, repo):
            why.append(f"raised in {Path(last.filename).name}:{last.lineno}")
        if case.expect and not re.search(case.expect, msg):
            why.append(f"wrong cause (wanted /{case.expect}/)")
        if isinstance(exc, ValueError) and case.type_error:
            why.append("a wrong type reported as a wrong value (ValueError, not TypeError)")
        if isinstance(exc, TypeError) and "unexpected keyword argument" in msg and \
                (not case.expect or re.search(case.expect, msg)):
            why = [w for w in why if not w.startswith("raised in")]       # Python's own message names the keyword
        return Outcome(case, "unclear" if why else "clear", f"{'; '.join(why)}{': ' if why else ''}"
                                                            f"{type(exc).__name__}: {msg[:300]}")
    else:
        if case.bad:
            return Outcome(case, "silent", f"returned {str(result)[:200]!r}")
        return Outcome(case, "ok", "")


TYPE_DESCS = ("float", "str", "bool", "list", "object", "None", "complex", "2-elem tensor", "float tensor", "int seed",
              "a name", "a bare function", "bytes", "int")


def judge_script(case: Case, repo: Path) -> Outcome:
    """case.thunk() -> (rc, out, err, reached) for an in-process script run or a subprocess."""
    try:
        rc, out, err, reached = case.thunk()
    except Exception as exc:  # noqa: BLE001 - a traceback out of main()
        tb = traceback.extract_tb(exc.__traceback__)[-1]
        cls = "unclear" if case.bad else "refused-good"
        return Outcome(case, cls, f"traceback: {type(exc).__name__}: {str(exc)[:250]} "
                                  f"({Path(tb.filename).name}:{tb.lineno})")
    if reached or rc in (0, None):
        if case.bad is None:
            return Outcome(case, "ok", "either: accepted")
        if case.bad:
            return Outcome(case, "silent", "accepted (went on to work)" if reached else f"exit {rc}: {out[-200:]!r}")
        return Outcome(case, "ok", "")
    if case.bad is False:
        return Outcome(case, "refused-good", f"exit {rc}: {err.strip()[-300:]}")
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("usage:")
             and not line.startswith("  ") and not line.startswith("g2c: reference solutions")]
    why = []
    if "Traceback" in err:
        why.append("traceback")
    errors = [line for line in lines if "error" in line.lower() or line.startswith(("test.sh", "notebook.sh"))]
    if not lines:
        why.append("no message")
    elif len(lines) > 2 and not errors:
        why.append("no error line")
    if case.expect and not re.search(case.expect, err):
        why.append(f"wrong cause (wanted /{case.expect}/)")
    text = " | ".join(lines[-3:])[:400]
    return Outcome(case, "unclear" if why else "clear", f"{'; '.join(why)}{': ' if why else ''}exit {rc}: {text}")


# -- values ---------------------------------------------------------------------------------------------------

def int_bad(lo: int | None, hi: int | None = None, *, optional: bool = False):
    import torch

    vals = [(2.5, "float"), ("3", "str"), (True, "bool"), (float("nan"), "nan"), ([2], "list"),
            (torch.tensor([1, 2]), "2-elem tensor"), (torch.tensor(2.0), "float tensor"), (object(), "object")]
    if not optional:
        vals.append((None, "None"))
    if lo is not None:
        vals.append((lo - 1, f"{lo - 1} (< {lo})"))
        vals.append((-(10**20), "-1e20"))
    if hi is not None:
        vals.append((hi + 1, f"{hi + 1} (> {hi})"))
    return vals


def real_bad(lo=None, hi=None, *, lo_open=False, hi_open=False, optional=False, finite=True):
    import torch

    vals = [("0.5", "str"), (True, "bool"), (float("nan"), "nan"), ([0.5], "list"),
            (torch.tensor([0.5, 0.5]), "2-elem tensor"), (object(), "object"), (complex(0.5, 1), "complex")]
    if not optional:
        vals.append((None, "None"))
    if finite:
        vals += [(float("inf"), "inf"), (float("-inf"), "-inf")]
    if lo is not None:
        vals.append((lo if lo_open else lo - 1, f"{'=' if lo_open else '<'} lo {lo}"))
    if hi is not None:
        vals.append((hi if hi_open else hi + 1.5, f"{'=' if hi_open else '>'} hi {hi}"))
    return vals


def ids_bad(vocab: int):
    import torch

    return [([], "empty"), ([1.5, 2.0], "floats"), ([1, -1], "negative id"), ([1, vocab], "id = V"),
            ("12", "text"), (None, "None"), ([[1, 2], [3, 4]], "2-D"), (torch.tensor([1.0, 2.0]), "float ids"),
            (torch.tensor([True, False]), "bool ids"), ([True, 1], "bool in list"), (object(), "object"),
            (torch.tensor(3), "0-d tensor"), ([1, 2**40], "huge id")]


def gen_bad():
    import torch

    class Elsewhere(torch.Generator):
        @property
        def device(self):
            return torch.device("cuda:0")

    return [(3, "int seed"), ("seed", "str"), (object(), "object"), (Elsewhere().manual_seed(0), "cuda generator")]


def flag_bad():
    return [("no", "str"), (1.5, "float"), (None, "None"), (2, "int 2")]


def choice_bad():
    return [("bogus", "unknown"), (None, "None"), (3, "int"), ("", "empty")]


def model_bad():
    return [(object(), "object"), (None, "None"), ("StoryLM-1M", "a name"), (lambda ids: ids, "a bare function")]


# -- the API surface ----------------------------------------------------------------------------------------

V = 16
BLOCKS = ("nn.", "training.", "attention.", "transformer.", "pretraining.", "lm.", "embeddings.",
          # module 11's warpers and sampling step: exercises whose caller (generate) validates; a bare helper
          "sampling.sample_from_logits", "sampling.top_k_filter", "sampling.top_p_filter", "sampling.apply_temperature",
          "sampling.apply_repetition_penalty", "sampling.next_token_logits", "recurrent.GatedLinearAttention")


def api_cases(repo: Path) -> list[Case]:
    import numpy as np
    import torch

    import g2c.attention as A
    import g2c.embeddings as E
    import g2c.kvcache as KV
    import g2c.lm as LM
    import g2c.nn as NN
    import g2c.pretraining as PT
    import g2c.recurrent as R
    import g2c.sampling as S
    import g2c.specdec as SD
    import g2c.specdec.lab as LAB
    import g2c.specdec.lineage as LIN
    import g2c.specdec.sampling as SS
    import g2c.specdec.theory as TH
    import g2c.specdec.trees as TR
    import g2c.training as TRN
    import g2c.transformer as T

    def lm(seed=0, vocab=V, dim=8, layers=2, heads=2, seq=32):
        return T.TransformerLM(vocab, dim, layers, heads, seq, generator=torch.Generator().manual_seed(seed)).eval()

    target, draft = lm(0), lm(1)
    other_vocab = lm(2, vocab=V + 3)
    rec = R.fan_in_init_(R.RecurrentLM(V, 16, 2, 2, layout="RA", max_seq_len=32),
                         generator=torch.Generator().manual_seed(0)).eval()
    cases: list[Case] = []

    def add(name, call, base: dict, params: dict):
        """A control (call(**base)) and, per param, call(**base | {param: bad}). A list where the control passes a
        tensor may be taken (converted) or refused; the building blocks of modules 03-11 (the student's own
        layers and steps, checked in their provided code: constructors, config ``__post_init__``, the provided
        lines before an exercise body) are the separate surface "blocks", outside the trial's target."""
        surface = "blocks" if name.startswith(BLOCKS) else "api"
        cases.append(Case(surface, f"{name} (good)", lambda: call(**base), bad=False))
        for param, values in params.items():
            for value, desc in values:
                kw = {**base, param: value}
                either = desc == "list" and isinstance(base.get(param), torch.Tensor)
                cases.append(Case(surface, f"{name}({param}={desc})", (lambda kw=kw: call(**kw)),
                                  bad=None if either else True))

    def good(name, call):
        cases.append(Case("api", f"{name} (good variant)", call, bad=False))

    gen = lambda s=0: torch.Generator().manual_seed(s)  # noqa: E731

    # -- module 03 / 03b: building blocks and training controls
    add("nn.Linear", lambda **k: NN.Linear(k["i"], k["o"], init_std=k["s"]), {"i": 4, "o": 3, "s": 0.02},
        {"i": int_bad(1), "o": int_bad(1), "s": real_bad(0, lo_open=False)})
    add("nn.Embedding", lambda **k: NN.Embedding(k["n"], k["d"]), {"n": 5, "d": 3}, {"n": int_bad(1), "d": int_bad(1)})
    add("nn.LayerNorm", lambda **k: NN.LayerNorm(k["d"], eps=k["eps"]), {"d": 4, "eps": 1e-5},
        {"d": int_bad(1), "eps": real_bad(0)})           # eps = 0 is a good value (test_nn's biased-variance test)
    add("nn.Dropout", lambda **k: NN.Dropout(k["p"]), {"p": 0.1}, {"p": real_bad(0, 1, hi_open=True)})
    add("nn.resolve_device", lambda **k: NN.resolve_device(k["d"]), {"d": "cpu"},
        {"d": [("tpu", "unknown"), (3, "int"), ("cuda:abc", "bad index"), ("cuda", "unavailable cuda"),
               ("mps", "unavailable mps"), (None, "None"), ("", "empty")]})
    add("nn.time_call", lambda **k: NN.time_call(k["fn"], warmup=k["w"], repeats=k["r"]),
        {"fn": lambda: 1, "w": 0, "r": 2}, {"fn": [(3, "int"), (None, "None")], "w": int_bad(0), "r": int_bad(1)})
    lin = NN.Linear(3, 2)
    add("nn.Linear.__call__", lambda **k: lin(k["x"]), {"x": torch.randn(2, 3)},
        {"x": [(torch.randn(2, 4), "wrong width"), ([1.0, 2.0, 3.0], "list"), (torch.ones(2, 3, dtype=torch.long),
                                                                                "int tensor"), (None, "None")]})
    ln = NN.LayerNorm(4)
    add("nn.LayerNorm.__call__", lambda **k: ln(k["x"]), {"x": torch.randn(2, 4)},
        {"x": [(torch.randn(2, 5), "wrong width"), ("x", "str"), (torch.ones(2, 4, dtype=torch.long), "int tensor")]})
    emb = NN.Embedding(5, 3)
    add("nn.Embedding.__call__", lambda **k: emb(k["x"]), {"x": torch.tensor([0, 4])},
        {"x": [(torch.tensor([5]), "id = V"), (torch.tensor([-1]), "negative"), (torch.tensor([1.0]), "float dtype"),
               ([1, 2], "list")]})

    params = [torch.nn.Parameter(torch.randn(3))]
    add("training.AdamW", lambda **k: TRN.AdamW(k["p"], lr=k["lr"], betas=k["b"], eps=k["eps"],
                                                 weight_decay=k["wd"]),
        {"p": params, "lr": 1e-3, "b": (0.9, 0.999), "eps": 1e-8, "wd": 0.01},
        {"p": [([], "no params"), (None, "None"), (3, "int"), ([torch.randn(3)], "a tensor without grad")],
         "lr": real_bad(0), "eps": real_bad(0), "wd": real_bad(0),     # eps = 0 is good (test_training uses it)
         "b": [((0.9,), "one beta"), ((1.0, 0.999), "beta1 = 1"), ((0.9, -0.1), "negative beta2"), ("0.9", "str"),
               (None, "None"), ((float("nan"), 0.9), "nan beta")]})
    add("training.clip_grad_norm_", lambda **k: TRN.clip_grad_norm_(k["p"], k["m"], eps=k["eps"]),
        {"p": params, "m": 1.0, "eps": 1e-6},
        {"m": real_bad(0, lo_open=True), "eps": real_bad(0), "p": [(3, "int"), (None, "None")]})
    add("training.cosine_with_warmup", lambda **k: TRN.cosine_with_warmup(k["s"], warmup_steps=k["w"],
                                                                          max_steps=k["m"], max_lr=k["lr"],
                                                                          min_lr=k["mn"]),
        {"s": 3, "w": 2, "m": 10, "lr": 1e-3, "mn": 1e-4},
        {"s": int_bad(0), "w": int_bad(0), "m": int_bad(1), "lr": real_bad(0),
         "mn": real_bad(0) + [(1.0, "min > max")]})

    # -- module 04: the tokenizer
    from g2c.tokenizer import BPETokenizer
    tok = BPETokenizer.train(["hello world hello there " * 20], vocab_size=270, show_progress=False)
    if tok is not None:
        add("tokenizer.encode", lambda **k: tok.encode(k["t"]), {"t": "hello"},
            {"t": [(None, "None"), (b"hello", "bytes"), (3, "int"), (["hello"], "list")]})
        add("tokenizer.decode", lambda **k: tok.decode(k["ids"]), {"ids": [104, 101]},
            {"ids": [([tok.vocab_size], "id = V"), ([-1], "negative"), ([1.5], "float"), ("12", "str"),
                     (None, "None"), ([True], "bool"), (torch.tensor([[1, 2]]), "2-D tensor")]})

    # -- modules 05-08: embeddings, lm, attention
    temb, pemb = NN.Embedding(V, 4), NN.Embedding(8, 4)
    add("embeddings.embed_tokens_and_positions", lambda **k: E.embed_tokens_and_positions(k["ids"], temb, pemb),
        {"ids": torch.tensor([[1, 2, 3]])},
        {"ids": [(torch.tensor([[1, V]]), "id = V"), (torch.zeros(1, 9, dtype=torch.long), "longer than positions"),
                 (torch.tensor([[1.0, 2.0]]), "float dtype"), ([1, 2], "list"), (torch.tensor([[-1, 2]]), "negative")]})
    add("lm.cross_entropy", lambda **k: LM.cross_entropy(k["l"], k["t"]),      # documented: (N, V) and (N,)
        {"l": torch.randn(3, V), "t": torch.tensor([1, 2, 3])},
        {"l": [(torch.randn(2, 3, V), "3-D"), (torch.ones(3, V, dtype=torch.long), "int logits"),
               (torch.randn(4, V), "wrong N"), ([1.0], "list")],
         "t": [(torch.tensor([1, 2, V]), "target = V"), (torch.tensor([1, 2, -5]), "negative target"),
               (torch.ones(3), "float targets"), (torch.tensor([[1, 2, 3]]), "2-D")]})
    add("lm.log_softmax", lambda **k: LM.log_softmax(k["l"]), {"l": torch.randn(2, V)},
        {"l": [([1.0, 2.0], "list"), (torch.ones(2, 3, dtype=torch.long), "int dtype"),
               (torch.randn(0, V), "empty rows"), (torch.randn(2, 0), "empty vocab")]})
    add("lm.perplexity", lambda **k: LM.perplexity(k["x"]), {"x": 2.0},
        {"x": real_bad(0) + [(torch.tensor([1.0, 2.0]), "2 losses")]})
    add("attention.causal_mask", lambda **k: A.causal_mask(k["q"], k["kk"]), {"q": 3, "kk": 5},
        {"q": int_bad(1), "kk": int_bad(1, optional=True) + [(2, "fewer keys than queries")]})
    q = torch.randn(1, 2, 3, 4)
    add("attention.scaled_dot_product_attention", lambda **k: A.scaled_dot_product_attention(k["q"], k["k"], k["v"]),
        {"q": q, "k": q, "v": q},
        {"q": [(torch.randn(1, 2, 3, 5), "wrong head dim"), (q.long(), "int dtype"), ([1.0], "list")],
         "k": [(torch.randn(1, 2, 2, 4), "fewer keys (causal)"), (torch.randn(1, 2, 3, 5), "wrong head dim")],
         "v": [(torch.randn(1, 2, 4, 4), "wrong length"), (torch.randn(2, 2, 3, 4), "wrong batch")]})
    add("attention.split_heads", lambda **k: A.split_heads(k["x"], k["h"]), {"x": torch.randn(1, 3, 8), "h": 2},
        {"h": int_bad(1) + [(3, "does not divide D")], "x": [(torch.randn(3, 8), "2-D"), ([1.0], "list")]})
    add("attention.merge_heads", lambda **k: A.merge_heads(k["x"]), {"x": torch.randn(1, 2, 3, 4)},
        {"x": [(torch.randn(2, 3, 4), "3-D"), ("x", "str")]})
    add("attention.MultiHeadAttention", lambda **k: A.MultiHeadAttention(k["d"], k["h"], dropout=k["p"]),
        {"d": 8, "h": 2, "p": 0.0}, {"d": int_bad(1), "h": int_bad(1) + [(3, "does not divide D")],
                                     "p": real_bad(0, 1, hi_open=True)})
    mha = A.MultiHeadAttention(8, 2)
    add("attention.MultiHeadAttention.__call__", lambda **k: mha(k["x"]), {"x": torch.randn(1, 3, 8)},
        {"x": [(torch.randn(1, 3, 7), "wrong width"), (torch.randn(3, 8), "2-D"), (torch.ones(1, 3, 8).long(),
                                                                                   "int dtype")]})
    add("attention.CausalSelfAttention", lambda **k: A.CausalSelfAttention(k["d"]), {"d": 8}, {"d": int_bad(1)})

    # -- module 09: the transformer
    add("transformer.TransformerLM", lambda **k: T.TransformerLM(k["v"], k["d"], k["l"], k["h"], k["t"],
                                                                  hidden_dim=k["hd"], dropout=k["p"]),
        {"v": V, "d": 8, "l": 1, "h": 2, "t": 16, "hd": None, "p": 0.0},
        {"v": int_bad(1), "d": int_bad(1), "l": int_bad(1), "h": int_bad(1) + [(3, "does not divide D")],
         "t": int_bad(1), "hd": int_bad(1, optional=True), "p": real_bad(0, 1, hi_open=True)})
    add("transformer.TransformerLM.__call__", lambda **k: target(k["x"]), {"x": torch.tensor([[1, 2, 3]])},
        {"x": [(torch.tensor([[1, V]]), "id = V"), (torch.tensor([[-1, 2]]), "negative"),
               (torch.zeros(1, 33, dtype=torch.long), "longer than the window"), (torch.tensor([1, 2]), "1-D"),
               (torch.tensor([[1.0, 2.0]]), "float dtype"), ([[1, 2]], "list"), (torch.zeros(1, 0, dtype=torch.long),
                                                                           "empty")]})
    add("transformer.StoryLMConfig", lambda **k: T.StoryLMConfig(k["n"], vocab_size=k["v"], num_heads=k["h"]),
        {"n": "x", "v": 64, "h": 4}, {"v": int_bad(1), "h": int_bad(1) + [(3, "does not divide D")],
                                      "n": [(3, "int name"), (None, "None")]})
    add("transformer.Block", lambda **k: T.Block(k["d"], k["h"], hidden_dim=k["hd"]), {"d": 8, "h": 2, "hd": 16},
        {"d": int_bad(1), "h": int_bad(1), "hd": int_bad(1)})
    add("transformer.MLP", lambda **k: T.MLP(k["d"], k["hd"], dropout=k["p"]), {"d": 8, "hd": 16, "p": 0.0},
        {"d": int_bad(1), "hd": int_bad(1), "p": real_bad(0, 1, hi_open=True)})

    # -- 09b / 10: pretraining and the trainer
    stream = np.arange(200) % V
    add("pretraining.get_lm_batch", lambda **k: PT.get_lm_batch(k["ids"], k["b"], k["c"], generator=k["g"]),
        {"ids": stream, "b": 2, "c": 8, "g": gen()},
        {"ids": [(np.arange(5), "shorter than context + 1"), ([1.5] * 50, "floats"), (None, "None"), ("abc", "str"),
                 (np.arange(20).reshape(4, 5), "2-D")],
         "b": int_bad(1), "c": int_bad(1), "g": gen_bad()})
    add("pretraining.lm_cross_entropy", lambda **k: PT.lm_cross_entropy(k["l"], k["t"]),
        {"l": torch.randn(2, 3, V), "t": torch.tensor([[1, 2, 3], [0, 1, 2]])},
        {"l": [(torch.randn(2, 3), "2-D"), (torch.randn(2, 4, V), "wrong T")],
         "t": [(torch.tensor([[1, 2, V], [0, 1, 2]]), "target = V"), (torch.ones(2, 3), "float targets")]})
    add("pretraining.split_stream", lambda **k: PT.split_stream(k["ids"], k["f"]), {"ids": stream, "f": 0.1},
        {"f": real_bad(0, 1, lo_open=True, hi_open=True), "ids": [(None, "None"), ([], "empty"), ("abc", "str")]})
    add("pretraining.stream_loss", lambda **k: PT.stream_loss(target, k["ids"], context=k["c"], batch_size=k["b"]),
        {"ids": stream, "c": 8, "b": 2},
        {"c": int_bad(1) + [(33, "longer than the window")], "b": int_bad(1),
         "ids": [(np.arange(3), "shorter than context"), (np.array([1, V]), "id = V"), (None, "None")]})
    add("pretraining.TrainConfig", lambda **k: PT.TrainConfig(batch_size=k["b"], max_lr=k["lr"], max_steps=k["m"],
                                                               warmup_steps=k["w"]),
        {"b": 2, "lr": 1e-3, "m": 10, "w": 2},
        {"b": int_bad(1), "lr": real_bad(0, lo_open=True), "m": int_bad(1), "w": int_bad(0) + [(11, "> max_steps")]})
    add("pretraining.Trainer", lambda **k: PT.Trainer(k["m"], k["ids"], config=k["c"]),
        {"m": lm(5), "ids": stream, "c": PT.TrainConfig(batch_size=2, context=8, max_steps=2, warmup_steps=1)},
        {"m": model_bad(), "ids": [(np.arange(3), "too short"), (None, "None"), (np.array([1, V] * 40), "id = V")],
         "c": [("fast", "str"), (3, "int"), (PT.TrainConfig(batch_size=2, context=64, max_steps=2, warmup_steps=1),
                                             "context past the window")]})

    # -- module 11: sampling
    logits = torch.randn(V)
    add("sampling.sample_from_logits", lambda **k: S.sample_from_logits(k["l"], temperature=k["t"], top_k=k["k"],
                                                                        top_p=k["p"], generator=k["g"]),
        {"l": logits, "t": 1.0, "k": None, "p": None, "g": gen()},
        {"l": [(torch.full((V,), float("nan")), "nan logits"), (torch.full((V,), float("-inf")), "all -inf"),
               (logits.long(), "int logits"), ([1.0, 2.0], "list"), (torch.randn(0), "empty")],
         "t": real_bad(0), "k": int_bad(1, optional=True), "p": real_bad(0, 1, lo_open=True, optional=True),
         "g": gen_bad()})
    add("sampling.top_k_filter", lambda **k: S.top_k_filter(k["l"], k["k"]), {"l": logits, "k": 3},
        {"k": int_bad(1), "l": [([1.0], "list"), (logits.long(), "int dtype")]})
    add("sampling.top_p_filter", lambda **k: S.top_p_filter(k["l"], k["p"]), {"l": logits, "p": 0.9},
        {"p": real_bad(0, 1, lo_open=True) + [(1e-46, "rounds to 0")], "l": [([1.0], "list")]})
    add("sampling.apply_temperature", lambda **k: S.apply_temperature(k["l"], k["t"]), {"l": logits, "t": 0.7},
        {"t": real_bad(0, lo_open=True)})
    add("sampling.apply_repetition_penalty", lambda **k: S.apply_repetition_penalty(k["l"], k["ids"], k["p"]),
        {"l": logits, "ids": torch.tensor([1, 2]), "p": 1.2},
        {"p": real_bad(0, lo_open=True), "ids": [(torch.tensor([V]), "id = V"), (torch.tensor([-1]), "negative"),
                                                  (torch.tensor([1.0]), "float dtype"), ([1, 2], "list")]})
    add("sampling.as_token_ids", lambda **k: S.as_token_ids(k["ids"], vocab_size=V), {"ids": [1, 2]},
        {"ids": ids_bad(V)})
    add("sampling.next_token_logits", lambda **k: S.next_token_logits(k["m"], k["ids"]),
        {"m": target, "ids": torch.tensor([1, 2])},           # documented: ids 1-D (one sequence)
        {"m": model_bad(), "ids": [(torch.tensor([[1, 2]]), "2-D"), (torch.tensor([1, V]), "id = V")]})

    # -- the loops: every loop x prompts, budgets, knobs
    loops = {
        "generate": lambda p, n, **kw: S.generate(target, p, n, **kw),
        "cached_generate": lambda p, n, **kw: KV.cached_generate(target, p, n, **kw),
        "speculative_generate": lambda p, n, **kw: SD.speculative_generate(target, draft, p, n, **kw),
        "speculative_sample": lambda p, n, **kw: SS.speculative_sample(target, SS.LMDrafter(draft), p, n, **kw),
        "speculative_generate_cached": lambda p, n, **kw: SS.speculative_generate_cached(target, draft, p, n, **kw),
        "tree_speculative_generate": lambda p, n, **kw: TR.tree_speculative_generate(target, draft, p, n, **kw),
        "batched_greedy": lambda p, n, **kw: LAB.batched_greedy(target, [p], n, **kw),
        "batched_speculative_generate": lambda p, n, **kw: LAB.batched_speculative_generate(target, draft, [p], n,
                                                                                            **kw),
        "plain_greedy": lambda p, n, **kw: R.plain_greedy(rec, p, n, **kw),
        "speculative_generate_stateful": lambda p, n, **kw: R.speculative_generate_stateful(
            rec, R.greedy_drafter(rec), p, n, **kw),
    }
    knobs = {
        "generate": ("temperature", "top_k", "top_p", "repetition_penalty", "eos_id", "generator"),
        "cached_generate": ("temperature", "top_k", "top_p", "repetition_penalty", "eos_id", "generator"),
        "speculative_generate": ("k", "eos_id"),
        "speculative_sample": ("k", "temperature", "top_k", "top_p", "repetition_penalty", "eos_id", "generator",
                               "stop_ids", "stop_strings", "logprobs"),
        "speculative_generate_cached": ("k", "eos_id"),
        "tree_speculative_generate": ("num_nodes", "temperature", "top_k", "top_p", "repetition_penalty", "eos_id",
                                      "generator", "tree", "width", "stop_ids", "stop_strings", "logprobs"),
        "batched_greedy": ("eos_id",),
        "batched_speculative_generate": ("k", "eos_id"),
        "plain_greedy": (),
        "speculative_generate_stateful": ("k", "eos_id", "strategy"),
    }
    knob_bad = {
        "temperature": real_bad(0), "top_k": int_bad(1, optional=True),
        "top_p": real_bad(0, 1, lo_open=True, optional=True), "repetition_penalty": real_bad(0, lo_open=True),
        "eos_id": int_bad(0, V - 1, optional=True), "generator": gen_bad(), "k": int_bad(1),
        "num_nodes": int_bad(1), "stop_ids": [([V], "id = V"), ([1.5], "float"), ("5", "str"), (True, "bool")],
        "stop_strings": [([""], "empty string"), ([3], "int"), (b"ab", "bytes"), (["ab"], "no decode")],
        "logprobs": flag_bad(), "tree": choice_bad(), "width": int_bad(1, optional=True),
        "strategy": choice_bad(),
    }
    for name, call in loops.items():
        cases.append(Case("api", f"{name} (good)", lambda call=call: call([1, 2], 3), bad=False))
        for value, desc in ids_bad(V):
            cases.append(Case("api", f"{name}(prompt={desc})", lambda call=call, v=value: call(v, 3)))
        for value, desc in int_bad(0):
            cases.append(Case("api", f"{name}(max_new_tokens={desc})", lambda call=call, v=value: call([1, 2], v)))
        cases.append(Case("api", f"{name}(prompt past the window: slides)", lambda call=call: call([1] * 40, 3),
                          bad=False if name not in ("batched_greedy", "batched_speculative_generate", "plain_greedy",
                                                    "speculative_generate_stateful") else None))
        for knob in knobs[name]:
            for value, desc in knob_bad[knob]:
                extra = {knob: value}
                if knob in ("top_k", "top_p", "repetition_penalty") and name != "speculative_sample":
                    extra["temperature"] = 1.0
                cases.append(Case("api", f"{name}({knob}={desc})", lambda call=call, e=extra: call([1, 2], 3, **e)))
        # controls a loop does not take: refused by name (a TypeError naming the keyword), never ignored
        for knob, value in (("repetition_penalty", 1.5), ("stop_strings", ["x"]), ("stop_ids", [3]),
                            ("logprobs", True), ("top_p", 0.5)):
            if knob not in knobs[name] and not (knob == "top_p" and "temperature" in knobs[name]):
                # Python names the keyword of a function without it; a preset that passes **kwargs on must say
                # which call takes the control (issue 57: the stateful preset failed in a transaction's constructor)
                cases.append(Case("api", f"{name}({knob}: not its control)",
                                  lambda call=call, e={knob: value}: call([1, 2], 3, **e),
                                  expect=rf"{knob}.*speculative_sample" if name.endswith("stateful") else knob))
    # collaborators of the wrong kind
    for name, call in (("speculative_sample", lambda d: SS.speculative_sample(target, d, [1, 2], 3)),
                       ("speculative_generate", lambda d: SD.speculative_generate(target, d, [1, 2], 3)),
                       ("tree_speculative_generate", lambda d: TR.tree_speculative_generate(target, d, [1, 2], 3)),
                       ("lineage_generate", lambda d: LIN.lineage_generate(target, d, [1, 2], 3))):
        for value, desc in model_bad() + [(other_vocab, "another vocabulary"),
                                          (SS.LMDrafter(other_vocab), "drafter of another vocabulary")]:
            cases.append(Case("api", f"{name}(drafter={desc})", lambda call=call, v=value: call(v)))
    for value, desc in model_bad():
        cases.append(Case("api", f"generate(model={desc})", lambda v=value: S.generate(v, [1, 2], 3)))
        cases.append(Case("api", f"speculative_sample(target={desc})",
                          lambda v=value: SS.speculative_sample(v, SS.LMDrafter(draft), [1, 2], 3)))

    # -- module 16: the KV cache
    add("kvcache.KVCache", lambda **k: KV.KVCache(k["l"], k["b"], k["h"], k["d"], k["t"], dtype=k["dt"],
                                                 device=k["dev"]),
        {"l": 1, "b": 1, "h": 2, "d": 4, "t": 8, "dt": torch.float32, "dev": "cpu"},
        {"l": int_bad(1), "b": int_bad(1), "h": int_bad(1), "d": int_bad(1), "t": int_bad(1),
         "dt": [("float32", "str"), (torch.int64, "int dtype"), (None, "None")],
         "dev": [("tpu", "unknown"), (3, "index 3 (cuda:3)"), ("cuda", "unavailable")]})
    add("kvcache.cached_forward", lambda **k: KV.cached_forward(target, k["ids"], k["c"]),
        {"ids": torch.tensor([[1, 2]]), "c": KV.KVCache.for_model(target)},
        {"ids": [(torch.tensor([[1, V]]), "id = V"), (torch.tensor([1, 2]), "1-D"),
                 (torch.tensor([[1.0]]), "float dtype"), (torch.zeros(1, 40, dtype=torch.long), "past the cache")],
         "c": [(None, "None"), ("cache", "str"), (KV.KVCache(1, 1, 2, 4, 8), "another shape")]})
    add("kvcache.KVCache.advance", lambda **k: KV.KVCache.for_model(target).advance(k["n"]), {"n": 0},
        {"n": int_bad(0) + [(100, "past max_seq_len")]})
    add("kvcache.prefill", lambda **k: KV.prefill(target, k["ids"]), {"ids": [1, 2]},
        {"ids": [x for x in ids_bad(V) if x[1] != "2-D"]})
    good("kvcache.prefill((B, T) ids)", lambda: KV.prefill(target, [[1, 2], [3, 4]]))
    add("kvcache.fast_model", lambda **k: KV.fast_model(k["m"], dtype=k["dt"]), {"m": target, "dt": None},
        {"m": model_bad(), "dt": [("fp8", "unknown str"), (torch.int64, "int dtype"), (3, "int")]})
    add("kvcache.causal? tree_attention_mask", lambda **k: TR.tree_attention_mask(k["c"], k["p"]),
        {"c": 3, "p": torch.tensor([-1, 0, 0])},
        {"c": int_bad(0), "p": [(torch.tensor([-1, 2, 0]), "parent after child"), (torch.tensor([0, 0]),
                                                                                  "no root"),
                                (torch.tensor([-1.0, 0.0]), "float dtype"), ([-1, 0], "list"), (torch.tensor([-1, -3]),
                                                                                          "parent -3")]})

    # -- recurrent
    add("recurrent.RecurrentLM", lambda **k: R.RecurrentLM(k["v"], k["d"], k["l"], k["h"], layout=k["lay"],
                                                            max_seq_len=k["t"]),
        {"v": V, "d": 16, "l": 2, "h": 2, "lay": "RA", "t": 32},
        {"v": int_bad(1), "d": int_bad(1), "l": int_bad(1), "h": int_bad(1) + [(3, "does not divide D")],
         "t": int_bad(1), "lay": [("RX", "unknown letter"), ("R", "too short"), (3, "int"), ("", "empty")]})
    add("recurrent.make_transaction", lambda **k: R.make_transaction(rec, k["s"]), {"s": "replay"},
        {"s": choice_bad()})
    add("recurrent.ReplayTransaction", lambda **k: R.ReplayTransaction(rec, capacity=k["c"], batch=k["b"]),
        {"c": 8, "b": 1}, {"c": int_bad(1), "b": int_bad(1)})
    add("recurrent.perturbed_twin", lambda **k: R.perturbed_twin(rec, sigma=k["s"], generator=k["g"]),
        {"s": 0.1, "g": gen()}, {"s": real_bad(0), "g": gen_bad() + [(None, "None")]})
    add("recurrent.fan_in_init_", lambda **k: R.fan_in_init_(R.RecurrentLM(V, 16, 2, 2, layout="RA"),
                                                             generator=k["g"], gain=k["gain"]),
        {"g": gen(), "gain": 1.0}, {"g": gen_bad() + [(None, "None")], "gain": real_bad(0, lo_open=True)})
    add("recurrent.GatedLinearAttention", lambda **k: R.GatedLinearAttention(k["d"], k["h"], decay_bias=k["b"]),
        {"d": 8, "h": 2, "b": 2.0}, {"d": int_bad(1), "h": int_bad(1) + [(3, "does not divide D")],
                                     "b": real_bad()})
    add("recurrent.update_flops", lambda **k: R.update_flops(k["h"], k["d"], k["n"]), {"h": 2, "d": 4, "n": 3},
        {"h": int_bad(0), "d": int_bad(0), "n": int_bad(0)})
    add("recurrent.readout_flops", lambda **k: R.readout_flops(k["h"], k["d"], k["q"], k["k"]),
        {"h": 2, "d": 4, "q": 3, "k": 5},
        {"h": int_bad(0), "d": int_bad(0), "q": int_bad(0) + [(6, "more queries than keys")], "k": int_bad(0)})

    # -- specdec (seed), its sampling engine and its drafters
    add("specdec.greedy_verify", lambda **k: SD.greedy_verify(k["d"], k["l"]),
        {"d": torch.tensor([1, 2]), "l": torch.randn(3, V)},
        {"d": [(torch.tensor([1, V]), "id = V"), (torch.tensor([1.0, 2.0]), "float dtype"), ([1, 2], "list"),
               (torch.tensor([[1, 2]]), "2-D")],
         "l": [(torch.randn(2, V), "one row short"), (torch.randn(3, V).long(), "int dtype"), (torch.full((3, V), float(
             "nan")), "nan"), (torch.randn(3, V, 1), "3-D")]})
    p3 = torch.softmax(torch.randn(3, V), -1)
    q2 = torch.softmax(torch.randn(2, V), -1)
    add("specdec.speculative_verify", lambda **k: SD.speculative_verify(k["d"], k["p"], k["q"], generator=k["g"]),
        {"d": torch.tensor([1, 2]), "p": p3, "q": q2, "g": gen()},
        {"p": [(p3 * 10, "sums to 10"), (p3[:2], "one row short"), (p3.double() * float("nan"), "nan")],
         "q": [(q2 * 0.01, "sums to 0.01"), (q2[:1], "one row short"), ((q2 > 0.1), "bool dtype")],
         "g": gen_bad()})
    add("specdec.draft_room", lambda **k: SD.draft_room(k["k"], k["c"], k["w"]), {"k": 4, "c": 10, "w": 32},
        {"k": int_bad(0), "c": int_bad(0), "w": int_bad(1)})
    add("specdec.MTPHead", lambda **k: SD.MTPHead(k["b"], generator=k["g"]), {"b": target, "g": gen()},
        {"b": model_bad(), "g": gen_bad()})
    head = SD.MTPHead(target, generator=gen(3))
    add("specdec.mtp_generate", lambda **k: SD.mtp_generate(k["b"], k["h"], [1, 2], 3),
        {"b": target, "h": head}, {"b": model_bad() + [(draft, "another base")], "h": model_bad()})
    add("specdec.mtp_loss", lambda **k: SD.mtp_loss(k["l"], k["ids"]),
        {"l": torch.randn(1, 3, V), "ids": torch.tensor([[1, 2, 3, 4]])},
        {"l": [(torch.randn(1, 4), "2-D"), (torch.randn(1, 4, V), "wrong T")],
         "ids": [(torch.tensor([[1, 2, 3, V]]), "id = V"), (torch.tensor([1, 2, 3, 4]), "1-D"),
                 (torch.ones(1, 4), "float dtype")]})
    add("specdec.train_mtp_head", lambda **k: SD.train_mtp_head(target, k["ids"], steps=k["s"], batch_size=k["b"],
                                                                seq_len=k["t"], lr=k["lr"], generator=gen()),
        {"ids": torch.tensor(stream), "s": 1, "b": 2, "t": 8, "lr": 1e-3},
        {"s": int_bad(1), "b": int_bad(1), "t": int_bad(2) + [(40, "past the window")],
         "lr": real_bad(0, lo_open=True), "ids": [(torch.arange(4), "too short"), (None, "None")]})

    add("specdec.sampling.ngram_lookup", lambda **k: SS.ngram_lookup(k["c"], k["k"], min_n=k["lo"], max_n=k["hi"]),
        {"c": [1, 2, 3, 1, 2], "k": 2, "lo": 1, "hi": 3},
        {"c": [x for x in ids_bad(10**9)[:8] if x[1] != "id = V"], "k": int_bad(1), "lo": int_bad(1),
         "hi": int_bad(1) + [(0, "< min_n")]})
    add("specdec.sampling.NGramDrafter", lambda **k: SS.NGramDrafter(prompt_lookup_max=k["hi"],
                                                                     prompt_lookup_min=k["lo"]),
        {"hi": 3, "lo": 1}, {"hi": int_bad(1), "lo": int_bad(1) + [(4, "> max")]})
    add("specdec.sampling.LMDrafter", lambda **k: SS.LMDrafter(k["m"], sample=k["s"], use_cache=k["c"]),
        {"m": draft, "s": False, "c": False}, {"m": model_bad(), "s": flag_bad(), "c": flag_bad()})
    add("specdec.sampling.Sampler", lambda **k: SS.Sampler(k["t"], top_k=k["k"], top_p=k["p"]),
        {"t": 1.0, "k": None, "p": None},
        {"t": real_bad(0), "k": int_bad(1, optional=True), "p": real_bad(0, 1, lo_open=True, optional=True)})
    add("specdec.sampling.StopRule", lambda **k: SS.StopRule(stop_ids=k["ids"], stop_strings=k["s"],
                                                             decode=k["d"], vocab_size=V),
        {"ids": [3], "s": ["ab"], "d": lambda ids: "ab"},
        {"ids": [([V], "id = V"), ([-1], "negative"), ([1.5], "float"), ("5", "str"),
                 (torch.tensor([True]), "bool dtype")],
         "s": [([""], "empty"), ([3], "int"), (b"ab", "bytes"), (3, "int")],
         "d": [("decode", "str"), (None, "no decode"), (3, "int")]})
    add("specdec.sampling.StaticK", lambda **k: SS.StaticK(k["k"]), {"k": 4}, {"k": int_bad(1)})
    add("specdec.sampling.HeuristicK", lambda **k: SS.HeuristicK(k["k"], k_min=k["lo"], k_max=k["hi"]),
        {"k": 4, "lo": 1, "hi": 8}, {"k": int_bad(1) + [(9, "> k_max")], "lo": int_bad(1), "hi": int_bad(1)})
    add("specdec.sampling.CostModelK", lambda **k: SS.CostModelK(k["k"], c=k["c"], prior_alpha=k["a"], decay=k["d"]),
        {"k": 4, "c": 0.1, "a": 0.5, "d": 1.0},
        {"k": int_bad(1), "c": real_bad(0, optional=True), "a": real_bad(0, 1), "d": real_bad(0, 1, lo_open=True)})
    add("specdec.sampling.optimal_k", lambda **k: SS.optimal_k(k["a"], k["c"], k_min=k["lo"], k_max=k["hi"]),
        {"a": 0.7, "c": 0.1, "lo": 1, "hi": 8},
        {"a": real_bad(0, 1), "c": real_bad(0), "lo": int_bad(1), "hi": int_bad(1) + [(0, "< k_min")]})
    add("specdec.sampling.speedup", lambda **k: SS.speedup(k["a"], k["k"], k["c"]), {"a": 0.7, "k": 4, "c": 0.1},
        {"a": real_bad(0, 1), "k": int_bad(0), "c": real_bad(0)})
    add("specdec.sampling.expected_tokens_per_round", lambda **k: SS.expected_tokens_per_round(k["a"], k["k"]),
        {"a": 0.7, "k": 4}, {"a": real_bad(0, 1), "k": int_bad(0)})
    add("specdec.sampling.verify_round", lambda **k: SS.verify_round(k["d"], k["q"], k["l"], sampler=k["s"],
                                                                     generator=gen()),
        {"d": torch.tensor([1, 2]), "q": q2, "l": torch.randn(3, V), "s": SS.Sampler(1.0)},
        {"s": [(None, "None"), (1.0, "a float"), ("greedy", "str")],
         "l": [(torch.randn(2, V), "one row short"), (torch.full((3, V), float("nan")), "nan")],
         "d": [(torch.tensor([1, V]), "id = V"), ([1, 2], "list")]})
    add("specdec.sampling.ControlledTarget", lambda **k: SS.ControlledTarget(SS.RecomputeTarget(target),
                                                                             repetition_penalty=k["p"],
                                                                             logprobs=k["lp"]),
        {"p": 1.2, "lp": False}, {"p": real_bad(0, lo_open=True), "lp": flag_bad()})
    add("specdec.sampling.CachedTarget", lambda **k: SS.CachedTarget(k["t"], refill_tokens=k["r"]),
        {"t": target, "r": None}, {"t": model_bad(), "r": int_bad(1, optional=True)})
    add("specdec.sampling.FeatureDrafter", lambda **k: SS.FeatureDrafter(k["b"], generator=k["g"]),
        {"b": target, "g": gen()}, {"b": model_bad(), "g": gen_bad()})
    add("specdec.sampling.EagleDrafter", lambda **k: SS.EagleDrafter(k["h"], sample=k["s"]),
        {"h": SS.FeatureDrafter(target, generator=gen()), "s": False},
        {"h": model_bad() + [(target, "a language model")], "s": flag_bad()})
    add("specdec.sampling.MTPDrafter", lambda **k: SS.MTPDrafter(k["h"], sample=k["s"]), {"h": head, "s": False},
        {"h": model_bad() + [(target, "a language model")], "s": flag_bad()})

    # -- trees
    add("trees.DraftTree", lambda **k: TR.DraftTree(k["t"], k["p"]),
        {"t": torch.tensor([1, 2, 3]), "p": torch.tensor([-1, 0, 0])},
        {"t": [(torch.tensor([1.0, 2.0, 3.0]), "float dtype"), ([1, 2, 3], "list"), (torch.tensor([1, 2]), "too short"),
               (torch.tensor([-1, 2, 3]), "negative id")],
         "p": [(torch.tensor([-1, 2, 0]), "forward parent"), (torch.tensor([0, 0, 0]), "no root"),
               (torch.tensor([-1, 0]), "too short"), ([-1, 0, 0], "list"),
               (torch.tensor([-1.0, 0.0, 0.0]), "float dtype"),
               (torch.tensor([-1, -2, 0]), "parent -2")]})
    add("trees.static_choices", lambda **k: TR.static_choices(k["n"], k["r"]), {"n": 6, "r": (0.6, 0.2)},
        {"n": int_bad(0), "r": [((), "empty"), ((1.5,), "> 1"), ((float("nan"),), "nan"), ("0.6", "str"),
                                (None, "None")]})
    add("trees.chain_choices", lambda **k: TR.chain_choices(k["k"]), {"k": 3}, {"k": int_bad(0)})
    add("trees.chain_tree", lambda **k: TR.chain_tree(k["t"]), {"t": torch.tensor([1, 2])},
        {"t": [(torch.tensor([1.0]), "float dtype"), ("12", "str"), (None, "None"), (torch.tensor([[1, 2]]), "2-D")]})
    add("trees.build_static_tree", lambda **k: TR.build_static_tree(k["d"], torch.tensor([1, 2]), k["c"],
                                                                    temperature=k["t"], sample=k["s"]),
        {"d": draft, "c": [(0,), (1,), (0, 0)], "t": 1.0, "s": True},
        {"d": model_bad(), "c": [([(0, 0)], "no parent"), ([(-1,)], "negative rank"), ([(1.5,)], "float rank"),
                                 ([()], "empty path"), ("0", "str"), ([(V,)], "rank = V")],
         "t": real_bad(0, lo_open=True), "s": flag_bad()})
    add("trees.build_dynamic_tree", lambda **k: TR.build_dynamic_tree(k["d"], torch.tensor([1, 2]), k["n"],
                                                                      width=k["w"], max_depth=k["m"]),
        {"d": draft, "n": 4, "w": 2, "m": None},
        {"d": model_bad(), "n": int_bad(0), "w": int_bad(1), "m": int_bad(1, optional=True)})
    tree = TR.DraftTree(torch.tensor([1, 2]), torch.tensor([-1, 0]))
    add("trees.greedy_tree_verify", lambda **k: TR.greedy_tree_verify(k["t"], k["l"]),
        {"t": tree, "l": torch.randn(3, V)},
        {"t": [(None, "None"), (torch.tensor([1, 2]), "a tensor")],
         "l": [(torch.randn(2, V), "one row short"), (torch.full((3, V), float("nan")), "nan"),
               (torch.randn(3, V).long(), "int dtype")]})
    add("trees.tree_speculative_verify", lambda **k: TR.tree_speculative_verify(k["t"], k["p"], generator=k["g"]),
        {"t": TR.DraftTree(torch.tensor([1, 2]), torch.tensor([-1, 0]), proposal_probs=q2), "p": p3, "g": gen()},
        {"p": [(p3 * 10, "sums to 10"), (p3[:2], "one row short")], "g": gen_bad(),
         "t": [(None, "None"), (torch.tensor([1, 2]), "a tensor")]})
    good("trees.tree_speculative_verify(a deterministic tree: one-hot q)",
         lambda: TR.tree_speculative_verify(tree, p3, generator=gen()))
    add("trees.expected_tokens_per_pass", lambda **k: TR.expected_tokens_per_pass(tree, k["a"]),
        {"a": torch.tensor([0.5, 0.5])},
        {"a": [(torch.tensor([1.5, 0.5]), "> 1"), (torch.tensor([0.5]), "too short"), ([0.5, 0.5], "list"),
               (torch.tensor([float("nan"), 0.5]), "nan")]})
    add("trees.sample_children", lambda **k: TR.sample_children(k["q"], k["k"], generator=k["g"]),
        {"q": torch.softmax(torch.randn(V), -1), "k": 2, "g": gen()},
        {"q": [(torch.randn(V), "logits"), (torch.zeros(V), "all zero"), (torch.tensor([1.0, float("nan")]), "nan")],
         "k": int_bad(0), "g": gen_bad()})
    good("trees.sample_children(k > V: fewer come back)", lambda: TR.sample_children(
        torch.softmax(torch.randn(V), -1), V + 1, generator=gen()))
    add("trees.warp_probs", lambda **k: TR.warp_probs(k["p"], k["t"]), {"p": p3, "t": 0.7},
        {"t": real_bad(0), "p": [(p3 * 10, "sums to 10"), ([0.5, 0.5], "list")]})
    add("trees.tree_rows", lambda **k: TR.tree_rows(tree, k["n"]), {"n": 3}, {"n": int_bad(0)})
    add("trees.tree_logits", lambda **k: TR.tree_logits(target, k["c"], tree), {"c": torch.tensor([1, 2])},
        {"c": ids_bad(V)[:9]})

    # -- lineage
    add("lineage.MedusaHeads", lambda **k: LIN.MedusaHeads(k["b"], k["n"]), {"b": target, "n": 2},
        {"b": model_bad(), "n": int_bad(1)})
    add("lineage.Eagle3Head", lambda **k: LIN.Eagle3Head(k["b"], k["l"]), {"b": lm(6, layers=3), "l": None},
        {"b": model_bad(), "l": [((0, 0, 1), "repeated"), ((0, 1, 7), "past the layers"), ("012", "str"),
                                 ((0.5, 1, 2), "float"), ((), "empty")]})
    add("lineage.BlockHead", lambda **k: LIN.BlockHead(k["b"], block_size=k["bs"], context_rows=k["c"],
                                                       num_blocks=k["nb"], injection=k["inj"]),
        {"b": lm(6, layers=3), "bs": 4, "c": 3, "nb": 1, "inj": "rows"},
        {"b": model_bad(), "bs": int_bad(1), "c": int_bad(1), "nb": int_bad(1), "inj": choice_bad()})
    add("lineage.block_loss_weights", lambda **k: LIN.block_loss_weights(k["b"], k["g"]), {"b": 4, "g": 2.0},
        {"b": int_bad(1), "g": real_bad(0, lo_open=True)})
    add("lineage.fusion_layers", lambda **k: LIN.fusion_layers(k["n"]), {"n": 6}, {"n": int_bad(3)})
    add("lineage.check_fusion_layers", lambda **k: LIN.check_fusion_layers(k["l"], k["n"]),
        {"l": (0, 2, 4), "n": 6},
        {"l": [((0, 0, 1), "repeated"), ((0, 1, 7), "past"), ("012", "str"), ((0.5, 1, 2), "float"), (None, "None")],
         "n": int_bad(1)})
    add("lineage.ttt_attention_mask", lambda **k: LIN.ttt_attention_mask(k["n"], k["s"]), {"n": 4, "s": 2},
        {"n": int_bad(1), "s": int_bad(1)})
    add("lineage.typical_accept", lambda **k: LIN.typical_accept(k["p"], k["t"], epsilon=k["e"], delta=k["d"]),
        {"p": p3, "t": torch.tensor([1, 2, 3]), "e": 0.09, "d": 0.3},
        {"e": real_bad(0, 1, lo_open=True), "d": real_bad(0, lo_open=True),
         "t": [(torch.tensor([1, 2, V]), "id = V"), (torch.tensor([1.0, 2.0, 3.0]), "float dtype")]})
    heads = LIN.MedusaHeads(target, 2)
    add("lineage.MedusaDrafter", lambda **k: LIN.MedusaDrafter(k["h"], k["c"], draft_mode=k["m"]),
        {"h": heads, "c": None, "m": "top"},
        {"h": model_bad() + [(target, "a language model")], "m": choice_bad(),
         "c": [([(0, 0)], "no parent"), ([(V,)], "rank = V"), ([(0, 0, 0)], "deeper than the heads"),
               ("0", "str")]})
    add("lineage.medusa_tree", lambda **k: LIN.medusa_tree(k["p"], k["c"]),
        {"p": q2, "c": [(0,), (1,), (0, 0)]},
        {"p": [(q2 * 10, "sums to 10"), (q2[0], "1-D")], "c": [([(0, 0)], "no parent"), ([(0, 0, 0)], "too deep")]})
    add("lineage.lineage_generate", lambda **k: LIN.lineage_generate(target, LIN.MedusaDrafter(heads), [1, 2], 3,
                                                                     num_nodes=k["n"], temperature=k["t"]),
        {"n": 3, "t": 0.0}, {"n": int_bad(1), "t": real_bad(0)})

    # -- lab and theory
    add("lab.simulate_rounds", lambda **k: LAB.simulate_rounds(k["a"], k["k"], k["c"], k["n"], generator=k["g"]),
        {"a": 0.7, "k": 4, "c": 0.1, "n": 10, "g": gen()},
        {"a": real_bad(0, 1), "k": int_bad(1), "c": real_bad(0), "n": int_bad(1), "g": gen_bad() + [(None, "None")]})
    rounds = LAB.simulate_rounds(0.7, 4, 0.1, 20, generator=gen())
    add("lab.fit_alpha", lambda **k: LAB.fit_alpha(k["r"]), {"r": rounds}, {"r": [(None, "None"), ([1, 2], "list")]})
    add("lab.Rounds", lambda **k: LAB.Rounds(k["a"], k["e"], k["k"]),
        {"a": torch.tensor([1, 2]), "e": torch.tensor([2, 3]), "k": 4},
        {"a": [(torch.tensor([5, 2]), "accepted > k"), (torch.tensor([-1, 2]), "negative")],
         "e": [(torch.tensor([3, 3]), "emitted > accepted + 1"), (torch.tensor([0, 3]), "emitted 0")],
         "k": int_bad(1)})
    for fname, fn, base, params in (
            ("theory.expected_tokens_per_pass", TH.expected_tokens_per_pass, {"alpha": 0.7, "k": 4},
             {"alpha": real_bad(0, 1), "k": int_bad(0)}),
            ("theory.expected_accepted", TH.expected_accepted, {"alpha": 0.7, "k": 4},
             {"alpha": real_bad(0, 1), "k": int_bad(0)}),
            ("theory.emitted_distribution", TH.emitted_distribution, {"alpha": 0.7, "k": 4},
             {"alpha": real_bad(0, 1), "k": int_bad(0)}),
            ("theory.speedup_per_token", TH.speedup_per_token, {"alpha": 0.7, "k": 4, "c1": 0.1},
             {"alpha": real_bad(0, 1), "k": int_bad(0), "c1": real_bad(0)}),
            ("theory.break_even_alpha", TH.break_even_alpha, {"c1": 0.1, "k": 2},
             {"c1": real_bad(0), "k": int_bad(1)}),
            ("theory.optimal_k", TH.optimal_k, {"alpha": 0.7, "c1": 0.1, "k_max": 16},
             {"alpha": real_bad(0, 1), "c1": real_bad(0), "k_max": int_bad(1)}),
            ("theory.tau_cap", TH.tau_cap, {"alpha": 0.7}, {"alpha": real_bad(0, 1)}),
            ("theory.ridge_point", TH.ridge_point, {"flops_per_s": 1e12, "bandwidth_bytes_per_s": 1e11},
             {"flops_per_s": real_bad(0, lo_open=True), "bandwidth_bytes_per_s": real_bad(0, lo_open=True)}),
            ("theory.memory_floor_step_s", TH.memory_floor_step_s, {"weight_bytes": 1e6, "bandwidth_bytes_per_s": 1e9},
             {"weight_bytes": real_bad(0), "bandwidth_bytes_per_s": real_bad(0, lo_open=True)}),
            ("theory.speedup_per_round", TH.speedup_per_round, {"tau": 2.0, "c": 0.1},
             {"tau": real_bad(1), "c": real_bad(0)}),
            ("theory.kv_reservation_bytes", TH.kv_reservation_bytes, {"k": 4, "bytes_per_token": 1024.0},
             {"k": int_bad(0), "bytes_per_token": real_bad(0)}),
            ("theory.bimodal_itl", TH.bimodal_itl, {"target_step_s": 0.01, "alpha": 0.7, "k": 4, "c": 0.1},
             {"target_step_s": real_bad(0, lo_open=True), "alpha": real_bad(0, 1), "k": int_bad(0),
              "c": real_bad(0)}),
            ("theory.expected_rollback", TH.expected_rollback, {"alpha": 0.7, "k": 4},
             {"alpha": real_bad(0, 1), "k": int_bad(0)}),
            ("theory.speculative_intensity", TH.speculative_intensity,
             {"weight_bytes": 1e6, "batch": 1, "k": 4, "context": 10, "kv_bytes_per_token": 100.0},
             {"batch": int_bad(1), "k": int_bad(0), "context": int_bad(0), "weight_bytes": real_bad(0, lo_open=True)}),
    ):
        add(fname, lambda fn=fn, **k: fn(**k), base, params)
    return cases


# -- scripts -----------------------------------------------------------------------------------------------

NUL_PATH = "out\x00put.png"


def bad_paths(repo: Path, *, folder: bool) -> list[tuple[str, str, str | None]]:
    """(path, description, expected cause) for an output option."""
    long_name = "n" * 300
    out = [("/proc/g2c-trial/x" + ("" if folder else ".png"), "a folder that cannot exist", r"/proc"),
           (str(repo / "README.md" / ("sub" if folder else "x.png")), "under a file", r"README\.md is a file"),
           (f"runs/{long_name}" + ("" if folder else ".png"), "a name too long", r"name|too long"),
           (NUL_PATH, "a NUL character", r"NUL"),
           ("", "an empty path", r"empty|folder|file"),
           (str(repo / "artifacts" / "models" / "StoryLM-1M" / ("" if folder else "model.safetensors")),
            "inside the shipped artifacts", r"shipped|artifacts"),
           ("/sys/g2c-trial" + ("" if folder else ".png"), "a read-only virtual folder", r"read-only|cannot")]
    out.append((str(repo / ("README.md" if folder else "docs")), "a file for a folder" if folder else
                "a folder for a file", r"is a (file|folder)"))
    return out


# script -> {option: (kind, extra args needed so the option applies)}
COUNT, REAL, CHOICE, MODEL, DEVICE, OUTFILE, OUTDIR, INTLIST, LIST, INFILE, INDIR, TEXT = (
    "count", "real", "choice", "model", "device", "outfile", "outdir", "intlist", "list", "infile", "indir", "text")
SCRIPT_OPTIONS: dict[str, dict[str, tuple]] = {
    "bench/specdec.py": {"--new-tokens": (COUNT,), "--ks": (INTLIST,), "--target": (MODEL,), "--out": (OUTFILE,),
                         "--dtype": (CHOICE,), "--threads": (COUNT,), "--prompts": (COUNT,),
                         "--mtp-steps": (COUNT, ["--seed-table"])},
    "bench/specdec_sampling.py": {"--new-tokens": (COUNT,), "--k": (COUNT,), "--modes": (LIST,),
                                  "--temperature": (REAL,), "--drafter": (MODEL,), "--target": (MODEL,),
                                  "--device": (DEVICE,), "--threads": (COUNT,)},
    "bench/lineage.py": {"--prompts": (COUNT,), "--temperature": (REAL,), "--rows": (LIST,),
                         "--json": (OUTFILE,), "--figure": (OUTFILE,), "--drafters": (INDIR,),
                         "--threads": (COUNT,), "--new-tokens": (COUNT,), "--seed": (COUNT,),
                         "--draws": (COUNT,), "--repetition-penalty": (REAL,)},
    "bench/specdec_trees.py": {"--new-tokens": (COUNT,), "--budgets": (INTLIST,), "--trees": (LIST,),
                               "--temperature": (REAL,), "--target": (MODEL,), "--drafter": (MODEL,),
                               "--device": (DEVICE,)},
    "bench/specdec_state.py": {"-k": (COUNT,), "--capacity": (COUNT,)},
    "bench/serving_lab.py": {"--new-tokens": (COUNT,), "--batches": (INTLIST,), "--ks": (INTLIST,),
                             "--target": (MODEL,), "--drafter": (MODEL,), "--device": (DEVICE,),
                             "--out": (OUTDIR,), "--threads": (COUNT,), "--export-prompts": (OUTFILE,)},
    "bench/peer_hf.py": {"--prompts": (COUNT,), "--ks": (INTLIST,), "--dtypes": (LIST,), "--drafters": (LIST,),
                         "--target": (MODEL,)},
    "bench/train_throughput.py": {"--steps": (COUNT,), "--batch-size": (COUNT,), "--precisions": (LIST,),
                                  "--device": (DEVICE,)},
    "bench/linear_kernels.py": {"--rounds": (COUNT,), "--clock": (CHOICE,)},
    "bench/roofline.py": {"--context": (COUNT,), "--rows": (INTLIST,), "--models": (LIST,), "--device": (DEVICE,),
                          "--plot": (OUTFILE,), "--paths": (LIST,), "--rounds": (COUNT,), "--threads": (COUNT,)},
    "bench/llamacpp.py": {"--k": (COUNT,), "--new-tokens": (COUNT,), "--drafter": (MODEL,), "--target": (MODEL,),
                          "--bin": (INDIR,)},
    "bench/setup_llamacpp.py": {"--jobs": (COUNT,), "--backend": (CHOICE,), "--work": (OUTDIR,)},
    "g2c/assets/export.py": {"--hf": (OUTDIR, ["StoryLM-1M"]), "--dtype": (CHOICE, ["StoryLM-1M", "--hf", "runs/x"])},
    "g2c/assets/gguf.py": {"OUT": (OUTFILE, ["StoryLM-1M"]), "--outtype": (CHOICE, ["StoryLM-1M", "runs/x.gguf"])},
    "g2c/assets/checkpoints.py": {"NAME": (MODEL,), "--from": (INDIR,)},
    "g2c/assets/data.py": {"--from": (INFILE,)},
    "scripts/agreement_figure.py": {"--out": (OUTFILE,), "--position": (COUNT,)},
    "scripts/run_notebooks.py": {"--save": (OUTDIR,), "--timeout": (COUNT,), "--jobs": (COUNT,)},
    "scripts/notebooks/build.py": {"--solved": (OUTDIR,)},
    "scripts/notebooks/screenshot.py": {"--out": (OUTDIR, ["03"]), "--timeout": (REAL, ["03"]),
                                        "--width": (COUNT, ["03"]), "--height": (COUNT, ["03"])},
    "scripts/new_module.py": {"ID": (TEXT, [], ["T", "--no-record"]),
                              "--requires": (LIST, ["x-new", "T", "--no-record"]),
                              "--file": (TEXT, ["x-new", "T", "--no-record"])},
    "scripts/contract.py": {"--jobs": (COUNT, ["--check"])},
    "g2c/specdec/__main__.py": {"--k": (COUNT,), "--target": (MODEL,), "--max-new-tokens": (COUNT,),
                                "--temperature": (REAL,), "--top-p": (REAL,), "--top-k": (COUNT,)},
    "g2c/course/__main__.py grade": {"--json": (OUTFILE, ["grade", "03"])},
}


def option_values(kind: str, repo: Path, folder=False):
    """(value, description, expected cause) per bad value of an option kind."""
    if kind == COUNT:
        return [("-1", "negative", None), ("0", "zero", None), ("1.5", "a float", None), ("x", "not a number", None),
                ("", "empty", None), ("1e3", "exponent", None), ("99999999999999999999999", "huge", None)]
    if kind == REAL:
        return [("nan", "nan", None), ("inf", "inf", None), ("x", "not a number", None), ("-1", "negative", None),
                ("", "empty", None)]
    if kind in (CHOICE, LIST, MODEL):
        vals = [("bogus", "unknown", None), ("", "empty", None), (",", "only a comma", None),
                ("a,,b", "empty item", None)]
        if kind == MODEL:
            vals.append(("StoryLM-30M-Medusa", "a draft head", None))
        return vals
    if kind == INTLIST:
        return [("1,x", "not a number", None), ("", "empty", None), (",", "only a comma", None),
                ("0", "zero", None), ("-1", "negative", None), ("1,,2", "empty item", None), ("1.5", "float", None)]
    if kind == DEVICE:
        return [("tpu", "unknown", None), ("cuda:abc", "bad index", None), ("cuda", "unavailable cuda", None),
                ("mps", "unavailable mps", None), ("", "empty", None)]
    if kind in (OUTFILE, OUTDIR):
        return bad_paths(repo, folder=kind == OUTDIR)
    if kind in (INFILE, INDIR):
        other = str(repo / "README.md") if kind == INDIR else str(repo / "docs")
        return [("/nonexistent/g2c", "missing", None), (other, "a file for a folder" if kind == INDIR else "a folder",
                                                        None), ("", "empty", None)]
    if kind == TEXT:
        return [("", "empty", None), ("Bad Name!", "not an identifier", None), ("specdec", "exists already", None),
                ("x" * 300, "300 characters", None)]
    raise ValueError(kind)


def _load_script(repo: Path, script: str):
    path = repo / script
    spec = importlib.util.spec_from_file_location("trial_" + re.sub(r"\W", "_", script), path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def sentinels(module=None):
    """Stop where work starts: a model load, a network's construction, a process, a tensor of data."""
    import subprocess as sp

    import torch

    import g2c.assets.artifacts as art

    def stop(*a, **k):
        raise Sentinel()

    saved = []

    def patch(obj, name):
        if obj is not None and hasattr(obj, name):
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, stop)

    for name in ("load_model", "load_story_tokenizer", "load_tokenizer", "verify_artifact"):
        patch(art, name)
        patch(module, name)
    for name in ("run", "Popen", "check_call", "check_output", "call"):
        patch(sp, name)
        patch(module, name) if module is not None and getattr(module, name, None) is getattr(sp, name, None) else None
    orig_init = torch.nn.Module.__init__
    saved.append((torch.nn.Module, "__init__", orig_init))
    torch.nn.Module.__init__ = stop
    for name in ("ones", "randn", "rand", "zeros", "empty"):
        patch(torch, name)
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def run_script(repo: Path, script: str, argv: list[str]):
    """(rc, stdout, stderr, reached): main(argv) in-process with the sentinels."""
    real, sub = (script.split(" ") + [""])[:2]
    out, err = io.StringIO(), io.StringIO()
    reached = False
    rc = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if real.endswith("__main__.py"):
                module = importlib.import_module(real.replace("/", ".").removesuffix(".py"))
            else:
                module = _load_script(repo, real)
            with sentinels(module):
                rc = module.main(argv)
        except Sentinel:
            reached = True
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (1 if exc.code else 0)
            if isinstance(exc.code, str):
                err.write(exc.code + "\n")
    return rc, out.getvalue(), err.getvalue(), reached


def late_write(path: str, folder: bool) -> str | None:
    """What a writer (``atomic_path``) would meet at ``path`` after the work: None, or the error."""
    from g2c.course.files import atomic_path

    try:
        target = Path(path) / "x.png" if folder else Path(path)
        if folder:
            Path(path).mkdir(parents=True, exist_ok=True)
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"x")
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def restored(repo: Path):
    """Put the copy's source back after a case that may add a module (scripts/new_module.py): every file under
    g2c/, solutions/, tests/, docs/, notebooks/ and the README as it was, new ones removed."""
    roots = [repo / d for d in ("g2c", "solutions", "tests", "docs", "notebooks")]
    before = {p: p.read_bytes() for r in roots for p in r.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    before[repo / "README.md"] = (repo / "README.md").read_bytes()
    try:
        yield
    finally:
        for r in roots:
            for p in sorted(r.rglob("*"), key=lambda p: -len(p.parts)):
                if "__pycache__" in p.parts:
                    continue
                if p.is_file() and p not in before:
                    p.unlink()
                elif p.is_dir() and not any(p.iterdir()):
                    p.rmdir()
        for p, data in before.items():
            if not p.is_file() or p.read_bytes() != data:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(data)


def script_cases(repo: Path) -> list[Case]:
    cases = []
    for script, options in SCRIPT_OPTIONS.items():
        for option, spec in options.items():
            kind = spec[0]
            pre = spec[1] if len(spec) > 1 else []
            post = spec[2] if len(spec) > 2 else []
            for value, desc, cause in option_values(kind, repo):
                bad = None if desc == "zero" else not (script.endswith("checkpoints.py") and desc == "a draft head")
                if script.endswith("new_module.py") and (option, value) in (("--file", "specdec"), ("--requires", "")):
                    bad = False                                       # a valid file name, no prerequisites: added
                if script.endswith("new_module.py") and (option, value) == ("--requires", ","):
                    bad = None                                        # read as no prerequisites
                if (option, value) == ("--plot", "") or (option, desc) == ("--export-prompts", "a folder for a file"):
                    bad = None                                        # --plot '': no plot; prefix 'docs': docs-*.jsonl
                if option.isupper():                                  # a positional argument
                    argv = pre + [value] + post
                else:
                    argv = pre + [f"{option}={value}"] + post
                if script == "g2c/course/__main__.py grade":
                    argv = pre + [f"{option}={value}"]
                    argv = argv[:1] + argv[2:] + argv[1:2] if False else argv

                def thunk(script=script, argv=argv, kind=kind, value=value, option=option):
                    if script == "scripts/new_module.py":    # it adds a module: its own process, the copy put back
                        with restored(repo):
                            rc, out, err, reached = proc(repo, [str(repo / ".venv" / "bin" / "python"), script,
                                                                *argv])()
                    else:
                        rc, out, err, reached = run_script(repo, script, argv)
                    if (reached or rc in (0, None)) and kind in (OUTFILE, OUTDIR):
                        if option == "--plot" and value == "":
                            return rc, out, err, reached                   # '': no plot, documented
                        target = f"{value}-endings.jsonl" if option == "--export-prompts" else value
                        problem = late_write(target, kind == OUTDIR)
                        if problem is not None:
                            raise RuntimeError(f"accepted at parse time; the write after the work fails: {problem}")
                    return rc, out, err, reached

                cases.append(Case("scripts", f"{script} {option}={desc}", thunk, bad=bad, expect=cause, kind="script"))
        cases.append(Case("scripts", f"{script} --no-such-option", lambda s=script: run_script(
            repo, s, (["grade"] if "grade" in s else []) + ["--no-such-option"]), kind="script"))
    return cases


# -- shell entry points and the environment ----------------------------------------------------------------

def proc(repo: Path, cmd: list[str] | str, env: dict | None = None, timeout: float = 120, stdin: str | None = None):
    def thunk():
        full_env = {k: v for k, v in os.environ.items() if k not in ("G2C_APPLY_SOLUTIONS",)}
        full_env.update({"PYTHONPATH": str(repo), "G2C_QUIET": "1", "OMP_NUM_THREADS": "1"})
        full_env.update(env or {})
        done = subprocess.run(cmd, cwd=repo, env=full_env, capture_output=True, text=True, timeout=timeout,
                              shell=isinstance(cmd, str), input=stdin)
        return done.returncode, done.stdout, done.stderr, False
    return thunk


def shell_cases(repo: Path) -> list[Case]:
    py = str(repo / ".venv" / "bin" / "python")
    cases = []
    for value, cause in (("all,", None), ("bogus", r"unknown module id"), ("03-", None), ("11-03", r"range"),
                         ("03,,bogus", None), ("1,03", None), ("ALL", None), (" all ", None), ("all,bogus", None),
                         ("99-100", None), ("specdec-", None)):
        good = value in ("all,", "ALL", " all ") or (None if value == "99-100" else False)   # 99-100: none, as 12-15
        cases.append(Case("shell", f"G2C_APPLY_SOLUTIONS={value!r}", proc(repo, [py, "-c", "import g2c.sampling"],
                                                                         {"G2C_APPLY_SOLUTIONS": value}),
                          bad=None if good is None else not good, expect=cause, kind="script"))
    for args in (["99"], ["--progres"], ["-3"], ["03", "--solve"], ["--submit", "--out", "/proc/x/y.zip"],
                 ["--author", "x"], ["tests/test_nope.py"], ["03", "--solve", "bogus"]):
        cases.append(Case("shell", f"./test.sh {' '.join(args)}", proc(repo, ["./test.sh", *args]), kind="script"))
    cases.append(Case("shell", "./test.sh with OMP_NUM_THREADS=0", proc(repo, ["./test.sh", "03"],
                                                                      {"OMP_NUM_THREADS": "0"}), kind="script"))
    for args in (["99", "--no-launch"], ["03", "--apply", "bogus", "--no-launch"], ["03", "--bogus"],
                 ["--no-launch"], ["03", "--solutions=bogus", "--no-launch"], ["03", "--execute", "--timeout", "x"]):
        cases.append(Case("shell", f"./notebook.sh {' '.join(args)}", proc(repo, ["./notebook.sh", *args]),
                          kind="script"))
    for args in (["StoryLM-2M"], ["--train"], ["--from", "/nonexistent"], ["--pin"], ["--budget", "x", "--train",
                                                                                        "StoryLM-30M-EAGLE"],
                 ["--bogus"], ["--from", ""]):
        cases.append(Case("shell", f"./checkpoints.sh {' '.join(args)}", proc(repo, ["./checkpoints.sh", *args]),
                          bad=None if args == ["--train"] else True, kind="script"))
    for args in (["--from", "/nonexistent.txt"], ["--from", str(repo / "README.md")], ["--bogus"],
                 ["--tiny", "--from", str(repo)]):
        cases.append(Case("shell", f"./datasets.sh {' '.join(args)}", proc(repo, ["./datasets.sh", *args]),
                          kind="script"))
    for var, value in (("G2C_TINYSTORIES", "/nonexistent.txt"), ("G2C_QUICK", "maybe")):
        cases.append(Case("shell", f"{var}={value} ./datasets.sh", proc(repo, ["./datasets.sh"], {var: value}),
                          bad=var == "G2C_TINYSTORIES", kind="script"))
    return cases


# -- faults -------------------------------------------------------------------------------------------------

def fault_cases(repo: Path) -> list[Case]:
    py = str(repo / ".venv" / "bin" / "python")
    cases = []
    script = ("import sys; from g2c.assets.artifacts import load_model\n"
              "try:\n    load_model('StoryLM-1M')\nexcept Exception as e:\n    print(type(e).__name__, e, "
              "file=sys.stderr); sys.exit(1)\n")

    def with_edit(edit, undo):
        def thunk():
            edit()
            try:
                return proc(repo, [py, "-c", script])()
            finally:
                undo()
        return thunk

    pins = repo / "g2c" / "assets" / "pins.json"
    pins_text = pins.read_text()

    def edit_pin():
        pins.write_text(re.sub(r'("StoryLM-1M": \{\s*"config.json": \{\s*"sha256": ")([0-9a-f])',
                               lambda m: m.group(1) + ("0" if m.group(2) != "0" else "1"), pins_text, count=1))

    cases.append(Case("faults", "an edited pin", with_edit(edit_pin, lambda: pins.write_text(pins_text)),
                      expect=r"git checkout -- g2c/assets/pins\.json|pins\.json itself was edited", kind="script"))
    model_dir = repo / "artifacts" / "models" / "StoryLM-1M"
    saved = {f.name: f.read_bytes() for f in model_dir.iterdir()}

    def restore():
        for name, data in saved.items():
            (model_dir / name).write_bytes(data)

    def truncate():
        data = saved["model.safetensors"]
        (model_dir / "model.safetensors").write_bytes(data[: len(data) // 2])

    cases.append(Case("faults", "a truncated model file", with_edit(truncate, restore), expect=r"checkpoints",
                      kind="script"))
    cases.append(Case("faults", "export --hf into the shipped artifacts --overwrite",
                      proc(repo, [py, "-m", "g2c.assets.export", "StoryLM-1M", "--hf", str(model_dir), "--overwrite"]),
                      expect=r"shipped|artifacts", kind="script"))
    cases.append(Case("faults", "export --hf a path under a file",
                      proc(repo, [py, "-m", "g2c.assets.export", "StoryLM-1M", "--hf", "README.md/x"]),
                      expect=r"README\.md is a file", kind="script"))
    cases.append(Case("faults", "gguf OUT inside the shipped artifacts",
                      proc(repo, [py, "-m", "g2c.assets.gguf", "StoryLM-1M", str(model_dir / "model.safetensors"),
                                  "--via", "writer"]), expect=r"shipped|artifacts", kind="script"))
    interrupted = ("import sys, g2c.assets.gguf as G\n"
                   "def stop(*a, **k): raise KeyboardInterrupt\n"
                   "G.check_gguf = stop\n"
                   "sys.exit(G.main(['StoryLM-1M', 'runs/trial.gguf', '--via', 'writer']))\n")
    cases.append(Case("faults", "gguf export interrupted during the read-back",
                      proc(repo, [py, "-c", interrupted]), expect=r"complete|unchecked|check", kind="script"))
    full = ("import resource, signal, sys, torch\n"
            "from g2c.pretraining.trainer import save_checked\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "try:\n    save_checked({'w': torch.zeros(100000)}, 'runs/trial-ckpt.pt')\n"
            "except Exception as e:\n    print(type(e).__name__, e, file=sys.stderr); sys.exit(1)\n")
    cases.append(Case("faults", "a checkpoint save past a file-size limit (torch.save)",
                      proc(repo, [py, "-c", full], {"G2C_APPLY_SOLUTIONS": "all"}), expect=r"^(OSError|File)",
                      kind="script"))
    new_mod = [py, "scripts/new_module.py", "specdec", "Dup", "--no-record"]
    cases.append(Case("faults", "new_module with an id that exists", proc(repo, new_mod),
                      expect=r"already", kind="script"))
    cases.append(Case("faults", "new_module 16 (exists, a number)", proc(repo, [py, "scripts/new_module.py", "16", "T",
                                                                                "--no-record"]),
                      expect=r"already", kind="script"))
    return cases


# -- main ---------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=HERE.parent.parent, help="the checkout to try (copied first)")
    ap.add_argument("--only", default="api,scripts,shell,faults", help="surfaces (comma-separated)")
    ap.add_argument("--list", default="unclear,silent,refused-good", help="classes to list case by case")
    ap.add_argument("--keep", action="store_true", help="keep the copy (its path is printed)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from repo_copy import IGNORED

    tmp = Path(tempfile.mkdtemp(prefix="g2c-trial-"))
    repo = tmp / "g2c"
    shutil.copytree(args.repo, repo, ignore=shutil.ignore_patterns(*IGNORED), symlinks=True)
    (repo / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    if (args.repo / "data").is_dir():
        shutil.copytree(args.repo / "data", repo / "data", symlinks=True)
    os.chdir(repo)
    os.environ.update(G2C_APPLY_SOLUTIONS="all", G2C_QUIET="1")
    sys.path.insert(0, str(repo))
    for name in [m for m in sys.modules if m == "g2c" or m.startswith("g2c.")]:
        del sys.modules[name]
    import g2c  # noqa: F401 - the copy's, with the answer key

    surfaces = args.only.split(",")
    cases: list[Case] = []
    if "api" in surfaces:
        cases += api_cases(repo)
    elif "blocks" in surfaces:                 # the building blocks alone (a part of the api cases)
        cases += [c for c in api_cases(repo) if c.surface == "blocks"]
    if "scripts" in surfaces:
        cases += script_cases(repo)
    if "shell" in surfaces:
        cases += shell_cases(repo)
    if "faults" in surfaces:
        cases += fault_cases(repo)
    outcomes = []
    import warnings

    warnings.simplefilter("ignore")
    for case in cases:
        outcome = judge_call(case, repo) if case.kind == "call" else judge_script(case, repo)
        outcomes.append(outcome)
    by = Counter((o.case.surface, o.cls) for o in outcomes)
    total = Counter(o.cls for o in outcomes)
    bad = [o for o in outcomes if o.case.bad]
    print(f"trial of {args.repo}: {len(outcomes)} inputs ({len(bad)} bad, {len(outcomes) - len(bad)} good controls)")
    for surface in [s for s in surfaces if s != "blocks"] + (["blocks"] if {"api", "blocks"} & set(surfaces) else []):
        row = {cls: by[(surface, cls)] for cls in ("clear", "unclear", "silent", "ok", "refused-good")}
        print(f"  {surface:8s} " + ", ".join(f"{c} {n}" for c, n in row.items()))
    print("  total    " + ", ".join(f"{c} {total[c]}" for c in ("clear", "unclear", "silent", "ok", "refused-good")))
    target = Counter(o.cls for o in outcomes if o.case.surface != "blocks")
    n_target = sum(target.values())
    print(f"  the trial's target (every surface but blocks): {n_target} inputs: " +
          ", ".join(f"{c} {target[c]}" for c in ("clear", "unclear", "silent", "ok", "refused-good")))
    wanted = set(args.list.split(","))
    for o in outcomes:
        if o.cls in wanted:
            print(f"[{o.cls}] {o.case.name}: {o.detail}")
    if args.keep:
        print(f"copy kept at {repo}")
    else:
        os.chdir("/")
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
