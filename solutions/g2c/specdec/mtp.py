"""Beyond (specdec): multi-token prediction (MTP), a drafter that lives inside the target.

A trained LM predicts token t+1 from its trunk state h_t. An MTP head reuses that state to
guess token t+2 as well: it combines h_t with the embedding of token t+1, runs one extra
causal block and projects with the base's own (tied) unembedding. The base stays frozen;
only the head trains. At inference one trunk pass gives the base's next token AND a guess
for the one after it: a free draft for self-speculation (verified like any draft).

Sources: Gloeckle et al., "Better & Faster Large Language Models via Multi-token
Prediction" (ICML 2024), sections 2 and 3.2 (self-speculative decoding); DeepSeek-AI,
"DeepSeek-V3 Technical Report" (2024), section 2.2 (sequential MTP modules: the previous
state and the next token's normalised embedding, concatenated, projected by a matrix M,
one transformer block, the shared output head).

Shape letters: B batch, T time, D width, V vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from g2c.nn import LayerNorm, Linear, Module
from g2c.sampling.generate import as_token_ids
from g2c.sampling.model import eval_mode
from g2c.transformer import Block

__all__ = ["MTPHead", "hidden_states", "mtp_loss", "mtp_propose"]


def hidden_states(model, token_ids: torch.Tensor) -> torch.Tensor:
    """The trunk's output after the final LayerNorm. Provided.

    Args:
        model: a ``TransformerLM``.
        token_ids: (B, T) int64, T <= model.max_seq_len.

    Returns:
        (B, T, D) float32: the states the base's unembedding turns into logits.
    """
    return model.hidden_states(token_ids)


class MTPHead(Module):
    """A second-token head on a frozen base ``TransformerLM``.

    Position t combines h_t (the base's final state at t) with the embedding of token t+1
    and predicts token t+2:

        x_t = fuse([h_t ; LN_e(E[token_{t+1}])])         Linear(2D, D)
        y   = ln_final(Block(x))                         one causal block over positions
        logits_t = y_t E^T + bias                        tied unembedding E (V, D) + own bias

    The base is frozen by leaving it out of ``parameters()``: it is kept in a dict, which
    the ``Module`` traversal does not enter, so ``parameters()``, ``state_dict()``,
    ``to()`` and ``train()`` touch only the head. The head starts on the base's device;
    move the base yourself if you move the head.

    Args:
        base: the frozen ``TransformerLM`` (its ``token_embed.weight`` is the unembedding).
        generator: optional ``torch.Generator`` for the initialisation.

    Attributes:
        base: the base model (a property; not a child module).
        ln_embed: ``LayerNorm(D)`` on the next token's embedding (DeepSeek-V3 normalises
            both inputs; h_t is already normalised by the base's ``ln_final``).
        fuse: ``Linear(2D, D)``.
        block: one causal ``Block(D, H, hidden_dim=base.hidden_dim)``.
        ln_final: ``LayerNorm(D)``.
        bias: (V,) float32 output bias, zeros at start.
    """

    def __init__(self, base, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self._frozen = {"base": base}     # a dict: invisible to parameters()/state_dict()/to()
        dim = base.embedding_dim
        self.ln_embed = LayerNorm(dim)
        self.fuse = Linear(2 * dim, dim, generator=generator)
        self.block = Block(dim, base.num_heads, hidden_dim=base.hidden_dim, causal=True, generator=generator)
        self.ln_final = LayerNorm(dim)
        self.bias = torch.zeros(base.vocab_size, requires_grad=True)
        self.to(base.token_embed.weight.device)

    @property
    def base(self):
        """The frozen base model."""
        return self._frozen["base"]

    def forward(self, hidden: torch.Tensor, next_token_ids: torch.Tensor) -> torch.Tensor:
        """Logits for the token two ahead.

        Args:
            hidden: (B, T', D) float32, the base's states h_t (``hidden_states``).
            next_token_ids: (B, T') int64, token t+1 for each position t.

        Returns:
            logits (B, T', V) float32: row t scores token t+2.

        Steps:
            1. Detach ``hidden`` and the base's embedding table E = base.token_embed.weight, so
               no gradient reaches the frozen base; look up the next tokens in E and normalise
               them with ``ln_embed``.
            2. Concatenate [hidden ; embedding] on the last axis (B, T', 2D) and ``fuse`` to D.
            3. ``block`` then ``ln_final`` (B, T', D).
            4. Project with E^T (tied, detached) and add ``bias`` (``test_mtp_head_forward_shape``).
        """
        # BEGIN SOLUTION
        table = self.base.token_embed.weight.detach()                           # (V, D)
        emb = self.ln_embed(table[next_token_ids])                              # (B, T', D)
        x = self.fuse(torch.cat([hidden.detach(), emb], dim=-1))                 # (B, T', 2D) -> (B, T', D)
        y = self.ln_final(self.block(x))                                         # (B, T', D)
        return y @ table.t() + self.bias                                         # (B, T', V)
        # END SOLUTION


def mtp_loss(mtp_logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the MTP head against the token two ahead.

    The head ran on ``hidden[:, :-1]`` with ``next_token_ids = token_ids[:, 1:]``, so row t of
    ``mtp_logits`` (B, T-1, V) predicts ``token_ids[:, t + 2]``. Rows 0..T-3 have a target;
    the last row (t = T-2) would need token T, which the batch does not hold.

    Args:
        mtp_logits: (B, T-1, V) float.
        token_ids: (B, T) int64, T >= 3.

    Returns:
        scalar float32: mean cross-entropy over B·(T-2) positions.

    Raises:
        ValueError: shapes do not line up (B and T-1), or T < 3.

    Steps:
        1. Keep rows 0..T-3 of the logits and the targets ``token_ids[:, 2:]`` (both B, T-2).
        2. Mean cross-entropy over every position (``test_mtp_loss_alignment``).
    """
    if mtp_logits.dim() != 3 or token_ids.dim() != 2 or mtp_logits.shape[0] != token_ids.shape[0] \
            or mtp_logits.shape[1] != token_ids.shape[1] - 1:
        raise ValueError(f"mtp_loss expects mtp_logits (B, T-1, V) and token_ids (B, T); got "
                         f"{tuple(mtp_logits.shape)} and {tuple(token_ids.shape)}")
    if token_ids.shape[1] < 3:
        raise ValueError(f"mtp_loss needs T >= 3 tokens per row (a target two ahead), got T={token_ids.shape[1]}")
    # BEGIN SOLUTION
    logits = mtp_logits[:, :-1]                                                  # (B, T-2, V)
    targets = token_ids[:, 2:].to(logits.device)                                 # (B, T-2)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))
    # END SOLUTION


@torch.no_grad()
def mtp_propose(base, head: MTPHead, ctx_ids) -> tuple[int, int]:
    """One trunk pass: the base's greedy next token and the head's guess for the one after. Provided.

    The head runs over the whole (cropped) context, as in training, so its causal block
    sees the same history; its last row uses the base's fresh greedy token as token t+1.

    Args:
        base: the frozen ``TransformerLM`` (a ``g2c.sampling.LanguageModel`` that also has
            ``hidden_states`` and ``token_embed``).
        head: an ``MTPHead`` on that base (same device).
        ctx_ids: 1-D int tensor or list, length >= 1, ids in [0, V).

    Returns:
        (next_token, guess): the base's argmax after ctx (exact) and the head's argmax two ahead
        (a draft, to be verified by the next target pass). Base and head run in eval mode and
        get their modes back afterwards (``eval_mode``, also on an exception).

    Raises:
        ValueError: ctx_ids empty, not 1-D, not integer, or with an id outside [0, V)
            (the message names "ctx_ids").
    """
    ids = as_token_ids(ctx_ids, "ctx_ids", vocab_size=base.vocab_size)
    with eval_mode(base, head):
        ctx = ids[-base.max_seq_len:].unsqueeze(0).to(base.device)               # (1, T)
        hidden = hidden_states(base, ctx)                                        # (1, T, D)
        next_token = int(base.unembed(hidden[0, -1]).argmax())
        following = torch.cat([ctx[:, 1:], torch.tensor([[next_token]], device=ctx.device)], dim=1)  # (1, T)
        guess = int(head(hidden, following)[0, -1].argmax())
    return next_token, guess
