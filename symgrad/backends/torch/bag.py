"""The torch backend's bags (``lower.BagKernel``, windows "bags": embedding_bag_max): the template
context of ``bag.py.jinja`` (host/bag.py's, in PyTorch's names), printed as plain PyTorch code.

Every element of the index list stays in place, in index order (padding_idx's take no part), so
the shapes are the inputs': no branch on a tensor's values, nothing sized by them.  Forward: each
bag's extremum by ``scatter_reduce`` (NaN propagating, or skipping NaN where the NaN rule is
PyTorch's 'keep'), its first/last hit by an integer ``scatter_reduce`` and its count of hits by an
integer scatter: exact, the same on every device.  Backward in gather form: each gathered row
reads its bag's winner (first/last) or output and count (split/all); the rows' gradients are then
added onto their table rows by ``index_add``, in index order on the CPU (the NumPy module's
add.at, bit for bit)."""

from __future__ import annotations

from pathlib import Path

from ...lower import BagKernel
from ..host.bag import BagDialect
from ..host.bag import bag_context as _context
from .window import GEOMETRY, _code

GEOMETRY["bags"] = "torch/_bag_layout.py.jinja"  # (the layout partial of embedding_bag_max's bags)

DIALECT = BagDialect("torch", {"max": "amax", "min": "amin"}, _code, "torch")


def builds_layout(layout: str | None) -> bool:
    """Whether it builds a bag op of this layout (lower.bag_layout; None: not a bag op): where
    its layout partial _<layout>_layout.py.jinja exists."""
    return layout is None or (Path(__file__).parent / "templates" / f"_{layout}_layout.py.jinja").is_file()


def bag_context(op, kernel: BagKernel) -> dict:
    """bag.py.jinja's finished strings."""
    return _context(op, kernel, DIALECT, "torch.Tensor")
