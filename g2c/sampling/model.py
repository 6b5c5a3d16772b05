"""Module 11: what the decoding loops need from a model, and the checks they share. Provided.

Every loop that takes a model (``generate`` here, ``speculative_generate``, ``draft_greedy``
and ``mtp_propose`` in ``g2c.specdec``) relies on the ``LanguageModel`` protocol below and
nothing else. ``TransformerLM`` satisfies it; so does a plain object with three attributes
and a ``__call__`` (the table-lookup mocks of the tests).

Mode methods are optional: ``eval_mode`` (``g2c.nn.eval_mode``, re-exported here) switches
a model to eval mode for the duration of a ``with`` block when it has ``training`` and
``train(mode)``, restores the saved mode in a ``finally`` (an exception or a Ctrl-C inside
the loop leaves every model as it was), and leaves a model without them alone.

Shape letters: T time, V vocabulary.
"""

from __future__ import annotations

import math
import numbers
import operator
from typing import Protocol, runtime_checkable

import torch

from g2c.nn import eval_mode  # re-exported: the loops' mode switch lives with Module (module 03)

__all__ = ["LanguageModel", "as_whole", "check_whole", "check_base_model", "check_count", "check_eos_id", "check_flag",
           "check_generator", "check_head_on_base", "check_language_model", "check_prob_rows", "check_real",
           "check_repetition_penalty", "check_same_vocab", "check_score_rows", "check_table_dtype",
           "check_temperature", "check_token_ids", "check_top_p", "check_window", "eval_mode", "prob_tolerance",
           "zero_prob_draws"]

REQUIRED = ("vocab_size", "max_seq_len", "device")


@runtime_checkable
class LanguageModel(Protocol):
    """The model protocol of every decoding loop in the course.

    Required:
        vocab_size: int, V; token ids live in [0, V).
        max_seq_len: int, the context window; loops crop the context to its last
            ``max_seq_len`` tokens before each call.
        device: ``torch.device`` where the model wants its input ids; the loops move ids
            there and read logits back from there.
        __call__(ids): ids (1, T) int64 on ``device`` -> logits (1, T, V) float on ``device``;
            row t scores the token after position t.

    Optional (used by ``eval_mode`` when present, ignored when absent):
        training: bool, the current mode.
        train(mode=True): set the mode (``eval()`` is ``train(False)``).
    """

    vocab_size: int
    max_seq_len: int
    device: torch.device

    def __call__(self, ids: torch.Tensor) -> torch.Tensor: ...


def check_language_model(model, name: str = "model") -> None:
    """Reject a model that does not satisfy ``LanguageModel``, naming what is missing.

    Raises:
        TypeError: ``model`` is not callable or lacks ``vocab_size``, ``max_seq_len`` or
            ``device``; the message names ``name``, the missing attributes and the protocol, and,
            for a drafter wrapping a model (``LMDrafter(model)``: it has ``propose`` and ``model``),
            says to pass ``<name>.model`` (the loops of modules 16 and specdec-trees/-lab take
            the bare model; only the engine, ``speculative_sample``, takes a drafter).
        ValueError: the model is on the meta device (it has shapes but no weights to run).
    """
    missing = [attr for attr in REQUIRED if not hasattr(model, attr)]
    if not callable(model):
        missing.append("__call__")
    if missing:
        hint = ""
        if callable(getattr(model, "propose", None)) and hasattr(model, "model"):
            hint = (f"; it is a drafter wrapping a model: this function takes the model itself, pass "
                    f"{name}.model (the model you wrapped) instead")
        raise TypeError(f"{name} ({type(model).__name__}) does not satisfy g2c.sampling.LanguageModel: "
                        f"missing {', '.join(missing)} (a model needs vocab_size, max_seq_len, device "
                        f"and ids (1, T) -> logits (1, T, V)){hint}")
    parameters = getattr(model, "parameters", None)     # the weights themselves: the fake accelerator of
    try:                                                  # the course's tests reports "meta" as its device
        on_meta = callable(parameters) and any(getattr(p, "is_meta", False) for p in parameters())
    except (TypeError, RuntimeError, AttributeError):     # parameters() of an unusual model: not ours to judge
        on_meta = False
    if on_meta:
        raise ValueError(f"{name} ({type(model).__name__}) is on the meta device (shapes without weights): "
                         "build or load it on a real device (its constructor, or load_model(name, device=...))")


