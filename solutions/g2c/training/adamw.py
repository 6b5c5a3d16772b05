"""Module 03b: the AdamW optimizer, written on plain tensors.

Source: Loshchilov and Hutter, "Decoupled Weight Decay Regularization" (ICLR 2019),
Algorithm 2; the moment estimates and bias correction come from Kingma and Ba,
"Adam: A Method for Stochastic Optimization" (ICLR 2015), Algorithm 1.
"""

from __future__ import annotations

import torch

from .schedule import check_real_arg

__all__ = ["AdamW"]


class AdamW:
    """Adam with decoupled weight decay.

    For each parameter θ with gradient g, at step t (starting at 1)::

        θ ← θ − lr·λ·θ                          (decoupled decay, applied first)
        m ← β1·m + (1 − β1)·g
        v ← β2·v + (1 − β2)·g²
        m̂ = m / (1 − β1^t),  v̂ = v / (1 − β2^t)
        θ ← θ − lr · m̂ / (sqrt(v̂) + ε)

    Parameters whose ``.grad`` is None are skipped entirely (no decay, no moment update,
    their step counter does not advance), exactly like ``torch.optim.AdamW``.

    Args:
        params: list of float tensors with ``requires_grad=True``.
        lr: learning rate (may be changed between steps through ``self.lr``).
        betas: (β1, β2), each in [0, 1).
        eps: ε added to the denominator.
        weight_decay: λ, the decoupled decay coefficient (0 disables it).
        no_decay: tensors among ``params`` that get no weight decay (biases and LayerNorm
            gains, by the usual GPT recipe).

    Raises:
        TypeError: ``params`` not an iterable of tensors; ``lr``, ``eps``, ``weight_decay`` or a beta not a
            real number; ``betas`` not a pair.
        ValueError: empty parameter list, negative lr/eps/weight_decay, NaN or infinity, or betas out of range.
    """

    def __init__(self, params, *, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, no_decay=()) -> None:
        if isinstance(params, torch.Tensor) or not hasattr(params, "__iter__") or isinstance(params, (str, bytes)):
            raise TypeError(f"AdamW: params must be an iterable of tensors (e.g. model.parameters()), "
                            f"got {type(params).__name__}")
        self.params = list(params)
        skip = {id(p) for p in no_decay}
        if not self.params:
            raise ValueError("AdamW got an empty parameter list")
        if not all(isinstance(p, torch.Tensor) for p in self.params):
            raise TypeError("AdamW: params must be tensors, got "
                            f"{sorted({type(p).__name__ for p in self.params if not isinstance(p, torch.Tensor)})}")
        lr, eps = check_real_arg(lr, "lr", "AdamW", low=None), check_real_arg(eps, "eps", "AdamW", low=None)
        weight_decay = check_real_arg(weight_decay, "weight_decay", "AdamW", low=None)   # ranges: below
        if isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2:
            raise TypeError(f"AdamW: betas must be a pair (beta1, beta2) of reals in [0, 1), got "
                            f"{type(betas).__name__} {betas!r:.60}")
        betas = (check_real_arg(betas[0], "betas[0]", "AdamW", low=None),
                 check_real_arg(betas[1], "betas[1]", "AdamW", low=None))
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"AdamW needs lr, eps, weight_decay >= 0; got lr={lr}, eps={eps}, "
                             f"weight_decay={weight_decay}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"AdamW betas must be in [0, 1); got {betas}")
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.weight_decay = weight_decay
        self.state: list[dict] = [{"step": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p),
                                   "decay": id(p) not in skip} for p in self.params]

    def zero_grad(self) -> None:
        """Set every parameter's ``.grad`` to None."""
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Apply one AdamW update to every parameter that has a gradient.

        Steps:
            1. Skip parameters whose grad is None (``test_adamw_skips_none_grads``).
            2. Advance that parameter's step counter t.
            3. Decay the parameter: θ ← θ·(1 − lr·λ) (``test_adamw_decay_is_decoupled``).
            4. Update m and v in place (``state["m"]``, ``state["v"]``).
            5. Bias-correct and update θ (``test_adamw_matches_torch_over_many_steps``).
        """
        beta1, beta2 = self.betas
        for p, st in zip(self.params, self.state):
            # BEGIN SOLUTION
            if p.grad is None:
                continue
            g = p.grad
            st["step"] += 1
            t = st["step"]
            if self.weight_decay and st["decay"]:
                p.mul_(1.0 - self.lr * self.weight_decay)
            st["m"].mul_(beta1).add_(g, alpha=1.0 - beta1)
            st["v"].mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
            m_hat = st["m"] / (1.0 - beta1 ** t)
            v_hat = st["v"] / (1.0 - beta2 ** t)
            p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))
            # END SOLUTION

    def state_dict(self) -> dict:
        """Hyper-parameters and per-parameter state (cloned tensors), for checkpoints."""
        return {
            "lr": self.lr, "betas": tuple(self.betas), "eps": self.eps, "weight_decay": self.weight_decay,
            "state": [{"step": s["step"], "m": s["m"].clone(), "v": s["v"].clone(), "decay": s["decay"]}
                      for s in self.state],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state_dict()`` output.

        Raises:
            ValueError: the number or shapes of the stored moments do not match the parameters.
        """
        if len(state["state"]) != len(self.params):
            raise ValueError(f"AdamW.load_state_dict: {len(state['state'])} parameter states for "
                             f"{len(self.params)} parameters")
        for p, s in zip(self.params, state["state"]):
            if s["m"].shape != p.shape:
                raise ValueError(f"AdamW.load_state_dict: moment shape {tuple(s['m'].shape)} != "
                                 f"parameter shape {tuple(p.shape)}")
        self.lr, self.eps, self.weight_decay = state["lr"], state["eps"], state["weight_decay"]
        self.betas = tuple(state["betas"])
        self.state = [{"step": int(s["step"]), "m": s["m"].clone().to(p.device),
                       "v": s["v"].clone().to(p.device), "decay": bool(s.get("decay", True))}
                      for p, s in zip(self.params, state["state"])]
