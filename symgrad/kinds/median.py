"""One rank of a row (issue 29, part 2): kthvalue, median, nanmedian, of the kind ``ranking``.

Each row along dim (every element when a median's dim is None) gives one output, the element of
one rank of the ascending order (kinds/order.py: the tie policy decides which of equal elements
holds it): kthvalue rank k - 1, median rank (n - 1) // 2 (the lower middle of an even count),
nanmedian rank (m - 1) // 2 of the row's m numbers (NaNs left out).  W has one row per output:
first/last a one at the element holding the rank, split 1/t at each of the t elements of its tie
block, all a one at each.  A NaN in a median's row decides it: the output is NaN, which under
'dominate' is rank m of the row (the NaNs' block), under 'propagate' sends no gradient.

JAX's median (order form "midpoint", jnp.quantile's method='midpoint') averages ranks
(n - 1) // 2 and n // 2: its W row is half of each rank's row, (y_low + y_high) * 0.5.
"""

from __future__ import annotations

SELECTS = ("kthvalue", "median", "nanmedian")


def selects_one(name: str) -> bool:
    return name in SELECTS


def midpoint(op: "Op") -> bool:
    """Whether the op's convention averages the two middle elements of an even count: its preset's
    order form 'midpoint' (kept when ties= overrides the preset's policy: it defines the value)."""
    from ..conventions import preset_for
    preset = preset_for(op.convention, op.name) if op.convention else None
    return bool(preset and preset.order_form == "midpoint")


def rank_words(op: "Op") -> str:
    """Which rank the output selects, in words."""
    if op.name == "kthvalue":
        return f"rank k - 1 = {op.params['k'] - 1}"
    count = "m numbers (NaNs left out)" if op.name == "nanmedian" else "n elements"
    if midpoint(op):
        return f"the mean of ranks (c - 1) // 2 and c // 2 of the row's c = {count}"
    return f"rank (c - 1) // 2 of the row's c = {count} (an even count: the lower middle)"


def describe(op: "Op") -> list[str]:
    dim = op.params["dim"]
    row = "every element as one row" if dim is None else f"row along dim {dim}"
    return [f"{row}, ranked ascending (NaN ranks as the largest value): the output selects "
            f"{rank_words(op)} (derived on a representative row of 3)"]
