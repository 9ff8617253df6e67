"""The order statistics' C-family strings (sort, topk, cummax, cummin, kthvalue, median,
nanmedian: lower.OrderKernel), once for the cpu backend (backends/cpu/order.py) and the cuda
backend (backends/cuda/order.py): which body a kernel takes (``body_name``, and ``one_form`` for
one rank of a row) and every finished string its kernels and loader place (the rank keys, the
tie order, the prefix's take-over test, JAX's tree's zeros, the selected ranks, the gradient's
form and NaN rule).  Each backend adds its template names, its bits types and its printer's
weight."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lower import TOTAL, OrderKernel

if TYPE_CHECKING:
    from ...lower import Artifacts
# the body of each (select, ties): the .c partial and the loader's
_BODIES = {("rank", "first"): "rank_one", ("rank", "last"): "rank_one", ("rank", "block"): "rank_block",
           ("prefix", "first"): "prefix_one", ("prefix", "last"): "prefix_one",
           ("prefix", "block"): "prefix_block", ("one", "first"): "one", ("one", "last"): "one",
           ("one", "block"): "one"}
# the element of step s of a row's scan: equal keys keep the scan's order (first: by index; last:
# by index reversed)
_POSITION = {"first": "s", "last": "n - 1 - s"}
# a prefix's winner is replaced by an element whose key is greater (first) or not smaller (last)
_REPLACES = {"first": ">", "last": ">="}
# first/last's gradient at its element (OrderKernel.grad_form), in the compute type, and the other elements'
_GRADIENT = {"written": "g", "added": "({A})0 + g", "negated": "-(({A})0 - g)"}
_OTHERS = {"written": "({A})0", "added": "({A})0", "negated": "-({A})0"}
_GRAD_DOCS = {"written": "written (a -0 stays -0)", "added": "added into +0 (a -0 becomes +0)",
              "negated": "as -(0 - g) (the gradient of -top_k(-x): -0 elsewhere)"}
# the selected rank(s) of a row of n elements, `numbers` of them not NaN (kinds/median.py)
_RANKS = {"k": ("K - 1", "K - 1"),
          "middle": ("numbers < n ? numbers : (n - 1) / 2", "numbers < n ? numbers : n / 2"),
          "middle_of_numbers": ("(numbers > 0 ? numbers - 1 : 0) / 2", "numbers / 2")}
_RANK_DOCS = {"k": "rank K - 1", "middle": "rank (n - 1) // 2 of the row's n elements, or its first NaN's",
              "middle_of_numbers": "rank (m - 1) // 2 of the row's m numbers (NaNs rank last; none: rank 0)"}


def _rank_key(kernel: OrderKernel, dt: str) -> str:
    """The key ranking first the element that comes first (the NumPy module's _rank_key) of v."""
    key = f"sg_key_{dt}(v)"
    if kernel.select == "prefix":  # the larger key wins a prefix (NaN every prefix holding one)
        return key if kernel.descending else f"sg_isnan_bits_{dt}(v) ? INT64_MAX : -{key}"
    return f"-{key}" if kernel.descending else key


def order_strings(art: Artifacts, base: dict, bits: dict, weight: str) -> dict:
    """The kernels' and loader's finished strings, over the backend's base context.  bits: {dtype
    name: (bits type, signed type, magnitude mask, +inf's bits, NumPy's NaN's bits)} of each
    dtype's key; weight: the kernel's weight printed in double ("" where it has none)."""
    kernel = art.kernel
    assert isinstance(kernel, OrderKernel)
    body = "prefix_tree" if kernel.tree else _BODIES[(kernel.select, kernel.ties)]
    ties = "last" if kernel.ties == "last" else "first"
    dtypes = [dt | {"bits": bits[dt["name"]], "rank_key": _rank_key(kernel, dt["name"]),
                    "gradient": _GRADIENT[kernel.grad_form].format(A=dt["acc"]),
                    "others": _OTHERS[kernel.grad_form].format(A=dt["acc"]),
                    "zero_lines": [] if kernel.zeros_ordered else
                    [f"if ((bits & {bits[dt['name']][2]}) == 0) bits = 0;  // -0 as +0"]} for dt in base["dtypes"]]
    ctx = base | {
        "body_name": body, "layout": "host/_order_along.py.jinja", "dtypes": dtypes,
        "saved_fields": list(kernel.saved), "saved_doc": ", ".join(kernel.saved),
        "key_doc": ("NaN above +inf (every NaN equal), -0 below +0" if kernel.zeros_ordered
                    else "NaN above +inf (every NaN equal), +0 and -0 equal"),
        "position": _POSITION[ties], "replaces": _REPLACES[ties], "tie_less": "<" if ties == "first" else ">",
        "tie_doc": ("equal elements rank by index (a stable sort)" if ties == "first"
                    else "equal elements rank by index reversed (the latest first)"),
        "weight": weight, "grad_doc": _GRAD_DOCS[kernel.grad_form],
        "weight_doc": "" if kernel.weight is None else (
            "the block's total over its size" if kernel.weight != TOTAL else "the block's total"),
        "count": "v.shape[-1]" if kernel.k is None else "K",
        "extremum": "max" if kernel.descending else "min",
    }
    if kernel.select == "prefix" and kernel.ties != "block":
        ctx |= _takes(kernel, ties, dtypes)
    if kernel.tree:
        ctx |= _tree_strings(kernel, dtypes)
    elif kernel.select == "prefix":
        ctx |= _prefix_strings(kernel, dtypes)
    if kernel.select == "one":
        ctx |= _one_strings(art.op, kernel, dtypes)
    return ctx


def _prefix_strings(kernel: OrderKernel, dtypes: list[dict]) -> dict:
    """A cumulative op's NaN rule 'zero' (an output that is NaN sends nothing): the saved values
    that backward and jvp read, and their lines."""
    nan_zero = kernel.nan_sends_nothing
    for dt in dtypes:
        isnan = f"sg_isnan_bits_{dt['name']}(values[r * n + i])"
        dt |= {"values_param": f"const {dt['ctype']}* restrict values, " if nan_zero else "",
               "nan_lines": [f"if ({isnan}) g = 0.0;  // NaN rule 'zero': no gradient"] if nan_zero else [],
               "nan_jvp_lines": [f"if ({isnan}) o = 0.0;  // NaN rule 'zero'"] if nan_zero else []}
    return {"values_param_doc": "const T* values, " if nan_zero else "",
            "values_read": ["_c(_saved_array(saved, \"values\", _row_shape(saved)))"] if nan_zero else [],
            "values_kept": "values, " if nan_zero else ""}


# x takes over from the winner b of a prefix, compared as floats where +0 and -0 are equal (the
# total-order key's order: NaN above every number); by (ties, descending)
_TAKES = {("first", True): "(sg_isnan(x) && !sg_isnan(b)) || x > b",
          ("last", True): "sg_isnan(x) || (!sg_isnan(b) && x >= b)",
          ("first", False): "(sg_isnan(x) && !sg_isnan(b)) || (!sg_isnan(b) && x < b)",
          ("last", False): "sg_isnan(x) || (!sg_isnan(b) && x <= b)"}


def _takes(kernel: OrderKernel, ties: str, dtypes: list[dict]) -> dict:
    """Whether element x takes over as a prefix's winner from b: compared as floats (NaN the
    largest, +0 equal to -0), or by the key where -0 ranks below +0."""
    for dt in dtypes:
        dt["takes"] = (f"sg_rank_{dt['name']}(row[i]) {_REPLACES[ties]} sg_rank_{dt['name']}(held)"
                       if kernel.zeros_ordered else _TAKES[(ties, kernel.descending)])
    return {"takes_doc": ("the keys compared" if kernel.zeros_ordered
                          else "compared as floats, NaN above every number, +0 equal to -0")}


def _tree_strings(kernel: OrderKernel, dtypes: list[dict]) -> dict:
    """JAX's tree of cummax/cummin: the binary extremum's winner, XLA's zeros (-0 below +0: the
    output is +0 once a +0 is met (max), -0 once a -0 is met (min))."""
    top, bottom = ("+0", "-0") if kernel.descending else ("-0", "+0")
    for dt in dtypes:
        zeros = {"+0": f"sg_store_{dt['name']}(({dt['acc']})0)", "-0": f"sg_store_{dt['name']}(-({dt['acc']})0)"}
        dt |= {"kept_zero": zeros[top], "other_zero": zeros[bottom]}
    return {"wins": ">=" if kernel.descending else "<=",
            "accumulate": "maximum.accumulate" if kernel.descending else "minimum.accumulate",
            "kept_sign": "!signbit(b)" if kernel.descending else "signbit(b)",
            "kept_doc": f"a {top} met so far: a zero output is {top}, else {bottom}",
            "zeros_doc": "-0 below +0" if kernel.descending else "-0 below +0: a min of zeros is -0 once one is met"}


_ONE_DOCS = {  # (backward, jvp) of each form
    "single": ("each row's gradient {grad} at the element holding the selected rank, +0 elsewhere",
               "the tangent of the element holding the rank (a gather)"),
    "pair": ("g * 0.5 added into +0 at each of the two middle elements (both halves, added, where one "
             "element holds both ranks), +0 elsewhere", "(t_low + t_high) * 0.5 of the two middle elements' tangents"),
    "block": ("each element of a selected rank's tie block gathering {weight} of the output's gradient "
              "(computed in float64, rounded once; a -0 kept), +0 elsewhere",
              "{weight} of each selected rank's block's tangents (float64, rounded once)")}


def _one_strings(op, kernel: OrderKernel, dtypes: list[dict]) -> dict:
    """kthvalue, median, nanmedian: the rank(s) each row selects, the value (JAX's midpoint: the
    two middle elements averaged), the gradient's partial and its NaN rule."""
    whole = op.params["dim"] is None
    low, high = _RANKS[kernel.rank]
    pair = kernel.midpoint
    form = "block" if kernel.ties == "block" else ("pair" if pair else "single")
    for dt in dtypes:
        name, a = dt["name"], dt["acc"]
        chosen = [f"row[ranked[{rank}].at]" for rank in ("low", "next")]
        isnan = f"sg_isnan_bits_{name}(x[r * n + picked[r * PICKS]])"
        dt |= {"value": (f"sg_store_{name}(sg_load_{name}(sg_store_{name}(sg_load_{name}({chosen[0]}) + "
                         f"sg_load_{name}({chosen[1]}))) * ({a})0.5)") if pair else chosen[0],
               "nan_lines": [f"if ({isnan}) g = 0;  // NaN rule '{kernel.nan}': a NaN output sends nothing"]
               if kernel.nan_sends_nothing else [],
               "nan_jvp_lines": [f"if ({isnan}) o = 0;  // NaN rule '{kernel.nan}'"] if kernel.nan_sends_nothing else []}
    hit = "(k == key[{m}] ? w[{m}] : 0.0)"
    backward_doc, jvp_doc = _ONE_DOCS[form]
    weight_doc = "its share over the block's size" if kernel.weight != TOTAL else "its whole share"
    return {
        "layout": "host/_order_whole.py.jinja" if whole else "host/_order_one_along.py.jinja",
        "low": low, "high": high if pair else low, "picks": "2" if pair else "1",
        "rank_doc_one": _RANK_DOCS[kernel.rank] + (" and rank n // 2 (m // 2): the two middle elements, "
                                                   "averaged" if pair else ""),
        "one_form": form,
        "shares": "{0.5, 0.5}" if pair else "{1.0}",
        "added_ranks": " + ".join(hit.format(m=m) for m in range(1 + pair)),
        "added_terms": " + ".join(f"terms[{m}]" for m in range(1 + pair)),
        "weight_doc": weight_doc if form == "block" else "",
        "backward_doc": backward_doc.format(grad=_GRAD_DOCS[kernel.grad_form], weight=weight_doc),
        "jvp_doc": jvp_doc.format(weight=weight_doc),
        "rank_checks": ["if not 1 <= K <= n:",
                        '    raise ValueError(f"{OP}: k={K} is out of range for the {n} elements along dim {DIM}")']
        if kernel.rank == "k" else [],
        "k_arg": "K" if kernel.rank == "k" else "0",
        "output": "values" if whole else "(values, _reduced(picked[..., 0], x.shape))",
        "output_doc": "value" if whole else "(values, indices)",
        "saved_args": ", ".join(("picked", "x")[:len(kernel.saved)]),
        "x_read": ('_c(_rows(_saved_array(saved, "x", saved.input_shape)))' if len(kernel.saved) > 1
                   else "np.empty(0, dtype=saved.dtype)"),  # (x not read)
    }
