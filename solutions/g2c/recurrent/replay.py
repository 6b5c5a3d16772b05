"""Beyond (specdec-state): checkpoint + input replay.

ReplaySSM's pattern (Dao AI Lab, "ReplaySSM: Cache SSM Inputs, Not State", 2026): keep a
checkpoint state and a buffer of recent recurrence inputs; verify from checkpoint + buffer
without writing any state; commit and reject by moving the buffer pointer; fold the buffer
into a new checkpoint when the next block would not fit. See ``transaction.py`` for the
interface and docs/beyond/specdec-state.md for the costs.

Shape letters: B batch, H heads, d head width, T block length, C buffer capacity.
"""

from __future__ import annotations

import torch

from g2c.sampling.model import check_whole

from .model import RecurrenceInputs, RecurrentLM
from .scan import gla_chunk, gla_fold
from .transaction import StateTransaction

__all__ = ["ReplayTransaction"]


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
        capacity = check_whole(capacity, f"replay: capacity must be an int >= 1 buffer positions, got {capacity!r}")
        self.capacity = capacity
        self.max_prefill_block = capacity
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