def check_token_ids(ids: torch.Tensor, vocab_size: int, name: str) -> None:
    """Reject token ids outside the vocabulary [0, vocab_size). Works on any device.

    A negative id would otherwise index from the end (-1 reads token V-1) and an id >= V
    would raise a bare ``IndexError`` deep inside a model or a verifier. One bool is read
    back from the device when every id is good (one synchronisation per call).

    Args:
        ids: integer tensor of any shape, on any device.
        vocab_size: V.
        name: the argument's name, for the message.

    Raises:
        TypeError: ``ids`` is not a tensor.
        ValueError: ``ids`` holds floats, bools or complex numbers ("<name> must hold integer
            token ids, got dtype ..."); an id is < 0 or >= V: the message names ``name``, the
            offending id and the range ``[0, V)``.
    """
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a tensor of integer token ids, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.numel() == 0:
        return
    outside = (ids < 0) | (ids >= vocab_size)
    if bool(outside.any()):
        bad = int(ids[outside].reshape(-1)[0])
        raise ValueError(f"{name} holds token id {bad}, outside the vocabulary [0, {vocab_size}); "
                         f"ids must come from the model's tokenizer")


def check_eos_id(eos_id, vocab_size: int | None, name: str = "eos_id") -> int | None:
    """An end-of-sequence id: None (no stop) or an int in [0, V); returned as a Python int.

    An id outside the vocabulary can never be emitted, so a loop given one would silently run
    to its budget instead of stopping. Every loop that takes ``eos_id`` calls this where its
    arguments enter (``vocab_size`` None: the type only, when the model is checked later).

    Raises:
        TypeError: not an int (a float, a bool, a string; 0-d integer tensors are accepted).
        ValueError: outside [0, V); the message names the value and the range.
    """
    if eos_id is None:
        return None
    value = check_count(eos_id, name, minimum=None)
    if vocab_size is not None and not 0 <= value < vocab_size:
        raise ValueError(f"{name} {value} is outside the vocabulary [0, {vocab_size}): the loop could never emit "
                         "it and would not stop; pass the tokenizer's end-of-text id or None")
    return value


# -- the argument checks every loop shares (one place: a new loop calls these where values enter) --

def check_count(value, name: str, *, minimum: int | None = 0) -> int:
    """An integer argument (a token budget, a draft length, a cache advance) as a Python int.

    Python ints, NumPy integers and 0-d integer tensors are accepted; a float (even ``2.0``),
    ``None``, a bool or a string is refused rather than truncated or compared later. With
    ``minimum=None`` only the type is checked (the caller owns the range rule).

    Raises:
        TypeError: not an integer; the message names ``name``, the value and its type.
        ValueError: below ``minimum``; the message names ``name``, the value and the rule.
    """
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        rule = "an int" if minimum is None else f"an int >= {minimum}"
        raise TypeError(f"{name} must be {rule}, got {type(value).__name__} {value!r}; pass a whole number") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {number}")
    return number


