"""torch.aminmax(input, *, dim=None, keepdim=False) -> (min, max) (issue 30): a composition of the
amin and amax reductions at the host level, as losses.py wraps a module.

``symgrad.load("aminmax", backend=..., ties=..., convention=..., nan=..., dim=..., keepdim=...)``
loads amin and amax with the same settings (each a generated module: any backend, every policy and
NaN rule they take) and returns an ``AminMax`` whose

* forward(input) returns ((min, max), saved);
* backward(grad_min, grad_max, saved) returns (grad_input,): amin's backward of grad_min plus
  amax's backward of grad_max, added once in the input's dtype.  That is PyTorch 2.13's
  AminmaxBackward0 (derivatives.yaml: scale_grad_by_count of each output's equality mask, summed),
  which the torch preset of amin/amax reproduces, and JAX's gradient of (jnp.min(x), jnp.max(x))
  of the same x (JAX has no aminmax; its cotangents of x add up), which the jax preset reproduces.
  An element that is both the min and the max (a constant slice) receives both terms;
* jvp(tangent, saved) returns (tangent_min, tangent_max).

dim is one int or None (every dim), as torch.aminmax takes it.  The composition is not a single
generated module, so it has no catalog entry and no derive()/generate() of its own: amin and amax
have theirs.
"""

from __future__ import annotations

import numpy as np

PARAMS = ("dim", "keepdim")


def check_dim(dim: object) -> None:
    """torch.aminmax's dim: an int or None, else a one-line TypeError."""
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, (int, np.integer))):
        raise TypeError(f"aminmax: dim must be an int or None (torch.aminmax reduces one dim or "
                        f"all), got {dim!r}")


class AminMax:
    """amin and amax of the same input, with the gradients of both outputs added."""

    OP = "aminmax"
    INPUTS = ("input",)

    def __init__(self, amin, amax):
        self.amin, self.amax = amin, amax
        self.__doc__ = (f"aminmax as ({amin.__name__}, {amax.__name__}) of the same input "
                        f"(symgrad.aminmax).")

    def __repr__(self) -> str:
        return f"<symgrad aminmax of {self.amin.__name__} and {self.amax.__name__}>"

    def forward(self, input):
        """Return ((min, max), saved)."""
        low, saved_min = self.amin.forward(input)
        high, saved_max = self.amax.forward(input)
        return (low, high), (saved_min, saved_max)

    def _split(self, saved):
        if not (isinstance(saved, tuple) and len(saved) == 2):
            raise TypeError(f"aminmax: saved must be the (saved_min, saved_max) pair that this "
                            f"module's forward returned, got {type(saved).__name__}")
        return saved

    def backward(self, grad_min, grad_max, saved):
        """(grad_input,) = amin's backward of grad_min + amax's backward of grad_max."""
        saved_min, saved_max = self._split(saved)
        (from_min,) = self.amin.backward(grad_min, saved_min)
        (from_max,) = self.amax.backward(grad_max, saved_max)
        return (from_min + from_max,)

    def jvp(self, tangent, saved):
        """(tangent_min, tangent_max): the tangents of both outputs."""
        saved_min, saved_max = self._split(saved)
        return self.amin.jvp(tangent, saved_min), self.amax.jvp(tangent, saved_max)


def load(load_op, settings: dict, params: dict) -> AminMax:
    """AminMax of load_op("amin", ...) and load_op("amax", ...) under the same settings."""
    check_dim(params.get("dim"))
    return AminMax(load_op("amin", **settings, **params), load_op("amax", **settings, **params))
