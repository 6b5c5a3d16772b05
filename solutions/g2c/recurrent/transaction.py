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

Costs are counted as the work happens, in ``txn.costs`` (a ``StateCosts``): bytes of state
copied, bytes of inputs logged, K/V bytes written, state-update and readout FLOPs, model
passes. Hybrid models: every attention layer's K/V pointer lands on the same boundary as
the recurrent state, in ``commit`` and ``rollback`` alike.

Shape letters: B batch (1 in the speculative loop), H heads, d head width, T block length,
k draft length, V vocabulary. States are (B, H, d, d) float32.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from .model import KVRows, RecurrenceInputs, RecurrentLM, attend_rows
from .scan import gla_chunk, gla_fold, readout_flops, update_flops

__all__ = ["RecomputeTransaction", "ReplayTransaction", "SnapshotTransaction", "StateCosts",
           "StateTransaction", "make_transaction"]


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
        kv: {layer: KVRows} for the attention layers.

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
        self.batch = batch
        self.device = model.device
        self.kv = {i: KVRows(batch, model.num_heads, model.max_seq_len, model.head_dim, self.device)
                   for i in model.attention_layers}
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
        """
        if not self._open:
            raise RuntimeError(f"{self.name}: advance() needs begin() first")
        if self._block is not None:
            raise RuntimeError(f"{self.name}: advance() called twice in one round; commit() or rollback() first")
        ids = torch.as_tensor(tokens)
        if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.numel() == 0 or ids.dim() > 2:
            raise ValueError(f"{self.name}: advance() needs a non-empty block of integer token ids, got "
                             f"dtype {ids.dtype}, shape {tuple(ids.shape)}")
        ids = ids.long().view(self.batch, -1).to(self.device)                # (B, T)
        self._before_advance(ids.shape[1])
        self._block = ids
        self.costs.model_passes += 1
        return self.model.run(ids, self)[0]

    def _before_advance(self, num_positions: int) -> None:
        """Strategy hook: make room for a block of ``num_positions`` (nothing by default)."""

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Attention layers, shared by every strategy: append rows at the pointer, attend."""
        rows = self.kv[layer]
        rows.append(k, v)
        self.costs.kv_bytes_written += k.shape[2] * rows.nbytes_per_row()
        return attend_rows(q, *rows.rows())

    def recurrent(self, layer: int, inp: RecurrenceInputs) -> torch.Tensor:
        """Outputs (B, H, T, d) of recurrent layer ``layer`` for the block. Strategy-specific."""
        raise NotImplementedError

    def _check_commit(self, num_accepted: int) -> int:
        """Validate a commit; return the number of block positions to keep (num_accepted + 1)."""
        if not self._open or self._block is None:
            raise RuntimeError(f"{self.name}: commit() needs an open round with an advanced block "
                               "(begin(), advance(tokens), then commit(num_accepted))")
        T = self._block.shape[1]
        if isinstance(num_accepted, bool) or not isinstance(num_accepted, int) or not 0 <= num_accepted < T:
            raise ValueError(f"{self.name}: num_accepted must be an int in [0, {T - 1}] for a block of {T} tokens "
                             f"(the last emitted token + {T - 1} drafts), got {num_accepted!r}")
        return num_accepted + 1

    def _check_rollback(self) -> None:
        if not self._open:
            raise RuntimeError(f"{self.name}: rollback() with no open round")

    def _truncate_kv(self, length: int) -> None:
        """Move every attention layer's K/V pointer to ``length`` (no bytes move)."""
        for rows in self.kv.values():
            rows.truncate(length)

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
        return {i: rows.rows() for i, rows in self.kv.items()}

    def prefill(self, ids) -> torch.Tensor:
        """Commit a prompt as one round that keeps everything; return its logits (T, V)."""
        self.begin()
        logits = self.advance(ids)
        self.commit(logits.shape[0] - 1)
        return logits


