"""Beyond (specdec-lineage): a block drafter in the spirit of DFlash: the whole draft in one pass.

Every drafter so far is autoregressive: k draft tokens cost k drafter steps, so its cost per
round c grows linearly with k, and the speed-up law tau / (1 + c) caps how long a draft can pay.
DFlash (Chen, Liang, Liu, "DFlash: Block Diffusion for Flash Speculative Decoding", arXiv:2602.06036,
2026) drafts a whole block in ONE forward: the input is the anchor (the last committed token) followed by B mask
slots, the drafter is conditioned on the target's fused hidden features of the context, and
slot j predicts the token j positions after the anchor, all at once. The drafter's for-loop is
gone; c is nearly flat in B.

This course version keeps the idea and the training recipe in a small form, with two ways for the
target's features to enter (``BlockHead(injection=...)``):

- ``"rows"`` (the shipped StoryLM-30M-Block): the fused features are W extra rows in front of the
  block; they travel through the draft blocks with it, and every slot attends to their outputs.
- ``"kv"`` (DFlash's design, its section 3): the fused features are projected by EVERY draft
  layer's own key and value maps and put in front of that layer's keys and values; only the anchor
  and the slots are rows (queries). Each layer then reads the target's features themselves, not
  what the earlier draft layers made of them.

    ctx    = fc(fused target features of the last W committed positions)     W context rows
    rows   = ctx + [LN(E[anchor])] + [m] * B            ("rows": anchor + B mask slots after ctx)
           = [LN(E[anchor])] + [m] * B                  ("kv": ctx enters each layer's keys/values)
    x      = rows + learned positions; two blocks; slot j attends to every context row, the
             anchor and the slots before it (causal inside the block, so a shorter block gives
             the same first tokens)
    logits = unembed(LN_out(x_slot_j))  ->  the token j after the anchor

Training, as DFlash describes it: anchors drawn at random positions of each window (any committed
token can be an anchor at inference), labels the target's own distributions, and the loss of
slot j weighted by exp(-(j - 1) / gamma) (``block_loss_weights``): a slot's draft only counts if
every earlier one was accepted, so the first slots matter most.

Shape letters: N anchors (batch), W context rows, B block size, D width, V vocabulary.
"""

from __future__ import annotations

import torch

from g2c.attention.multihead import split_heads
from g2c.kvcache.fast import head_unembed
from g2c.kvcache.forward import unembed
from g2c.nn import LayerNorm, Linear
from g2c.sampling.model import check_real, check_whole
from g2c.transformer import Block

from ..trees import DraftTree, warp_probs
from .eagle3 import check_fusion_layers, fusion_layers
from .protocol import HeadOnBase, TreeDrafter, chain_tree, check_draft_mode, masked_block, masked_block_past

__all__ = ["BlockDrafter", "BlockHead", "block_loss", "block_loss_weights"]


def block_loss_weights(block_size: int, gamma: float) -> torch.Tensor:
    """The weight of each slot's loss: w_j proportional to exp(-(j - 1) / gamma), summing to 1.

    Args:
        block_size: B >= 1 slots, j = 1..B.
        gamma: the decay length (> 0, finite; DFlash's gamma). Large gamma -> nearly uniform.

    Returns:
        (B,) float32 on the CPU, positive, non-increasing, summing to 1.

    Raises:
        TypeError: B not an int, or gamma not a real number (a string, None, a tensor of several
            values); a 0-d real tensor is a real number, as everywhere in the course.
        ValueError: B < 1, or gamma not finite and > 0 (message names "gamma").

    Example: B = 3, gamma = 1: proportional to [1, e^-1, e^-2] = [0.665, 0.245, 0.090].

    Steps:
        1. Validate (provided).
        2. The unnormalised weights for j = 1..B, then divide by their sum
           (``test_block_loss_weights_by_hand``, ``test_block_loss_weights_sum_to_one``).
    """
    block_size = check_whole(block_size, f"block_loss_weights: block_size must be an int >= 1, got {block_size!r}")
    gamma = check_real(gamma, "block_loss_weights: gamma", low=0, low_open=True)   # 0-d tensors pass, as reals do
    # BEGIN SOLUTION
    j = torch.arange(block_size, dtype=torch.float32)
    w = torch.exp(-j / float(gamma))
    return w / w.sum()
    # END SOLUTION


