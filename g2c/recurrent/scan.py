"""Beyond (specdec-state): the gated linear-attention recurrence, in two equal forms.

One head keeps a state S (d, d). Token t brings a query q_t, a key k_t, a value v_t (each
(d,)) and a decay a_t in (0, 1):

    S_t = a_t * S_(t-1) + k_t^T v_t          (the state update: outer product, d x d)
    o_t = q_t S_t                            (the readout, (d,))

The **recurrent form** (``gla_recurrent``) applies this one token at a time: what plain
decoding does, one state update per emitted token. The **chunked form** (``gla_chunk``)
computes a whole block of T positions at once from the state S_0 before the block. With
L_t = sum_(r<=t) log a_r (a cumulative sum inside the block),

    o_t = exp(L_t) q_t S_0 + sum_(s<=t) exp(L_t - L_s) (q_t . k_s) v_s
    S_T = exp(L_T) S_0 + sum_s exp(L_T - L_s) k_s^T v_s

which is causal linear attention with a decay mask: the form that scores a verification
block of k+1 positions in one pass. The two forms agree to float32 rounding (tested).

Sources: Katharopoulos et al., "Transformers are RNNs" (ICML 2020), section 3.4 (the
recurrent view of causal linear attention); Sun et al., "Retentive Network" (2023),
section 2.1 (decay, parallel and chunkwise forms); Yang et al., "Gated Linear Attention
Transformers with Hardware-Efficient Training" (ICML 2024), sections 2-4 (data-dependent
gates, chunkwise form); Dao and Gu, "Transformers are SSMs" (Mamba-2, ICML 2024), section 6
(the scalar-decay state space dual used here: one decay per head and token).

Shape letters: B batch, H heads, T time (block length), d head width. The state of one
layer is (B, H, d, d) float32. No exercise in this file.
"""

from __future__ import annotations

import torch

from g2c.sampling.model import check_count

__all__ = ["gla_chunk", "gla_fold", "gla_recurrent", "readout_flops", "update_flops"]


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_a: torch.Tensor, state: torch.Tensor) -> None:
    if k.dim() != 4 or v.shape != k.shape or q.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"gated linear attention expects q (B, H, Tq, d), k and v (B, H, T, d); got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[2] > k.shape[2]:
        raise ValueError(f"q has Tq={q.shape[2]} positions but k only T={k.shape[2]}; queries sit at the last "
                         "Tq of the T key positions, so Tq <= T")
    if log_a.shape != k.shape[:3]:
        raise ValueError(f"log_a must be (B, H, T) = {tuple(k.shape[:3])}, got {tuple(log_a.shape)}")
    B, H, _, d = k.shape
    if state.shape != (B, H, d, d):
        raise ValueError(f"state must be (B, H, d, d) = {(B, H, d, d)}, got {tuple(state.shape)}")


