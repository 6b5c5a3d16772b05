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

Shape letters: k draft length, V vocabulary.
"""

from __future__ import annotations

import torch

__all__ = ["greedy_verify", "speculative_verify"]


def _check_block(draft_ids: torch.Tensor, rows: torch.Tensor, name: str, *, extra_rows: int) -> int:
    """Validate a draft (k,) and a score table of k + ``extra_rows`` rows; return k. Provided."""
    if not isinstance(draft_ids, torch.Tensor) or draft_ids.dim() != 1 or draft_ids.numel() == 0:
        shape = tuple(draft_ids.shape) if isinstance(draft_ids, torch.Tensor) else type(draft_ids).__name__
        raise ValueError(f"draft_ids must be a non-empty 1-D tensor of k token ids, got shape {shape}")
    k = draft_ids.numel()
    num_rows = k + extra_rows
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[0] != num_rows:
        shape = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise ValueError(f"{name} must have shape ({num_rows}, V) for a draft of k={k} tokens, got {shape}")
    return k


def greedy_verify(draft_ids: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Greedy verification: keep the longest draft prefix that equals the target's argmax.

    Args:
        draft_ids: (k,) int64, the drafted tokens, k >= 1.
        target_logits: (k+1, V) float32. Row i (i < k) scores draft position i; row k
            scores the bonus position after the last draft.

    Returns:
        (num_accepted, token): num_accepted in [0, k] is the length of the longest prefix
        with ``draft_ids[i] == argmax(target_logits[i])``; token is the target's argmax at
        row num_accepted, i.e. the correction token at the first mismatch or the bonus
        token when every draft matched.

    Raises:
        ValueError: draft_ids is not a non-empty 1-D tensor, or target_logits is not
            (k+1, V); the message names the bad argument and the expected shape.

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
    # TODO: implement this (module specdec, see docs/beyond/specdec.md).
    raise NotImplementedError(
        "module specdec: greedy_verify in g2c/specdec/verify.py is not implemented yet. "
        "Write it, or run with G2C_APPLY_SOLUTIONS=specdec to use the reference solution."
    )


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
        draft_ids: (k,) int64, drafted tokens (sampled from draft_probs).
        target_probs: (k+1, V) float, the target's probabilities after the same warpers
            (temperature, top-k, top-p) as the drafter's.
        draft_probs: (k, V) float, the drafter's probabilities the draft was sampled from.
        generator: ``torch.Generator`` on the CPU for the uniforms and the resampling.

    Returns:
        (num_accepted, token): the accepted prefix length and the correction or bonus token.

    Raises:
        ValueError: bad shapes (as ``greedy_verify``; draft_probs must be (k, V) with the
            same V as target_probs).

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
        1. Validate (``_check_block`` for both tables, and V must agree).
        2. Draw k uniforms at once with ``generator``; accept position i when
           u_i * q_i(x_i) < p_i(x_i); the accepted count is the length of the all-true
           prefix (``test_speculative_verify_identical_distributions_accept_all``).
        3. Full match: sample the bonus from row k.
        4. Otherwise sample from the positive residual at the rejected row, falling back to
           p when it is all zero (``test_speculative_verify_never_emits_zero_probability_draft``,
           ``test_speculative_verify_matches_target_distribution``).
    """
    # TODO: implement this (module specdec, see docs/beyond/specdec.md).
    raise NotImplementedError(
        "module specdec: speculative_verify in g2c/specdec/verify.py is not implemented yet. "
        "Write it, or run with G2C_APPLY_SOLUTIONS=specdec to use the reference solution."
    )