class SnapshotTransaction(StateTransaction):
    """Snapshot: copy the state before the block; on a partial accept restore and re-fold.

    The live state sits in one slot per layer and ``advance`` updates it in place (as a
    decode kernel's state cache does); ``begin`` copies every layer's state into a second
    slot (``bytes_copied``). ``advance`` also keeps the block's recurrence inputs, which the
    verification pass computed anyway.
    """

    name = "snapshot"

    def __init__(self, model: RecurrentLM, *, batch: int = 1) -> None:
        super().__init__(model, batch=batch)
        self.state = {i: self._zero_state() for i in model.recurrent_layers}
        self._snapshot = {i: self._zero_state() for i in model.recurrent_layers}
        self._inputs: dict[int, RecurrenceInputs] = {}

    def _on_begin(self) -> None:
        for i, s in self.state.items():
            self._snapshot[i].copy_(s)
            self.costs.bytes_copied += self._state_nbytes()

    def recurrent(self, layer: int, inp: RecurrenceInputs) -> torch.Tensor:
        o, new_state = gla_chunk(inp.q, inp.k, inp.v, inp.log_a, self.state[layer])
        self.state[layer].copy_(new_state)                                  # in place: the slot now holds S_T
        self._inputs[layer] = inp
        T = inp.k.shape[2]
        self.costs.update_flops += self._update_flops(T)
        self.costs.readout_flops += self._readout_flops(T, T)
        return o

    def commit(self, num_accepted: int) -> None:
        """Keep num_accepted + 1 positions.

        Steps:
            1. ``n = self._check_commit(num_accepted)`` (provided): positions to keep.
            2. Full accept (n == block length): the live state already is the answer.
            3. Otherwise, for each recurrent layer: copy the snapshot back into the live
               slot (count ``self._state_nbytes()`` in ``costs.bytes_copied``), then fold the
               first n kept inputs (``gla_fold``) and store the result in the slot (count
               ``self._update_flops(n)``) (``test_commit_lands_on_the_boundary``).
            4. Every attention layer's pointer to ``self._start + n`` (``self._truncate_kv``)
               and ``self._close(n)`` (``test_hybrid_commits_kv_and_state_at_one_boundary``).
        """
        n = self._check_commit(num_accepted)
        # BEGIN SOLUTION
        if n < self._block.shape[1]:
            for i, inp in self._inputs.items():
                self.state[i].copy_(self._snapshot[i])
                self.costs.bytes_copied += self._state_nbytes()
                self.state[i].copy_(gla_fold(self.state[i], inp.k[:, :, :n], inp.v[:, :, :n], inp.log_a[:, :, :n]))
                self.costs.update_flops += self._update_flops(n)
        self._truncate_kv(self._start + n)
        self._close(n)
        # END SOLUTION

    def rollback(self) -> None:
        """Drop the block.

        Steps:
            1. ``self._check_rollback()`` (provided).
            2. If a block was advanced, copy every snapshot back (count the bytes).
            3. Pointers to ``self._start``; ``self._close(0)`` (``test_rollback_restores_the_round_start``).
        """
        self._check_rollback()
        # BEGIN SOLUTION
        if self._block is not None:
            for i, snap in self._snapshot.items():
                self.state[i].copy_(snap)
                self.costs.bytes_copied += self._state_nbytes()
        self._truncate_kv(self._start)
        self._close(0)
        # END SOLUTION

    def committed_state(self) -> dict[int, torch.Tensor]:
        if self._open:
            raise RuntimeError(f"{self.name}: committed_state() inside an open round; commit or roll back first")
        return {i: s.clone() for i, s in self.state.items()}


