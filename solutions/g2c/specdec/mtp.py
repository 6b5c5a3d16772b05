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

Provided around the exercises: ``train_mtp_head`` (the head's training loop with the course
AdamW, logging loss and top-1 accuracy next to the base's) and ``mtp_generate`` (greedy
self-speculation, one base pass per round); ``mtp_metrics`` scores a batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from g2c.nn import LayerNorm, Linear, Module
from g2c.sampling.generate import as_token_ids
from g2c.sampling.model import (
    check_base_model,
    check_count,
    check_eos_id,
    check_generator,
    check_language_model,
    check_real,
    check_token_ids,
    check_window,
    eval_mode,
)
from g2c.training import AdamW
from g2c.transformer import Block

from .generate import SpecStats, draft_room
from .verify import greedy_verify

__all__ = ["MTPHead", "hidden_states", "mtp_generate", "mtp_loss", "mtp_metrics", "mtp_propose", "train_mtp_head"]


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
        check_base_model(base, "MTPHead", generator)   # a TypeError naming what is missing, before it is read
        super().__init__()
        self._frozen = {"base": base}     # a dict: invisible to parameters()/state_dict()/to()
        dim = base.embedding_dim
        self.ln_embed = LayerNorm(dim)
        self.fuse = Linear(2 * dim, dim, generator=generator)
        self.block = Block(dim, base.num_heads, hidden_dim=base.hidden_dim, causal=True, generator=generator)
        self.ln_final = LayerNorm(dim)
        self.bias = torch.zeros(base.vocab_size, requires_grad=True)
        self.to(base.token_embed.weight.device, base.token_embed.weight.dtype)   # the base's device and dtype

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
        ValueError: shapes do not line up (B and T-1), or T < 3; token_ids not integer or outside
            [0, V) (V = the logits' last dimension).

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
    if token_ids.dtype.is_floating_point or token_ids.dtype == torch.bool:       # targets index the vocabulary
        raise ValueError(f"mtp_loss: token_ids must hold integer token ids, got dtype {token_ids.dtype}")
    check_token_ids(token_ids.reshape(-1), mtp_logits.shape[-1], "mtp_loss: token_ids")
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


def _check_pair(base, head) -> None:
    """The head must sit on this base (it reads the base's states and embedding table)."""
    if not isinstance(head, MTPHead):                       # the type rule: a wrong type is a TypeError
        raise TypeError(f"head must be an MTPHead built on this base (MTPHead(base)); got {type(head).__name__}")
    if head.base is not base:
        raise ValueError("head must be an MTPHead built on this base (MTPHead(base)); got a head on another model")


def mtp_metrics(base, head: MTPHead, token_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Two-ahead loss and top-1 accuracy of the head, and the base's one-ahead ones, on a batch. Provided.

    Both predictors are scored on the same targets ``token_ids[:, 2:]``: head row t (state
    h_t plus the true token t+1) against the base's row t+1 (its next-token prediction, which
    has seen tokens 0..t+1). The base runs without gradients; the head's loss keeps its graph.

    Args:
        base: the frozen ``TransformerLM``.
        head: an ``MTPHead`` on that base.
        token_ids: (B, T) int64, T >= 3, T <= base.max_seq_len, on any device (moved to the base's).

    Returns:
        dict of scalar float32 tensors on the base's device: ``loss`` (the head's ``mtp_loss``,
        differentiable), ``accuracy`` (its top-1 accuracy), ``base_loss`` and ``base_accuracy``
        (the base's cross-entropy and top-1 accuracy on the same targets).

    Raises:
        TypeError: head not an MTPHead.
        ValueError: head not built on base; token_ids not (B, T) with T >= 3 (from ``mtp_loss``).
    """
    _check_pair(base, head)
    x = token_ids.to(base.device)                                               # (B, T)
    with torch.no_grad():
        hidden = hidden_states(base, x)                                         # (B, T, D)
        base_logits = base.unembed(hidden[:, 1:-1])                             # (B, T-2, V): predict x[:, 2:]
    logits = head(hidden[:, :-1], x[:, 1:])                                     # (B, T-1, V): row t predicts x[t+2]
    loss = mtp_loss(logits, x)
    targets = x[:, 2:]                                                          # (B, T-2)
    with torch.no_grad():
        accuracy = (logits[:, :-1].argmax(-1) == targets).float().mean()
        base_loss = F.cross_entropy(base_logits.reshape(-1, base_logits.shape[-1]), targets.reshape(-1))
        base_accuracy = (base_logits.argmax(-1) == targets).float().mean()
    return {"loss": loss, "accuracy": accuracy, "base_loss": base_loss, "base_accuracy": base_accuracy}


def train_mtp_head(base, train_ids, *, steps: int = 300, batch_size: int = 16, seq_len: int = 128,
                   lr: float = 1e-3, generator: torch.Generator | None = None,
                   on_step: Callable[[dict], None] | None = None) -> tuple[MTPHead, list[dict]]:
    """Train a fresh ``MTPHead`` on a frozen base with the course AdamW. Provided.

    Each step draws ``batch_size`` random windows of ``seq_len`` tokens from ``train_ids``,
    runs the frozen trunk without gradients, and takes one AdamW step (no weight decay) on
    the head's ``mtp_loss``. The base's parameters and mode are left as they were.

    Args:
        base: the frozen ``TransformerLM`` (its device is used for everything).
        train_ids: 1-D token stream (int tensor or numpy array, e.g. the ``uint16`` memmap of
            the training split), longer than ``seq_len``.
        steps: optimizer steps, >= 1.
        batch_size: B >= 1.
        seq_len: T, 3 <= T <= base.max_seq_len.
        lr: AdamW learning rate.
        generator: CPU ``torch.Generator`` for the head's initialisation and the window starts
            (default: seeded with 0, so two calls give the same head).
        on_step: called after every step with that step's record (see Returns).

    Returns:
        (head, history): the trained head in eval mode, on the base's device; one dict per step
        with ``step`` (1-based) and the floats of ``mtp_metrics`` on that training batch:
        ``loss``, ``accuracy`` (head, two ahead), ``base_loss``, ``base_accuracy`` (base, one
        ahead, same targets).

    Raises:
        TypeError: base not a language model; steps, batch_size or seq_len not an int; lr not a real
            number; a generator that is not one; train_ids not a stream (None, a string).
        ValueError: steps or batch_size < 1; lr not finite and > 0; seq_len outside [3,
            base.max_seq_len]; a stream too short or not 1-D.
    """
    check_language_model(base, "base")
    steps, batch_size = check_count(steps, "steps", minimum=1), check_count(batch_size, "batch_size", minimum=1)
    seq_len = check_count(seq_len, "seq_len", minimum=None)
    lr = check_real(lr, "lr", low=0, low_open=True)
    check_generator(generator)
    if train_ids is None or isinstance(train_ids, (str, bytes)):
        raise TypeError(f"train_ids must be a 1-D stream of token ids (a tensor or array), got "
                        f"{type(train_ids).__name__}")
    if not 3 <= seq_len <= base.max_seq_len:
        raise ValueError(f"seq_len must be in [3, base.max_seq_len={base.max_seq_len}] (a target two ahead "
                         f"inside the window), got {seq_len}")
    stream = torch.as_tensor(train_ids.astype("int64") if hasattr(train_ids, "astype") else train_ids)
    if stream.dim() != 1 or stream.numel() <= seq_len:
        raise ValueError(f"train_ids must be a 1-D stream longer than seq_len={seq_len}, got shape "
                         f"{tuple(stream.shape)}")
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    head = MTPHead(base, generator=gen)
    opt = AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    head.train()
    history = []
    with eval_mode(base):                                                        # the base's mode comes back
        for step in range(1, steps + 1):
            starts = torch.randint(0, stream.numel() - seq_len + 1, (batch_size,), generator=gen)   # (B,)
            x = stream[starts.unsqueeze(1) + torch.arange(seq_len)]                                  # (B, T)
            metrics = mtp_metrics(base, head, x)
            opt.zero_grad()
            metrics["loss"].backward()
            opt.step()
            record = {"step": step, **{name: float(value.detach()) for name, value in metrics.items()}}
            history.append(record)
            if on_step is not None:
                on_step(record)
    return head.eval(), history


@torch.no_grad()
def mtp_generate(base, head: MTPHead, prompt_ids, max_new_tokens: int, *,
                 eos_id: int | None = None) -> tuple[torch.Tensor, SpecStats]:
    """Greedy self-speculation with an MTP head: one base pass per round. Provided.

    Every pass runs the base over the context plus the head's last guess. Its last two rows
    verify the guess (``greedy_verify`` with k = 1: the guess is accepted if it is the base's
    argmax, then the next row gives the bonus token; otherwise that row's argmax is the
    correction). The same pass's hidden states then feed the head over the whole committed
    history, as in training, with the fresh token as token t+1: its argmax is the next guess.
    The first pass has no guess and emits the base's next token. So each pass emits 1 or 2
    tokens and drafting costs one head call (no second model, no extra trunk pass).

    The window edge follows ``g2c.specdec.draft_room``, the rule every loop shares: the guess
    is verified only while context + guess fit ``base.max_seq_len``; once the context fills
    the window every pass is a plain step over its last ``max_seq_len`` tokens (no guess
    verified), exactly module 11's crop.

    Args:
        base: the ``TransformerLM`` whose greedy output we want.
        head: an ``MTPHead`` built on ``base`` (trained, or not: the output is the same).
        prompt_ids: 1-D int tensor or list, length >= 1.
        max_new_tokens: budget, an int >= 0; never exceeded.
        eos_id: stop right after emitting this id (included in the output).
            None, or an id in [0, V) (``check_eos_id``: ValueError outside it, TypeError for a non-int).

    Returns:
        (ids, stats): LongTensor (N,) on the CPU, the prompt followed by the new tokens, and a
        ``SpecStats`` with one record per base pass (the first pass and plain steps at the
        window edge draft nothing). ids equals
        ``g2c.sampling.generate(base, prompt_ids, max_new_tokens, temperature=0.0, eos_id=eos_id)``
        token for token at any length.

    Raises:
        TypeError: base not a language model; head not an ``MTPHead`` ("MTPHead(base)"); max_new_tokens
            not an int.
        ValueError: prompt_ids empty, not 1-D, not integer or outside [0, V) ("prompt_ids"); max_new_tokens
            below 0 ("max_new_tokens"); head on another base ("MTPHead(base)"); base.max_seq_len < 2
            ("max_seq_len").

    Sources: Gloeckle et al. (2024), section 3.2 (self-speculative decoding with the extra
    heads); Leviathan et al. (2023), section 2 (the verification rule).
    """
    check_language_model(base, "base")                            # a TypeError before its vocabulary is read
    ids = as_token_ids(prompt_ids, "prompt_ids", vocab_size=base.vocab_size)
    eos_id = check_eos_id(eos_id, base.vocab_size)                # None, or an id the loop can emit
    max_new_tokens = check_count(max_new_tokens, "max_new_tokens")
    _check_pair(base, head)
    window = base.max_seq_len
    check_window(window, "base")                                  # the loops' one window precondition
    stats = SpecStats()
    guess = None
    with eval_mode(base, head):                                                  # modes restored, also on errors
        while stats.generated < max_new_tokens:
            remaining = max_new_tokens - stats.generated
            k_step = draft_room(0 if guess is None else 1, len(ids), window)     # the shared window-edge rule
            block = ids[-window:] if k_step == 0 else torch.cat([ids, torch.tensor([guess])])
            x = block.unsqueeze(0).to(base.device)                               # (1, T)
            hidden = hidden_states(base, x)                                      # (1, T, D)
            if k_step == 0:                                                      # first pass, or window full
                token = int(base.unembed(hidden[0, -1]).argmax())
                num_accepted, emitted, keep = 0, [token], hidden.shape[1]
            else:
                rows = base.unembed(hidden[0, -2:])                              # (2, V): verify row, bonus row
                num_accepted, token = greedy_verify(torch.tensor([guess]), rows)
                emitted = [guess] * num_accepted + [token]
                keep = hidden.shape[1] - 1 + num_accepted                        # rows of committed history
            emitted = emitted[:remaining]
            hit_eos = eos_id is not None and eos_id in emitted
            if hit_eos:
                emitted = emitted[:emitted.index(eos_id) + 1]
            stats.record(drafted=k_step, accepted=min(num_accepted, len(emitted)),
                         generated=len(emitted))
            ids = torch.cat([ids, torch.tensor(emitted, dtype=torch.long)])
            if hit_eos or stats.generated >= max_new_tokens:
                break
            # The head at the last committed position, with the base's fresh token as token t+1.
            following = torch.cat([x[:, 1:keep], torch.tensor([[token]], device=x.device)], dim=1)  # (1, keep)
            guess = int(head(hidden[:, :keep], following)[0, -1].argmax())
    return ids, stats
