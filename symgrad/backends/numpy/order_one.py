"""The NumPy module of kthvalue, median and nanmedian (lower.OrderKernel with select "one"): the
order statistics' skeleton (order.py.jinja) with a layout for an output per row (the ranked dim
dropped or kept, or every element one row) and the body ``_order_one.py.jinja``, whose backward
and jvp are the partial the kernel picks (one element, JAX's two middle elements, or tie blocks)."""

from __future__ import annotations

from ...lower import TOTAL, OrderKernel
from ..host.printer import numpy_code
from .order import _GRAD_DOCS, _RANKED, _TIE_DOCS

# the rank(s) each row selects, by OrderKernel.rank (the row's n elements, its `numbers` non-NaN)
_NUMBERS = "numbers = np.sum(~np.isnan(v), axis=-1, keepdims=True, dtype=np.int64)"
_RANKS = {
    "k": (["if not 1 <= K <= n:",
           '    raise ValueError(f"{OP}: k={K} is out of range for the {n} elements along dim {DIM}")'],
          "np.full(v.shape[:-1] + (1,), K - 1, dtype=np.int64)", None),
    "middle": ([_NUMBERS, "nan_row = numbers < n  # a row holding NaN: its first NaN (rank `numbers`)"],
               "np.where(nan_row, numbers, (n - 1) // 2)", "np.where(nan_row, numbers, n // 2)"),
    "middle_of_numbers": ([_NUMBERS], "np.maximum(numbers - 1, 0) // 2  # a row of NaNs: rank 0", "numbers // 2"),
}
_RANK_DOCS = {"k": "rank K - 1", "middle": "rank (n - 1) // 2 of the row's n elements, or its first NaN's",
              "middle_of_numbers": "rank (m - 1) // 2 of the row's m numbers (NaNs rank last; none: rank 0)"}
_BACKWARDS = {"single": "numpy/_order_one_single.py.jinja", "pair": "numpy/_order_one_pair.py.jinja",
              "block": "numpy/_order_one_block.py.jinja"}
_SELECTED_NAN = "np.isnan(np.take_along_axis(_rows(_saved_array(saved, \"x\", saved.input_shape)), picked[..., :1], axis=-1))"


def context(op, kernel: OrderKernel, shared: dict) -> dict:
    """What order.py.jinja, the layout and _order_one.py.jinja place: finished strings only."""
    whole = op.params["dim"] is None
    lines, low, high = _RANKS[kernel.rank]
    pair = kernel.midpoint
    ranks = f"np.concatenate([{low.split('  #')[0]}, {high}], axis=-1)" if pair else low
    form = "block" if kernel.ties == "block" else ("pair" if pair else "single")
    ctx = shared | {
        "layout": "host/_order_whole.py.jinja" if whole else "host/_order_one_along.py.jinja",
        "body": "numpy/_order_one.py.jinja", "backward_body": _BACKWARDS[form],
        "rank_key": "_key(v)", "rank_doc": "the smaller key ranks first (the smallest first, NaN after +inf)",
        "rank_lines": lines + [f"return {ranks}"], "picks": "2" if pair else "1",
        "rank_doc_one": _RANK_DOCS[kernel.rank] + (" and rank n // 2 (m // 2): the two middle elements, "
                                                   "averaged" if pair else ""),
        "tie_doc": _TIE_DOCS["last" if kernel.ties == "last" else "first"],
        "ranked": _RANKED["last" if kernel.ties == "last" else "first"],
        "value": "(chosen[..., 0] + chosen[..., 1]) * np.asarray(0.5, v.dtype)" if pair else "chosen[..., 0]",
        "output": "values" if whole else "(values, _reduced(picked[..., 0], x.shape))",
        "output_doc": "value" if whole else "(values, indices)",
        "saved_args": ", ".join(("picked", "x")[:len(kernel.saved)]),
        "grad_value": "g" if kernel.grad_form == "written" else "g + 0",
        "grad_doc": _GRAD_DOCS[kernel.grad_form],
        "nan_lines": [f"g = np.where({_SELECTED_NAN}, 0, g)  # NaN rule '{kernel.nan}': a NaN output sends nothing"]
        if kernel.nan_sends_nothing else [],
        "nan_jvp_lines": [f"out = np.where({_SELECTED_NAN}, 0, out)  # NaN rule '{kernel.nan}'"]
        if kernel.nan_sends_nothing else [],
        "shares": "np.array([0.5, 0.5])" if pair else "np.array([1.0])",
        # the selected ranks' terms added (not np.sum, which starts from +0 and loses a -0)
        "added_ranks": "terms[..., 0, :] + terms[..., 1, :]" if pair else "terms[..., 0, :]",
    }
    if kernel.weight is not None:
        ctx |= {"weight": numpy_code(kernel.weight),
                "weight_doc": "its share over the block's size" if kernel.weight != TOTAL else "its whole share"}
    return ctx
