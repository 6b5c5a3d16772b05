"""Module 08: multi-head attention.

Source: Vaswani et al., "Attention Is All You Need" (NeurIPS 2017), section 3.2.2. The
fused query/key/value projection matches GPT-2's ``c_attn`` layer.

Shape letters: B batch, T time, D width, H heads, d = D / H head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from g2c.nn import Dropout, Linear, Module
from g2c.nn.module import check_features, check_int, check_real

from .causal import scaled_dot_product_attention

__all__ = ["MultiHeadAttention", "fused_causal_trusted", "merge_heads", "split_heads"]

# torch's scaled_dot_product_attention(..., is_causal=True) on MPS in float16/bfloat16 applied the causal mask once per
# group of four queries in released versions before this one, so three queries in four read future keys with no error
# (pytorch/pytorch#195910, labelled "correctness (silent)"); 2.14.0 gives the masked result (a user's measurement on
# that downstream report, YuE #176). Older torch on MPS gets an explicit mask instead.
MPS_HALF_CAUSAL_FIXED = (2, 14)


def fused_causal_trusted(q: torch.Tensor) -> bool:
    """Whether torch's fused ``is_causal=True`` may be used for queries ``q`` (B, H, T, d). Provided.

    Yes on the CPU and on CUDA, and in float32 anywhere; in float16/bfloat16 on MPS only from torch
    ``MPS_HALF_CAUSAL_FIXED`` on; on any other device (an accelerator the course has not checked, the
    tests' fake one) no: the caller passes an explicit causal mask, the same maths in every case."""
    if q.dtype not in (torch.float16, torch.bfloat16) or q.device.type in ("cpu", "cuda"):
        return True
    return q.device.type == "mps" and torch.__version__ >= MPS_HALF_CAUSAL_FIXED


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, T, D) -> (B, H, T, d): cut the width into H heads of width d = D / H.

    Head h gets the columns ``h*d : (h+1)*d``.

    Raises:
        TypeError: x is not a tensor; ``num_heads`` is not an int (a bool, a float).
        ValueError: x is not 3-D, ``num_heads`` < 1 or D is not divisible by H.

    Steps:
        1. Reshape to (B, T, H, d), then move H before T (``test_split_heads_layout``).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"split_heads: x must be a tensor (B, T, D), got {type(x).__name__}")
    num_heads = check_int(num_heads, "num_heads", where="split_heads")
    if x.dim() != 3 or x.shape[-1] % num_heads:
        raise ValueError(f"split_heads needs (B, T, D) with D divisible by H={num_heads}; got {tuple(x.shape)}")
    # BEGIN SOLUTION
    B, T, D = x.shape
    return x.view(B, T, num_heads, D // num_heads).transpose(1, 2)           # (B, H, T, d)
    # END SOLUTION


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, T, d) -> (B, T, H*d): the inverse of ``split_heads``.

    Raises:
        TypeError: x is not a tensor.
        ValueError: x is not 4-D.

    Steps:
        1. Move H back after T, make the memory contiguous, flatten the last two
           dimensions (``test_merge_heads_inverts_split``).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"merge_heads: x must be a tensor (B, H, T, d), got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"merge_heads: x must be (B, H, T, d), got shape {tuple(x.shape)}")
    # BEGIN SOLUTION
    B, H, T, d = x.shape
    return x.transpose(1, 2).contiguous().view(B, T, H * d)                  # (B, T, D)
    # END SOLUTION


class MultiHeadAttention(Module):
    """Causal multi-head self-attention (GPT-2 layout).

    Args:
        dim: model width D.
        num_heads: H, must divide D.
        causal: mask future positions (default True).
        dropout: dropout on the output projection (residual dropout).
        generator: optional ``torch.Generator`` for the initialisation.

    Attributes:
        qkv: ``Linear(D, 3D)``; output columns are [queries | keys | values].
        proj: ``Linear(D, D)``, the output projection.
        fused: when True, the forward pass calls
            ``torch.nn.functional.scaled_dot_product_attention`` instead of the course
            function (an opt-in speed path, tested equal to the course path). Default False.
            On MPS in float16/bfloat16 with a torch before 2.14 its causal mask is passed
            explicitly (``fused_causal_trusted``: torch's own was wrong there, silently).

    Raises:
        TypeError: ``dim`` or ``num_heads`` not an int (a bool, a float, a tensor), ``dropout`` not a
            real number; the message names the argument.
        ValueError: a size < 1, D not divisible by H, ``dropout`` outside [0, 1) or NaN.
    """

    def __init__(self, dim: int, num_heads: int, *, causal: bool = True, dropout: float = 0.0,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        dim = check_int(dim, "dim", where="MultiHeadAttention")
        num_heads = check_int(num_heads, "num_heads", where="MultiHeadAttention")
        dropout = check_real(dropout, "dropout", low=0.0, high=1.0, high_open=True, where="MultiHeadAttention")
        if dim % num_heads:
            raise ValueError(f"embedding dim {dim} is not divisible by num_heads {num_heads}")
        self.dim, self.num_heads, self.causal = dim, num_heads, causal
        self.fused = False  # True: torch's fused kernel (same maths, faster)
        self.qkv = Linear(dim, 3 * dim, generator=generator)
        self.proj = Linear(dim, dim, generator=generator)
        self.dropout = Dropout(dropout)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention kernel on (B, H, T, d) tensors: course function or torch's fused one.

        The fused path's causal mask is torch's ``is_causal`` where that is trusted
        (``fused_causal_trusted``), else an explicit boolean mask with the same top-left alignment
        (query i reads keys 0..i): older torch on MPS in half precision let three queries in four read
        future keys without an error (pytorch/pytorch#195910)."""
        if self.fused:
            if self.causal and not fused_causal_trusted(q):
                allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()  # (T, S)
                return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return scaled_dot_product_attention(q, k, v, causal=self.causal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend with H heads in parallel: input and output are both (B, T, D) float tensors.

        Steps:
            1. ``qkv`` then split the last dimension into three (B, T, D) tensors.
            2. ``split_heads`` each to (B, H, T, d).
            3. ``self._attend`` (all heads at once), ``merge_heads`` back to (B, T, D).
            4. Output projection, then dropout (``test_mha_matches_torch_reference``).

        Raises (checked before your code runs):
            TypeError: x is not a tensor.
            ValueError: x is not floating point or not (B, T, D) with D = ``dim``.
        """
        check_features(x, self.dim, "x", "MultiHeadAttention")
        if x.dim() != 3:
            raise ValueError(f"MultiHeadAttention: x must be (B, T, {self.dim}), got shape {tuple(x.shape)}")
        # BEGIN SOLUTION
        q, k, v = self.qkv(x).split(self.dim, dim=-1)                       # (B, T, D) each
        q, k, v = (split_heads(t, self.num_heads) for t in (q, k, v))        # (B, H, T, d)
        y = merge_heads(self._attend(q, k, v))                               # (B, T, D)
        return self.dropout(self.proj(y))
        # END SOLUTION
