"""Order statistics (issue 29): sort, topk, cummax, cummin.

In the W-matrix view each output selects the element of one rank of its row: y_j = sum_i W[j, i]
x_i with W[j, i] = [x_i holds rank r_j].  Which of several equal elements holds which rank is the
tie policy's choice: ``first`` (the lower index ranks first: a stable sort), ``last`` (the higher
index ranks first), ``split`` (each tied element gets the mean of the tied ranks' rows: 1/t of
every output of a block of t tied ranks) and ``all`` (each tied element gets the whole row of every
tied rank: not a subgradient).  A cumulative max/min is the same with the row cut to the prefix
x[0..i]: output i selects rank 0 of its prefix.

The kind derives by derive_order.py, lowers to an ``lower.OrderKernel`` (its own kernel type:
no windows) and is built by the backends whose FORMS list it (NumPy so far).
"""

from __future__ import annotations

from .base import Kind
from .median import describe as describe_one, selects_one


# the cumulative ops: output i the first rank of the prefix x[0..i], not of the whole row
CUMULATIVE = ("cummax", "cummin")


def cumulative(name: str) -> bool:
    return name in CUMULATIVE


def _settings(name: str, ties: str, nan: str) -> None:
    if nan == "zero" and ties not in ("split", "all"):  # (policy.check_nan says it first)
        raise ValueError(f"{name}: NaN rule 'zero' expects ties 'split' or 'all', not {ties!r}")


def _window(params: dict) -> int:
    return 3  # the representative row the rule is derived on (derive_order.ROW)


def _describe(op: "Op", listed: int) -> list[str]:
    p = op.params
    if selects_one(op.name):  # kthvalue, median, nanmedian (kinds/median.py)
        return describe_one(op)
    if cumulative(op.name):
        return [f"output i = {op.spec.extremum}(x[0..i]) along dim {p['dim']}: the element of rank 0 "
                f"of the prefix (derived on a representative row of 3; the rule is the same for "
                f"every length)"]
    order = "descending" if descending(op) else "ascending"
    what = f"the first k={p['k']} ranks" if op.name == "topk" else "every rank"
    return [f"row along dim {p['dim']}, ranked {order} (NaN ranks as the largest value): output j "
            f"selects the element of rank j, for {what} (derived on a representative row of 3)"]


def descending(op: "Op") -> bool:
    p = op.params
    if op.name == "topk":
        return p["largest"]
    if op.name == "sort":
        return p["descending"]
    return op.spec.extremum == "max"


def _backward(op: "Op") -> list[str]:
    return ["", "== backward ==",
            "  grad_x[i] = sum_j W[j, i] grad_output[j] (W^T g): a gather from the saved ranks' "
            "source indices; no two outputs write one element under first/last, and a tie block's "
            "gradients are summed once and gathered by each of its elements under split/all"]


# special: its own derivation and kernel (no window extremum); the kind's name is "ranking" (the
# word "order" names the argument order of elementwise ops)
ORDER = Kind("ranking", special=True, derivation="order", lowering="order", window_size=_window,
             settings=_settings, describe=_describe, backward=_backward)
