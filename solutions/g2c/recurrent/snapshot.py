"""Beyond (specdec-state): the snapshot strategy.

Copy every recurrent state before the block; after verification, restore the copy and
re-fold the accepted positions' inputs. The simplest undo for a state that cannot be
truncated, paid in state copies: one per round, a second one per round that rejects.
See ``transaction.py`` for the interface and docs/beyond/specdec-state.md for the costs.

Shape letters: B batch, H heads, d head width, T block length. States are (B, H, d, d) float32.
"""

from __future__ import annotations

import torch

from .model import RecurrenceInputs, RecurrentLM
from .scan import gla_chunk, gla_fold
from .transaction import StateTransaction

__all__ = ["SnapshotTransaction"]


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
