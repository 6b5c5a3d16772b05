"""Table-lookup language models for the specdec tests (no checkpoint needed).

``TableLM`` returns logits that depend only on the token at each position: row t of the
output is ``table[ids[:, t]]``. Its greedy continuation is therefore a chain you can
follow by hand: after token v comes ``argmax(table[v])``. It has the attributes
``g2c.sampling.generate`` and ``g2c.specdec`` read (``vocab_size``, ``max_seq_len``,
``device``, ``training``, ``train``/``eval``) and records every input it is called with.
"""

from __future__ import annotations

import torch


class TableLM:
    """A (V, V) table posing as a language model: logits (B, T, V) = table[ids]."""

    def __init__(self, table: torch.Tensor, *, max_seq_len: int = 64) -> None:
        if table.dim() != 2 or table.shape[0] != table.shape[1]:
            raise ValueError(f"table must be (V, V), got {tuple(table.shape)}")
        self.table = table.float()
        self.vocab_size = table.shape[0]
        self.max_seq_len = max_seq_len
        self.device = torch.device("cpu")
        self.training = True
        self.calls: list[torch.Tensor] = []

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        assert ids.dim() == 2, f"expected (B, T) ids, got {tuple(ids.shape)}"
        assert 1 <= ids.shape[1] <= self.max_seq_len, f"T={ids.shape[1]} exceeds max_seq_len={self.max_seq_len}"
        self.calls.append(ids.detach().cpu().clone())
        return self.table[ids.cpu()]                                        # (B, T, V)

    def train(self, mode: bool = True) -> "TableLM":
        self.training = mode
        return self

    def eval(self) -> "TableLM":
        return self.train(False)


def chain_table(next_of: list[int], *, margin: float = 5.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """A (V, V) table whose row v has its argmax at ``next_of[v]`` (by ``margin``) over small noise."""
    vocab = len(next_of)
    table = torch.rand(vocab, vocab, generator=generator)                   # (V, V) in [0, 1)
    table[torch.arange(vocab), torch.tensor(next_of)] = 1.0 + margin
    return table


def follow_chain(next_of: list[int], start: int, n: int, *, eos_id: int | None = None) -> list[int]:
    """The n tokens after ``start`` along ``next_of`` (cut after ``eos_id``): the greedy oracle."""
    out, tok = [], start
    for _ in range(n):
        tok = next_of[tok]
        out.append(tok)
        if tok == eos_id:
            break
    return out


def random_next_of(vocab: int, generator: torch.Generator) -> list[int]:
    """A random successor map v -> next_of[v]."""
    return torch.randint(0, vocab, (vocab,), generator=generator).tolist()
