"""Module 03: the layers every course model is built from.

Shape letters: B batch, T time, D width (``in_features``/``dim``), V vocabulary.
Every layer here is an exercise in its ``forward``; construction is provided.
Parameters are float32 leaf tensors with ``requires_grad=True``.
"""

from __future__ import annotations

import math

import torch

from .module import Module, check_features, check_int, check_real

__all__ = ["Dropout", "Embedding", "GELU", "LayerNorm", "Linear"]


def _normal(shape: tuple[int, ...], std: float, generator: torch.Generator | None) -> torch.Tensor:
    return (torch.randn(shape, generator=generator) * std).requires_grad_(True)


class Linear(Module):
    """Affine map ``y = x W^T + b``.

    Args:
        in_features: size of the last input dimension.
        out_features: size of the last output dimension.
        bias: add a learned bias (default True).
        init_std: weights start as N(0, init_std^2) (GPT-2 uses 0.02); the bias starts at 0.
        generator: optional ``torch.Generator`` for the initialisation.

    Attributes:
        weight: (out_features, in_features) float32.
        bias: (out_features,) float32, or None.

    Raises:
        TypeError: a size that is not an int (a bool, a float, a tensor), ``init_std`` not a real
            number, ``bias`` not a bool; the message names the argument.
        ValueError: a size < 1, ``init_std`` negative, NaN or infinite.
    """

    def __init__(self, in_features: int, out_features: int, *, bias: bool = True,
                 init_std: float = 0.02, generator: torch.Generator | None = None) -> None:
        super().__init__()
        in_features = check_int(in_features, "in_features", where="Linear")
        out_features = check_int(out_features, "out_features", where="Linear")
        init_std = check_real(init_std, "init_std", low=0.0, where="Linear")
        if not isinstance(bias, bool):
            raise TypeError(f"Linear: bias must be True or False, got {type(bias).__name__} {bias!r:.60}")
        self.in_features = in_features
        self.out_features = out_features
        self.weight = _normal((out_features, in_features), init_std, generator)
        self.bias = torch.zeros(out_features, requires_grad=True) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the affine map to the last dimension.

        Args:
            x: (..., in_features) float.

        Returns:
            (..., out_features), same leading dimensions.

        Steps:
            1. Multiply by the transposed weight: (..., in) @ (in, out) -> (..., out).
               (``test_linear_matches_torch``)
            2. Add the bias if there is one (it broadcasts over the leading dimensions).
               (``test_linear_without_bias``)

        Raises (checked before your code runs):
            TypeError: x is not a tensor.
            ValueError: x is not floating point or its last dimension is not ``in_features``.
        """
        check_features(x, self.in_features, "x", "Linear")
        # BEGIN SOLUTION
        y = x @ self.weight.t()
        if self.bias is not None:
            y = y + self.bias
        return y
        # END SOLUTION


class Embedding(Module):
    """A lookup table: row ``i`` of ``weight`` is the vector of id ``i``.

    Args:
        num_embeddings: number of rows (the vocabulary size V, or the context length).
        embedding_dim: width D of each row.
        init_std: rows start as N(0, init_std^2).
        generator: optional ``torch.Generator`` for the initialisation.

    Attributes:
        weight: (num_embeddings, embedding_dim) float32.

    Raises:
        TypeError: a size that is not an int, ``init_std`` not a real number.
        ValueError: a size < 1, ``init_std`` negative, NaN or infinite.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, init_std: float = 0.02,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        num_embeddings = check_int(num_embeddings, "num_embeddings", where="Embedding")
        embedding_dim = check_int(embedding_dim, "embedding_dim", where="Embedding")
        init_std = check_real(init_std, "init_std", low=0.0, where="Embedding")
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = _normal((num_embeddings, embedding_dim), init_std, generator)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Look up rows.

        Args:
            ids: integer tensor of any shape (...,), values in [0, num_embeddings).

        Returns:
            (..., embedding_dim) float32.

        Raises:
            TypeError: ``ids`` is not a tensor (checked before your code runs), or not an integer
                tensor; the message says the layer expects "integer ids" and names the dtype.
            IndexError: an id is negative or >= num_embeddings; the message gives the range
                as "[0, num_embeddings)" (e.g. "[0, 5)") and the smallest and largest id.

        Steps:
            1. Check the dtype and the range of the ids (``test_embedding_rejects_bad_ids``).
            2. Index the weight with the ids; indexing keeps the autograd graph, so the
               rows that were used receive gradient (``test_embedding_matches_torch``).
        """
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"Embedding expects integer ids as a tensor, got {type(ids).__name__}")
        # BEGIN SOLUTION
        if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise TypeError(f"Embedding expects integer ids, got dtype {ids.dtype}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            raise IndexError(f"Embedding ids must lie in [0, {self.num_embeddings}); "
                             f"got min {int(ids.min())}, max {int(ids.max())}")
        return self.weight[ids.long()]
        # END SOLUTION


class LayerNorm(Module):
    """Layer normalisation over the last dimension (Ba, Kiros, Hinton 2016).

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` where mean and the *biased*
    variance (divide by D, not D-1) are taken over the last dimension.

    Args:
        dim: size D of the last dimension.
        eps: added to the variance for stability (GPT-2 uses 1e-5).

    Attributes:
        weight: (D,) float32, starts at 1.
        bias: (D,) float32, starts at 0.

    Raises:
        TypeError: ``dim`` not an int, ``eps`` not a real number.
        ValueError: ``dim`` < 1, ``eps`` negative, NaN or infinite.
    """

    def __init__(self, dim: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        dim = check_int(dim, "dim", where="LayerNorm")
        eps = check_real(eps, "eps", low=0.0, where="LayerNorm")        # 0 is allowed (exact normalisation)
        self.dim = dim
        self.eps = eps
        self.weight = torch.ones(dim, requires_grad=True)
        self.bias = torch.zeros(dim, requires_grad=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise each vector along the last dimension, then scale and shift.

        Args:
            x: (..., D) float.

        Returns:
            (..., D), the same dtype as ``x``.

        Steps:
            1. Mean over the last dimension, kept as (..., 1).
            2. Biased variance over the last dimension, (..., 1) (``test_layernorm_uses_biased_variance``).
            3. Normalise with ``eps`` inside the square root, then apply weight and bias
               (``test_layernorm_matches_torch``).

        Raises (checked before your code runs):
            TypeError: x is not a tensor.
            ValueError: x is not floating point or its last dimension is not ``dim``.
        """
        check_features(x, self.dim, "x", "LayerNorm")
        # BEGIN SOLUTION
        mean = x.mean(dim=-1, keepdim=True)                      # (..., 1)
        var = (x - mean).pow(2).mean(dim=-1, keepdim=True)       # (..., 1)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias
        # END SOLUTION


class GELU(Module):
    """Gaussian error linear unit, exact form (Hendrycks and Gimpel 2016, eq. 1).

    ``GELU(x) = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))``. GPT-2 itself used a tanh
    approximation; the course (and ``torch.nn.GELU()`` by default) uses the exact erf form.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply GELU elementwise.

        Args:
            x: any shape, float.

        Returns:
            same shape and dtype.

        Steps:
            1. Compute the standard normal CDF with ``torch.erf`` and multiply
               (``test_gelu_matches_torch``).
        """
        # BEGIN SOLUTION
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
        # END SOLUTION


class Dropout(Module):
    """Inverted dropout (Srivastava et al. 2014): zero each element with probability ``p``
    during training and scale survivors by ``1/(1-p)``; the identity in eval mode.

    Args:
        p: drop probability in [0, 1).
        generator: optional ``torch.Generator`` for the mask (the default RNG otherwise).

    Raises:
        TypeError: ``p`` not a real number (a bool, a string, a tensor of several elements).
        ValueError: ``p`` outside [0, 1), or NaN.
    """

    def __init__(self, p: float = 0.0, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        p = check_real(p, "p (the dropout probability)", low=0.0, high=1.0, high_open=True, where="Dropout")
        self.p = p
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply dropout.

        Args:
            x: any shape, float.

        Returns:
            same shape; ``x`` itself in eval mode or when p == 0.

        Devices: a ``torch.Generator`` draws only on its own device (a CPU generator cannot
        fill a CUDA or MPS tensor), so with ``self.generator`` the uniforms are drawn on the
        generator's device and the mask is moved to x's device; the same seed then gives the
        same mask on every device. Without a generator, draw directly on x's device.

        Steps:
            1. Return ``x`` unchanged when not training or p == 0 (``test_dropout_eval_is_identity``).
            2. Draw a keep-mask with probability 1-p (on ``self.generator.device`` when there
               is a generator, then ``.to(x.device)``; ``test_dropout_with_a_cpu_generator_on_a_device``)
               and scale kept values by 1/(1-p) so the expectation is unchanged
               (``test_dropout_keeps_expectation``).
        """
        # BEGIN SOLUTION
        if not self.training or self.p == 0.0:
            return x
        draw_on = self.generator.device if self.generator is not None else x.device
        keep = torch.rand(x.shape, generator=self.generator, device=draw_on).to(x.device) >= self.p
        return x * keep.to(x.dtype) / (1.0 - self.p)
        # END SOLUTION