def gla_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_a: torch.Tensor,
                  state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrent form: one state update per position.

    Args:
        q, k, v: (B, H, T, d) float32.
        log_a: (B, H, T) float32, log of the decays (<= 0).
        state: (B, H, d, d) float32, the state before position 0 (not modified).

    Returns:
        (o, state_T): outputs (B, H, T, d) and the state after the last position (B, H, d, d).

    Raises:
        ValueError: shapes disagree (the message gives the expected shapes).
    """
    _check(q, k, v, log_a, state)
    if q.shape[2] != k.shape[2]:
        raise ValueError("gla_recurrent needs one query per position (Tq == T)")
    S = state
    outs = []
    for t in range(k.shape[2]):
        a = log_a[:, :, t].exp()[..., None, None]                            # (B, H, 1, 1)
        S = a * S + k[:, :, t, :, None] * v[:, :, t, None, :]                # (B, H, d, d)
        outs.append((q[:, :, t, None, :] @ S).squeeze(2))                    # (B, H, d)
    return torch.stack(outs, dim=2), S                                       # (B, H, T, d)


def gla_fold(state: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_a: torch.Tensor) -> torch.Tensor:
    """Fold T positions of recurrence inputs into a state, without any readout.

    This is the replay step of checkpoint + input replay: S_T from S_0 and the buffered
    (k, v, log a). T = 0 returns ``state`` itself.

    Args:
        state: (B, H, d, d) float32, S_0 (not modified).
        k, v: (B, H, T, d) float32.
        log_a: (B, H, T) float32.

    Returns:
        (B, H, d, d) float32, S_T.
    """
    _check(k[:, :, :0], k, v, log_a, state)
    if k.shape[2] == 0:
        return state
    L = log_a.cumsum(dim=-1)                                                 # (B, H, T)
    w = (L[..., -1:] - L).exp()                                              # (B, H, T) decay to the end
    return state * L[..., -1].exp()[..., None, None] + (k * w[..., None]).transpose(-1, -2) @ v


def gla_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_a: torch.Tensor, state: torch.Tensor, *,
              return_state: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked (parallel) form over a block, from the state before it.

    The queries may cover only the last Tq of the T positions: checkpoint + input replay
    asks for the outputs of the new block while the keys and values span the whole buffer.

    Args:
        q: (B, H, Tq, d) float32, queries of positions T-Tq .. T-1.
        k, v: (B, H, T, d) float32.
        log_a: (B, H, T) float32.
        state: (B, H, d, d) float32, the state before position 0 (not modified).
        return_state: also compute S_T (False: output-only verification, no state written).

    Returns:
        (o, state_T): o (B, H, Tq, d); state_T (B, H, d, d), or None when ``return_state``
        is False.

    Raises:
        ValueError: shapes disagree, or Tq > T.
    """
    _check(q, k, v, log_a, state)
    T, Tq = k.shape[2], q.shape[2]
    L = log_a.cumsum(dim=-1)                                                 # (B, H, T)
    Lq = L[..., T - Tq:]                                                     # (B, H, Tq)
    o = (q @ state) * Lq.exp()[..., None]                                    # (B, H, Tq, d) from S_0
    pos_k = torch.arange(T, device=k.device)
    pos_q = pos_k[T - Tq:]
    causal = pos_k[None, :] <= pos_q[:, None]                                # (Tq, T)
    diff = Lq[..., :, None] - L[..., None, :]                                # (B, H, Tq, T)
    decay = torch.where(causal, diff, torch.full_like(diff, float("-inf"))).exp()
    o = o + ((q @ k.transpose(-1, -2)) * decay) @ v                          # (B, H, Tq, d)
    return o, (gla_fold(state, k, v, log_a) if return_state else None)


def update_flops(num_heads: int, head_dim: int, num_positions: int) -> int:
    """Floating-point operations of ``num_positions`` state updates of one layer.

    Per head and position: scale S by a (d^2 multiplies), form k^T v (d^2 multiplies), add
    (d^2 adds): 3 d^2. The chunked form does the same work up to a constant.

    Raises:
        TypeError / ValueError: a count that is not an int >= 0 (``check_count``).
    """
    num_heads, head_dim, num_positions = (check_count(v, f"update_flops: {n}") for n, v in
                                          (("num_heads", num_heads), ("head_dim", head_dim),
                                           ("num_positions", num_positions)))
    return 3 * num_heads * head_dim * head_dim * num_positions


def readout_flops(num_heads: int, head_dim: int, num_queries: int, num_keys: int) -> int:
    """Floating-point operations of a chunked readout of one layer.

    Per head: q S_0 for every query (2 d^2 each) plus, for each causal (query, key) pair,
    q . k and the weighted value (4 d). The queries sit at the last ``num_queries`` of
    ``num_keys`` positions.

    Raises:
        TypeError / ValueError: a count that is not an int >= 0 (``check_count``); more queries than keys.
    """
    num_heads, head_dim, num_queries, num_keys = (check_count(v, f"readout_flops: {n}") for n, v in
                                                  (("num_heads", num_heads), ("head_dim", head_dim),
                                                   ("num_queries", num_queries), ("num_keys", num_keys)))
    if num_queries > num_keys:
        raise ValueError(f"readout_flops: the {num_queries} queries sit at the last positions of the {num_keys} "
                         "keys; num_queries must be <= num_keys")
    first = num_keys - num_queries
    pairs = sum(first + i + 1 for i in range(num_queries))
    return num_heads * (2 * head_dim * head_dim * num_queries + 4 * head_dim * pairs)
