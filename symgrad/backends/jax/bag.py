"""The jax backend's bags (``lower.BagKernel``, windows "bags": embedding_bag_max): the template
context of ``bag.py.jinja`` (host/bag.py's, in jax.numpy's names), printed as jax.numpy code.

Every element of the index list stays in place, in index order (padding_idx's take no part), so
the shapes are the inputs' (static under jit): no host callback, no branch on array values.
Forward: each bag's extremum by a scatter max/min (NaN propagating, or skipping NaN where the NaN
rule is PyTorch's 'keep'), its first/last hit by an integer scatter min/max and its count of hits
by an integer scatter-add: exact, the same on every device.  Backward in gather form: each
gathered row reads its bag's winner (first/last) or output and count (split/all); the rows'
gradients are then added onto their table rows by a scatter-add, in index order on the CPU (the
NumPy module's add.at, bit for bit)."""

from __future__ import annotations

from pathlib import Path

from ...lower import BagKernel
from ..host.bag import BagDialect
from ..host.bag import bag_context as _context
from .printer import jax_code


def builds_layout(layout: str | None) -> bool:
    """Whether it builds a bag op of this layout (lower.bag_layout; None: not a bag op): where
    its layout partial _<layout>_layout.py.jinja exists."""
    return layout is None or (Path(__file__).parent / "templates" / f"_{layout}_layout.py.jinja").is_file()


def bag_context(op, kernel: BagKernel, weight_lines) -> dict:
    """bag.py.jinja's finished strings (weight_lines: the mask's weight's first lines, a function
    of the selection)."""
    return _context(op, kernel, BagDialect("jnp", {"max": "max", "min": "min"}, jax_code, "jax", weight_lines),
                    "jax.Array")