def as_whole(value) -> int | None:
    """``value`` as a Python int when it is a whole number (an int, a NumPy integer, a 0-d integer
    tensor), else None (a bool or a bool tensor, a float, a string, None, a tensor of any other
    shape). For range checks that keep their own message, ``check_whole`` below raises it."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor)
                                   and (value.dim() != 0 or value.dtype == torch.bool)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_whole(value, message: str, *, low: int = 1, high: int | None = None) -> int:
    """``value`` as a Python int in ``[low, high]`` (``high=None``: no upper bound), for the range
    checks that keep their own words: an int, a NumPy integer or a 0-d integer tensor passes; a
    bool, a float (even ``2.0``), a string, None or a tensor of another shape or dtype does not.

    Raises:
        TypeError: not a whole number (the project's type rule: a value of the wrong type is a
            TypeError); the message is ``message`` plus the type given.
        ValueError: a whole number outside the range; the message is ``message``, the caller's (it
            names the argument, the rule and the value given).
    """
    number = as_whole(value)
    if number is None:
        raise TypeError(f"{message} ({type(value).__name__}; pass a whole number)")
    if number < low or (high is not None and number > high):
        raise ValueError(message)
    return number


def check_generator(generator, name: str = "generator") -> None:
    """``generator`` must be None or a CPU ``torch.Generator`` (a seed is not one).

    The course draws every random number of its sampling and verification on the CPU (the rows
    are moved there first), so one seed gives the same draws on CPU, CUDA and MPS; a CUDA or MPS
    generator would reach torch's own device error in the middle of a loop.

    Raises:
        TypeError: anything else; the message says how to make one from a seed.
        ValueError: a generator on another device ("generator is on cuda:0; g2c draws its random
            numbers on the CPU ..."); the message says to use a CPU one.
    """
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{name} must be a torch.Generator or None, got {type(generator).__name__} {generator!r}; "
                        "use torch.Generator().manual_seed(seed)")
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"{name} is on {generator.device}; g2c draws its random numbers on the CPU whatever the "
                         "model's device (one seed, the same draws everywhere): "
                         "use torch.Generator().manual_seed(seed)")


def check_real(value, name: str, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False) -> float:
    """A real-number argument as a finite Python float within an optional range.

    Python ints and floats, NumPy scalars and 0-d (or one-element) real tensors are accepted; a
    bool, a string, None, a complex number or a tensor of several elements is a TypeError.

    Raises:
        TypeError: not a real number; the message names ``name``, the value and its type.
        ValueError: NaN, infinite, or outside the range; the message names the value and the range.
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex \
            and value.dtype != torch.bool:
        value = value.item()
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item") and not isinstance(value, torch.Tensor):
        value = value.item()                                                  # a NumPy scalar
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r:.60}")
    value = float(value)
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    span = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
    if not math.isfinite(value) or (low is not None and (value < low or (low_open and value == low))) \
            or (high is not None and (value > high or (high_open and value == high))):
        raise ValueError(f"{name} must be a finite number in {span}, got {value!r}")
    return value


def check_temperature(temperature, name: str = "temperature") -> float:
    """A sampling temperature as a float: finite and >= 0 (0 = greedy).

    Raises:
        TypeError: not a real number (a string, None, a tensor with more than one element).
        ValueError: negative, NaN or infinite; the message names the value and the rule.
    """
    if isinstance(temperature, torch.Tensor) and temperature.numel() == 1:
        temperature = temperature.item()
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):   # NumPy floats too
        raise TypeError(f"{name} must be a real number >= 0 (0 = greedy), got {type(temperature).__name__} "
                        f"{temperature!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"{name} must be >= 0 and finite (0 = greedy), got {temperature}")
    return float(temperature)


def check_top_p(top_p) -> float | None:
    """A nucleus mass (Holtzman et al. 2020, section 3.1) in (0, 1], or None (off).

    The one check behind module 11's ``generate`` and the speculative engine's ``Sampler``. A
    top_p so small that float32 (the dtype the warpers compare the probability mass in) rounds it
    to 0 would keep no token at all, not even the most likely one: refused here, with the value
    that does what was meant.

    Raises:
        TypeError: not a real number ("top_p must be a real number in (0, 1] or None").
        ValueError: outside (0, 1] or NaN ("top_p must be in (0, 1] or None"); positive but
            below float32's smallest positive value, about 1.4e-45 ("rounds to 0 in float32").
    """
    if top_p is None:
        return None
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):           # NumPy floats too
        raise TypeError(f"top_p must be a real number in (0, 1] or None, got {type(top_p).__name__} {top_p!r}")
    if not 0.0 < top_p <= 1.0:  # also refuses NaN
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")
    if float(torch.tensor(float(top_p), dtype=torch.float32)) == 0.0:
        raise ValueError(f"top_p={top_p} rounds to 0 in float32 (the dtype of the probability mass it is compared "
                         "with), which would keep no token; any top_p below the top token's probability keeps "
                         "only that token: use e.g. 1e-9")
    return float(top_p)


def check_flag(flag, name: str) -> bool:
    """A switch that must be exactly True or False: a string such as "False" is truthy, so it is
    refused, not guessed.

    Raises:
        TypeError: anything but a bool ("<name> must be True or False").
    """
    if not isinstance(flag, bool):
        raise TypeError(f"{name} must be True or False, got {type(flag).__name__} {flag!r}")
    return flag