class BlockHead(HeadOnBase):
    """The block drafter's network on a frozen base ``TransformerLM``. Provided.

    Args:
        base: the frozen target (kept in a dict; only the head trains).
        layers: fused target layers (default ``fusion_layers(L)``, as EAGLE-3).
        block_size: the most slots B it is trained for (learned positions for W + 1 + B rows).
        context_rows: W, committed positions whose features it reads.
        num_blocks: transformer blocks.
        injection: how the target's fused features enter: ``"rows"`` (context rows in front of the
            block, the shipped head) or ``"kv"`` (each draft layer's own key/value projections of
            them, in front of its keys and values: DFlash, Chen, Liang, Liu 2026, section 3).
        generator: for the initialisation.

    Raises:
        ValueError: a size not an int >= 1; ``injection`` not "rows" or "kv".
    """

    INJECTIONS = ("rows", "kv")

    def __init__(self, base, layers=None, *, block_size: int = 8, context_rows: int = 8, num_blocks: int = 2,
                 injection: str = "rows", generator: torch.Generator | None = None) -> None:
        super().__init__(base, generator=generator)
        if not isinstance(injection, str) or injection not in self.INJECTIONS:           # a wrong type: TypeError
            raise (ValueError if isinstance(injection, str) else TypeError)(
                f"BlockHead: injection must be 'rows' (context rows) or 'kv' (DFlash's key/value injection into every "
                f"draft layer), got {injection!r}")
        self.injection = injection
        for name, value in (("block_size", block_size), ("context_rows", context_rows), ("num_blocks", num_blocks)):
            check_whole(value, f"BlockHead: {name} must be an int >= 1, got {value!r}")
        num_layers = len(base.blocks)
        self.layers = fusion_layers(num_layers) if layers is None else check_fusion_layers(layers, num_layers)
        self.block_size, self.context_rows = block_size, context_rows
        dim = base.embedding_dim
        g = generator
        self.fc = Linear(3 * dim, dim, generator=g)
        self.ln_embed = LayerNorm(dim)
        self.mask_embed = (torch.randn(dim, generator=g) * 0.02).requires_grad_(True)
        self.pos_embed = (torch.randn(context_rows + 1 + block_size, dim, generator=g) * 0.02).requires_grad_(True)
        self.blocks = [Block(dim, base.num_heads, hidden_dim=base.hidden_dim, causal=False, generator=g)
                       for _ in range(num_blocks)]
        self.ln_out = LayerNorm(dim)
        self.to(base.token_embed.weight.device, base.token_embed.weight.dtype)   # the base's device and dtype

    @classmethod
    def from_config(cls, base, config: dict) -> "BlockHead":
        return cls(base, config["fusion_layers"], block_size=config["block_size"],
                   context_rows=config["context_rows"], num_blocks=config["num_blocks"],
                   injection=config.get("injection", "rows"), generator=torch.Generator().manual_seed(0))

    def config(self) -> dict:
        cfg = {"fusion_layers": list(self.layers), "block_size": self.block_size,
               "context_rows": self.context_rows, "num_blocks": len(self.blocks)}
        if self.injection != "rows":          # the shipped artifacts' config.json has no such key
            cfg["injection"] = self.injection
        return cfg

    def forward(self, context_states: torch.Tensor, anchor_ids: torch.Tensor, block_size: int | None = None
                ) -> torch.Tensor:
        """Logits of B slots after each anchor, in one pass.

        Args:
            context_states: (N, w, 4, D) float: the fusion layers' outputs and the final state of
                the w <= W committed positions before the anchor (fewer than W at a short
                prompt's start: the missing rows are masked out).
            anchor_ids: (N,) int64, the last committed token.
            block_size: B in [1, self.block_size] (default all of them).

        Returns:
            (N, B, V) float: slot j (0-based) scores the token j + 1 after the anchor.

        Raises:
            ValueError: shapes disagree (D must be the base's width); B not an int in
                [1, self.block_size]; anchor ids not integers in [0, V).
        """
        B = self.block_size if block_size is None else block_size
        B = check_whole(B, f"BlockHead: block_size must be an int in [1, {self.block_size}], got {B!r}",
                        high=self.block_size)
        dim = self.base.embedding_dim
        if context_states.dim() != 4 or context_states.shape[2] != 4 or context_states.shape[3] != dim \
                or anchor_ids.shape != context_states.shape[:1]:
            raise ValueError(f"BlockHead expects context_states (N, w, 4, D = {dim}) and anchor_ids (N,), got "
                             f"{tuple(context_states.shape)} and {tuple(anchor_ids.shape)}")
        if anchor_ids.dtype.is_floating_point or anchor_ids.dtype == torch.bool or (anchor_ids.numel() and (
                int(anchor_ids.min()) < 0 or int(anchor_ids.max()) >= self.base.vocab_size)):
            raise ValueError(f"BlockHead: anchor_ids must be integer token ids in [0, {self.base.vocab_size}), got "
                             f"{anchor_ids.dtype} {anchor_ids.tolist() if anchor_ids.numel() <= 8 else '...'}")
        W = self.context_rows
        rows = context_states[:, -W:]
        n, w = rows.shape[:2]
        dev = self.pos_embed.device
        ctx = self.fc(rows[:, :, :3].flatten(-2).to(dev))                                   # (N, w, D)
        if w < W:
            ctx = torch.cat([ctx.new_zeros(n, W - w, ctx.shape[-1]), ctx], dim=1)
        table = self.base.token_embed.weight.detach()
        anchor = self.ln_embed(table[anchor_ids.to(table.device)]).unsqueeze(1)              # (N, 1, D)
        slots = self.mask_embed.expand(n, B, -1)
        size = W + 1 + B
        valid = torch.zeros(size, dtype=torch.bool, device=dev)
        valid[W - w:] = True
        allowed = torch.ones(size, size, dtype=torch.bool, device=dev).tril() & valid   # causal over valid rows
        allowed |= torch.eye(size, dtype=torch.bool, device=dev)                          # a padded row sees itself
        if self.injection == "kv":            # DFlash: the features enter every layer's keys and values
            ctx = ctx + self.pos_embed[:W]
            x = torch.cat([anchor, slots], dim=1) + self.pos_embed[W:size]                 # (N, 1 + B, D)
            for blk in self.blocks:
                attn = blk.attn
                _, k, v = (split_heads(t, attn.num_heads) for t in attn.qkv(blk.ln_1(ctx)).split(attn.dim, dim=-1))
                x = masked_block_past(blk, x, allowed[W:], past=(k, v))[0]                # (N, 1 + B, D)
            return head_unembed(self, self.ln_out(x[:, 1:]))
        x = torch.cat([ctx, anchor, slots], dim=1) + self.pos_embed[:size]
        for blk in self.blocks:
            x = masked_block(blk, x, allowed)
        return head_unembed(self, self.ln_out(x[:, W + 1:]))


