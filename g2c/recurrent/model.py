"""Beyond (specdec-state): a small recurrent language model and its hybrid variant.

``GatedLinearAttention`` is the token mixer: queries, keys and values as in attention, plus
one data-dependent decay per head, a_t = sigmoid(w . x_t + b) (Mamba-2's scalar decay, Dao and
Gu 2024, section 6; Yang et al. 2024's gated linear attention with a scalar gate). Its
state is (H, d, d) per layer whatever the context length (``scan.py`` has the maths).

``RecurrentLM`` stacks pre-norm blocks (as module 09's ``Block``: x + mixer(ln_1(x)), then
x + mlp(ln_2(x))) over the course's token ``Embedding``, with a final ``LayerNorm`` and the
tied unembedding. ``layout`` says which layers are recurrent (``"R"``) and which are the
course's attention ``Block`` (``"A"``): ``"RRRR"`` is the recurrent LM, ``"RARA"`` a hybrid
(as Jamba, Lieber et al. 2024, which interleaves Mamba and attention layers and, like this
model, uses no position embeddings: the recurrent layers carry order).

Stateful passes go through ``RecurrentLM.run(ids, access)``: the model does the maths and
asks ``access`` for the two things that depend on the stored state:

    access.recurrent(layer, inputs) -> o (B, H, T, d)   outputs of a recurrent layer
    access.attention(layer, attn, h) -> (B, T, D)       an attention sub-layer on the new positions

Attention layers keep their keys and values in module 16's ``KVCache`` (one cache layer per
attention layer, ``new_kv_cache``), through module 16's ``cached_attention``: the cache
rolls back by moving its ``length`` pointer. ``DecodeState`` (plain decoding: state updated
in place, K/V rows appended) is one access object; the speculative ``StateTransaction``
strategies are the others.

Shape letters: B batch, T time, D width, H heads, d = D / H, V vocabulary. Everything is
float32. No exercise in this file; it needs modules 03 (layers) and, for hybrid layouts,
07-09 (the course's attention ``Block``) and 16 (``KVCache``, ``cached_attention``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from g2c.kvcache import KVCache, cached_attention
from g2c.nn import Embedding, LayerNorm, Linear, Module
from g2c.nn.module import check_int
from g2c.nn.module import check_real as check_finite
from g2c.sampling.model import check_generator, check_real, check_whole
from g2c.transformer.block import MLP, Block

from .scan import gla_chunk, gla_recurrent

__all__ = ["DecodeState", "GatedLinearAttention", "RecurrenceInputs", "RecurrentBlock", "RecurrentLM",
           "fan_in_init_", "new_kv_cache", "perturbed_twin"]


@dataclass
class RecurrenceInputs:
    """What one recurrent layer consumes per position: the input log that replay buffers.

    Attributes:
        q, k, v: (B, H, T, d) float32 (k already scaled by 1/sqrt(d)).
        log_a: (B, H, T) float32, log of the decay, <= 0.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    log_a: torch.Tensor