def check_repetition_penalty(penalty) -> float:
    """A CTRL repetition penalty as a float: finite and > 0 (1.0 = off).

    The one check behind module 11's ``generate``, module 16's ``cached_generate`` and the
    speculative engine's ``repetition_penalty``.

    Raises:
        TypeError: not a real number ("repetition_penalty must be a real number > 0").
        ValueError: <= 0, NaN or infinite ("repetition_penalty must be > 0 and finite"); the
            message names the value.
    """
    if isinstance(penalty, bool) or not isinstance(penalty, numbers.Real):       # NumPy floats too
        raise TypeError(f"repetition_penalty must be a real number > 0, got {type(penalty).__name__} {penalty!r}")
    if not 0 < penalty < math.inf:                      # also refuses NaN
        raise ValueError(f"repetition_penalty must be > 0 and finite (1.0 = off), got {penalty}")
    return float(penalty)


HEAD_READS = ("embedding_dim", "num_heads", "hidden_dim", "token_embed", "blocks")


def check_base_model(base, owner: str, generator=None) -> None:
    """The base a draft head is built on (``MTPHead(base)``, ``MedusaHeads(base)``, ``FeatureDrafter(base)``, ...)
    must be the target ``TransformerLM`` (or a model with its attributes: a ``FastLM`` snapshot), and the
    head's ``generator`` None or a CPU ``torch.Generator``; checked before the head reads either.

    Raises:
        TypeError: ``base`` is not a language model or lacks what a head reads (``embedding_dim``,
            ``num_heads``, ``hidden_dim``, ``token_embed``, ``blocks``): the message names ``owner``, the
            missing attributes and the fix; a generator that is not one (``check_generator``).
        ValueError: a generator on another device (``check_generator``).
    """
    check_language_model(base, f"{owner}: base")
    missing = [attr for attr in HEAD_READS if not hasattr(base, attr)]
    if missing:
        raise TypeError(f"{owner}: base ({type(base).__name__}) is not a TransformerLM: a draft head reads its "
                        f"{', '.join(missing)}; build the head on the target model (e.g. load_model('StoryLM-30M')[0] "
                        "or a g2c.transformer.TransformerLM)")
    check_generator(generator)


def check_head_on_base(head, base, name: str = "head") -> None:
    """A draft head reads its base's states and embedding table: it must sit on ``base`` (the same
    object, a ``FastLM`` snapshot of it, or the model such a snapshot was built from) and compute in
    the base's dtype.

    Heads take the base's device and dtype when built (``MTPHead(base)``, ``MedusaHeads(base)``,
    ...); a base converted afterwards (``base.to(dtype=torch.bfloat16)``) leaves its head behind.

    Raises:
        TypeError: ``head`` has no ``base`` (it is not a draft head).
        ValueError: the head sits on another model ("built on another model: pass head.base"), or
            its parameters are in another dtype than the base's weights (names both and the fix).
    """
    head_base = getattr(head, "base", None)
    if head_base is None:
        raise TypeError(f"{name} ({type(head).__name__}) is not a draft head on a base model (no .base)")
    def root(model):                  # a FastLM snapshot or a swapped copy stands for the model it was built from
        return getattr(model, "fast_source", None) or getattr(model, "source", None) or model

    if root(head_base) is not root(base):
        raise ValueError(f"{name} ({type(head).__name__}) was built on another model: it reads the states and "
                         "embedding table of head.base; pass head.base as the base/target, or build the head on "
                         "this model")
    params = head.parameters() if callable(getattr(head, "parameters", None)) else []
    base_weight = getattr(getattr(head_base, "token_embed", None), "weight", None)
    if params and isinstance(base_weight, torch.Tensor) and params[0].dtype != base_weight.dtype:
        raise ValueError(f"{name} ({type(head).__name__}) computes in {params[0].dtype} but its base in "
                         f"{base_weight.dtype}; convert the head with its base: head.to(dtype={base_weight.dtype})")



