"""Optimisers that torch lacks.

``Lamb`` (You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes"), the
optimiser of DeiT-III: Adam's step plus decoupled weight decay, rescaled per parameter tensor by the trust
ratio ‖w‖ / ‖step‖, so that each tensor moves by a fraction ``lr`` of its own norm, whatever the scale of
its gradient. That is what lets a large batch take a large learning rate.
"""
from __future__ import annotations

import torch
from torch import Tensor


class Lamb(torch.optim.Optimizer):
    """LAMB with Adam's bias correction. Per parameter tensor w with gradient g, at step t:

        m ← β1·m + (1 − β1)·g,   v ← β2·v + (1 − β2)·g²
        u = (m / (1 − β1^t)) / (√(v / (1 − β2^t)) + eps) + weight_decay·w
        w ← w − lr · r · u,  r = ‖w‖ / ‖u‖ (1 where either norm is 0)

    As in timm's ``Lamb`` (DeiT-III's, also NVIDIA's LAMB), groups without weight decay (biases, norms,
    LayerScale: ``common.task`` puts every 1-D tensor there) take the plain Adam step (r = 1): a trust ratio
    would freeze a LayerScale started at 1e-4. timm's built-in global gradient-norm clipping (at 1.0) is
    left to the trainer (``trainer.gradient_clip_val``). ``eps`` 1e-8 is what DeiT-III passes (timm's
    ``--opt-eps``)."""

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"invalid LAMB settings: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return loss

    def _update(self, param: Tensor, group: dict) -> None:
        (beta1, beta2), decay = group["betas"], group["weight_decay"]
        state = self.state[param]
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(param), exp_avg_sq=torch.zeros_like(param))
        state["step"] += 1
        grad, t = param.grad, state["step"]
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt_().add_(group["eps"])
        update = (state["exp_avg"] / (1 - beta1**t)).div_(denom)
        if decay == 0:
            param.add_(update, alpha=-group["lr"])
            return
        update.add_(param, alpha=decay)
        weight_norm, update_norm = param.norm(), update.norm()
        trust = torch.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, 1.0)
        param.sub_(update * (group["lr"] * trust))