class ReplayTransaction(StateTransaction):
    """Checkpoint + input replay (ReplaySSM's pattern): cache inputs, not state.

    Each recurrent layer keeps a checkpoint state S_0 and a buffer of the recurrence inputs
    (k, v, log a) of the ``num_logged`` committed positions since. ``advance`` writes the
    block's inputs after them and computes the verification outputs from S_0 plus the
    buffer (``gla_chunk`` with ``return_state=False``): no state is materialised. Commit
    and rejection move the pointer ``num_logged``. When the next block would not fit,
    ``fold`` replays the buffer into a new checkpoint and empties it.

    Args:
        model, batch: as ``StateTransaction``.
        capacity: buffer positions per layer (default 32); must hold a whole block.

    Raises:
        ValueError: capacity < 1, or a block longer than ``capacity`` ("capacity").
    """

    name = "replay"

    def __init__(self, model: RecurrentLM, *, batch: int = 1, capacity: int = 32) -> None:
        super().__init__(model, batch=batch)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"replay: capacity must be an int >= 1 buffer positions, got {capacity!r}")
        self.capacity = capacity
        H, d = model.num_heads, model.head_dim
        self.checkpoint = {i: self._zero_state() for i in model.recurrent_layers}
        self.buf_k = {i: torch.zeros(batch, H, capacity, d, device=self.device) for i in model.recurrent_layers}
        self.buf_v = {i: torch.zeros(batch, H, capacity, d, device=self.device) for i in model.recurrent_layers}
        self.buf_log_a = {i: torch.zeros(batch, H, capacity, device=self.device) for i in model.recurrent_layers}
        self.num_logged = 0

    def _before_advance(self, num_positions: int) -> None:
        if num_positions > self.capacity:
            raise ValueError(f"replay: a block of {num_positions} tokens does not fit a buffer of capacity="
                             f"{self.capacity}; build the transaction with capacity >= k + 1")
        if not self.checkpoint:                  # no recurrent layer: nothing is ever logged
            self.num_logged = 0
        elif self.num_logged + num_positions > self.capacity:
            self.fold()

    def recurrent(self, layer: int, inp: RecurrenceInputs) -> torch.Tensor:
        n0, T = self.num_logged, inp.k.shape[2]
        self.buf_k[layer][:, :, n0:n0 + T] = inp.k
        self.buf_v[layer][:, :, n0:n0 + T] = inp.v
        self.buf_log_a[layer][:, :, n0:n0 + T] = inp.log_a
        self.costs.bytes_logged += (inp.k.numel() + inp.v.numel() + inp.log_a.numel()) * 4
        o, _ = gla_chunk(inp.q, self.buf_k[layer][:, :, :n0 + T], self.buf_v[layer][:, :, :n0 + T],
                         self.buf_log_a[layer][:, :, :n0 + T], self.checkpoint[layer], return_state=False)
        self.costs.readout_flops += self._readout_flops(T, n0 + T)
        return o

    def fold(self) -> None:
        """Replay the committed buffer into a new checkpoint and empty the buffer.

        Steps:
            1. For each recurrent layer: the checkpoint becomes ``gla_fold`` of itself with
               the first ``num_logged`` buffered inputs (count ``self._update_flops(num_logged)``).
            2. ``num_logged = 0``; ``costs.folds += 1`` (``test_replay_folds_when_the_buffer_fills``).
        """
        if self._block is not None:
            raise RuntimeError("replay: fold() inside an advanced round would fold uncommitted inputs")
        # BEGIN SOLUTION
        n = self.num_logged
        for i in self.checkpoint:
            self.checkpoint[i] = gla_fold(self.checkpoint[i], self.buf_k[i][:, :, :n], self.buf_v[i][:, :, :n],
                                          self.buf_log_a[i][:, :, :n])
            self.costs.update_flops += self._update_flops(n)
        self.num_logged = 0
        self.costs.folds += 1
        # END SOLUTION

    def commit(self, num_accepted: int) -> None:
        """Keep num_accepted + 1 positions: a pointer move, no state touched.

        Steps:
            1. ``n = self._check_commit(num_accepted)`` (provided).
            2. The first n block inputs become committed log entries: advance ``num_logged``;
               the rest of the block stays in memory, invisible, and is overwritten later.
            3. Pointers to ``self._start + n``; ``self._close(n)``.
        """
        n = self._check_commit(num_accepted)
        # BEGIN SOLUTION
        self.num_logged += n
        self._truncate_kv(self._start + n)
        self._close(n)
        # END SOLUTION

    def rollback(self) -> None:
        """Drop the block: nothing to restore, the pointer never moved.

        Steps:
            1. ``self._check_rollback()`` (provided).
            2. K/V pointers to ``self._start``; ``self._close(0)``.
        """
        self._check_rollback()
        # BEGIN SOLUTION
        self._truncate_kv(self._start)
        self._close(0)
        # END SOLUTION

    def committed_state(self) -> dict[int, torch.Tensor]:
        if self._open:
            raise RuntimeError(f"{self.name}: committed_state() inside an open round; commit or roll back first")
        n = self.num_logged
        return {i: gla_fold(s, self.buf_k[i][:, :, :n], self.buf_v[i][:, :, :n], self.buf_log_a[i][:, :, :n]).clone()
                for i, s in self.checkpoint.items()}