def check_same_vocab(drafter_vocab: int | None, target_vocab: int) -> None:
    """A drafter proposes ids the target scores: both must index one vocabulary (one tokenizer).

    The one copy of this check: the speculative loops (sampled, cached, tree, lineage, batched)
    call it before any pass. ``drafter_vocab`` None (a drafter that declares no ``vocab_size``, such
    as prompt lookup, which copies ids from the context) passes.

    Raises:
        ValueError: the sizes differ ("drafter vocab_size X differs from target vocab_size Y; both
            must use the same tokenizer").
    """
    if drafter_vocab is not None and drafter_vocab != target_vocab:
        raise ValueError(f"drafter vocab_size {drafter_vocab} differs from target vocab_size {target_vocab}; "
                         "both must use the same tokenizer")


def check_window(max_seq_len: int, name: str = "target") -> None:
    """A speculative pass scores a context token and at least one draft: the window must hold 2.

    The one window precondition of the speculative loops (the engine's ``_setup``, so every preset,
    and ``mtp_generate``; only the seed's loop keeps its own copy). No loop needs more, whatever k
    or the prompt: each pass drafts ``g2c.specdec.draft_room(k, visible context, max_seq_len)``
    tokens, so context + drafts always fit, and a cached target re-prefills before it runs out
    of rows.

    Raises:
        ValueError: max_seq_len < 2 ("<name> max_seq_len=W leaves no room for a draft; need >= 2").
    """
    if max_seq_len < 2:
        raise ValueError(f"{name} max_seq_len={max_seq_len} leaves no room for a draft; need >= 2")

# -- score and probability rows: every verifier and loop checks its tables here -----------------
# One layer, so a new verifier or loop inherits it: the flat verifiers (``greedy_verify``,
# ``speculative_verify``), the tree verifiers, the batched and recurrent loops, module 11's
# ``next_token_logits`` and module 16's ``cached_forward`` call these before a table is read.
#
# * ``check_score_rows`` (logits): a NaN anywhere, or a row whose every entry is -inf, is an
#   error. The argmax of such a row is silently token 0 (or the NaN's index) and its softmax is
#   NaN: the loop would emit text from a broken model.
# * ``check_prob_rows`` (probabilities): every entry finite and >= 0, every row summing to 1
#   within ``prob_tolerance(dtype)``: 1e-3 for float32/float64 (a float32 softmax over V = 4096
#   sums to 1 within about 1e-6; the margin covers renormalised top-k/top-p rows), 1e-2 for
#   float16/bfloat16 (11 or 8 mantissa bits). Speculative sampling is exact only for
#   distributions p and q (Leviathan et al. 2023, section 2.3): rows summing to 10 or 0.01
#   would silently skew the output.
#
# * Both refuse a table that is not floating point (``check_table_dtype``): an int64 table of
#   counts, a bool mask or a complex table is never converted. Counts are not a distribution
#   (a row of counts summing to 5 would be read as p(x) = 5), and a one-hot bool row converts to
#   a distribution only by accident; the caller normalises explicitly (``counts / counts.sum(-1,
#   keepdim=True)``) or passes softmax probabilities. float16, bfloat16, float32 and float64 are
#   accepted on every path.
#
# Both reduce on the table's own device (float32, never float64: MPS has none) and read one bool
# back. A non-tensor or a table of another rank is left to the caller's shape check.

def check_table_dtype(rows, name: str, *, kind: str = "probabilities") -> None:
    """Refuse a score or probability table whose dtype is not floating point.

    Args:
        rows: a tensor; anything else is ignored (the caller's shape check names it).
        name: the argument's name, for the message.
        kind: "probabilities" or "scores", for the message.

    Raises:
        ValueError: "<name> must hold <kind> as a floating-point tensor, got dtype torch.int64"
            with the fix (normalise counts, or pass softmax probabilities / float logits).
    """
    if isinstance(rows, torch.Tensor) and not rows.dtype.is_floating_point:
        fix = ("normalise counts yourself (counts / counts.sum(-1, keepdim=True)) or pass softmax "
               "probabilities" if kind == "probabilities" else "pass the model's float logits")
        raise ValueError(f"{name} must hold {kind} as a floating-point tensor (float32, float16, bfloat16), "
                         f"got dtype {rows.dtype}; {fix}")


