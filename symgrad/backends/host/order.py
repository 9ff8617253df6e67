"""The order statistics' template context (``lower.OrderKernel``: sort, topk, cummax, cummin,
kthvalue, median, nanmedian), once for the torch and jax backends: which body and layout templates
a kernel takes and the strings they place, each backend's array calls given by its ``OrderDialect``
(backends/torch/order.py, backends/jax/order.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...lower import TOTAL, OrderKernel

_TIE_DOCS = {"first": "equal elements rank by index (a stable sort)",
             "last": "equal elements rank by index reversed (the latest first)"}
_GRAD_DOCS = {"written": "written (a -0 stays -0, as zeros.scatter)",
              "added": "added into +0 (a -0 becomes +0)",
              "negated": "as -(0 - g) (the gradient of -top_k(-x): -0 elsewhere)"}
_RANK_DOCS = {"k": "rank K - 1", "middle": "rank (n - 1) // 2 of the row's n elements, or its first NaN's",
              "middle_of_numbers": "rank (m - 1) // 2 of the row's m numbers (NaNs rank last; none: rank 0)"}


@dataclass(frozen=True)
class OrderDialect:
    """One framework's calls in the order statistics' modules.

    templates: the backend's template folder (jax, torch); code: prints a lowered weight; ranked:
    the argsort of a row by tie order; rising: the line marking a prefix's new bests; grad_values,
    grad_zeros: a selected gradient and the zeros it lands in, by OrderKernel.grad_form; numbers:
    the line counting a row's non-NaN elements; rank_k, middle_low, middle_high, numbers_low: the
    selected ranks; concat: {a}, {b} joined on the last axis; pair_value: the two middle values
    averaged; selected_nan: whether a row's selected element is NaN; canonical: -0 made +0;
    nan_top: a min prefix's key with NaN on top; signbit, module: the library's names; accumulate:
    a running max/min ({f}: cummax or cummin); to_int8: a Boolean as 8-bit integers ({a}); kept:
    a running any ({a}); zero_where: {name} zeroed where {cond}."""

    templates: str
    code: Callable
    ranked: dict
    rising: str
    grad_values: dict
    grad_zeros: dict
    numbers: str
    rank_k: str
    middle_low: str
    middle_high: str
    numbers_low: str
    concat: str
    pair_value: str
    selected_nan: str
    canonical: str
    nan_top: str
    module: str
    accumulate: str
    kept: str
    to_dtype: str
    zero_where: str

    def template(self, name: str) -> str:
        return f"{self.templates}/_order_{name}.py.jinja"

def order_context(op, kernel: OrderKernel, d: OrderDialect) -> dict:
    """What order.py.jinja and its body place: finished strings only."""
    ctx = _shared(kernel, d) | {"params_list": [(k.upper(), repr(v)) for k, v in op.params.items()]}
    if kernel.select == "one":
        return ctx | _one(op, kernel, d)
    prefix = kernel.select == "prefix"
    body = ("prefix_tree" if kernel.tree else
            f"{kernel.select}_{'block' if kernel.ties == 'block' else 'one'}")
    ctx |= {"body": d.template(body), "layout": d.template("along")} | _rank_key(kernel, prefix, d)
    if kernel.ties in _TIE_DOCS:
        winners = {"first": ["takes = key == best", d.rising,
                             "takes = takes & rising  # the first to reach a new best"],
                   "last": ["takes = key == best  # every element reaching the best takes over: the latest holds it"]}
        ctx |= {"tie_doc": _TIE_DOCS[kernel.ties], "ranked": d.ranked[kernel.ties],
                "winner_lines": winners[kernel.ties]}
    ctx |= _weight(kernel, d, "the block's total over its size", "the block's total")
    ctx |= {"count": "v.shape[-1]" if kernel.k is None else "K",
            "count_doc": "n - 1" if kernel.k is None else "K - 1",
            "grad_value": d.grad_values[kernel.grad_form], "grad_zeros": d.grad_zeros[kernel.grad_form],
            "grad_doc": _GRAD_DOCS[kernel.grad_form]}
    return ctx | _prefix_strings(kernel, d)


def _shared(kernel: OrderKernel, d: OrderDialect) -> dict:
    return {"saved_fields": list(kernel.saved), "saved_doc": ", ".join(kernel.saved),
            "key_doc": ("NaN above +inf (every NaN equal), -0 below +0" if kernel.zeros_ordered
                        else "NaN above +inf (every NaN equal), +0 and -0 equal"),
            "canonical_lines": [] if kernel.zeros_ordered else [d.canonical],
            "extremum": "max" if kernel.descending else "min"}


def _weight(kernel: OrderKernel, d: OrderDialect, share: str, whole: str) -> dict:
    if kernel.weight is None:
        return {}
    return {"weight": d.code(kernel.weight), "weight_doc": share if kernel.weight != TOTAL else whole}


def _rank_key(kernel: OrderKernel, prefix: bool, d: OrderDialect) -> dict:
    """The key the body orders by: a rank select sorts it ascending (the largest first: the key
    complemented, ~key = -key - 1, the same order reversed); a prefix keeps its running maximum (a
    min: complemented, NaN still on top)."""
    if prefix:
        key = "_key(v)" if kernel.descending else d.nan_top
        doc = "the larger key wins a prefix (NaN wins every prefix holding one)"
    else:
        key = "~_key(v)" if kernel.descending else "_key(v)"
        doc = "the smaller key ranks first (" + ("the largest first, NaN before +inf)" if kernel.descending
                                                  else "the smallest first, NaN after +inf)")
    return {"rank_key": key, "rank_doc": doc}


def _prefix_strings(kernel: OrderKernel, d: OrderDialect) -> dict:
    """A cumulative op's strings: the saved blocks (and NaN outputs under NaN rule 'zero'), the
    tree's binary step, XLA's zeros (-0 below +0)."""
    extremum = "maximum" if kernel.descending else "minimum"
    nan_zero = kernel.nan_sends_nothing and not kernel.tree
    sign = f"{d.module}.signbit(v)"
    zero_kept = f"(v == 0) & ~{sign}" if kernel.descending else f"(v == 0) & {sign}"
    signs = "0.0, -0.0" if kernel.descending else "-0.0, 0.0"
    nan = "isnan(saved.values)"
    return {"saved_args": "block_start, tied, values" if nan_zero else "block_start, tied",
            "nan_lines": [d.zero_where.format(name="g", cond=f"{d.module}.{nan}") + "  # NaN rule 'zero': no gradient"]
            if nan_zero else [],
            "nan_jvp_lines": [d.zero_where.format(name="out", cond=f"{d.module}.{nan}") + "  # NaN rule 'zero'"]
            if nan_zero else [],
            "combine": f"{d.module}.{extremum}(a, b)",
            "accumulate": d.accumulate.format(f="cummax" if kernel.descending else "cummin"),
            "zeros_doc": "-0 below +0" if kernel.descending else "-0 below +0: a min of zeros is -0 once one is met",
            "zeros_lines": [f"kept = {d.kept.format(a=f'({zero_kept})')}  # XLA's zeros: -0 below +0",
                            f"values = {d.module}.where(values == 0, {d.to_dtype.format(a=f'{d.module}.where(kept, {signs})')}, values)"]}


def _one(op, kernel: OrderKernel, d: OrderDialect) -> dict:
    """kthvalue, median, nanmedian: the layout of an output per row and the body's strings."""
    whole = op.params["dim"] is None
    lines, low, high = {"k": (["if not 1 <= K <= n:",
                               '    raise ValueError(f"{OP}: k={K} is out of range for the {n} elements along dim {DIM}")'],
                              d.rank_k, None),
                        "middle": ([d.numbers, "nan_row = numbers < n  # a row holding NaN: its first NaN (rank `numbers`)"],
                                   d.middle_low, d.middle_high),
                        "middle_of_numbers": ([d.numbers], d.numbers_low, "numbers // 2")}[kernel.rank]
    pair = kernel.midpoint
    ranks = d.concat.format(a=low, b=high) if pair else low
    form = "block" if kernel.ties == "block" else ("pair" if pair else "single")
    tie = "last" if kernel.ties == "last" else "first"
    ctx = {"layout": d.template("whole" if whole else "one_along"),
           "body": d.template("one"), "backward_body": d.template(f"one_{form}"),
           "rank_key": "_key(v)", "rank_doc": "the smaller key ranks first (the smallest first, NaN after +inf)",
           "rank_lines": lines + [f"return {ranks}"], "picks": "2" if pair else "1",
           "rank_doc_one": _RANK_DOCS[kernel.rank] + (" and rank n // 2 (m // 2): the two middle elements, "
                                                      "averaged" if pair else ""),
           "tie_doc": _TIE_DOCS[tie], "ranked": d.ranked[tie],
           "value": d.pair_value if pair else "chosen[..., 0]",
           "output": "values" if whole else "(values, _reduced(picked[..., 0], shape))",
           "output_doc": "value" if whole else "(values, indices)",
           "saved_args": ", ".join(("picked", "x")[:len(kernel.saved)]),
           "grad_value": "g" if kernel.grad_form == "written" else d.grad_values["added"],
           "grad_doc": _GRAD_DOCS[kernel.grad_form],
           "nan_lines": [d.zero_where.format(name="g", cond=d.selected_nan)
                         + f"  # NaN rule '{kernel.nan}': a NaN output sends nothing"]
           if kernel.nan_sends_nothing else [],
           "nan_jvp_lines": [d.zero_where.format(name="out", cond=d.selected_nan) + f"  # NaN rule '{kernel.nan}'"]
           if kernel.nan_sends_nothing else [],
           "shares": "[0.5, 0.5]" if pair else "[1.0]",
           # the selected ranks' terms added (not a sum, which starts from +0 and loses a -0)
           "added_ranks": "terms[..., 0, :] + terms[..., 1, :]" if pair else "terms[..., 0, :]"}
    return ctx | _weight(kernel, d, "its share over the block's size", "its whole share")
