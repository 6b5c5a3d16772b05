"""Argument types shared by every script (``bench/*.py``, ``./datasets.sh``, ``./checkpoints.sh``,
``python -m g2c.assets.export``): bad options stop at parse time with one line and exit 2.

Each factory returns an ``argparse`` ``type=`` callable; argparse turns its
``ArgumentTypeError`` into ``usage: ...`` plus one line ``error: argument --flag: <why>``
and exit status 2, before anything is loaded or printed. A script whose option is not
expressible as a type (a rule across two options) calls ``parser.error`` the same way.

    ap.add_argument("--new-tokens", type=count(1), default=48)
    ap.add_argument("--ks", type=int_list(1), default="1,2,4")   # stays the string "1,2,4"
    ap.add_argument("--modes", type=choice_list("greedy", "sampled"), default="greedy,sampled")
    ap.add_argument("--target", type=model_name(ladder_only=True), default="StoryLM-30M")
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

__all__ = ["COUNT_MAX", "choice_list", "count", "device_name", "draft_room_problem", "int_list", "model_list",
           "model_name", "output_dir", "output_file", "real", "seed"]


def draft_room_problem(k: int, window: int, *, whose: str, nodes: bool = False) -> str | None:
    """The one rule for asking for drafts, on every command line (the CLI, the benches): the pending
    token and the bonus take 2 of a ``window``-token context's places, so at most ``window - 2``
    drafts fit. None when ``k`` fits; else the message's tail, "at most W - 2 draft tokens fit
    WHOSE W-token window next to the pending token and the bonus", for the caller to prefix with the
    flag it read (``nodes``: "draft tokens (or tree nodes)")."""
    if k <= window - 2:
        return None
    return (f"at most {window - 2} draft tokens{' (or tree nodes)' if nodes else ''} fit {whose} {window}-token "
            "window next to the pending token and the bonus")


def _named(fn: Callable, name: str) -> Callable:
    fn.__name__ = name  # argparse names the type in some messages
    return fn


COUNT_MAX = 2**31 - 1     # torch's thread and size arguments are C ints: a count past this overflowed late


def _int(text: str, minimum: int, maximum: int | None = COUNT_MAX) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; use an int >= {minimum}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{value} is below {minimum}; use an int >= {minimum}")
    if maximum is not None and value > maximum:
        raise argparse.ArgumentTypeError(f"{value} is above {maximum:,}; use an int in [{minimum}, {maximum:,}]")
    return value


def count(minimum: int = 1) -> Callable[[str], int]:
    """An integer option in [``minimum``, 2**31 - 1] (token counts, prompts, repeats, threads, steps)."""
    return _named(lambda text: _int(text, minimum), f"int>={minimum}")


SEED_MAX = 2**63 - 1          # torch.Generator.manual_seed takes up to 2**64 - 1; the benches seed prompt i with
#                               seed + i, so half the range leaves room for any count of prompts


def seed() -> Callable[[str], int]:
    """A generator seed: an int in [0, 2**63 - 1] (inside ``torch.Generator.manual_seed``'s range with
    room for the benches' seed + i per prompt; past it torch said only "Overflow when unpacking long
    long", without naming the option)."""
    def parse(text: str) -> int:
        value = _int(text, 0, maximum=None)
        if value > SEED_MAX:
            raise argparse.ArgumentTypeError(f"{value} is above 2**63 - 1; a seed is an int in [0, 2**63 - 1]")
        return value

    return _named(parse, "seed")


def real(lo: float = -math.inf, hi: float = math.inf, *, lo_open: bool = False) -> Callable[[str], float]:
    """A finite float in [lo, hi] (or (lo, hi] with ``lo_open``); NaN and inf are refused."""
    if math.isfinite(lo) and math.isfinite(hi):
        rule = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
    elif math.isfinite(lo):
        rule = f"{'>' if lo_open else '>='} {lo:g}"
    else:
        rule = f"<= {hi:g}" if math.isfinite(hi) else "(-inf, inf)"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; use a finite number {rule}") from None
        if not math.isfinite(value) or value < lo or value > hi or (lo_open and value == lo):
            raise argparse.ArgumentTypeError(f"{text} is not allowed; use a finite number {rule}")
        return value

    return _named(parse, f"number {rule}")


def _items(text: str, menu: str) -> list[str]:
    """The comma-separated items of ``text``, stripped; an empty list or an empty item (``a,,b``: something
    left out?) raises ``argparse.ArgumentTypeError`` ending with ``menu`` (what to give instead)."""
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError(f"an empty list: {menu}")
    if not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item between commas (something left out?): {menu}")
    return parts


def int_list(minimum: int = 1) -> Callable[[str], str]:
    """A comma-separated list of ints >= ``minimum`` (``1,2,4``), at least one, no empty item; returned as the
    normalised comma-separated string, so code that splits the option keeps working."""
    def parse(text: str) -> str:
        parts = _items(text, f"give comma-separated ints >= {minimum}, e.g. 1,2,4")
        return ",".join(str(_int(p, minimum)) for p in parts)

    return _named(parse, "int list")


def choice_list(*choices: str) -> Callable[[str], str]:
    """A comma-separated, case-insensitive list drawn from ``choices``, at least one; returned as
    the comma-separated string in the choices' own spelling. Dashes, spaces and underscores do not
    count (``ngram`` is the choice ``n-gram``, ``EAGLE3`` is ``EAGLE-3``) unless two choices differ only by them.
    An empty list, an empty item (``a,,b``: a name left out?) and a choice named twice are refused, naming
    the choices."""
    def squash(text: str) -> str:
        return re.sub(r"[-_ ]", "", text.lower())

    squashed = [squash(c) for c in choices]
    known = {c.lower(): c for c in choices}
    loose = {s: c for s, c in zip(squashed, choices) if squashed.count(s) == 1}
    menu = f"choose from {', '.join(choices)} (comma-separated)"

    def parse(text: str) -> str:
        parts = _items(text, menu)
        bad = [p for p in parts if p.lower() not in known and squash(p) not in loose]
        if bad:
            from g2c.course.registry import did_you_mean

            raise argparse.ArgumentTypeError(f"{', '.join(map(repr, bad))}{did_you_mean(bad[0], choices)}: {menu}")
        chosen = [known.get(p.lower()) or loose[squash(p)] for p in parts]
        twice = sorted({c for c in chosen if chosen.count(c) > 1})
        if twice:
            raise argparse.ArgumentTypeError(f"{', '.join(twice)} named twice in {text!r}: name each once")
        return ",".join(chosen)

    return _named(parse, "choice list")


def _model(text: str, ladder_only: bool, extra: tuple[str, ...] = (), language_models: bool = False,
           standalone: bool = False) -> str:
    from g2c.assets.artifacts import DRAFTERS, artifact_kind, canonical_name, drafter_names, model_names

    lms = [n for n in drafter_names() if DRAFTERS[n]["kind"] == "lm"]
    models = (model_names() if ladder_only else model_names() + tuple(lms) if language_models
              else model_names() + drafter_names()) + extra
    try:
        name = canonical_name(text.strip())
    except ValueError:
        from g2c.course.registry import did_you_mean

        raise argparse.ArgumentTypeError(f"unknown model {text!r}{did_you_mean(text, models)}; use one of "
                                         f"{', '.join(models)}") from None
    if ladder_only and name not in model_names():
        raise argparse.ArgumentTypeError(f"{name} is not a ladder model; use {', '.join(model_names())}")
    if artifact_kind(name) != "model":
        raise argparse.ArgumentTypeError(f"{name} is not a model; use "
                                         f"{', '.join(model_names() + drafter_names() + extra)}")
    if (language_models or standalone) and name in DRAFTERS and DRAFTERS[name]["kind"] != "lm":
        base = DRAFTERS[name]["base"]
        fix = (f"this option takes a standalone language model: {', '.join(model_names() + tuple(lms))}"
               if standalone else f"use --target {base} --drafter {name}")
        raise argparse.ArgumentTypeError(f"{name} is a draft head on {base}'s states, not a language model; {fix}")
    return name


def model_name(*, ladder_only: bool = False, extra: tuple[str, ...] = (), language_models: bool = False,
               standalone: bool = False) -> Callable[[str], str]:
    """A shipped model or drafter name, any case, returned canonical (``ladder_only``: a StoryLM
    of the ladder; ``language_models``: a ladder model or a standalone drafter LM, never a draft head, which
    is refused naming the base it reads and the flags that use it), or one of ``extra`` (lower-case keywords
    such as ``"ngram"``, returned lower-case). A mistyped name is refused with the closest names
    (``did you mean``) and the full list, ``extra`` in it. ``standalone``: as ``language_models``, for an
    option that wraps the model as a drafter itself (the benches' ``--drafter``): a head is refused
    naming the standalone language models."""
    def parse(text: str) -> str:
        keyword = str(text).strip().lower()
        return keyword if keyword in extra else _model(text, ladder_only, tuple(extra), language_models, standalone)

    return _named(parse, "model name")


def model_list(*, ladder_only: bool = False) -> Callable[[str], str]:
    """A comma-separated list of model names (see ``model_name``), at least one, no empty item, returned
    canonical."""
    def parse(text: str) -> str:
        parts = _items(text, "give comma-separated model names, e.g. StoryLM-1M,StoryLM-5M")
        return ",".join(_model(p, ladder_only) for p in parts)

    return _named(parse, "model list")


def _writable(text: str, folder: bool, noun: str = "file"):
    from g2c.assets.artifacts import shipped_problem
    from g2c.course.files import check_output_path

    try:
        path = check_output_path(text, folder=folder)
    except IsADirectoryError:
        raise argparse.ArgumentTypeError(f"{text} is a folder; give the {noun} to write") from None
    except OSError as exc:
        raise argparse.ArgumentTypeError(exc.strerror or str(exc)) from None
    problem = shipped_problem(path)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return path


def output_file(*, as_path: bool = False, allow_empty: bool = False, noun: str = "file") -> Callable[[str], object]:
    """A file to write (a figure, a table, JSON), checked at parse time, before minutes of measuring,
    by ``g2c.course.files.check_output_path`` (no NUL, names the file system takes, no file where a
    folder must be, not a folder, its folder writable by a real probe) and outside the shipped
    artifacts (``g2c.assets.artifacts.shipped_problem``). Returned as given, ``~`` expanded
    (``as_path``: a ``Path``); ``allow_empty`` accepts ``''`` (= do not write); ``noun`` names what to give
    instead of a folder ("give the .gguf file to write")."""
    def parse(text: str):
        if allow_empty and text == "":
            return text
        path = _writable(text, folder=False, noun=noun)
        return path if as_path else str(path)

    return _named(parse, "output file")


def output_dir(*, as_path: bool = False) -> Callable[[str], object]:
    """A folder to write into: not a file, writable (or creatable), outside the shipped artifacts,
    checked at parse time as ``output_file`` checks a file."""
    def parse(text: str):
        path = _writable(text, folder=True)
        return path if as_path else str(path)

    return _named(parse, "output folder")


def device_name(*, auto: bool = True) -> Callable[[str], str]:
    """``cpu``, ``cuda[:i]``, ``mps`` (and ``auto`` when allowed), available on this machine."""
    def parse(text: str) -> str:
        from g2c.assets.artifacts import _device

        if text == "auto" and not auto:
            raise argparse.ArgumentTypeError("'auto' is not accepted here; use cpu, cuda or mps")
        try:
            _device(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return _named(parse, "device")