def prob_tolerance(dtype: torch.dtype) -> float:
    """How far a probability row's sum may be from 1: 1e-3 (float32/64), 1e-2 (16-bit floats)."""
    return 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-3


def _where(where: str | None) -> str:
    return f" at {where}" if where else ""


def check_score_rows(rows, name: str, *, where: str | None = None) -> None:
    """Refuse logits (..., V) holding NaN or a row of only -inf.

    Args:
        rows: float tensor (..., V) on any device; a non-tensor is ignored.
        name: the argument's name, for the message ("target_logits").
        where: the step, for the message ("generate, position 7").

    Raises:
        ValueError: a tensor that is not floating point (``check_table_dtype``).
        ValueError: "<name> holds NaN at <where>" or "<name> row i is all -inf at <where>", with
            the fix (check the model: overflow in half precision, a bad temperature).
    """
    check_table_dtype(rows, name, kind="scores")
    if not isinstance(rows, torch.Tensor) or rows.dim() < 1 or rows.numel() == 0:
        return
    if math.isfinite(rows.sum().item()):   # one reduction, one read: no NaN and no -inf anywhere (a decode
        return                             # step's common case; a masked or overflowing row is looked at below)
    if bool(torch.isnan(rows).any()):
        raise ValueError(f"{name} holds NaN{_where(where)}: the model produced NaN scores, so no token can be "
                         "chosen; check the model (overflow in float16, a division by a zero temperature) "
                         "before decoding")
    dead = torch.isneginf(rows).all(dim=-1)                                # (...,)
    if bool(dead.any()):
        row = [int(i) for i in dead.nonzero()[0]]
        which = name if not row else f"{name} row {row[0] if len(row) == 1 else tuple(row)}"
        raise ValueError(f"{which} is all -inf{_where(where)}: every token is masked, so none can be chosen; "
                         "check the mask or the filters")


def check_prob_rows(rows, name: str, *, where: str | None = None) -> None:
    """Refuse a probability table (n, V) that is not n distributions.

    Args:
        rows: float tensor (n, V) on any device; a non-tensor or another rank is ignored.
        name: the argument's name ("target_probs", "draft_probs", "proposal_probs").
        where: the step, for the message.

    Raises:
        ValueError: a tensor that is not floating point (integer counts, a bool mask:
            ``check_table_dtype``; never converted).
        ValueError: "<name> must hold probabilities: ..." naming the first bad row (NaN, an
            infinite or negative entry, or a sum off 1 by more than ``prob_tolerance``) and the
            fix: pass softmax probabilities after the same warpers, not logits or weights.
    """
    check_table_dtype(rows, name, kind="probabilities")
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.numel() == 0:
        return
    fix = ("pass each row as a distribution (softmax of the warped logits), not logits or unnormalised "
           "weights")
    bad = ~torch.isfinite(rows).all(dim=-1) | (rows < 0).any(dim=-1)       # (n,)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{name} must hold probabilities: row {i} has a NaN, infinite or negative entry"
                         f"{_where(where)}; {fix}")
    tol = prob_tolerance(rows.dtype)
    sums = rows.float().sum(dim=-1)                                        # (n,) on the table's device
    off = (sums - 1).abs() > tol
    if bool(off.any()):
        i = int(off.nonzero()[0, 0])
        raise ValueError(f"{name} must hold probabilities: row {i} sums to {float(sums[i]):.6g}, not 1 "
                         f"(tolerance {tol:g}){_where(where)}; {fix}")


def zero_prob_draws(rows: torch.Tensor, tokens: torch.Tensor) -> list[int]:
    """Indices i where ``rows[i, tokens[i]] <= 0``: a row that cannot be the distribution its token was
    drawn from (a speculative verifier's p/q would then divide by zero). ``rows`` (n, V) float,
    ``tokens`` (n,) int64 on the CPU; the drafts' checks (``check_draft`` in ``g2c.specdec.sampling.draft``,
    ``DraftTree.check``) raise with their own message."""
    own = rows.detach().float().cpu().gather(1, tokens.view(-1, 1)).view(-1)           # (n,)
    return (own <= 0).nonzero().view(-1).tolist()