def _split(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    B, T, D = x.shape
    return x.view(B, T, num_heads, D // num_heads).transpose(1, 2)          # (B, H, T, d)


def _merge(x: torch.Tensor) -> torch.Tensor:
    B, H, T, d = x.shape
    return x.transpose(1, 2).contiguous().view(B, T, H * d)                 # (B, T, D)


class GatedLinearAttention(Module):
    """Gated linear attention with a scalar decay per head.

    Args:
        dim: width D.
        num_heads: H, divides D.
        decay_bias: initial gate bias; a = sigmoid(decay_bias) ~ 0.88 for the default 2.0,
            a memory of roughly 1 / (1 - a) ~ 8 tokens at initialisation.
        generator: optional ``torch.Generator`` for the initialisation.

    Attributes:
        qkv: ``Linear(D, 3D)`` -> [queries | keys | values].
        gate: ``Linear(D, H)`` -> one decay logit per head.
        proj: ``Linear(D, D)``, the output projection.

    Raises:
        TypeError: ``dim`` or ``num_heads`` not an int (a bool, a float, a tensor), ``decay_bias`` not
            a real number; the message names the argument.
        ValueError: a size < 1, D not divisible by H, ``decay_bias`` NaN or infinite.
    """

    def __init__(self, dim: int, num_heads: int, *, decay_bias: float = 2.0,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        dim = check_int(dim, "dim", where="GatedLinearAttention")
        num_heads = check_int(num_heads, "num_heads", where="GatedLinearAttention")
        decay_bias = check_finite(decay_bias, "decay_bias", where="GatedLinearAttention")
        if dim % num_heads:
            raise ValueError(f"GatedLinearAttention: dim {dim} is not divisible by num_heads {num_heads}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.qkv = Linear(dim, 3 * dim, generator=generator)
        self.gate = Linear(dim, num_heads, generator=generator)
        self.proj = Linear(dim, dim, generator=generator)
        with torch.no_grad():
            self.gate.bias.fill_(decay_bias)

    def inputs(self, x: torch.Tensor) -> RecurrenceInputs:
        """(B, T, D) normalised stream -> the recurrence inputs of every position."""
        q, k, v = self.qkv(x).split(self.dim, dim=-1)                       # (B, T, D) each
        q, k, v = (_split(t, self.num_heads) for t in (q, k, v))             # (B, H, T, d)
        log_a = F.logsigmoid(self.gate(x)).transpose(1, 2)                   # (B, H, T)
        return RecurrenceInputs(q, k / math.sqrt(self.head_dim), v, log_a.contiguous())

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """(B, H, T, d) readouts -> (B, T, D) through the output projection."""
        return self.proj(_merge(o))

    def zero_state(self, batch: int = 1, device: torch.device | str | None = None) -> torch.Tensor:
        """The empty state (B, H, d, d) float32 of zeros."""
        return torch.zeros(batch, self.num_heads, self.head_dim, self.head_dim, device=device)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunked form over (B, T, D) from ``state`` (zeros if None) -> (y (B, T, D), state_T)."""
        inp = self.inputs(x)
        if state is None:
            state = self.zero_state(x.shape[0], x.device)
        o, state = gla_chunk(inp.q, inp.k, inp.v, inp.log_a, state)
        return self.output(o), state

    def step(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent form, one token at a time: (B, T, D), state -> (y (B, T, D), state_T)."""
        inp = self.inputs(x)
        o, state = gla_recurrent(inp.q, inp.k, inp.v, inp.log_a, state)
        return self.output(o), state


class RecurrentBlock(Module):
    """Pre-norm block with a recurrent mixer: x + mixer(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, dim: int, num_heads: int, *, hidden_dim: int,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(dim)
        self.mixer = GatedLinearAttention(dim, num_heads, generator=generator)
        self.ln_2 = LayerNorm(dim)
        self.mlp = MLP(dim, hidden_dim, generator=generator)

    def forward(self, x: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, D), state -> (B, T, D), state_T (chunked form)."""
        y, state = self.mixer(self.ln_1(x), state)
        x = x + y
        return x + self.mlp(self.ln_2(x)), state


class RecurrentLM(Module):
    """A small recurrent (or hybrid) language model.

    Args:
        vocab_size: V.
        embedding_dim: D.
        num_layers: number of blocks.
        num_heads: H, divides D; every layer's state is (H, D/H, D/H).
        layout: one letter per layer, ``"R"`` recurrent or ``"A"`` attention (module 09's
            ``Block``); default all recurrent.
        max_seq_len: the K/V capacity of attention layers (a pure recurrent model has no
            window; the attribute also sets the drafter window of ``g2c.specdec.draft_greedy``).
        hidden_dim: MLP width (default 4 D).
        generator: ``torch.Generator`` for the initialisation (GPT-2's N(0, 0.02), residual
            projections scaled by 1/sqrt(2 num_layers)).

    Attributes:
        token_embed: ``Embedding(V, D)``, also the tied unembedding.
        blocks: list of ``RecurrentBlock`` / ``Block``.
        ln_final: ``LayerNorm(D)``.
        layout, vocab_size, embedding_dim, num_layers, num_heads, head_dim, max_seq_len.
        config: the constructor's keyword arguments (to build a twin).

    Raises:
        ValueError: a size is not positive, D is not divisible by H, or ``layout`` is not a
            string of ``num_layers`` letters from "RA".
    """

    def __init__(self, vocab_size: int, embedding_dim: int, num_layers: int, num_heads: int, *,
                 layout: str | None = None, max_seq_len: int = 256, hidden_dim: int | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        for name, value in [("vocab_size", vocab_size), ("embedding_dim", embedding_dim),
                            ("num_layers", num_layers), ("num_heads", num_heads), ("max_seq_len", max_seq_len)]:
            check_whole(value, f"RecurrentLM: {name} must be an int >= 1, got {value!r}")
        if embedding_dim % num_heads:
            raise ValueError(f"RecurrentLM: embedding_dim {embedding_dim} is not divisible by num_heads {num_heads}")
        layout = "R" * num_layers if layout is None else layout
        if not isinstance(layout, str) or len(layout) != num_layers or set(layout) - set("RA"):
            raise (ValueError if isinstance(layout, str) else TypeError)(
                f"RecurrentLM: layout must be {num_layers} letters from 'RA' (R recurrent, A attention), e.g. "
                f"{('RA' * num_layers)[:num_layers]!r}; got {layout!r}")
        self.vocab_size, self.embedding_dim, self.num_layers = vocab_size, embedding_dim, num_layers
        self.num_heads, self.head_dim, self.max_seq_len = num_heads, embedding_dim // num_heads, max_seq_len
        self.layout = layout
        hidden = hidden_dim or 4 * embedding_dim
        self.config = dict(vocab_size=vocab_size, embedding_dim=embedding_dim, num_layers=num_layers,
                           num_heads=num_heads, layout=layout, max_seq_len=max_seq_len, hidden_dim=hidden)
        self.token_embed = Embedding(vocab_size, embedding_dim, generator=generator)
        self.blocks = [RecurrentBlock(embedding_dim, num_heads, hidden_dim=hidden, generator=generator) if c == "R"
                       else Block(embedding_dim, num_heads, hidden_dim=hidden, generator=generator) for c in layout]
        self.ln_final = LayerNorm(embedding_dim)
        with torch.no_grad():
            for blk in self.blocks:
                (blk.mixer if isinstance(blk, RecurrentBlock) else blk.attn).proj.weight.mul_(
                    1.0 / math.sqrt(2 * num_layers))
                blk.mlp.proj.weight.mul_(1.0 / math.sqrt(2 * num_layers))

    @property
    def recurrent_layers(self) -> list[int]:
        """Indices of the recurrent layers."""
        return [i for i, c in enumerate(self.layout) if c == "R"]

    @property
    def attention_layers(self) -> list[int]:
        """Indices of the attention layers."""
        return [i for i, c in enumerate(self.layout) if c == "A"]

    def state_nbytes(self, batch: int = 1) -> int:
        """Bytes of every recurrent layer's state: layers x B x H x d x d x 4."""
        return len(self.recurrent_layers) * batch * self.num_heads * self.head_dim ** 2 * 4

    def _check_ids(self, ids: torch.Tensor) -> None:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype.is_floating_point \
                or ids.dtype == torch.bool or ids.shape[1] < 1:
            shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"RecurrentLM expects integer ids of shape (B, T) with T >= 1; got {shape}")

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln_final(x) @ self.token_embed.weight.t()               # (B, T, V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits of a whole sequence from the empty state (chunked form; ``Block`` for "A").

        Args:
            ids: (B, T) int64; T <= max_seq_len when the layout has attention layers.

        Returns:
            logits (B, T, V) float32; row t scores the token at position t + 1.

        Raises:
            ValueError: ids not 2-D integers with T >= 1, or T > max_seq_len with attention layers.
        """
        self._check_ids(ids)
        if self.attention_layers and ids.shape[1] > self.max_seq_len:
            raise ValueError(f"sequence length T={ids.shape[1]} exceeds max_seq_len={self.max_seq_len} "
                             "of the attention layers; crop the sequence")
        x = self.token_embed(ids)                                           # (B, T, D)
        for blk in self.blocks:
            x = blk(x)[0] if isinstance(blk, RecurrentBlock) else blk(x)
        return self._logits(x)

    def run(self, ids: torch.Tensor, access) -> torch.Tensor:
        """A stateful pass over a block: the model's maths, ``access``'s state.

        Args:
            ids: (B, T) int64, the block (continuing whatever ``access`` has stored).
            access: an object with ``recurrent(layer, RecurrenceInputs) -> o (B, H, T, d)``
                and ``attention(layer, attn, h) -> (B, T, D)`` (``attn`` the block's module 08
                ``MultiHeadAttention``, ``h`` (B, T, D) the normalised stream of the block).

        Returns:
            logits (B, T, V) float32.

        Raises:
            ValueError: ids not 2-D integers with T >= 1; K/V rows beyond ``max_seq_len``
                (raised by the access object's storage).
        """
        self._check_ids(ids)
        x = self.token_embed(ids)                                           # (B, T, D)
        for i, blk in enumerate(self.blocks):
            h = blk.ln_1(x)
            if isinstance(blk, RecurrentBlock):
                x = x + blk.mixer.output(access.recurrent(i, blk.mixer.inputs(h)))
            else:
                x = x + access.attention(i, blk.attn, h)
            x = x + blk.mlp(blk.ln_2(x))
        return self._logits(x)


def _check_seeded(model, generator, who: str) -> None:
    if not isinstance(model, RecurrentLM):
        raise TypeError(f"{who}: model must be a RecurrentLM, got {type(model).__name__}")
    if generator is None:
        raise TypeError(f"{who}: generator must be a seeded torch.Generator (the draw must be reproducible), "
                        "got None; use torch.Generator().manual_seed(seed)")
    check_generator(generator)


@torch.no_grad()
def fan_in_init_(model: RecurrentLM, *, generator: torch.Generator, gain: float = 1.0) -> RecurrentLM:
    """Redraw an untrained model's weights so that its greedy chain is varied; returns it.

    Under GPT-2's N(0, 0.02) every block adds almost nothing to the tied embedding, so an
    untrained LM just predicts the token it was fed and greedy decoding repeats one id:
    useless for checking that speculation follows the target. Here every matrix of fan-in n
    is drawn from N(0, gain^2 / n) (LeCun et al. 1998, "Efficient BackProp", section 4.6) and
    the embedding from N(0, 1); biases, LayerNorms and the decay gate's bias stay as they
    were. Losslessness and the state costs do not depend on training; acceptance does.

    Args:
        model: a ``RecurrentLM``, changed in place.
        generator: ``torch.Generator`` on the CPU (required: the draw must be reproducible).
        gain: scale of the weights (default 1.0), finite and > 0.

    Raises:
        TypeError: model not a ``RecurrentLM``, generator not a ``torch.Generator`` (None
            included), gain not a real number.
        ValueError: gain not finite and > 0; a generator on another device than the CPU.
    """
    _check_seeded(model, generator, "fan_in_init_")
    gain = check_real(gain, "fan_in_init_: gain", low=0, low_open=True)
    for name, p in model.named_parameters():
        if p.dim() != 2:
            continue
        std = 1.0 if name.startswith("token_embed") else gain / p.shape[1] ** 0.5
        p.copy_(torch.randn(p.shape, generator=generator) * std)
    return model


@torch.no_grad()
def perturbed_twin(model: RecurrentLM, *, sigma: float, generator: torch.Generator) -> RecurrentLM:
    """A same-family drafter: a copy of ``model`` whose every weight matrix gets relative noise.

    Each matrix W becomes W + sigma * std(W) * N(0, 1). sigma = 0 is a perfect drafter;
    growing sigma lowers acceptance smoothly, which lets a cost table sweep the accepted
    length without training anything.

    Args:
        model: a ``RecurrentLM`` (not modified).
        sigma: relative noise, >= 0.
        generator: ``torch.Generator`` on the CPU.

    Raises:
        TypeError: model not a ``RecurrentLM``, generator not a ``torch.Generator``, sigma not a
            real number.
        ValueError: sigma < 0 or not finite; a generator on another device than the CPU.
    """
    _check_seeded(model, generator, "perturbed_twin")
    sigma = check_real(sigma, "perturbed_twin: sigma", low=0)
    twin = RecurrentLM(**model.config)
    twin.load_state_dict(model.state_dict())
    for _, p in twin.named_parameters():
        if p.dim() == 2:
            p.add_((torch.randn(p.shape, generator=generator) * sigma * float(p.std())).to(p.device))
    return twin.to(model.device)


def new_kv_cache(model: RecurrentLM, batch: int = 1) -> tuple[KVCache | None, dict[int, int]]:
    """Module 16's ``KVCache`` with one cache layer per attention layer of ``model``.

    Returns:
        (cache, slots): the cache (None for a model without attention layers) on the model's
        device, capacity ``model.max_seq_len``, and {model layer index: cache layer index}.
    """
    slots = {layer: j for j, layer in enumerate(model.attention_layers)}
    if not slots:
        return None, slots
    return KVCache(len(slots), batch, model.num_heads, model.head_dim, model.max_seq_len,
                   device=model.device), slots


class DecodeState:
    """Plain decoding: the reference every speculative strategy must match.

    Recurrent states are updated with the recurrent form (one update per token, in place
    of the old state); attention layers append K/V rows.

    Args:
        model: a ``RecurrentLM``.
        batch: B (default 1).

    Attributes:
        states: {layer: (B, H, d, d)} for recurrent layers.
        kv: module 16 ``KVCache`` of the attention layers (None without any); kv_slots maps
            a model layer to its cache layer.
        length: tokens fed so far.
    """

    def __init__(self, model: RecurrentLM, batch: int = 1) -> None:
        device = model.device
        self.model = model
        self.states = {i: model.blocks[i].mixer.zero_state(batch, device) for i in model.recurrent_layers}
        self.kv, self.kv_slots = new_kv_cache(model, batch)
        self.length = 0

    def recurrent(self, layer: int, inp: RecurrenceInputs) -> torch.Tensor:
        o, self.states[layer] = gla_recurrent(inp.q, inp.k, inp.v, inp.log_a, self.states[layer])
        return o

    def attention(self, layer: int, attn, h: torch.Tensor) -> torch.Tensor:
        return cached_attention(attn, h, self.kv, self.kv_slots[layer])

    def kv_rows(self) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """{layer: (K, V)} the committed rows (B, H, length, d) of every attention layer (views)."""
        return {i: (self.kv.keys(j), self.kv.values(j)) for i, j in self.kv_slots.items()}

    @torch.no_grad()
    def feed(self, ids) -> torch.Tensor:
        """Feed tokens one at a time; return the logits (T, V) of batch row 0 (B = 1 input).

        Args:
            ids: 1-D int tensor or list of token ids.
        """
        ids = torch.as_tensor(ids, dtype=torch.long).view(-1)
        rows = []
        for t in ids.tolist():
            tok = torch.tensor([[t]], device=self.model.device)
            rows.append(self.model.run(tok, self)[0, -1])
            if self.kv is not None:
                self.kv.advance(1)
            self.length += 1
        return torch.stack(rows)
