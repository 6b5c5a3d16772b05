"""Beyond (specdec-state): verification as a state transaction, three ways.

A speculative round feeds the target a block of k+1 tokens: the last emitted token (not
yet in the state) and k drafts. Verification keeps j drafts, so the committed state must
become the state after the first j+1 block positions, exactly as if plain decoding had fed
those tokens. Attention layers roll back by moving a pointer over their K/V rows. A
recurrent layer cannot: S_(t+4) has folded all four drafts in. Three ways to land on the
same boundary (the seed's "verification is also a state transaction"; ReplaySSM, Dao AI
Lab 2026, for checkpoint + input replay):

    strategy   keeps                         commit of j+1 < k+1 positions
    snapshot   live state + a copy           copy the snapshot back, re-fold the j+1 kept inputs
    replay     checkpoint + input buffer     move the buffer pointer (fold when the buffer fills)
    recompute  checkpoint (last commit)      rerun the model over the j+1 tokens from it

The transaction interface, for every strategy:

    txn.begin()                      open a round at the committed boundary
    logits = txn.advance(tokens)     one target pass over the block (T, V): the verification rows
    txn.commit(num_accepted)         keep the first num_accepted + 1 positions, drop the rest
    txn.rollback()                   drop the whole block

This file holds the interface and the shared machinery (no exercise); the strategies live
in ``snapshot.py``, ``replay.py`` and ``recompute.py`` (their ``commit``/``rollback`` are the
exercises). Costs are counted as the work happens, in ``txn.costs`` (a ``StateCosts``): bytes of state
copied, bytes of inputs logged, K/V bytes written, state-update and readout FLOPs, model
passes. Hybrid models: every attention layer's K/V pointer lands on the same boundary as
the recurrent state, in ``commit`` and ``rollback`` alike.

Shape letters: B batch (1 in the speculative loop), H heads, d head width, T block length,
k draft length, V vocabulary. States are (B, H, d, d) float32.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from g2c.kvcache import cached_attention
from g2c.sampling.model import check_count, check_token_ids, check_whole

from .model import RecurrenceInputs, RecurrentLM, new_kv_cache
from .scan import readout_flops, update_flops

__all__ = ["StateCosts", "StateTransaction"]


@dataclass
class StateCosts:
    """Work counted by a transaction. Provided.

    Attributes:
        rounds: committed or rolled-back rounds.
        model_passes: forward passes of the target (verification passes and recompute passes).
        bytes_copied: bytes of recurrent state copied (snapshots and restores).
        bytes_logged: bytes of recurrence inputs written to a replay buffer.
        kv_bytes_written: bytes of K/V rows written by attention layers.
        update_flops: FLOPs spent producing recurrent states (``scan.update_flops``).
        readout_flops: FLOPs of recurrent readouts from a state plus a block (``scan.readout_flops``).
        folds: times a replay buffer was folded into a new checkpoint.
    """

    rounds: int = 0
    model_passes: int = 0
    bytes_copied: int = 0
    bytes_logged: int = 0
    kv_bytes_written: int = 0
    update_flops: int = 0
    readout_flops: int = 0
    folds: int = 0

    def per_round(self) -> dict[str, float]:
        """Every counter divided by ``rounds`` (0.0 before the first round)."""
        return {f.name: (getattr(self, f.name) / self.rounds if self.rounds else 0.0)
                for f in fields(self) if f.name != "rounds"}


class StateTransaction:
    """The shared machinery: round bookkeeping, K/V rows with pointer rollback, cost meter.

    Subclasses store the recurrent state their own way: they implement ``recurrent``
    (outputs of a recurrent layer for the open block), ``commit``, ``rollback`` and
    ``committed_state``.

    Args:
        model: a ``RecurrentLM`` (any layout), in eval mode.
        batch: B (default 1).

    Attributes:
        length: tokens in the committed state.
        costs: ``StateCosts``.
        kv: module 16's ``KVCache`` for the attention layers (None without any), one
            pointer ``kv.length`` for all of them; ``kv_slots`` maps model layer -> cache layer.

    Raises (the round protocol, by every method):
        RuntimeError: ``begin`` while a round is open; ``advance`` without ``begin`` or twice
            in one round; ``commit`` / ``rollback`` with no open round ("no open round";
            ``commit`` also needs an ``advance``).
        ValueError: ``commit(num_accepted)`` outside [0, T-1] for a block of T tokens; an
            empty or non-integer block.
    """

    name = "base"

    def __init__(self, model: RecurrentLM, *, batch: int = 1) -> None:
        if not isinstance(model, RecurrentLM):
            raise TypeError(f"{type(self).__name__} needs a RecurrentLM, got {type(model).__name__}")
        self.model = model
        self.batch = check_count(batch, "batch", minimum=1)
        self.device = model.device
        self.kv, self.kv_slots = new_kv_cache(model, batch)
        self.length = 0
        self.costs = StateCosts()
        self._open = False
        self._block: torch.Tensor | None = None     # (B, T) of the open round, once advanced
        self._start = 0                               # committed length when the round opened

    # -- sizes ----------------------------------------------------------------------------------
    def _zero_state(self) -> torch.Tensor:
        return torch.zeros(self.batch, self.model.num_heads, self.model.head_dim, self.model.head_dim,
                           device=self.device)

    def _state_nbytes(self) -> int:
        """Bytes of ONE layer's state."""
        return self.batch * self.model.num_heads * self.model.head_dim ** 2 * 4

    def _update_flops(self, num_positions: int) -> int:
        return self.batch * update_flops(self.model.num_heads, self.model.head_dim, num_positions)

    def _readout_flops(self, num_queries: int, num_keys: int) -> int:
        return self.batch * readout_flops(self.model.num_heads, self.model.head_dim, num_queries, num_keys)

    # -- the round protocol ---------------------------------------------------------------------
    def begin(self) -> None:
        """Open a round at the committed boundary."""
        if self._open:
            raise RuntimeError(f"{self.name}: begin() while a round is open; commit() or rollback() it first")
        self._open = True
        self._block = None
        self._start = self.length
        self._on_begin()

    def _on_begin(self) -> None:
        """Strategy hook run by ``begin`` (nothing by default)."""

    @torch.no_grad()
    def advance(self, tokens) -> torch.Tensor:
        """One target pass over the block; returns its logits (T, V) float32 (batch row 0).

        Args:
            tokens: 1-D int tensor or list (T,), or (B, T): the last emitted token, then the drafts.

        Returns:
            logits (T, V): row i scores the position after block token i, so rows 0..k are
            the k+1 verification rows of ``g2c.specdec.greedy_verify``.

        Raises:
            RuntimeError: no open round, or the round already advanced.
            ValueError: an empty or non-integer block; a block whose rows differ from ``batch``
                (a (2, T) block on a batch-1 transaction is refused, never flattened); an id
                outside [0, V); a block that overflows the attention
                layers' ``max_seq_len`` or (replay) the buffer ``capacity``.
        """
        if not self._open:
            raise RuntimeError(f"{self.name}: advance() needs begin() first")
        if self._block is not None:
            raise RuntimeError(f"{self.name}: advance() called twice in one round; commit() or rollback() first")
        ids = torch.as_tensor(tokens)
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.numel() == 0 or ids.dim() > 2:
            raise ValueError(f"{self.name}: advance() needs a non-empty block of integer token ids, got "
                             f"dtype {ids.dtype}, shape {tuple(ids.shape)}")
        if (ids.dim() == 2 and ids.shape[0] != self.batch) or (ids.dim() == 1 and self.batch != 1):
            raise ValueError(f"{self.name}: advance() got a block of shape {tuple(ids.shape)} but the transaction "
                             f"holds {self.batch} row(s); pass (T,) for batch 1 or ({self.batch}, T)")
        check_token_ids(ids, self.model.vocab_size, f"{self.name}: advance() tokens")
        ids = ids.long().view(self.batch, -1).to(self.device)                # (B, T)
        self._before_advance(ids.shape[1])
        self._block = ids
        return self._run(ids)[0]

    def _run(self, ids: torch.Tensor) -> torch.Tensor:
        """One counted target pass over ids (B, T); the K/V pointer then moves past the T rows."""
        self.costs.model_passes += 1
        logits = self.model.run(ids, self)
        if self.kv is not None:
            self.kv.advance(ids.shape[1])
        return logits

    def _before_advance(self, num_positions: int) -> None:
        """Strategy hook: make room for a block of ``num_positions`` (nothing by default)."""

    def attention(self, layer: int, attn, h: torch.Tensor) -> torch.Tensor:
        """Attention layers, shared by every strategy: module 16's ``cached_attention`` writes
        the new K/V rows after the pointer and attends over every visible row."""
        B, T, D = h.shape
        self.costs.kv_bytes_written += 2 * B * T * D * self.kv.keys_buffer[0].element_size()
        return cached_attention(attn, h, self.kv, self.kv_slots[layer])

    def recurrent(self, layer: int, inp: RecurrenceInputs) -> torch.Tensor:
        """Outputs (B, H, T, d) of recurrent layer ``layer`` for the block. Strategy-specific."""
        raise NotImplementedError

    def _check_commit(self, num_accepted: int) -> int:
        """Validate a commit; return the number of block positions to keep (num_accepted + 1)."""
        if not self._open or self._block is None:
            raise RuntimeError(f"{self.name}: commit() needs an open round with an advanced block "
                               "(begin(), advance(tokens), then commit(num_accepted))")
        T = self._block.shape[1]
        num_accepted = check_whole(num_accepted, f"{self.name}: num_accepted must be an int in [0, {T - 1}] for a "
                                                 f"block of {T} tokens (the last emitted token + {T - 1} drafts), got "
                                                 f"{num_accepted!r}", low=0, high=T - 1)
        return num_accepted + 1

    def _check_rollback(self) -> None:
        if not self._open:
            raise RuntimeError(f"{self.name}: rollback() with no open round")

    def _truncate_kv(self, length: int) -> None:
        """Move the attention layers' K/V pointer back to ``length`` (``KVCache.crop``: no bytes move)."""
        if self.kv is not None:
            self.kv.crop(length)

    def _close(self, num_kept: int) -> None:
        """End the round with ``num_kept`` block positions added to the committed length."""
        self.length = self._start + num_kept
        self._open = False
        self._block = None
        self.costs.rounds += 1

    def commit(self, num_accepted: int) -> None:
        """Keep the first num_accepted + 1 block positions in the committed state. Strategy-specific."""
        raise NotImplementedError

    def rollback(self) -> None:
        """Drop the whole open block: the committed state is what it was at ``begin``."""
        raise NotImplementedError

    def committed_state(self) -> dict[int, torch.Tensor]:
        """{layer: (B, H, d, d)} the committed recurrent states, materialised (for checks; not costed)."""
        raise NotImplementedError

    def committed_kv(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """{layer: (K, V)} the visible K/V rows (B, H, length, d) of every attention layer."""
        return {i: (self.kv.keys(j), self.kv.values(j)) for i, j in self.kv_slots.items()}

    #: longest block ``prefill`` feeds in one round (replay: its buffer capacity)
    max_prefill_block: int | None = None

    def prefill(self, ids) -> torch.Tensor:
        """Commit a prompt in rounds that keep everything; return its logits (T, V).

        The prompt goes in one round, or in rounds of at most ``max_prefill_block`` tokens.
        """
        ids = torch.as_tensor(ids).view(-1)
        if ids.numel() == 0:
            raise ValueError(f"{self.name}: prefill() needs at least one token id, got an empty prompt; "
                             "feed the prompt's tokens (all but the last, which the first round re-reads)")
        step = self.max_prefill_block or max(ids.numel(), 1)
        rows = []
        for start in range(0, ids.numel(), step):
            self.begin()
            logits = self.advance(ids[start:start + step])
            self.commit(logits.shape[0] - 1)
            rows.append(logits)
        return torch.cat(rows)
