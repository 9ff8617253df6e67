"""The torch backend's order statistics (``lower.OrderKernel``: sort, topk, cummax, cummin,
kthvalue, median, nanmedian): the template context of ``order.py.jinja`` and the body the kernel
picks, printed as plain PyTorch code with the NumPy module's results bit for bit on the CPU.

Forward ranks each row by the NumPy module's total-order key (the float's bits as an integer of
its width: NaN above +inf, every NaN equal; -0 below +0 or equal to it) with PyTorch's stable
argsort (ties in index order; "last": the row reversed, positions mapped back), or, for the
cumulative ops, a running maximum of the key (torch.cummax).  Backward is in gather form from the
saved ranks or indices (a permutation's writes: each element written once; no scatter_add, no
atomics); the tie blocks' sums are added in float64 in the NumPy module's order (a running sum
along the ranks), each result rounded once to the dtype (float16 from float64 by way of float32
rounded to odd: PyTorch's own cast rounds twice).  No ``.item()``, no ``.numpy()``, no branch on a
tensor's values: forward, backward and jvp trace under torch.compile(fullgraph=True)."""

from __future__ import annotations

from ...lower import TOTAL, OrderKernel
from .printer import torch_code

_BODIES = {("rank", "first"): "torch/_order_rank_one.py.jinja", ("rank", "last"): "torch/_order_rank_one.py.jinja",
           ("rank", "block"): "torch/_order_rank_block.py.jinja",
           ("prefix", "first"): "torch/_order_prefix_one.py.jinja",
           ("prefix", "last"): "torch/_order_prefix_one.py.jinja",
           ("prefix", "block"): "torch/_order_prefix_block.py.jinja"}
_TREE = "torch/_order_prefix_tree.py.jinja"
_TIE_DOCS = {"first": "equal elements rank by index (a stable sort)",
             "last": "equal elements rank by index reversed (the latest first)"}
_RANKED = {"first": "torch.argsort(key, dim=-1, stable=True)",
           "last": "key.shape[-1] - 1 - torch.argsort(torch.flip(key, (-1,)), dim=-1, stable=True)"}
_WINNERS = {"first": ["takes = key == best",
                      "rising = torch.cat([torch.ones_like(takes[..., :1]), best[..., 1:] > best[..., :-1]], -1)",
                      "takes = takes & rising  # the first to reach a new best"],
            "last": ["takes = key == best  # every element reaching the best takes over: the latest holds it"]}
_GRAD_VALUES = {"written": "g", "added": "g + 0", "negated": "-(0 - g)"}
_GRAD_ZEROS = {"written": "torch.zeros", "added": "torch.zeros", "negated": "-torch.zeros"}
_GRAD_DOCS = {"written": "written (a -0 stays -0, as zeros.scatter)",
              "added": "added into +0 (a -0 becomes +0)",
              "negated": "as -(0 - g) (the gradient of -top_k(-x): -0 elsewhere)"}
# the rank(s) each row selects, by OrderKernel.rank (the row's n elements, its `numbers` non-NaN)
_NUMBERS = "numbers = (~torch.isnan(v)).sum(-1, keepdim=True)"
_RANKS = {
    "k": (["if not 1 <= K <= n:",
           '    raise ValueError(f"{OP}: k={K} is out of range for the {n} elements along dim {DIM}")'],
          "torch.full(v.shape[:-1] + (1,), K - 1, dtype=torch.int64, device=v.device)", None),
    "middle": ([_NUMBERS, "nan_row = numbers < n  # a row holding NaN: its first NaN (rank `numbers`)"],
               "torch.where(nan_row, numbers, (n - 1) // 2)", "torch.where(nan_row, numbers, n // 2)"),
    "middle_of_numbers": ([_NUMBERS], "torch.clamp(numbers - 1, min=0) // 2", "numbers // 2"),
}
_RANK_DOCS = {"k": "rank K - 1", "middle": "rank (n - 1) // 2 of the row's n elements, or its first NaN's",
              "middle_of_numbers": "rank (m - 1) // 2 of the row's m numbers (NaNs rank last; none: rank 0)"}
_ONE_BACKWARDS = {"single": "torch/_order_one_single.py.jinja", "pair": "torch/_order_one_pair.py.jinja",
                  "block": "torch/_order_one_block.py.jinja"}
_SELECTED_NAN = "torch.isnan(torch.gather(_saved_rows(saved), -1, picked[..., :1]))"


def order_context(op, kernel: OrderKernel) -> dict:
    """What order.py.jinja and its body place: finished strings only."""
    ctx = _shared(op, kernel)
    if kernel.select == "one":
        return ctx | _one(op, kernel)
    prefix = kernel.select == "prefix"
    ctx |= {"body": _TREE if kernel.tree else _BODIES[(kernel.select, kernel.ties)],
            "layout": "torch/_order_along.py.jinja"} | _rank_key(kernel, prefix)
    if kernel.ties in _TIE_DOCS:
        ctx |= {"tie_doc": _TIE_DOCS[kernel.ties], "ranked": _RANKED[kernel.ties],
                "winner_lines": _WINNERS[kernel.ties]}
    ctx |= _weight(kernel)
    ctx |= {"count": "v.shape[-1]" if kernel.k is None else "K",
            "count_doc": "n - 1" if kernel.k is None else "K - 1",
            "grad_value": _GRAD_VALUES[kernel.grad_form], "grad_zeros": _GRAD_ZEROS[kernel.grad_form],
            "grad_doc": _GRAD_DOCS[kernel.grad_form]}
    return ctx | _prefix_strings(kernel)


