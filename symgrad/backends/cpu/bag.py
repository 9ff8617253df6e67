"""The cpu backend's bag kernels (windows given by offsets into gathered table rows:
embedding_bag_max, roi_max_pool; kinds/bag.py, kinds/roi.py): bag.c.jinja (forward a bag per
thread, each bag's elements in index order; backward and jvp a column per thread, the rows in
index order, so the table's gradient adds each row's term in the NumPy module's order whatever
the thread count, no atomics) and loader_bag.py.jinja (the NumPy module's layout partials from
host/, its Saved field for field)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .printer import c_code
from ..cfamily.segment import rounds_apart_in_float16

if TYPE_CHECKING:
    from ...lower import Artifacts

# how a bag reads NaN (the NumPy module's numpy/bag.py: symgrad's rules, PyTorch's CPU 'keep',
# torchvision's 'floor'): the fold of its elements, its hits, the output where it is not the
# picked element's value
_FOLD_DOCS = {"propagating": "the extremum propagates NaN",
              "keep": "NaN is skipped unless it comes first, which then wins (PyTorch's CPU rule)",
              "floor": "the running max starts at FLOOR; NaN never wins (torchvision's CPU rule)"}
# the element picked among the hits: first[o], last[o], preferred (first of the preferred sign)
_PICKED = {"first": "first", "second": "last", "ordered": "preferred >= 0 ? preferred : first"}


def _how(op, kernel) -> str:
    return "floor" if kernel.bag.floor else "keep" if op.nan == "keep" else "propagating"


def _functions(how: str, rt: str, extremum: str, rule_hit) -> list[dict]:
    """sg_fold (the extremum so far: NaN propagating, or skipped) and sg_bag_hit (an element
    attains its bag's extremum), in compute type rt."""
    beats = ">" if extremum == "max" else "<"
    fold = (f"return sg_combine_{rt}(best, v);" if how == "propagating" else
            f"return sg_isnan(v) ? best : (sg_isnan(best) || v {beats} best) ? v : best;")
    hit = {"propagating": f"return {c_code(rule_hit, rt)};", "keep": "return v == extremum;",
           "floor": "return v == extremum && v > FLOOR;"}[how]
    params = f"const {rt} {{}}, const {rt} {{}}"
    return [{"ret": rt, "name": f"sg_fold_{rt}", "params": params.format("best", "v"), "body": [fold]},
            {"ret": "bool", "name": f"sg_bag_hit_{rt}", "params": params.format("v", "extremum"), "body": [hit]}]


def bag_context(art: Artifacts, base: dict, selection: tuple, dtypes: list[dict]) -> dict:
    """The .c source's and loader's finished strings, over the backend's base context (base) and
    printed selection (selection: _selection's docs and functions, to which the fold and the bag's
    hit are added)."""
    op, kernel = art.op, art.kernel
    sel, rule, bag = kernel.selection, kernel.segment, kernel.bag
    scan = sel.form == "scan"
    how = _how(op, kernel)
    docs, real_types = selection
    docs = docs + ["sg_fold(best, v): the bag's extremum so far (" + _FOLD_DOCS[how] + ")",
                   "sg_bag_hit(v, extremum): an element attains its bag's extremum"]
    for rt in real_types:
        rt["functions"] += _functions(how, rt["name"], sel.extremum, rule.hit)
    pick = {"last": "second"}.get(sel.order if scan else rule.zeros, sel.order if scan else rule.zeros)
    inputs, constants = op.spec.inputs, op.spec.constant_inputs
    floating = next(n for n in inputs if n not in constants)
    counts = {dt["name"]: f", ({dt['acc']})saved[o]" if sel.counts else "" for dt in dtypes}
    return base | {
        "template": "cpu/bag.c.jinja", "loader_template": "cpu/loader_bag.py.jinja",
        "layout_partial": f"host/_{bag.layout}_layout.py.jinja",
        "selection_doc": docs, "real_types": real_types, "scan": scan, "fold_doc": _FOLD_DOCS[how],
        "constants": ([f"#define FLOOR ({bag.floor})  // where the running max starts (torchvision's -FLT_MAX)"]
                      if bag.floor else [])
        + [f"#define PREFERRED(v) ({'!' if sel.extremum == 'max' else ''}signbit(v))  // the preferred sign of a tied zero"],
        "picked": _PICKED[pick], "keeps_first": how == "keep", "floor": bool(bag.floor),
        # the output is the picked element's value, or the extremum (NaN where it propagates)
        "chosen": "at >= 0 && !sg_isnan(ext)" if how == "propagating" else "at >= 0",
        "empty_saved": "-1" if scan else "0", "extremum": sel.extremum,
        # the table as the kernels read it (a scan reads the winner only)
        "table_read": "np.empty((0,), dtype=saved.dtype)" if scan else "_c(saved.table)", "gather_doc": "winner" if scan else "output and count",
        "count_initial": bool(rule.count_initial and not scan),
        "saved_doc": "each bag's winner per column (-1 none)" if scan else "each bag's count of hits per column",
        "count_arg": counts, "floating": floating, "constant_inputs": list(constants),
        "forward_params": ", ".join(inputs), "jvp_params": ", ".join(f"tangent_{n}" for n in inputs),
        "grads": ", ".join("grad" if n == floating else "None" for n in inputs),
        "grads_doc": ", ".join(f"grad_{n}" if n == floating else "None" for n in inputs),
        "forward_doc": bag.forward_doc, "float16_refused": repr(rounds_apart_in_float16(kernel)),
    }
