"""Beyond (specdec): verification, the step that makes speculative decoding lossless.

A drafter proposed k tokens; the target scored the whole block in one pass. Verification
turns those scores into emitted tokens: the accepted prefix of the draft, then one token
from the target itself (the correction token at the first rejection, or the bonus token
after a full match). So every target pass emits accepted + 1 tokens.

Row alignment: the target pass over ``context + draft`` gives k+1 useful rows. Row i
(i < k) is the target's prediction for draft position i; row k predicts the bonus position,
the token after the last draft.

Sources: Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023), section 2.3 and Algorithm 1; Chen et al., "Accelerating Large
Language Model Decoding with Speculative Sampling" (2023), Algorithm 2. Their symbols:
p the target distribution, q the draft distribution, residual max(0, p - q).

Devices: the draft ids and the score tables arrive on ONE device, the target's (CPU,
CUDA or MPS); ``speculative_generate`` hands them over that way. A verifier must not mix
in CPU tensors (``draft_ids.cpu() == rows.argmax(-1)`` fails on a GPU) and must not create
float64 tensors on the device (MPS has no float64): move to the CPU first, then convert.

Shape letters: k draft length, V vocabulary.
"""

from __future__ import annotations

import torch

from g2c.sampling.model import check_generator, check_prob_rows, check_score_rows, check_token_ids

__all__ = ["greedy_verify", "speculative_verify"]


def _check_block(draft_ids: torch.Tensor, rows: torch.Tensor, name: str, *, extra_rows: int) -> int:
    """Validate a draft (k,) and a score table of k + ``extra_rows`` rows; return k. Provided.

    Raises:
        TypeError: draft_ids or ``rows`` not a tensor (a list: wrap it with ``torch.tensor``).
        ValueError: draft_ids is not a non-empty 1-D integer tensor ("draft_ids must be ...");
            ``rows`` is not (k + extra_rows, V) ("<name> must have shape (n, V)"); a draft id
            lies outside the vocabulary ("draft_ids holds token id x, outside the vocabulary
            [0, V)"), V being ``rows.shape[1]``. A negative id would otherwise read row V-1.
            ``rows`` holds NaN or a row of only -inf ("<name> holds NaN", "... is all -inf"):
            an argmax or a sample of such scores is silently meaningless. A table whose name
            ends in ``_probs`` must hold distributions: finite, >= 0, each row summing to 1
            within ``g2c.sampling.model.prob_tolerance`` ("<name> must hold probabilities").
            The table checks are the shared ``check_score_rows`` / ``check_prob_rows``.
    """
    if not isinstance(draft_ids, torch.Tensor):                                    # the type rule: a TypeError
        raise TypeError(f"draft_ids must be a non-empty 1-D tensor of k token ids, got {type(draft_ids).__name__}; "
                        "wrap a list with torch.tensor(ids)")
    if draft_ids.dim() != 1 or draft_ids.numel() == 0:
        raise ValueError(f"draft_ids must be a non-empty 1-D tensor of k token ids, got shape "
                         f"{tuple(draft_ids.shape)}")
    if draft_ids.dtype.is_floating_point or draft_ids.dtype.is_complex or draft_ids.dtype == torch.bool:
        raise ValueError(f"draft_ids must hold integer token ids, got dtype {draft_ids.dtype}")
    k = draft_ids.numel()
    num_rows = k + extra_rows
    if not isinstance(rows, torch.Tensor):
        raise TypeError(f"{name} must be a ({num_rows}, V) tensor for a draft of k={k} tokens, got "
                        f"{type(rows).__name__}")
    if rows.dim() != 2 or rows.shape[0] != num_rows:
        raise ValueError(f"{name} must have shape ({num_rows}, V) for a draft of k={k} tokens, got "
                         f"{tuple(rows.shape)}")
    check_token_ids(draft_ids, rows.shape[1], "draft_ids")
    (check_prob_rows if name.endswith("_probs") else check_score_rows)(rows, name)
    return k


