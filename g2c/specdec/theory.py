"""Beyond (specdec-lab): the speculative-decoding calculator. Provided code, no exercise.

Closed forms of the i.i.d. acceptance model and of the serving arithmetic that decides
whether speculation pays. Every function states its formula, its units and its source;
``tests/test_specdec_lab.py`` pins each one to the worked numbers of the lecture behind the
specdec module (and says where the lecture's arithmetic does not check out).

Symbols (Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative
Decoding", ICML 2023, section 3; the lecture uses the same ones):

    alpha   probability that one draft token is accepted, i.i.d. per position (0 <= alpha <= 1)
    k       draft length: tokens proposed per round (the paper's gamma)
    tau     expected tokens emitted per target pass (accepted drafts + 1 correction/bonus)
    c       draft cost of a whole round, in units of one target step (the lecture's c_draft)
    c1      draft cost per draft token, in units of one target step (the paper's c); an
            autoregressive drafter has c = k * c1

Two speed-up conventions exist and give different numbers for the same drafter:

    speedup_per_round(tau, c)       = tau / (1 + c)            the lecture's canonical law
    speedup_per_token(alpha, k, c1) = (E[accepted] + 1) / (1 + k * c1)
                                    = tau(alpha, k) / (1 + k * c1)   Leviathan et al. Thm 3.8

They agree when c = k * c1 (e.g. k = 1). Pure Python floats: nothing here touches a device.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from g2c.sampling.model import check_count, check_real

__all__ = ["ITLModel", "bimodal_itl", "break_even_alpha", "emitted_distribution", "expected_accepted",
           "expected_rollback", "expected_tokens_per_pass", "free_verify_k_ceiling", "kv_reservation_bytes",
           "memory_floor_step_s", "optimal_k", "ridge_point", "speculative_intensity", "speedup_per_round",
           "speedup_per_token", "tau_cap", "tree_expected_tokens"]


# --- validation helpers -------------------------------------------------------------------
# The rule of every function here: a value of the wrong type (a string, None, a bool, a float
# where a count is needed) is a TypeError naming the argument; a number outside its range is a
# ValueError. Python numbers, NumPy scalars and 0-d (one-element) tensors are numbers: a 0-d
# tensor is read as the Python number it holds (``alpha=torch.tensor(0.8)`` works like 0.8).

def _int(value, name: str, *, minimum: int, rule: str = "") -> int:
    """``value`` as a Python int >= ``minimum`` (TypeError for a non-int, ValueError below)."""
    number = check_count(value, name, minimum=None)
    if number < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{rule}, got {number!r}")
    return number


def _alpha(alpha, name: str = "alpha") -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        alpha = check_real(alpha, name)                      # a 0-d tensor -> float; a string -> TypeError
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {alpha!r}")
    return float(alpha)


def _k(k, *, minimum: int = 0) -> int:
    return _int(k, "k", minimum=minimum, rule=" (draft tokens per round)")


def _nonneg(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        value = check_real(value, name)
    if not float(value) >= 0.0 or math.isinf(float(value)):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _positive(value, name: str) -> float:
    v = _nonneg(value, name)
    if v == 0.0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return v


# --- tokens per pass ----------------------------------------------------------------------

def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """tau(alpha, k) = sum_{i=0..k} alpha^i = (1 - alpha^(k+1)) / (1 - alpha), tokens per target pass.

    A round accepts a geometric run of drafts, truncated at k, plus the target's own token
    (correction after a rejection, bonus after a full match): between 1 and k+1 tokens.
    At alpha = 1 every draft is accepted: k + 1.

    Source: Leviathan et al. 2023, section 3.1, eq. (1); the lecture, "The Speedup Law".

    Raises:
        ValueError: alpha outside [0, 1] ("alpha must be a probability"), k not an int >= 0.
    """
    a, k = _alpha(alpha), _k(k)
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def tau_cap(alpha: float) -> float:
    """The chain asymptote lim_{k->inf} tau = 1 / (1 - alpha) tokens per pass (inf at alpha = 1).

    No chain length escapes it: alpha = 0.85 caps at 6.67. Source: the lecture, "The Speedup Law".

    Raises:
        ValueError: alpha outside [0, 1].
    """
    a = _alpha(alpha)
    return math.inf if a == 1.0 else 1.0 / (1.0 - a)


def expected_accepted(alpha: float, k: int) -> float:
    """E[accepted drafts per round] = tau(alpha, k) - 1 = alpha (1 - alpha^k) / (1 - alpha).

    Note this is not alpha * k: acceptance stops at the first rejection. The fraction of
    drafted tokens that get accepted (``SpecStats.acceptance_rate``) is E[accepted] / k,
    which is smaller than alpha for k > 1.

    Raises:
        ValueError: as ``expected_tokens_per_pass``.
    """
    return expected_tokens_per_pass(alpha, k) - 1.0


def emitted_distribution(alpha: float, k: int) -> list[float]:
    """P(a round emits r tokens) for r = 1, ..., k+1 (a list of k+1 floats summing to 1).

    P(r) = alpha^(r-1) (1 - alpha) for r <= k (r-1 accepted, then a rejection), and
    P(k+1) = alpha^k (all accepted, plus the bonus). Its mean is tau(alpha, k).

    Raises:
        ValueError: as ``expected_tokens_per_pass``.
    """
    a, k = _alpha(alpha), _k(k)
    return [a ** (r - 1) * (1.0 - a) for r in range(1, k + 1)] + [a ** k]


# --- speed-up -----------------------------------------------------------------------------

def speedup_per_round(tau: float, c: float) -> float:
    """The lecture's canonical law: speedup = tau / (1 + c), c = draft cost of a round.

    A round costs one target step plus the draft, T_tgt (1 + c), and emits tau tokens that
    plain decoding would take tau T_tgt to produce (verification is free while the step
    stays memory-bound). Lecture: tau = 2.5, c = 0.1 -> 2.27x; tau = 3.5 -> 3.18x; a weak
    draft tau = 2.0, c = 0.3 -> 1.54x.

    Args:
        tau: tokens per target pass, >= 1 (measured, or ``expected_tokens_per_pass``).
        c: draft cost per ROUND in target steps, >= 0.

    Raises:
        ValueError: tau < 1 (a round always emits at least one token) or c < 0.
    """
    t = _nonneg(tau, "tau")
    if t < 1.0:
        raise ValueError(f"tau must be >= 1 token per pass (every round emits at least one), got {tau!r}")
    return t / (1.0 + _nonneg(c, "c"))


def speedup_per_token(alpha: float, k: int, c1: float) -> float:
    """(E[accepted] + 1) / (1 + k c1): the speed-up when each draft token costs c1 target steps.

    The form of Leviathan et al. 2023, Theorem 3.8 (their gamma = k, c = c1). Equals
    ``speedup_per_round(tau(alpha, k), k * c1)``; the two conventions differ only in what
    "c" counts.

    Raises:
        ValueError: alpha outside [0, 1], k not an int >= 0, c1 < 0.
    """
    return expected_tokens_per_pass(alpha, k) / (1.0 + _k(k) * _nonneg(c1, "c1"))


def optimal_k(alpha: float, c1: float, *, k_max: int = 64) -> tuple[int, float]:
    """The draft length k in 1..k_max that maximises ``speedup_per_token(alpha, k, c1)``.

    tau grows towards its cap 1/(1-alpha) while the draft cost 1 + k c1 grows linearly, so
    for c1 > 0 the optimum is interior. Ties go to the smaller k.

    Returns:
        (k_best, speedup at k_best).

    Raises:
        ValueError: alpha outside [0, 1], c1 < 0, k_max not an int >= 1.
    """
    alpha = _alpha(alpha)
    c1 = _nonneg(c1, "c1")
    k_max = _int(k_max, "k_max", minimum=1)
    best = max(range(1, k_max + 1), key=lambda k: (speedup_per_token(alpha, k, c1), -k))
    return best, speedup_per_token(alpha, best, c1)


def break_even_alpha(c1: float, k: int = 1, *, tol: float = 1e-12) -> float:
    """The acceptance alpha at which speculation neither helps nor hurts: tau(alpha, k) = 1 + k c1.

    Below it, ``speedup_per_token`` < 1. For k = 1 it is exactly alpha = c1 (one draft
    costing c1 must be accepted with probability c1 to pay for itself). Found by bisection
    (tau is increasing in alpha). Returns 1.0 when even alpha = 1 does not pay (k c1 >= k).

    Raises:
        ValueError: c1 < 0, k not an int >= 1.
    """
    c1, k = _nonneg(c1, "c1"), _k(k, minimum=1)
    goal = 1.0 + k * c1
    if goal >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if expected_tokens_per_pass(mid, k) < goal:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# --- KV cache bookkeeping -----------------------------------------------------------------

def expected_rollback(alpha: float, k: int) -> float:
    """Expected KV rows written during verify and then rolled back, per round: k - (tau - 1).

    The verify pass writes k draft rows; tau - 1 of them are accepted on average (the
    correction/bonus token's row is written by the next round). Lecture: k = 4,
    alpha = 0.85 -> 4 - 2.71 = 1.29 rows, about 423 KB at 320 KiB per token.

    Raises:
        ValueError: as ``expected_tokens_per_pass``.
    """
    return _k(k) - expected_accepted(alpha, k)


def kv_reservation_bytes(k: int, bytes_per_token: float) -> float:
    """Worst-case KV bytes to reserve per request before a round: (k + 1) * bytes_per_token.

    Lecture: 70B (320 KiB per token) -> 1.6 MB at k = 4 and 2.95 MB at k = 8 (the lecture
    rounds it to 3.0); DeepSeek-V3 MLA (34 KiB) at k = 1 -> 70 KB.

    Raises:
        ValueError: k not an int >= 0, bytes_per_token < 0.
    """
    return (_k(k) + 1) * _nonneg(bytes_per_token, "bytes_per_token")


# --- trees --------------------------------------------------------------------------------

def tree_expected_tokens(parents: Sequence[int], accept: Sequence[float]) -> float:
    """E[tau_tree] = 1 + sum_{v != root} prod_{u in path(root, v)} a(u), tokens per target pass.

    At most one node per depth can continue the committed sequence (siblings are disjoint
    events), so the expected accepted length is the sum over nodes of the probability that
    the whole path to the node is accepted. With i.i.d. alpha, a chain of k gives tau(alpha, k).

    Args:
        parents: parents[i] is the parent of draft node i: -1 for the root (the last
            committed token), else an index j < i.
        accept: accept[i] = a(i), the probability node i is accepted given its parent was.

    Raises:
        TypeError: parents or accept not a sequence, a parent not an int, an a(i) not a number.
        ValueError: lengths differ; a parent index is not -1 or an earlier node; an a(i) is
            outside [0, 1]; the children of one node have a(.) summing above 1 (sibling
            events are disjoint, so their probabilities cannot add up to more than 1).

    Source: the lecture, "Draft Trees"; SpecInfer (Miao et al. 2024) and Medusa (Cai et al.
    2024, section 2.3) for tree verification.
    """
    for name, seq in (("parents", parents), ("accept", accept)):
        if isinstance(seq, (str, bytes)) or not isinstance(seq, Iterable):
            raise TypeError(f"{name} must be a sequence with one entry per node, got {type(seq).__name__}")
    parents, accept = list(parents), list(accept)           # read once (a generator too), then check
    if len(parents) != len(accept):
        raise ValueError(f"parents ({len(parents)}) and accept ({len(accept)}) must have one entry per node")
    reach: list[float] = []
    child_mass: dict[int, float] = {}
    for i, (p, a) in enumerate(zip(parents, accept)):
        p = check_count(p, f"parents[{i}]", minimum=None)
        if not -1 <= p < i:
            raise ValueError(f"parents[{i}] = {p!r}: must be -1 (root) or the index of an earlier node")
        a = _alpha(a, f"accept[{i}]")
        child_mass[p] = child_mass.get(p, 0.0) + a
        if child_mass[p] > 1.0 + 1e-6:             # float32 rows: rounding, not a wrong tree
            raise ValueError(f"children of node {p} have acceptance summing to {child_mass[p]:.3f} > 1; "
                             "siblings are disjoint events, so their probabilities must sum to <= 1")
        reach.append(a * (1.0 if p == -1 else reach[p]))
    return 1.0 + sum(reach)


# --- roofline -----------------------------------------------------------------------------

def memory_floor_step_s(weight_bytes: float, bandwidth_bytes_per_s: float) -> float:
    """The decode floor T_step >= weight bytes / memory bandwidth, in seconds.

    Every decode step reads all weights once. Lecture: 70B FP16 (140 GB) on an H100
    (3.35 TB/s) -> 41.8 ms, about 24 tokens/s for one request.

    Raises:
        ValueError: weight_bytes < 0 or bandwidth <= 0.
    """
    return _nonneg(weight_bytes, "weight_bytes") / _positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")


def ridge_point(flops_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """Roofline ridge pi / beta in FLOP/byte: above it a kernel is compute-bound.

    Lecture: H100 989 TFLOP/s dense FP16 over 3.35 TB/s -> 295 FLOP/byte.
    Source: Williams, Waterman, Patterson, "Roofline" (CACM 2009).

    Raises:
        ValueError: either rate <= 0.
    """
    return _positive(flops_per_s, "flops_per_s") / _positive(bandwidth_bytes_per_s, "bandwidth_bytes_per_s")


def speculative_intensity(weight_bytes: float, batch: int, k: int, context: int, kv_bytes_per_token: float) -> float:
    """Effective arithmetic intensity of a speculative decode step, in FLOP/byte:

        I_spec = 2P * B (k + 1) / (2P + B L kv)

    2P is read twice: as FLOPs per token (2 per parameter) and as FP16 weight bytes (2 per
    parameter), so pass ``weight_bytes`` = 2P. B requests each verify k + 1 tokens (FLOPs
    2P B (k+1)); the step reads the weights once plus every request's KV cache, L tokens of
    kv bytes each. Once I_spec nears the ridge (``ridge_point``), verify tokens stop being free.

    Lecture: "104 FLOP/byte at B = 32, k = 4 and 204 at B = 128 (L = 2048)". With its own
    70B constants (2P = 140 GB, kv = 320 KiB per token) this formula gives 139 at B = 32
    and 397 at B = 128 (already past the ridge); both lecture numbers follow from
    kv = 1.14 MB per token instead.

    Args:
        weight_bytes: 2P, bytes of FP16 weights (= FLOPs per token), > 0.
        batch: B, requests in the step, int >= 1.
        k: draft tokens per request, int >= 0 (k = 0: plain decoding).
        context: L, KV tokens per request, int >= 0.
        kv_bytes_per_token: bytes of K and V for one token across all layers, >= 0.

    Raises:
        ValueError: any argument out of the ranges above.
    """
    p2 = _positive(weight_bytes, "weight_bytes")
    batch = _int(batch, "batch", minimum=1)
    context = _int(context, "context", minimum=0, rule=" (KV tokens per request)")
    k = _k(k)
    kv = _nonneg(kv_bytes_per_token, "kv_bytes_per_token")
    return p2 * batch * (k + 1) / (p2 + batch * context * kv)


def free_verify_k_ceiling(ridge: float, mfu: float, mbu: float, weight_bytes: float, batch: int,
                          kv_bytes_per_request: float) -> float:
    """Largest k for which verifying k tokens per request still costs one memory-bound step:

        k <= (pi / beta) * (MFU / MBU) * (2P + B kv) / (2P B)

    from T_verify(k) = max((2P + B kv) / (beta MBU), k 2P B / (pi MFU)). Here kv is the whole
    KV read of one request (bytes per token times context). Lecture: 70B on an H100 at
    B = 1, L = 4K (1.3 GB of KV against 140 GB of weights), MFU 0.5, MBU 1 -> k* ~ 148.

    Raises:
        ValueError: ridge, mfu, mbu or weight_bytes <= 0, batch not an int >= 1, kv < 0.
    """
    p2 = _positive(weight_bytes, "weight_bytes")
    batch = _int(batch, "batch", minimum=1)
    kv = _nonneg(kv_bytes_per_request, "kv_bytes_per_request")
    scale = _positive(ridge, "ridge") * _positive(mfu, "mfu") / _positive(mbu, "mbu")
    return scale * (p2 + batch * kv) / (p2 * batch)


# --- streaming ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ITLModel:
    """Inter-token latency of speculative rounds under the i.i.d. model (seconds).

    Attributes:
        round_s: one round, target step times (1 + c).
        mean_s: mean inter-token latency round_s / tau (the TPOT).
        burst_fraction: share of tokens that arrive ~0 s after the previous one (every token
            of a round but the first): (tau - 1) / tau.
        emitted_pmf: P(round emits r tokens), r = 1..k+1.
    """

    round_s: float
    mean_s: float
    burst_fraction: float
    emitted_pmf: tuple[float, ...]


def bimodal_itl(target_step_s: float, alpha: float, k: int, c: float) -> ITLModel:
    """The two-spike ITL distribution of speculative streaming.

    A round takes T = target_step_s (1 + c) and delivers r tokens at once: the first after
    ~T, the other r - 1 after ~0. The mean ITL is T / tau, but no token arrives at that
    latency. Lecture (70B, MTP k = 1, alpha = 0.85, c = 0.10, 41.8 ms step): 46.0 ms rounds,
    mean 46.0 / 1.85 = 24.9 ms.

    Args:
        target_step_s: one target step in seconds, > 0.
        alpha, k: acceptance and draft length (see ``expected_tokens_per_pass``).
        c: draft cost per round in target steps, >= 0.

    Raises:
        ValueError: target_step_s <= 0 or c < 0, and as ``expected_tokens_per_pass``.
    """
    tau = expected_tokens_per_pass(alpha, k)
    round_s = _positive(target_step_s, "target_step_s") * (1.0 + _nonneg(c, "c"))
    return ITLModel(round_s=round_s, mean_s=round_s / tau, burst_fraction=(tau - 1.0) / tau,
                    emitted_pmf=tuple(emitted_distribution(alpha, k)))
