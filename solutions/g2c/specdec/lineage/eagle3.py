"""Beyond (specdec-lineage): an EAGLE-3-style drafter: fused layers and training-time test (generation 3).

EAGLE-3 (Li, Wei, Zhang, Zhang, "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test", 2025) changes two things in EAGLE:

1. **Inputs from three depths.** Instead of the final state alone, the drafter reads the target's
   residual stream after a low, a middle and a high block, concatenated (3D) and projected to D
   (section 3.2). The final state is tuned for the NEXT token only; earlier layers still carry
   what later tokens need.
2. **Tokens, not features.** The drafter's output a_t is no longer trained to equal the target's
   next state (EAGLE-1's regression loss is dropped); it is trained only to predict tokens. Its
   own output then stands in for the target's fused features on the next draft step.
3. **Training-time test (TTT).** At inference, draft step 2 reads the drafter's step-1 output,
   not a target state. So training unrolls the drafter on its own outputs for S steps, with an
   attention mask that shows each step exactly what it would see at inference
   (``ttt_attention_mask``), and adds the losses of every step.

The layer choice in the reference implementations (vLLM's EAGLE-3 support reads the residual
stream entering layers 2, L // 2 and L - 3, i.e. the outputs of blocks 1, L // 2 - 1 and L - 4)
collides on shallow models: (1, 2, 2) for 6 blocks, (1, 1, 0) for 4. ``fusion_layers`` spreads the
three by quarters instead, distinct for every L >= 3, and ``check_fusion_layers`` refuses a repeat
rather than silently fusing one layer twice.

Shape letters: B batch, T time, N positions per step, S unrolled steps, D width, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from g2c.kvcache.fast import head_unembed
from g2c.kvcache.forward import unembed
from g2c.nn import LayerNorm, Linear
from g2c.sampling.model import check_count, check_whole
from g2c.transformer import Block

from .eagle2 import FeatureTreeDrafter
from .protocol import HeadOnBase, masked_block_past

__all__ = ["Eagle3Drafter", "Eagle3Head", "check_fusion_layers", "eagle3_loss", "fusion_layers",
           "ttt_attention_mask"]


def fusion_layers(num_layers: int) -> tuple[int, int, int]:
    """A low, a middle and a high block for EAGLE-3's fused features: distinct for every L >= 3.

    The rule: the blocks at a quarter, half and three quarters of the depth, rounded down:
    (L // 4, L // 2, 3 L // 4), 0-based block indices whose outputs are fused. For the ladder:
    4 blocks (StoryLM-1M) -> (1, 2, 3); 6 (StoryLM-5M) -> (1, 3, 4); 9 (StoryLM-30M) -> (2, 4, 6).

    Args:
        num_layers: the target's number of blocks L.

    Returns:
        three strictly increasing block indices in [0, L).

    Raises:
        TypeError: L is not an int (a float such as 9.0, a bool, a string; provided, before your
            code runs: ``test_fusion_layers_refuses_a_non_int``).
        ValueError: L < 3 (message: "needs at least 3 blocks"): fewer blocks have no three
            distinct depths, and fusing one twice would hide that.

    Steps:
        1. Refuse L < 3 (``test_fusion_layers_refuses_shallow_models``).
        2. Return the three quarters (``test_fusion_layers_ladder``,
           ``test_fusion_layers_distinct_for_every_depth``).
    """
    num_layers = check_count(num_layers, "fusion_layers: num_layers", minimum=None)   # provided: ints only
    # BEGIN SOLUTION
    if num_layers < 3:
        raise ValueError(f"fusion_layers: EAGLE-3 fuses a low, a middle and a high block and needs at least "
                         f"3 blocks, got num_layers={num_layers!r}")
    return num_layers // 4, num_layers // 2, (3 * num_layers) // 4
    # END SOLUTION


def check_fusion_layers(layers, num_layers: int) -> tuple[int, ...]:
    """Validate explicit fusion layers. Provided.

    ``layers`` may be any iterable (a generator too): it is read once, then checked.

    Raises:
        TypeError: not an iterable of ints ("block indices (ints)": a float, a bool); num_layers not an int.
        ValueError: not exactly 3, a repeat ("duplicate"), or an index outside [0, num_layers); num_layers < 1.
    """
    num_layers = check_whole(num_layers, f"check_fusion_layers: num_layers must be an int >= 1, got {num_layers!r}")
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Iterable):
        raise TypeError(f"EAGLE-3 fusion layers must be 3 block indices (ints), got {type(layers).__name__}")
    layers = tuple(layers)                                              # read once, then check
    if any(isinstance(i, bool) or not isinstance(i, int) for i in layers):
        raise TypeError(f"EAGLE-3 fusion layers must be block indices (ints), got {layers}")
    if len(layers) != 3:
        raise ValueError(f"EAGLE-3 fuses exactly 3 layers (low, middle, high), got {layers}")
    if len(set(layers)) != 3:
        raise ValueError(f"EAGLE-3 fusion layers {layers} contain a duplicate; choose 3 distinct blocks "
                         f"(e.g. fusion_layers({num_layers}): L // 4, L // 2, 3L // 4)")
    if not all(0 <= i < num_layers for i in layers):
        raise ValueError(f"EAGLE-3 fusion layers {layers} must lie in [0, {num_layers})")
    return tuple(sorted(layers))


def ttt_attention_mask(num_positions: int, steps: int) -> torch.Tensor:
    """The training-time-test mask: what unrolled step s at position t may read (EAGLE-3 section 3.3).

    Rows and columns are (step, position) pairs in step-major order: index (s - 1) * N + t for
    step s in 1..S and position t in 0..N-1. Step 1 is the drafter on the target's true features
    (ordinary causal attention). Row (s, t) for s >= 2 stands for the (s - 1)-th speculative
    draft row after a context that ends at position t, so it may read exactly what that row
    reads at inference:

        * the step-1 rows (1, t') with t' <= t: the committed context;
        * its own chain (s', t) for 2 <= s' <= s: the earlier drafts of the same round, and itself.

    Args:
        num_positions: N >= 1.
        steps: S >= 1.

    Returns:
        (S*N, S*N) bool on the CPU, True = may attend.

    Raises:
        ValueError: N < 1 or S < 1.

    Example, N = 2, S = 2 (rows/cols (1,0), (1,1), (2,0), (2,1)):

        [[1, 0, 0, 0],
         [1, 1, 0, 0],
         [1, 0, 1, 0],
         [1, 1, 0, 1]]

    Steps:
        1. Validate (provided).
        2. The step-1 columns: causal (t' <= t) in every row block (``test_ttt_mask_by_hand``).
        3. For row block s >= 2: an identity (diagonal) in each column block s' with 2 <= s' <= s
           (``test_ttt_mask_steps``).
    """
    for name, value in (("num_positions", num_positions), ("steps", steps)):
        check_whole(value, f"ttt_attention_mask: {name} must be an int >= 1, got {value!r}")
    # BEGIN SOLUTION
    n = num_positions
    mask = torch.zeros(steps * n, steps * n, dtype=torch.bool)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    eye = torch.eye(n, dtype=torch.bool)
    for s in range(steps):
        mask[s * n:(s + 1) * n, :n] = causal
        for s2 in range(1, s + 1):
            mask[s * n:(s + 1) * n, s2 * n:(s2 + 1) * n] = eye
    return mask
    # END SOLUTION


class Eagle3Head(HeadOnBase):
    """The EAGLE-3-style draft head on a frozen base ``TransformerLM``. Provided.

    Per position t with target states at the fusion layers (l1, l2, l3):

        g_t = fc([x^{l1}_t ; x^{l2}_t ; x^{l3}_t])          Linear(3D, D)    fused target features
        a_t = Block(fuse([g_t ; LN(E[token_{t+1}])]))        Linear(2D, D), one causal block
        logits_t = unembed(LN_out(a_t))                      scores token t + 2

    On later draft steps a_t replaces g_t as the feature input (``FeatureTreeDrafter``).

    Args:
        base: the frozen target (kept in a dict; only the head's layers train).
        layers: the fusion layers (default ``fusion_layers(base.num_layers)``), validated by
            ``check_fusion_layers``.
        generator: for the initialisation.

    Raises:
        ValueError: from ``fusion_layers`` / ``check_fusion_layers``.
    """

    def __init__(self, base, layers=None, *, generator: torch.Generator | None = None) -> None:
        super().__init__(base, generator=generator)
        num_layers = len(base.blocks)
        self.layers = fusion_layers(num_layers) if layers is None else check_fusion_layers(layers, num_layers)
        dim = base.embedding_dim
        self.fc = Linear(3 * dim, dim, generator=generator)
        self.ln_embed = LayerNorm(dim)
        self.fuse = Linear(2 * dim, dim, generator=generator)
        self.block = Block(dim, base.num_heads, hidden_dim=base.hidden_dim, causal=True, generator=generator)
        self.ln_out = LayerNorm(dim)
        self.to(base.token_embed.weight.device, base.token_embed.weight.dtype)   # the base's device and dtype

    @classmethod
    def from_config(cls, base, config: dict) -> "Eagle3Head":
        return cls(base, config["fusion_layers"], generator=torch.Generator().manual_seed(0))

    def config(self) -> dict:
        return {"fusion_layers": list(self.layers)}

    def true_features(self, states: torch.Tensor) -> torch.Tensor:
        """(..., 4, D) states (the three fusion layers, then the final) -> (..., D) fused g."""
        return self.fc(states[..., :3, :].flatten(-2))

    def embed_next(self, features: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """fuse([features ; LN(E[next])]): (B, T, D), (B, T) -> (B, T, D)."""
        table = self.base.token_embed.weight.detach()
        emb = self.ln_embed(table[next_ids.to(table.device)])
        return self.fuse(torch.cat([features, emb], dim=-1))

    def logits(self, outputs: torch.Tensor) -> torch.Tensor:
        """(..., D) block outputs -> (..., V)."""
        return head_unembed(self, self.ln_out(outputs))


def eagle3_loss(head: Eagle3Head, states: torch.Tensor, ids: torch.Tensor, *, steps: int = 3,
                decay: float = 0.8) -> dict[str, torch.Tensor]:
    """EAGLE-3's loss with training-time test, on the frozen target's states. Provided.

    Step s (1..S) at position t reads the true tokens up to t + s and, as features, the target's
    fused g_t (s = 1) or the drafter's own step s - 1 output (s >= 2); it is trained towards the
    target's distribution for token t + s + 1 (its unembedded final state at t + s). All steps run
    through the block under ``ttt_attention_mask`` (each step's rows read the earlier steps' keys and
    values, ``masked_block_past``); step s weighs decay**(s-1).

    Args:
        head: the ``Eagle3Head``.
        states: (B, T, 4, D) float32: the fusion layers' outputs and the final state per token.
        ids: (B, T) int64 tokens, T > steps + 1.
        steps: S >= 1 unrolled steps.

    Returns:
        dict of scalars: ``loss``, ``ce_s`` and ``agree_s`` (argmax agreement with the target) per step.

    Raises:
        ValueError: shapes disagree, or T <= S + 1.
    """
    if ids.dim() != 2 or states.dim() != 4 or tuple(states.shape[:2]) != tuple(ids.shape) \
            or states.shape[2] != 4 or ids.shape[1] <= steps + 1:
        raise ValueError(f"eagle3_loss needs ids (B, T) with T > steps + 1 = {steps + 1} and states (B, T, 4, D); "
                         f"got ids {tuple(ids.shape)} and states {tuple(states.shape)}")
    T = ids.shape[1]
    n = T - steps
    mask = ttt_attention_mask(n, steps).to(states.device)
    feats = head.true_features(states[:, :n])                                          # (B, N, D)
    past, out, total, weights = None, {}, 0.0, 0.0
    for s in range(1, steps + 1):
        x = head.embed_next(feats, ids[:, s:s + n])                                      # token t+s
        a, past = masked_block_past(head.block, x, mask[(s - 1) * n:s * n, :s * n], past)   # step s's outputs
        logq = torch.log_softmax(head.logits(a).float(), dim=-1)
        with torch.no_grad():
            teacher = unembed(head.base, states[:, s:s + n, -1]).float()                 # token t+s+1
        ce = -(torch.softmax(teacher, -1) * logq).sum(-1).mean()
        total = total + decay ** (s - 1) * ce
        weights += decay ** (s - 1)
        out[f"ce_{s}"] = ce.detach()
        out[f"agree_{s}"] = (logq.argmax(-1) == teacher.argmax(-1)).float().mean()
        feats = a
    out["loss"] = total / weights
    return out


class Eagle3Drafter(FeatureTreeDrafter):
    """An ``Eagle3Head`` behind ``lineage_generate``: chain (width 1) or EAGLE-2 dynamic tree. Provided.

    Reads ``head.layers`` of the target (``target_layers``) besides the final state. ``draft_mode``:
    ``"top"`` or ``"sample"`` (see ``FeatureTreeDrafter``).

    Raises:
        TypeError: head is not an ``Eagle3Head``.
    """

    def __init__(self, head: Eagle3Head, *, width: int = 1, draft_mode: str = "top") -> None:
        if not isinstance(head, Eagle3Head):
            raise TypeError(f"Eagle3Drafter needs an Eagle3Head (load_model('StoryLM-30M-EAGLE3')), "
                            f"got {type(head).__name__}")
        super().__init__(head, width=width, target_layers=head.layers, draft_mode=draft_mode)
