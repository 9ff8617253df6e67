"""The torch backend's max unpooling (``lower.UnpoolKernel``): the template context of
``unpool.py.jinja``, printed as plain PyTorch code.

Forward finds the writer that stays in each output slot (the first or last element written there,
in row-major order of the input: an integer ``scatter_reduce`` amin/amax of the elements'
positions, which is deterministic on every device) and gathers it; backward is a gather of
grad_output at the indices (masked to the writers that stayed, unless every writer gets its
gradient); jvp gathers the tangent of the writer that stayed, or (every writer) adds the tangents
of a slot's writers in row-major order of the input by ``index_add`` in at least float32, as the
NumPy module's ``np.add.at``.  No ``.item()``, no branch on a tensor's values (the indices' range
is checked eagerly only)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..host import framework_unpool_context

if TYPE_CHECKING:
    from ...lower import Artifacts


def unpool_context(art: "Artifacts") -> dict:
    """The template context of an unpooling module: finished strings only."""
    return framework_unpool_context(art, "torch", {"first": "'amin'", "last": "'amax'"})
