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
  An element that is both the min and the max (a constant slice) receives both terms.  None for
  one of the gradients leaves its term out (PyTorch's undefined gradient of an unused output);
* jvp(tangent, saved) returns (tangent_min, tangent_max).

dim is one int or None (every dim), as torch.aminmax takes it.  The composition is not a single
generated module, so it has no catalog entry and no derive()/generate() of its own: amin and amax
have theirs.
"""

from __future__ import annotations

import numpy as np

PARAMS = ("dim", "keepdim")
NOT_A_MODULE = ("aminmax is amin and amax composed, loaded only: symgrad.load('aminmax', ...); "
                "derive, generate or check 'amin' and 'amax'")


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
        """(grad_input,) = amin's backward of grad_min + amax's backward of grad_max.  One of them
        may be None (that output unused): its term is left out, as PyTorch leaves out an undefined
        gradient (adding zeros instead would turn a -0 into +0)."""
        saved_min, saved_max = self._split(saved)
        if grad_min is None and grad_max is None:
            raise TypeError("aminmax: backward needs grad_min or grad_max (got None for both)")
        terms = [module.backward(g, part)[0] for module, g, part in
                 ((self.amin, grad_min, saved_min), (self.amax, grad_max, saved_max))
                 if g is not None]
        return (terms[0] + terms[1] if len(terms) == 2 else terms[0],)

    def jvp(self, tangent, saved):
        """(tangent_min, tangent_max): the tangents of both outputs."""
        saved_min, saved_max = self._split(saved)
        return self.amin.jvp(tangent, saved_min), self.amax.jvp(tangent, saved_max)


def load(load_op, settings: dict, params: dict) -> AminMax:
    """AminMax of load_op("amin", ...) and load_op("amax", ...) under the same settings."""
    check_dim(params.get("dim"))
    return AminMax(load_op("amin", **settings, **params), load_op("amax", **settings, **params))
