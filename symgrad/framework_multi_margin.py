"""F.multi_margin_loss with p=1 in the frameworks (issue 30): symgrad.torch's multi_margin_loss and
MultiMarginLoss, symgrad.jax's multi_margin_loss; PyTorch's names, parameters and default
reduction ('mean').  The definition and the two arithmetics are symgrad/multi_margin.py's (the
NumPy module): per row (1/C) sum_{i != y} w[y] max(0, z_i), z_i = (margin - x[y]) + x[i], each
hinge's weight k(z_i) relu's backward of ones under the preset's (or the given) tie policy and
NaN rule.

* torch (every convention): aten's CPU kernel in torch operations, inside an
  autograd.Function whose backward is aten's multi_margin_loss_backward (``_torch_backward``),
  made of relu's torch backend module (k) and torch code, so it runs on any device and
  torch.compile(fullgraph=True) traces it.  A row's active hinges (k != 0) are added one at a
  time into +0 in the dtype, then divided by C; 'mean'/'sum' add the rows in float64 (a cumsum:
  at::acc_type's double on the CPU, added in order) and 'mean' divides by N there.  float16 and
  bfloat16, which PyTorch's CPU kernel refuses, take the same steps in their dtype (the NumPy
  module's torch arithmetic, but that the rows are added in float64, not float32: the same
  where float32's partial sums are exact).  Double backward: the backward is linear in
  grad_output and constant in the input (k is piecewise constant), as PyTorch's.
* jax: the expression a JAX user writes (multi_margin.py's docstring) with symgrad.jax's relu
  for jnp.maximum(0, z): jit, grad, vmap, no callback.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import api, losses, multi_margin
from .hinge import _check_margin

OP = multi_margin.OP


def settings_of(p, margin, reduction, settings: dict) -> tuple[float, str, dict]:
    """(margin, reduction, relu's ties/nan/order), each checked (one-line errors)."""
    multi_margin.check_p(p)
    return (_check_margin(OP, margin), losses.check_reduction(OP, reduction),
            multi_margin.kink_settings(settings))


def _check(input, target, weight, is_float: bool, is_int: bool) -> None:
    multi_margin.check_shapes((is_float, input.dtype, input.shape), (is_int, target.dtype, target.shape),
                              None if weight is None else weight.shape)


def _check_range(y, C: int) -> None:
    """A one-line ValueError for a class outside [0, C) (y: a tensor or a NumPy array, known)."""
    wrong = (y < 0) | (y >= C)
    if wrong.any():
        raise ValueError(f"{OP}: target out of range: every class must be in [0, {C}), got {int(y[wrong][0])}")


# ----------------------------------------------------------------------------- torch

def torch_loss(kink_settings: dict):
    """fn(input, target, margin, weight, reduction): aten's multi_margin_loss (p=1) with relu's
    torch backend module under ``kink_settings`` for the hinges' weights (made once per settings)."""
    return _torch_loss(*(kink_settings[k] for k in ("ties", "nan", "order")))


@lru_cache(maxsize=None)
def _torch_loss(ties, nan, order):
    import torch
    relu = api.load("relu", backend="torch", ties=ties, nan=nan, order=order)
    floats = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

    class MultiMarginLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, y, margin, weight, reduction):
            z = (torch.full((), margin, dtype=x.dtype, device=x.device) - x.gather(1, y[:, None])) + x
            k = relu.backward(torch.ones_like(z), relu.forward(z)[1])[0]
            k = torch.where(torch.arange(x.shape[1], device=x.device) == y[:, None], 0, k)
            w = None if weight is None else weight.to(x.dtype)[y][:, None]
            ctx.save_for_backward(y, k, w)
            ctx.reduction = reduction
            return _torch_forward(torch, torch.where(k != 0, z if w is None else z * w, 0), reduction)

        @staticmethod
        def backward(ctx, grad):
            y, k, w = ctx.saved_tensors
            return _torch_backward(torch, grad, y, k, w, ctx.reduction), None, None, None, None

    def loss(input, target, margin, weight, reduction):
        if not isinstance(input, torch.Tensor) or not isinstance(target, torch.Tensor):
            raise TypeError(f"{OP}: input and target must be torch.Tensors, got "
                            f"{type(input).__name__} and {type(target).__name__}")
        _check(input, target, weight, input.dtype in floats, target.dtype in (torch.int64, torch.int32))
        x, y = input.reshape(-1, input.shape[-1]), target.reshape(-1).long()
        if not torch.compiler.is_compiling():
            _check_range(y, x.shape[1])
        out = MultiMarginLoss.apply(x, y, margin, weight, reduction)
        return out.reshape(()) if reduction == "none" and input.ndim == 1 else out
    return loss


