"""The ensemble trainer's optimiser step (``runners.runs.ensemble``): AdamW and gradient-norm clipping as torch runs
them, vectorised over the runs of a chunk, whose parameters are stacked along a first dimension."""
from __future__ import annotations

import torch
from torch import Tensor


def _per_member(values: list[float], like: Tensor) -> Tensor:
    """float32 [E, 1, ...] of per-member Python floats, rounded as torch rounds a Python scalar argument."""
    return torch.tensor(values, dtype=like.dtype).view(-1, *([1] * (like.dim() - 1)))


class StackedAdamW:
    """``torch.optim.AdamW`` as it runs on CPU (its single-tensor update, amsgrad off), on parameters
    stacked over members, each with its own base learning rate and weight decay: the vectorised step's
    optimiser. One torch optimiser per member over its slices would give the same bits but cost three times
    the chunk's training (a Python call per member and step). The operations, their order and their scalars
    are torch's, so a member's slice gets what its own AdamW would give (``tests/test_ensemble.py`` checks
    it to the bit); the groups are ``common.task.build_optimizer``'s (weight decay on the parameters
    ``Task.decayed`` names)."""

    def __init__(self, params: dict[str, Tensor], decayed: set[str], lrs: list[float], weight_decays: list[float],
                 betas: tuple[float, float], eps: float = 1e-8):
        self.lrs, self.weight_decays = lrs, weight_decays
        self.beta1, self.beta2 = betas
        self.eps, self.steps = eps, 0
        self.decay = decayed
        self.exp_avg = {name: torch.zeros_like(p) for name, p in params.items()}
        self.exp_avg_sq = {name: torch.zeros_like(p) for name, p in params.items()}

    @torch.no_grad()
    def step(self, params: dict[str, Tensor], grads: dict[str, Tensor], factor: float) -> None:
        """One update with every member's learning rate at ``factor`` × its base (the LambdaLR schedule)."""
        self.steps += 1
        lrs = [lr * factor for lr in self.lrs]
        bias_correction1 = 1 - self.beta1**self.steps
        bias_correction2_sqrt = (1 - self.beta2**self.steps) ** 0.5
        for name, param in params.items():
            grad = grads[name]
            if name in self.decay:
                param.mul_(_per_member([1 - lr * wd for lr, wd in zip(lrs, self.weight_decays)], param))
            self.exp_avg[name].lerp_(grad, 1 - self.beta1)
            self.exp_avg_sq[name].mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
            denom = (self.exp_avg_sq[name].sqrt() / bias_correction2_sqrt).add_(self.eps)
            # addcdiv_(exp_avg, denom, value=-step_size) computes self + (value * exp_avg) / denom
            step_size = _per_member([-lr / bias_correction1 for lr in lrs], param)
            param.add_(step_size * self.exp_avg[name] / denom)


@torch.no_grad()
def clip_grad_norms_(grads: dict[str, Tensor], order: list[str], max_norm: float) -> None:
    """``torch.nn.utils.clip_grad_norm_``, which Lightning applies, per member of the stack: the norm of each
    parameter's gradient, their norm in ``order`` (the optimiser's: decayed parameters first), and the same
    clipping coefficient (checked to the bit against torch's)."""
    norms = torch.stack([torch.linalg.vector_norm(grads[name].flatten(1), dim=1) for name in order], dim=1)
    coef = torch.clamp(max_norm / (torch.linalg.vector_norm(norms, dim=1) + 1e-6), max=1.0)
    for grad in grads.values():
        grad.mul_(coef.view(-1, *([1] * (grad.dim() - 1))))
