"""The NumPy module of an order statistic (sort, topk, cummax, cummin; lower.OrderKernel): the
skeleton ``order.py.jinja`` (Saved, the checks, the rows' layout, the total-order key) and the body
the kernel picks (BODIES: how forward selects, how backward and jvp route the gradient), with the
finished strings each body places."""

from __future__ import annotations

from ...lower import TOTAL, OrderKernel
from ..host.printer import numpy_code

# the body of each (select, ties) of an OrderKernel; a tree (JAX's split) has its own
BODIES = {("rank", "first"): "numpy/_order_rank_one.py.jinja", ("rank", "last"): "numpy/_order_rank_one.py.jinja",
          ("rank", "block"): "numpy/_order_rank_block.py.jinja",
          ("prefix", "first"): "numpy/_order_prefix_one.py.jinja",
          ("prefix", "last"): "numpy/_order_prefix_one.py.jinja",
          ("prefix", "block"): "numpy/_order_prefix_block.py.jinja"}
TREE = "numpy/_order_prefix_tree.py.jinja"

_TIE_DOCS = {"first": "equal elements rank by index (a stable sort)",
             "last": "equal elements rank by index reversed (the latest first)"}
# how a stable argsort ranks ties: by index, or (the row reversed, and its positions mapped back)
# by index reversed
_RANKED = {"first": 'np.argsort(key, axis=-1, kind="stable")',
           "last": 'key.shape[-1] - 1 - np.argsort(key[..., ::-1], axis=-1, kind="stable")'}
# of the elements tied with a top-k's k-th, those that rank first (need: how many are still to take)
# (counted in int64, as every count the emitted code holds: tests/test_numbers.py)
_TAKEN = {"first": "np.cumsum(tied, axis=-1, dtype=np.int64) <= need",
          "last": "np.cumsum(tied[..., ::-1], axis=-1, dtype=np.int64)[..., ::-1] <= need"}
# the elements that take over as a prefix's winner: the first to reach a new best, or every
# element reaching the best (the latest one holds it)
_WINNERS = {"first": ["takes = key == best",
                      "takes[..., 1:] &= best[..., 1:] > best[..., :-1]  # the first to reach a new best"],
            "last": ["takes = key == best  # every element reaching the best takes over: the latest holds it"]}
_LARGEST = "np.iinfo(np.int64).max"
# first/last's gradient at its element (OrderKernel.grad_form), the other elements' value, the words
_GRAD_VALUES = {"written": "_rows(grad_output)", "added": "_rows(grad_output) + 0",
                "negated": "-(0 - _rows(grad_output))"}
_GRAD_ZEROS = {"written": "np.zeros", "added": "np.zeros", "negated": "-np.zeros"}
_GRAD_DOCS = {"written": "written (a -0 stays -0, as zeros.scatter)",
              "added": "added into +0 (a -0 becomes +0)",
              "negated": "as -(0 - g) (the gradient of -top_k(-x): -0 elsewhere)"}


def context(op, kernel: OrderKernel) -> dict:
    """What order.py.jinja and its body place: finished strings only."""
    if kernel.select == "one":  # kthvalue, median, nanmedian (numpy/order_one.py)
        from .order_one import context as one_context
        return one_context(op, kernel, shared(op, kernel))
    prefix = kernel.select == "prefix"
    body = TREE if kernel.tree else BODIES[(kernel.select, kernel.ties)]
    ctx = shared(op, kernel) | {"body": body, "layout": "host/_order_along.py.jinja"}
    ctx |= _rank_key(kernel, prefix)
    if kernel.ties in _TIE_DOCS:
        ctx |= {"tie_doc": _TIE_DOCS[kernel.ties], "ranked": _RANKED[kernel.ties], "taken": _TAKEN[kernel.ties],
                "winner_lines": _WINNERS[kernel.ties]}
    if kernel.weight is not None:
        ctx |= {"weight": numpy_code(kernel.weight),  # in total and tied
                "weight_doc": "the block's total over its size" if kernel.weight != TOTAL else "the block's total"}
    k = "v.shape[-1]" if kernel.k is None else "K"
    ctx |= {"count": k, "count_doc": "n - 1" if kernel.k is None else "K - 1",
            "grad_value": _GRAD_VALUES[kernel.grad_form], "grad_zeros": _GRAD_ZEROS[kernel.grad_form],
            "grad_doc": _GRAD_DOCS[kernel.grad_form]}
    ctx |= _prefix_strings(kernel)
    return ctx


def shared(op, kernel: OrderKernel) -> dict:
    """The skeleton's strings every order statistic places: parameters, Saved, the key."""
    return {"template": "numpy/order.py.jinja",
            "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
            "saved_fields": list(kernel.saved),
            "saved_doc": ", ".join(kernel.saved),
            "key_doc": ("NaN above +inf (every NaN equal), -0 below +0" if kernel.zeros_ordered
                        else "NaN above +inf (every NaN equal), +0 and -0 equal"),
            "canonical_lines": [] if kernel.zeros_ordered else
            ["canonical = np.where(canonical == 0, np.zeros((), v.dtype), canonical)  # -0 as +0"],
            "extremum": "max" if kernel.descending else "min",
            "imports": []}


def _rank_key(kernel: OrderKernel, prefix: bool) -> dict:
    """The key the body orders by: a rank select sorts it ascending (the largest first: the key
    negated); a prefix keeps its running maximum (a min: negated, NaN still on top)."""
    if prefix:
        key = "_key(v)" if kernel.descending else f"np.where(np.isnan(v), {_LARGEST}, -_key(v))"
        doc = "the larger key wins a prefix (NaN wins every prefix holding one)"
    else:
        key = "-_key(v)" if kernel.descending else "_key(v)"
        doc = "the smaller key ranks first (" + ("the largest first, NaN before +inf)" if kernel.descending
                                                  else "the smallest first, NaN after +inf)")
    return {"rank_key": key, "rank_doc": doc}


def _prefix_strings(kernel: OrderKernel) -> dict:
    """A cumulative op's strings: the saved blocks (and NaN outputs under NaN rule 'zero'), the
    tree's binary step, XLA's zeros (-0 below +0)."""
    extremum = "maximum" if kernel.descending else "minimum"
    nan_zero = kernel.nan_sends_nothing and not kernel.tree
    saved_args = "block_start, tied, values" if nan_zero else "block_start, tied"
    zero_kept = ("(v == 0) & ~np.signbit(v)" if kernel.descending else "(v == 0) & np.signbit(v)")
    return {"saved_args": saved_args,
            "nan_lines": ["g = np.where(np.isnan(saved.values), 0, g)  # NaN rule 'zero': no gradient"]
            if nan_zero else [],
            "nan_jvp_lines": ["out = np.where(np.isnan(saved.values), 0, out)  # NaN rule 'zero'"]
            if nan_zero else [],
            "combine": f"np.{extremum}(a, b)",
            "accumulate": f"np.{extremum}.accumulate(v, axis=-1)",
            "zeros_doc": "-0 below +0" if kernel.descending else "-0 below +0: a min of zeros is -0 once one is met",
            "zeros_lines": [f"kept = np.logical_or.accumulate({zero_kept}, axis=-1)  # XLA's zeros: -0 below +0",
                            "values = np.where(values == 0, np.where(kept, "
                            + ("np.zeros((), v.dtype), -np.zeros((), v.dtype)" if kernel.descending
                               else "-np.zeros((), v.dtype), np.zeros((), v.dtype)") + "), values)"]}