def _meet(draft_ids, rows, name: str, *, generator=None):
    """The provided first step of each verifier: the shared table checks of
    ``g2c.sampling.model`` (``check_score_rows`` for logits, ``check_prob_rows`` for
    probabilities; a table that is not floating point is refused, never converted), the
    generator (``check_generator``: None or a ``torch.Generator``), and a CPU draft moved to
    the table's device, where the loops' rows live."""
    check_generator(generator)
    (check_prob_rows if name.endswith("_probs") else check_score_rows)(rows, name)
    if isinstance(draft_ids, torch.Tensor) and isinstance(rows, torch.Tensor) and draft_ids.device != rows.device:
        draft_ids = draft_ids.to(rows.device)
    return draft_ids


def greedy_verify(draft_ids: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy verification: keep the longest draft prefix that equals the target's argmax.

    Args:
        draft_ids: (k,) int64, the drafted tokens, k >= 1, each in [0, V).
        target_logits: (k+1, V) float32 on the target's device (CPU, CUDA or MPS); a CPU
            ``draft_ids`` is moved there first (provided). Row i (i < k) scores draft
            position i; row k scores the bonus position after the last draft.

    Returns:
        (num_accepted, token): num_accepted in [0, k] is the length of the longest prefix
        with ``draft_ids[i] == argmax(target_logits[i])``; token is the target's argmax at
        row num_accepted, i.e. the correction token at the first mismatch or the bonus
        token when every draft matched.

    Raises:
        TypeError: draft_ids or target_logits not a tensor (``_check_block``).
        ValueError: draft_ids is not a non-empty 1-D integer tensor ("draft_ids"), a draft id
            is outside [0, V) ("draft_ids ... outside the vocabulary [0, V)"), or
            target_logits is not (k+1, V) ("target_logits must have shape (k+1, V)"); all
            raised by ``_check_block``. target_logits holds NaN or a row of only -inf
            ("target_logits holds NaN", "... is all -inf"; provided, before your code runs).

    Devices: compare on the inputs' device; do not move one argument to the CPU and compare
    it with the other (``test_greedy_verify_stays_on_the_inputs_device``). Python ints out.

    Why it is lossless: every emitted token is the target's own argmax given the tokens
    before it, so the output is the target's greedy chain whatever the drafter proposed.

    Steps:
        1. Validate with ``_check_block(draft_ids, target_logits, "target_logits", extra_rows=1)``
           (provided; ``test_greedy_verify_rejects_bad_shapes``).
        2. The target's choice at every row: argmax over V, (k+1,).
        3. Count the matching prefix: stop at the first i where the draft differs
           (``test_greedy_verify_rejects_mid_block``, ``test_greedy_verify_rejects_first_position``).
        4. Return the count and the target's choice at that row
           (``test_greedy_verify_full_match_returns_bonus``).
    """
    draft_ids = _meet(draft_ids, target_logits, "target_logits")            # provided: NaN/-inf rows, one device
    # BEGIN SOLUTION
    k = _check_block(draft_ids, target_logits, "target_logits", extra_rows=1)
    choice = target_logits.argmax(dim=-1)                                   # (k+1,)
    match = (choice[:k] == draft_ids).cpu()                                 # (k,) bool; k is tiny
    num_accepted = int(torch.cumprod(match.long(), dim=0).sum())            # int64 cumprod: on the CPU (MPS)
    return num_accepted, int(choice[num_accepted])
    # END SOLUTION


def speculative_verify(draft_ids: torch.Tensor, target_probs: torch.Tensor, draft_probs: torch.Tensor, *,
                       generator: torch.Generator | None = None) -> tuple[int, int]:
    """Stochastic verification (speculative sampling): the emitted token follows p exactly.

    Leviathan et al. 2023, section 2.3 / Algorithm 1; Chen et al. 2023, Algorithm 2.
    For each draft position i in order, with x = draft_ids[i], p = target_probs[i],
    q = draft_probs[i]:

        accept x with probability min(1, p(x) / q(x));
        at the first rejection, emit a sample from normalize(max(0, p - q)) and stop;
        if all k are accepted, emit a bonus sample from target_probs[k].

    Args:
        draft_ids: (k,) int64, drafted tokens (sampled from draft_probs), each in [0, V).
        target_probs: (k+1, V) float, the target's probabilities after the same warpers
            (temperature, top-k, top-p) as the drafter's.
        draft_probs: (k, V) float, the drafter's probabilities the draft was sampled from.
        generator: ``torch.Generator`` on the CPU for the uniforms and the resampling.

    Devices and dtypes: the three tensors live on one device, any device (CPU, CUDA, MPS).
    The arithmetic runs in float64 on the CPU: move the tables to the CPU FIRST, then
    convert (``.cpu().double()``; MPS has no float64, so ``.double().cpu()`` fails there),
    and draw with the CPU ``generator`` on CPU tensors only
    (``test_speculative_verify_computes_on_the_cpu_in_float64``).

    Returns:
        (num_accepted, token): the accepted prefix length and the correction or bonus token.

    Raises:
        TypeError: a table or the draft not a tensor, as ``greedy_verify``.
        ValueError: bad shapes or draft ids outside [0, V), as ``greedy_verify``
            (``_check_block`` for both tables; draft_probs must be (k, V)); and when
            draft_probs and target_probs have different V, a message containing
            "share one vocabulary" (``test_speculative_verify_rejects_bad_shapes``). A table
            that is not a set of distributions (NaN, inf or negative entries, or a row sum off
            1 by more than ``prob_tolerance``: 1e-3 in float32) raises "<name> must hold
            probabilities"; a table that is not floating point (integer counts, a bool mask)
            raises "<name> must hold probabilities as a floating-point tensor" (provided, before
            your code runs).
        TypeError: generator is not None or a ``torch.Generator`` (a seed; provided).

    Edge cases (our choice, documented):
        * q(x) = 0. The test is written without a division, ``u * q(x) < p(x)`` with
          u ~ U[0, 1): it equals ``u < min(1, p/q)`` when q(x) > 0, accepts when q(x) = 0
          and p(x) > 0 (the limit of p/q), and rejects when p(x) = 0. So a token the target
          cannot produce is never accepted, and no NaN appears.
        * All-zero residual. max(0, p - q) sums to 0 only when p <= q everywhere, i.e.
          p == q, where a rejection has probability 0; it can still happen through
          rounding. We then sample from p itself: the event has (near) zero probability, so
          any choice keeps the output distribution, and p keeps the token a target sample.
        Outside that fallback a rejected x is never resampled: rejection means
        p(x) <= u q(x) < q(x), so the residual is 0 at x.

    Steps:
        1. Validate (``_check_block`` for both tables, and V must agree: raise a ValueError
           saying drafter and target "share one vocabulary").
        2. Draw k uniforms at once with ``generator``; accept position i when
           u_i * q_i(x_i) < p_i(x_i); the accepted count is the length of the all-true
           prefix (``test_speculative_verify_identical_distributions_accept_all``).
        3. Full match: sample the bonus from row k.
        4. Otherwise sample from the positive residual at the rejected row, falling back to
           p when it is all zero (``test_speculative_verify_never_emits_zero_probability_draft``,
           ``test_speculative_verify_matches_target_distribution``).
    """
    _meet(draft_ids, target_probs, "target_probs", generator=generator)     # provided: rows are distributions
    _meet(draft_ids, draft_probs, "draft_probs")
    # BEGIN SOLUTION
    k = _check_block(draft_ids, target_probs, "target_probs", extra_rows=1)
    _check_block(draft_ids, draft_probs, "draft_probs", extra_rows=0)
    if draft_probs.shape[1] != target_probs.shape[1]:
        raise ValueError(f"draft_probs has V={draft_probs.shape[1]} but target_probs has V={target_probs.shape[1]}; "
                         "drafter and target must share one vocabulary")
    p = target_probs.detach().cpu().double()                                # (k+1, V) CPU first, then float64
    q = draft_probs.detach().cpu().double()                                 # (k, V)
    x = draft_ids.long().cpu()                                              # (k,)
    u = torch.rand(k, generator=generator, dtype=torch.float64)             # (k,)
    rows = torch.arange(k)
    accept = u * q[rows, x] < p[rows, x]                                    # (k,)
    num_accepted = int(torch.cumprod(accept.long(), dim=0).sum())
    if num_accepted == k:
        weights = p[k]                                                      # (V,) bonus
    else:
        weights = (p[num_accepted] - q[num_accepted]).clamp(min=0.0)        # (V,) residual
        if not float(weights.sum()) > 0.0:
            weights = p[num_accepted]
    return num_accepted, int(torch.multinomial(weights, 1, generator=generator))
    # END SOLUTION
