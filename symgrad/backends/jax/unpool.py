"""The jax backend's max unpooling (``lower.UnpoolKernel``): the template context of
``unpool.py.jinja``, printed as jax.numpy code.

Forward finds the writer that stays in each output slot (the first or last element written there,
in row-major order of the input: an integer scatter min/max of the elements' positions, exact
and the same on every device) and gathers it; backward is a gather of grad_output at the indices
(masked to the writers that stayed, unless every writer gets its gradient): no scatter-add of
gradients.  jvp gathers the tangent of the writer that stayed, or (every writer) adds the tangents
of a slot's writers by ``.at[].add`` in at least float32, as the NumPy module's ``np.add.at``
(a scatter-add: atomic on a GPU).  No host callback, no branch on array values under jit or vmap
(the indices' range is checked where their values are known)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..host import framework_unpool_context

if TYPE_CHECKING:
    from ...lower import Artifacts

# the paragraph the module's docstring ends with
NOTE = [
    "A JAX module (jax.numpy only: no host callback, no branch on array values), so forward, backward",
    "and jvp run under jax.jit, jax.vmap and jax.grad, on every device JAX has, and equal the NumPy",
    "backend's module bit for bit on the CPU; the writers that stay are found by an integer scatter",
    "min/max (exact), the output and backward are gathers, and only the jvp of ties='all' adds with a",
    "scatter-add (atomic on a GPU)."]


def unpool_context(art: "Artifacts") -> dict:
    """The template context of an unpooling module: finished strings only."""
    return framework_unpool_context(art, "jax", {"first": "min", "last": "max"})