def _torch_forward(torch, term, reduction):
    """aten's multi_margin_loss (p=1) of the active hinges' terms (N, C): each row's added one at
    a time into +0 and divided by C; the rows added in float64 in order (a cumsum) for 'mean'
    (then divided by N) and 'sum'."""
    n, C = term.shape
    total = torch.zeros(n, dtype=term.dtype, device=term.device)
    for column in term.unbind(1):  # one at a time into +0, as aten's loop
        total = total + column
    rows = total / torch.full((), C, dtype=term.dtype, device=term.device)
    if reduction == "none":
        return rows
    acc = torch.cumsum(rows.to(torch.float64), 0)[-1] if n else rows.new_zeros((), dtype=torch.float64)
    return (acc / n if reduction == "mean" else acc).to(term.dtype)


def _torch_backward(torch, grad, y, k, w, reduction):
    """aten's multi_margin_loss_backward (p=1): each active hinge's input h = (k * c) * w[y], c =
    1/(N C) ('mean') or 1/C rounded to the dtype, the target column 0 - h_0 - h_1 - ... in
    order, every entry times grad_output (the row's for 'none')."""
    n, C = k.shape
    c = torch.full((), 1.0 / (n * C) if reduction == "mean" else 1.0 / C, dtype=torch.float64).to(k.dtype)
    h = torch.where(k != 0, k * c.to(k.device), 0)
    if w is not None:
        h = torch.where(k != 0, h * w, 0)
    target = torch.zeros(n, dtype=k.dtype, device=k.device)
    for column in h.unbind(1):  # (the target column's h is +0)
        target = target - column
    h = torch.where(torch.arange(C, device=k.device) == y[:, None], target[:, None], h)
    return h * (grad.reshape(-1, 1) if reduction == "none" else grad)


# ----------------------------------------------------------------------------- jax

def jax_loss(input, target, margin, weight, reduction, make_kink):
    """The jnp expression of multi_margin.py's docstring, make_kink() (symgrad.jax's relu, made
    once the arguments are checked) for jnp.maximum(0, z)."""
    import jax
    import jax.numpy as jnp
    _check(input, target, weight, jnp.issubdtype(input.dtype, jnp.floating),
           jnp.issubdtype(target.dtype, jnp.integer))
    x, y = jnp.reshape(input, (-1, input.shape[-1])), jnp.reshape(target, (-1,))
    if not isinstance(y, jax.core.Tracer):  # (known: checked here, in NumPy, even under a trace)
        _check_range(np.asarray(y), x.shape[1])
    z = make_kink()(margin - jnp.take_along_axis(x, y[:, None], 1) + x)
    if weight is not None:
        z = z * jnp.asarray(weight, x.dtype)[y][:, None]
    rows = jnp.sum(jnp.where(jnp.arange(x.shape[1]) == y[:, None], 0, z), axis=-1) / x.shape[1]
    if reduction == "none":
        return rows.reshape(()) if np.ndim(input) == 1 else rows
    return jnp.mean(rows) if reduction == "mean" else jnp.sum(rows)