def block_loss(head: BlockHead, states: torch.Tensor, ids: torch.Tensor, *, anchors_per_window: int = 16,
               gamma: float = 4.0, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    """The block drafter's loss with random anchors (DFlash's training recipe). Provided.

    For each window, ``anchors_per_window`` anchors a are drawn uniformly with W <= a <= T - B; the
    head reads the states of positions a - W .. a - 1 and token a; slot j is trained towards the
    target's distribution of token a + j (its unembedded final state at a + j - 1), weighted by
    ``block_loss_weights(B, gamma)``.

    Args:
        head: the ``BlockHead``.
        states: (Bw, T, 4, D) float32 states of each window; ids: (Bw, T) int64, T >= W + B.
        anchors_per_window: >= 1.
        gamma: the weights' decay length.
        generator: CPU ``torch.Generator`` for the anchors.

    Returns:
        dict of scalars: ``loss``, ``agree_j`` (j = 1..B) per-slot argmax agreement with the target.

    Raises:
        ValueError: shapes disagree or T < W + B.
    """
    W, B = head.context_rows, head.block_size
    if ids.dim() != 2 or states.dim() != 4 or tuple(states.shape[:2]) != tuple(ids.shape) or ids.shape[1] < W + B:
        raise ValueError(f"block_loss needs ids (Bw, T) with T >= W + B = {W + B} and states (Bw, T, 4, D); got ids "
                         f"{tuple(ids.shape)} and states {tuple(states.shape)}")
    windows, T = ids.shape
    a = torch.randint(W, T - B + 1, (windows, anchors_per_window), generator=generator)           # (Bw, A)
    w_idx = torch.arange(windows).view(-1, 1).expand_as(a).reshape(-1)
    a = a.reshape(-1)
    ctx_pos = a.view(-1, 1) + torch.arange(-W, 0).view(1, -1)                                     # (N, W)
    lab_pos = a.view(-1, 1) + torch.arange(0, B).view(1, -1)                                      # (N, B): state a+j-1
    dev = states.device
    context = states[w_idx.view(-1, 1).to(dev), ctx_pos.to(dev)]                                  # (N, W, 4, D)
    logits = head(context, ids[w_idx.to(ids.device), a.to(ids.device)], B)                        # (N, B, V)
    with torch.no_grad():
        teacher = unembed(head.base, states[w_idx.view(-1, 1).to(dev), lab_pos.to(dev), -1]).float()   # (N, B, V)
    logq = torch.log_softmax(logits.float(), dim=-1)
    ce = -(torch.softmax(teacher, -1) * logq).sum(-1).mean(0)                                    # (B,)
    weights = block_loss_weights(B, gamma).to(ce.device)
    out = {"loss": (weights * ce).sum()}
    agree = (logq.argmax(-1) == teacher.argmax(-1)).float().mean(0)
    for j in range(B):
        out[f"agree_{j + 1}"] = agree[j]
    return out


class BlockDrafter(TreeDrafter):
    """A ``BlockHead`` behind ``lineage_generate``: one drafter pass proposes a chain of up to B. Provided.

    Keeps the last W committed positions' states; each round feeds them and the anchor (the last
    committed token) with ``min(block_size, max_nodes, max_depth)`` slots, and drafts each slot's
    argmax.

    Args:
        head: a trained ``BlockHead`` (``load_model("StoryLM-30M-Block")``).
        block_size: slots per round (default: all the head was trained for).
        draft_mode: ``"top"`` (default: each slot's argmax) or ``"sample"``: at the loop's T > 0 each
            slot's token is drawn from its softmax(logits / T), the chain carrying those rows (a
            slot's q does not depend on the earlier slots' drafts, so the rows are exact).

    Raises:
        TypeError: head is not a ``BlockHead``. ValueError: block_size outside [1, head.block_size];
            draft_mode not "top" or "sample".
    """

    def __init__(self, head: BlockHead, *, block_size: int | None = None, draft_mode: str = "top") -> None:
        self.draft_mode = check_draft_mode(draft_mode, "BlockDrafter")
        if not isinstance(head, BlockHead):
            raise TypeError(f"BlockDrafter needs a BlockHead (load_model('StoryLM-30M-Block')), got "
                            f"{type(head).__name__}")
        B = head.block_size if block_size is None else block_size
        B = check_whole(B, f"BlockDrafter: block_size must be an int in [1, {head.block_size}], got {block_size!r}",
                        high=head.block_size)
        self.head, self.base, self.vocab_size = head, head.base, head.base.vocab_size
        self.block_size = B
        self.target_layers = head.layers
        self._rows = None

    def __repr__(self) -> str:
        return f"BlockDrafter(block_size={self.block_size})"

    def read_prefill(self, context_ids: torch.Tensor, states: torch.Tensor) -> None:
        self._rows = states[-self.head.context_rows:] if states.shape[0] else None

    def read_commit(self, context_ids: torch.Tensor, states: torch.Tensor) -> None:
        if states.shape[0]:
            rows = states if self._rows is None else torch.cat([self._rows, states])
            self._rows = rows[-self.head.context_rows:]

    @torch.no_grad()
    def draft(self, context_ids: torch.Tensor, *, max_nodes: int, max_depth: int) -> DraftTree:
        size = min(self.block_size, max_nodes, max_depth)
        if self._rows is None or size < 1:
            return DraftTree.empty()
        w = self.base.token_embed.weight
        logits = self.head(self._rows.unsqueeze(0).to(w.device, w.dtype), context_ids[-1:], size)[0]   # (size, V)
        if self.sampling:                                  # sampled drafting: one draw per slot
            q = warp_probs(torch.softmax(logits.float(), dim=-1).cpu(), self.sample_temperature)        # (size, V)
            tokens = torch.multinomial(q, 1, generator=self.sample_generator).view(-1)
            return DraftTree(tokens, chain_tree(tokens).parents, q)
        return chain_tree(logits.argmax(-1).cpu())