def _shared(op, kernel: OrderKernel) -> dict:
    return {"params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
            "saved_fields": list(kernel.saved), "saved_doc": ", ".join(kernel.saved),
            "key_doc": ("NaN above +inf (every NaN equal), -0 below +0" if kernel.zeros_ordered
                        else "NaN above +inf (every NaN equal), +0 and -0 equal"),
            "canonical_lines": [] if kernel.zeros_ordered else
            ["canonical = torch.where(canonical == 0, torch.zeros_like(v), canonical)  # -0 as +0"],
            "extremum": "max" if kernel.descending else "min"}


def _weight(kernel: OrderKernel) -> dict:
    if kernel.weight is None:
        return {}
    return {"weight": torch_code(kernel.weight, []),
            "weight_doc": "the block's total over its size" if kernel.weight != TOTAL else "the block's total"}


def _rank_key(kernel: OrderKernel, prefix: bool) -> dict:
    """The key the body orders by: a rank select sorts it ascending (the largest first: the key
    complemented, ~key = -key - 1, the same order reversed); a prefix keeps its running maximum (a
    min: complemented, NaN still on top)."""
    if prefix:
        key = "_key(v)" if kernel.descending else \
            "torch.where(torch.isnan(v), torch.iinfo(_BITS[v.dtype]).max, ~_key(v))"
        doc = "the larger key wins a prefix (NaN wins every prefix holding one)"
    else:
        key = "~_key(v)" if kernel.descending else "_key(v)"
        doc = "the smaller key ranks first (" + ("the largest first, NaN before +inf)" if kernel.descending
                                                  else "the smallest first, NaN after +inf)")
    return {"rank_key": key, "rank_doc": doc}


def _prefix_strings(kernel: OrderKernel) -> dict:
    """A cumulative op's strings: the saved blocks (and NaN outputs under NaN rule 'zero'), the
    tree's binary step, XLA's zeros (-0 below +0)."""
    extremum = "maximum" if kernel.descending else "minimum"
    nan_zero = kernel.nan_sends_nothing and not kernel.tree
    zero_kept = "(v == 0) & ~torch.signbit(v)" if kernel.descending else "(v == 0) & torch.signbit(v)"
    signs = "0.0, -0.0" if kernel.descending else "-0.0, 0.0"
    return {"saved_args": "block_start, tied, values" if nan_zero else "block_start, tied",
            "nan_lines": ["g = torch.where(torch.isnan(saved.values), 0.0, g)  # NaN rule 'zero': no gradient"]
            if nan_zero else [],
            "nan_jvp_lines": ["out = torch.where(torch.isnan(saved.values), 0.0, out)  # NaN rule 'zero'"]
            if nan_zero else [],
            "combine": f"torch.{extremum}(a, b)",
            "accumulate": f"torch.{'cummax' if kernel.descending else 'cummin'}(v, -1).values",
            "zeros_doc": "-0 below +0" if kernel.descending else "-0 below +0: a min of zeros is -0 once one is met",
            "zeros_lines": [f"kept = torch.cummax(({zero_kept}).to(torch.uint8), -1).values.bool()  # XLA's zeros: -0 below +0",
                            f"values = torch.where(values == 0, torch.where(kept, {signs}).to(v.dtype), values)"]}


def _one(op, kernel: OrderKernel) -> dict:
    """kthvalue, median, nanmedian: the layout of an output per row and the body's strings."""
    whole = op.params["dim"] is None
    lines, low, high = _RANKS[kernel.rank]
    pair = kernel.midpoint
    ranks = f"torch.cat([{low}, {high}], -1)" if pair else low
    form = "block" if kernel.ties == "block" else ("pair" if pair else "single")
    tie = "last" if kernel.ties == "last" else "first"
    ctx = {"layout": "torch/_order_whole.py.jinja" if whole else "torch/_order_one_along.py.jinja",
           "body": "torch/_order_one.py.jinja", "backward_body": _ONE_BACKWARDS[form],
           "rank_key": "_key(v)", "rank_doc": "the smaller key ranks first (the smallest first, NaN after +inf)",
           "rank_lines": lines + [f"return {ranks}"], "picks": "2" if pair else "1",
           "rank_doc_one": _RANK_DOCS[kernel.rank] + (" and rank n // 2 (m // 2): the two middle elements, "
                                                      "averaged" if pair else ""),
           "tie_doc": _TIE_DOCS[tie], "ranked": _RANKED[tie],
           "value": "(chosen[..., 0] + chosen[..., 1]) * 0.5" if pair else "chosen[..., 0]",
           "output": "values" if whole else "(values, _reduced(picked[..., 0], shape))",
           "output_doc": "value" if whole else "(values, indices)",
           "saved_args": ", ".join(("picked", "x")[:len(kernel.saved)]),
           "grad_value": "g" if kernel.grad_form == "written" else "g + 0",
           "grad_doc": _GRAD_DOCS[kernel.grad_form],
           "nan_lines": [f"g = torch.where({_SELECTED_NAN}, 0.0, g)  # NaN rule '{kernel.nan}': a NaN output sends nothing"]
           if kernel.nan_sends_nothing else [],
           "nan_jvp_lines": [f"out = torch.where({_SELECTED_NAN}, 0.0, out)  # NaN rule '{kernel.nan}'"]
           if kernel.nan_sends_nothing else [],
           "shares": "[0.5, 0.5]" if pair else "[1.0]",
           # the selected ranks' terms added (not a sum, which starts from +0 and loses a -0)
           "added_ranks": "terms[..., 0, :] + terms[..., 1, :]" if pair else "terms[..., 0, :]"}
    if kernel.weight is not None:
        ctx |= {"weight": torch_code(kernel.weight, []),
                "weight_doc": "its share over the block's size" if kernel.weight != TOTAL else "its whole share"}
    return ctx
