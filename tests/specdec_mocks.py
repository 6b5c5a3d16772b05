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


class _SumAttention(torch.nn.Module):
    """One head that attends uniformly (q = k = 0) and copies each visible token's one-hot
    into the 'mean one-hot' channels: the output at a position is the histogram of the
    visible tokens divided by their count."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.dim, self.num_heads = dim, 1
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        with torch.no_grad():
            self.qkv.weight.zero_()
            for v in range(vocab):                      # value channel V+1+v <- own one-hot channel v
                self.qkv.weight[2 * dim + vocab + 1 + v, v] = 1.0
            self.proj.weight.copy_(torch.eye(dim))


class _SumRule(torch.nn.Module):
    """The 'MLP': counts = histogram * (position + 1); writes one-hot(sum mod m) * margin
    into the answer channels."""

    def __init__(self, vocab: int, modulus: int, margin: float) -> None:
        super().__init__()
        self.vocab, self.modulus, self.margin = vocab, modulus, margin

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        V = self.vocab
        visible = x[..., V] + 1.0                                               # (..., ) position + 1
        counts = torch.round(x[..., V + 1:2 * V + 1] * visible.unsqueeze(-1))  # (..., V)
        total = (counts * torch.arange(V, dtype=x.dtype, device=x.device)).sum(-1).round().long()
        out = torch.zeros_like(x)
        answer = torch.nn.functional.one_hot(total % self.modulus, V).to(x.dtype) * self.margin
        out[..., 2 * V + 2:] = answer
        return out


class _SumBlock(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, modulus: int, margin: float) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.Identity(), torch.nn.Identity()
        self.attn = _SumAttention(vocab, dim)
        self.mlp = _SumRule(vocab, modulus, margin)


class SumModLM(torch.nn.Module):
    """A context-sensitive language model for the window-edge tests: next token = (sum of
    the VISIBLE ids) mod ``modulus``, as a one-hot logit row of height ``margin``.

    Unlike ``TableLM`` its next token depends on the whole context it sees, so cropping the
    context (a sliding window, a re-prefill) changes the output: every loop's window rule
    shows. It is built like a one-block ``TransformerLM`` (``token_embed``, ``pos_embed``,
    ``blocks`` with ``ln_1``/``attn.qkv``/``attn.proj``/``ln_2``/``mlp``, ``ln_final``,
    ``unembed``, ``hidden_states``), so module 16's cached forward, the cached speculative
    loops and the tree passes run it too and compute the same rule over the keys they keep:
    uniform attention gives the histogram of the visible ids, the position gives their count.

    Channels (D = 3V + 2): own one-hot | position | visible histogram / count | unused |
    answer logits. ``rule(context)`` is the oracle: the next token after ``context`` (every id
    of it visible).
    """

    def __init__(self, vocab_size: int = 7, *, max_seq_len: int = 8, modulus: int | None = None,
                 margin: float = 10.0) -> None:
        super().__init__()
        V = vocab_size
        self.vocab_size, self.max_seq_len = V, max_seq_len
        self.modulus = V if modulus is None else modulus
        self.embedding_dim = D = 3 * V + 2
        self.num_layers, self.num_heads, self.hidden_dim = 1, 1, 4 * D
        self.token_embed = torch.nn.Embedding(V, D)
        self.pos_embed = torch.nn.Embedding(max_seq_len, D)
        with torch.no_grad():
            self.token_embed.weight.zero_()
            self.token_embed.weight[:, :V] = torch.eye(V)
            self.pos_embed.weight.zero_()
            self.pos_embed.weight[:, V] = torch.arange(max_seq_len, dtype=torch.float32)
        self.blocks = torch.nn.ModuleList([_SumBlock(V, D, self.modulus, margin)])
        self.ln_final = torch.nn.Identity()
        self.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return self.token_embed.weight.device

    def rule(self, context) -> int:
        """The oracle: (sum of ``context``) mod ``modulus``."""
        return int(sum(int(t) for t in context)) % self.modulus

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        return h[..., 2 * self.vocab_size + 2:]                                # (..., V)

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) -> (B, T, D), causal, positions 0..T-1."""
        B, T = ids.shape
        assert 1 <= T <= self.max_seq_len, f"T={T} exceeds max_seq_len={self.max_seq_len}"
        x = self.token_embed(ids) + self.pos_embed(torch.arange(T, device=ids.device))
        for blk in self.blocks:
            _, _, v = blk.attn.qkv(blk.ln_1(x)).split(blk.attn.dim, dim=-1)      # (B, T, D)
            mean = v.cumsum(dim=1) / torch.arange(1, T + 1, device=ids.device).view(1, T, 1)
            x = x + blk.attn.proj(mean)
            x = x + blk.mlp(blk.ln_2(x))
        return self.ln_final(x)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.unembed(self.hidden_states(ids))                           # (B, T, V)


def windowed_greedy(model, prompt, max_new_tokens: int) -> list[int]:
    """Plain greedy decoding by the rule alone, cropping to the last ``max_seq_len`` ids: the
    oracle module 11's ``generate`` must match (prompt + output, a list)."""
    ids = [int(t) for t in prompt]
    for _ in range(max_new_tokens):
        ids.append(model.rule(ids[-model.max_seq_len:]))
    return ids


def refill_greedy(model, prompt, max_new_tokens: int, refill_tokens: int | None = None) -> list[int]:
    """Greedy decoding by the rule with module 16's window policy (``cached_generate``): the
    visible context starts at ``start`` and, when it would exceed the window, restarts at the
    last ``refill_tokens`` ids (default ``max_seq_len // 2``)."""
    window = model.max_seq_len
    refill = max(1, window // 2) if refill_tokens is None else refill_tokens
    ids = [int(t) for t in prompt]
    start = max(0, len(ids) - window)
    for _ in range(max_new_tokens):
        if len(ids) - start > window:
            start = len(ids) - refill
        ids.append(model.rule(ids[start:]))
    return ids
