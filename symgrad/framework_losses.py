"""The margin losses of issue 30 in the frameworks (symgrad.torch and symgrad.jax): l1_loss,
margin_ranking_loss and hinge_embedding_loss with PyTorch's names, parameters and default
reduction ('mean').

Each is its elementwise symgrad op (the framework's op: autograd or custom_jvp, double backward,
torch.compile / jit and vmap as any elementwise op) and the framework's own reduction (torch.mean
/ torch.sum, jnp.mean / jnp.sum: at::mean's order and mean_backward in PyTorch, as
F.l1_loss's apply_loss_reduction).  hinge_embedding_loss is hinge.py's composition written in the
framework's where: ``where(target != 1, margin_ranking_loss(input, 0, 1; margin), 0) +
where(target != -1, input, 0)`` (aten's arithmetic; autograd differentiates the where and the
sum, the kink is the op's).  The generated/NumPy API (symgrad.load) keeps reduction='none' as its
default (losses.py).
"""

from __future__ import annotations

from . import losses
from .hinge import _check_margin


def kink(make, name: str, margin, settings: dict):
    """The elementwise op of loss ``name`` (make: symgrad.torch.op or symgrad.jax.op), made
    eagerly (an nn.Module makes it in its constructor, as torch.compile needs)."""
    op = "l1_loss" if name == "l1_loss" else "margin_ranking_loss"
    extra = {} if name == "l1_loss" else {"margin": _check_margin(name, margin)}
    return make(op, **extra, **{k: v for k, v in settings.items() if v is not None})


def reduce(xp, op: str, elements, reduction: str):
    """The framework's reduction of the elementwise loss (xp: torch or jax.numpy)."""
    reduction = losses.check_reduction(op, reduction)
    if reduction == "none":
        return elements
    return xp.mean(elements) if reduction == "mean" else xp.sum(elements)


def loss(name: str, fn, xp, inputs, reduction: str):
    """Loss ``name`` of ``inputs`` (PyTorch's positional tensors) through its op ``fn`` (kink)."""
    if name != "hinge_embedding_loss":
        return reduce(xp, name, fn(*inputs), reduction)
    input, target = inputs
    zeros = xp.zeros_like(input)
    output = xp.where(target != 1, fn(input, zeros, xp.ones_like(input)), zeros) + xp.where(target != -1, input, zeros)
    return reduce(xp, name, output, reduction)