class RecomputeTransaction(StateTransaction):
    """Recompute: never overwrite the checkpoint; on a partial accept, rerun the accepted tokens.

    The checkpoint is the committed state. ``advance`` writes the state after the whole
    block into a scratch slot (out of place). A full accept swaps the scratch in; anything
    less reruns the model over the accepted positions from the checkpoint: a second (shorter)
    target pass, no stored inputs, no copies.
    """

    name = "recompute"

    def __init__(self, model: RecurrentLM, *, batch: int = 1) -> None:
        super().__init__(model, batch=batch)
        self.checkpoint = {i: self._zero_state() for i in model.recurrent_layers}
        self._scratch: dict[int, torch.Tensor] = {}

    def recurrent(self, layer: int, inp: RecurrenceInputs) -> torch.Tensor:
        o, self._scratch[layer] = gla_chunk(inp.q, inp.k, inp.v, inp.log_a, self.checkpoint[layer])
        T = inp.k.shape[2]
        self.costs.update_flops += self._update_flops(T)
        self.costs.readout_flops += self._readout_flops(T, T)
        return o

    @torch.no_grad()
    def _rerun(self, ids: torch.Tensor) -> None:
        """One model pass over ``ids`` (B, n) from the checkpoint; the new states land in the scratch slots
        and attention layers append their rows at the current pointer. Provided."""
        self.costs.model_passes += 1
        self.model.run(ids, self)

    def commit(self, num_accepted: int) -> None:
        """Keep num_accepted + 1 positions.

        Steps:
            1. ``n = self._check_commit(num_accepted)`` (provided).
            2. Partial accept (n < block length): move the K/V pointers back to
               ``self._start`` and ``self._rerun`` the first n block tokens (it refills the
               scratch states and re-appends those K/V rows).
            3. The scratch states become the checkpoint (a swap of references).
            4. Pointers to ``self._start + n``; ``self._close(n)``.
        """
        n = self._check_commit(num_accepted)
        # BEGIN SOLUTION
        if n < self._block.shape[1]:
            self._truncate_kv(self._start)
            self._rerun(self._block[:, :n])
        self.checkpoint, self._scratch = dict(self._scratch), {}
        self._truncate_kv(self._start + n)
        self._close(n)
        # END SOLUTION

    def rollback(self) -> None:
        """Drop the block: forget the scratch states, pointers back to ``self._start``, close."""
        self._check_rollback()
        # BEGIN SOLUTION
        self._scratch = {}
        self._truncate_kv(self._start)
        self._close(0)
        # END SOLUTION

    def committed_state(self) -> dict[int, torch.Tensor]:
        if self._open:
            raise RuntimeError(f"{self.name}: committed_state() inside an open round; commit or roll back first")
        return {i: s.clone() for i, s in self.checkpoint.items()}


_STRATEGIES = {"snapshot": SnapshotTransaction, "replay": ReplayTransaction, "recompute": RecomputeTransaction}


def make_transaction(model: RecurrentLM, strategy: str, **kwargs) -> StateTransaction:
    """Build the transaction named ``strategy`` ("snapshot", "replay" or "recompute").

    Raises:
        ValueError: an unknown strategy name (the message lists the valid names).
    """
    if strategy not in _STRATEGIES:
        raise ValueError(f"unknown state strategy {strategy!r}; choose one of {', '.join(_STRATEGIES)}")
    return _STRATEGIES[strategy](model, **kwargs)
