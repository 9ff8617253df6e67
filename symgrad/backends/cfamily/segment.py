"""What the C and CUDA segment kernels (scatter_max, segment_max) share: which hit a segment's
output is, and where float16 computed in float parts from the NumPy module."""

from __future__ import annotations

import sympy as sp

from ...lower import Quotient, WindowKernel

# which of a segment's hits the output (and a scan's winner) is, by the scan's order or the zeros
# rule (lower.SegmentRule.zeros): the first, the last, or the first of the preferred sign
PICK_DOCS = {"first": "is the first hit", "last": "is the last hit", "second": "is the last hit",
             "ordered": "is the first hit that is +0 where the extremum is a zero (-0 below +0)"}


def picked(pick: str, first: str, last: str, preferred: str) -> str:
    """The C expression of the hit the output is (-2 none, -1 the initial element, e >= 0 src row
    e), from the expressions of the first hit, the last and the first of the preferred sign."""
    return {"first": first, "last": last, "second": last,
            "ordered": f"{preferred} != -2 ? {preferred} : {first}"}[pick]


def rounds_apart_in_float16(kernel: WindowKernel) -> bool:
    """The weight takes 1 / count (JAX's g * (1 / count)): NumPy rounds the reciprocal to float16
    before the product, the kernels (float16 computed in float) do not."""
    weight = kernel.selection.weight
    return weight is not None and any(q.args[0] == sp.S.One for q in weight.atoms(Quotient))
