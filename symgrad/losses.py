"""PyTorch's ``reduction`` for the margin losses (issue 30): 'none', 'mean' or 'sum'.

A loss op (ops.py: l1_loss, margin_ranking_loss, ...) is elementwise before its reduction; its
generated module (any backend) computes reduction='none'.  The reduction is linear, so it has no
tie and no policy: ``Reduced`` wraps the module and adds the elements up around it, as the
frameworks do:

* forward: the elements' sum in at least float32 (float16 and bfloat16 accumulate in float32,
  rounded once), in the order of PyTorch's CPU at::sum under the torch preset (the NumPy module's
  ``host/_torch_sum.py.jinja``, one thread), else NumPy's pairwise order (XLA's order, under the
  jax preset, may differ in the last bits); 'mean' divides that sum by the element count once in
  the same precision (at::mean, jnp.mean), then rounds it to the dtype;
* backward: grad_output (a 0-d array) spread over the elements: g itself ('sum'), or g / count in
  at least float32 rounded to the dtype ('mean': PyTorch's mean_backward, jnp.mean's transpose),
  then the module's backward;
* jvp: the module's jvp, reduced as forward reduces.

``symgrad.load(loss, reduction=...)`` defaults to 'none' (the generated module itself, which
every other part of symgrad - check, symgrad.torch, the catalog - takes as it takes any
elementwise op), where PyTorch defaults to 'mean': pass reduction='mean' for PyTorch's default.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

REDUCTIONS = ("none", "mean", "sum")
LOSSES = ("l1_loss", "margin_ranking_loss")  # the ops that take reduction=


def check_reduction(op: str, reduction: object) -> str:
    """reduction as PyTorch names it, or a one-line ValueError/TypeError."""
    if not isinstance(reduction, str):
        raise TypeError(f"{op}: reduction must be one of 'none', 'mean', 'sum', got {reduction!r}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of 'none', 'mean', 'sum', got {reduction!r}")
    return reduction


@lru_cache(maxsize=1)
def _torch_sum():
    """_torch_sum of the NumPy module's host template (one implementation of at::sum's order)."""
    from .backends.common import SHARED_TEMPLATES
    source = (SHARED_TEMPLATES["host"] / "_torch_sum.py.jinja").read_text()
    source = source[source.index("#}") + 2:]  # (the template's comment; the rest is plain Python)
    namespace = {"np": np}
    exec(compile(source, "host/_torch_sum.py.jinja", "exec"), namespace)
    return namespace["_torch_sum"]


def _accumulating(dtype: np.dtype) -> np.dtype:
    """The dtype sums are computed in: float32 for float16 and bfloat16, else the dtype."""
    return np.dtype(np.float32) if np.dtype(dtype).itemsize < 4 else np.dtype(dtype)


class Reduced:
    """A loss module with PyTorch's reduction 'mean' or 'sum' applied around it (module's
    forward/backward/jvp, each with a 0-d output)."""

    def __init__(self, module, reduction: str, torch_order: bool):
        self.module, self.reduction, self.torch_order = module, reduction, torch_order
        self.INPUTS, self.OP = module.INPUTS, module.OP
        self.__doc__ = (f"{module.OP} with reduction={reduction!r} around the generated module "
                        f"{module.__name__} (symgrad.losses).")

    def __repr__(self) -> str:
        return f"<symgrad loss {self.OP} reduction={self.reduction!r} of {self.module.__name__}>"

    def _reduce(self, elements) -> np.ndarray:
        dtype = np.asarray(elements).dtype
        acc = _accumulating(dtype)
        flat = np.asarray(elements).astype(acc).reshape(-1)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            if not flat.size:
                total = acc.type(0)  # (a mean of no elements: 0 / 0, NaN, as the frameworks)
            elif self.torch_order:
                # sum: at::sum of the float16/bfloat16 tensor (its own order, in float32); mean:
                # PyTorch's CPU mean sums the tensor cast to float32 (ReduceOps.cpp mean_out)
                itemsize = dtype.itemsize if self.reduction == "sum" else acc.itemsize
                total = _torch_sum()(flat.reshape(1, -1), (flat.size,), (0,), itemsize)[0]
            else:
                total = np.sum(flat, dtype=acc)
            if self.reduction == "mean":
                total = acc.type(total) / acc.type(flat.size)
            return np.asarray(total, dtype=acc).astype(dtype)

    def forward(self, *inputs):
        """Return (the reduced loss, a 0-d array; saved)."""
        output, saved = self.module.forward(*inputs)
        return self._reduce(output), saved

    def backward(self, grad_output, saved):
        """The gradient of every input for grad_output, a 0-d array (or a number)."""
        shape = getattr(saved, "output_shape", None)
        dtype = getattr(saved, "dtype", None)
        if not isinstance(shape, tuple) or not isinstance(dtype, np.dtype):
            raise TypeError(f"{self.OP}: saved must be the Saved value that this module's forward "
                            f"returned, got {type(saved).__name__}")
        g = np.asarray(grad_output)
        if g.shape != () or not (g.dtype.kind == "f" or g.dtype.name == "bfloat16"):
            raise ValueError(f"{self.OP}: grad_output must be a 0-d float array (the reduced "
                             f"loss's gradient), got {g.dtype} with shape {g.shape}")
        g = g.astype(dtype)
        if self.reduction == "mean":
            acc = _accumulating(dtype)
            count = int(np.prod(shape, dtype=np.int64))
            with np.errstate(invalid="ignore", divide="ignore"):
                g = (acc.type(g) / acc.type(count)).astype(dtype)
        return self.module.backward(np.broadcast_to(g, shape), saved)

    def jvp(self, *args):
        """The reduced loss's tangent: the module's jvp, reduced as forward reduces."""
        return self._reduce(self.module.jvp(*args))


def reduced(module, op, reduction: str):
    """module itself for reduction='none', else module wrapped by Reduced (the torch preset adds
    in at::sum's order)."""
    if reduction == "none":
        return module
    return Reduced(module, reduction, torch_order=op.convention == "torch")
