"""What the torch and jax backends' bag modules share (``lower.BagKernel``, windows "bags":
embedding_bag_max; their templates <backend>/bag.py.jinja and its partials): the template
context as finished strings, in one array library's names.

Every element of the index list stays in place, in index order (padding_idx's take no part), so
the shapes are the inputs': nothing branches on or is sized by an array's values.  Each bag's
extremum, hits and picked element follow the NumPy module's (numpy/bag.py: NaN propagating, or
PyTorch's 'keep', or torchvision's floor), as scatters over the elements that take part."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...lower import BagKernel
from .segment import SYMBOLS


@dataclass(frozen=True)
class BagDialect:
    """One framework's names: its array module (``lib``: "torch" or "jnp"), its scatter max/min
    (``reduce``: {"max": ..., "min": ...}, _per_bag's how), its expression printer, its template
    folder, the mask's weight's first lines (a function of the lowered selection)."""

    lib: str
    reduce: dict
    code: Callable
    folder: str
    weight_lines: Callable = lambda sel: []


# each bag's extremum, hits and picked element by how the NaN rule reads NaN (numpy/bag.py's
# _EXTREMUM), over the elements that take part; {lib} and {reduce} filled per framework
_SKIPPING = "_per_bag({lib}.where(taking & ~{lib}.isnan(v), v, FILL), bag, num, FILL, {reduce!r})"
_EXTREMUM = {
    "propagating": ["extremum = _per_bag({lib}.where(taking, v, FILL), bag, num, FILL, {reduce!r})",
                    "hit = taking & _hit(v, _rows(extremum, bag))",
                    "return extremum, hit, _picked(v, hit, bag, num)"],
    "floor": [f"extremum = {{lib}}.fmax({_SKIPPING}, {{lib}}.asarray(FLOOR, dtype=v.dtype))  # NaN never takes over",
              "hit = taking & _hit(v, _rows(extremum, bag)) & (v > FLOOR)",
              "return extremum, hit, _picked(v, hit, bag, num)"],
    "keep": [f"extremum = {_SKIPPING}  # NaN never takes over",
             "hit = taking & _hit(v, _rows(extremum, bag))",
             "first = _first_hit(taking | hit, bag, num)  # each bag's first element (hit: within taking)",
             "first_nan = {lib}.isnan(_at(v, first))  # a NaN that comes first keeps its bag",
             "return extremum, hit, {lib}.where(first_nan, first, _picked(v, hit, bag, num))"],
}
_EXTREMUM_DOCS = {"propagating": "the extremum propagates NaN",
                  "floor": "the running max starts at FLOOR; NaN never wins (torchvision's CPU rule)",
                  "keep": "NaN is skipped unless it comes first, which then wins (PyTorch's CPU rule)"}
_OUTPUT = {"propagating": "{lib}.where({lib}.isnan(extremum), extremum, chosen)", "keep": "chosen",
           "floor": "{lib}.where(picked >= 0, chosen, extremum)"}

# the element each bag's output (and a scan's winner) is, among its hits
_PICKS = {"first": ["return _first_hit(hit, bag, num)"], "second": ["return _last_hit(hit, bag, num)"]}
_PICK_DOCS = {"first": "first hit", "second": "last hit",
              "ordered": "first hit that is +0 where the extremum is a zero (-0 below +0), else its first hit"}


def _pick(pick: str, extremum: str, lib: str) -> list[str]:
    """_picked's lines: the first or last hit, or under the zeros rule 'ordered' the first +0
    (max; min: -0) among them, else the first."""
    sign = f"~{lib}.signbit(v)" if extremum == "max" else f"{lib}.signbit(v)"
    return _PICKS.get(pick) or ["first = _first_hit(hit, bag, num)",
                                f"preferred = _first_hit(hit & {sign}, bag, num)",
                                f"return {lib}.where(preferred >= 0, preferred, first)"]


def _names(op) -> dict:
    """The strings naming the op's float input, its integer inputs and its parameters."""
    inputs, constants = op.spec.inputs, op.spec.constant_inputs
    floating = next(n for n in inputs if n not in constants)
    tangents = ", ".join(f"tangent_{n}" for n in inputs)
    return {"float_name": floating, "constant_inputs": list(constants),
            "constant_names": " and ".join(f"tangent_{n}" for n in constants),
            "grads_doc": ", ".join(f"grad_{n}" if n == floating else "None" for n in inputs),
            "returns": ", ".join("_table(grad_rows, saved)" if n == floating else "None" for n in inputs),
            "wrt_tuple": repr((floating,)),
            "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
            "forward_params": ", ".join(inputs), "forward_args": ", ".join(inputs),
            "jvp_params": tangents, "jvp_args": tangents}


def _how(op, kernel: BagKernel) -> str:
    """How a bag's extremum reads NaN: "floor" (a framework's running max from a floor), "keep"
    (PyTorch's CPU rule) or "propagating"."""
    return "floor" if kernel.bag.floor else "keep" if op.nan == "keep" else "propagating"


def bag_context(op, kernel: BagKernel, d: BagDialect, array: str) -> dict:
    """bag.py.jinja's finished strings in dialect d (array: the module's array type's name)."""
    sel, rule = kernel.selection, kernel.segment
    mask = sel.form == "mask"
    how, lib = _how(op, kernel), d.lib
    pick = sel.order if sel.form == "scan" else rule.zeros
    pick = {"last": "second"}.get(pick, pick)
    fields = ([f"table: {array}  # the table (weight)", f"output: {array}  # the output rows (B, F)",
               f"count: {array}  # each bag's hits per column (integers)"] if mask else
              [f"winner: {array}  # each bag's winner per column (B, F): -1 none, e >= 0 element e"])
    return {
        "layout_partial": f"{d.folder}/_{kernel.bag.layout}_layout.py.jinja",
        "selection_partial": f"{d.folder}/_bag_{sel.form}.py.jinja",
        "extremum": sel.extremum,
        "fill": "-math.inf" if sel.extremum == "max" else "math.inf",
        "floor_line": ([f"FLOOR = {kernel.bag.floor}  # where the running max starts (torchvision's -FLT_MAX)"]
                       if kernel.bag.floor else []),
        "hit": "v == extremum" if how != "propagating" else d.code(rule.hit.xreplace(SYMBOLS)),
        "weight": d.code(sel.weight) if mask else "grad_output",
        "weight_lines": d.weight_lines(sel) if mask else [],
        "pick_lines": _pick(pick, sel.extremum, lib), "pick_doc": _PICK_DOCS[pick],
        "extremum_lines": [line.format(lib=lib, reduce=d.reduce[sel.extremum]) for line in _EXTREMUM[how]],
        "extremum_doc": _EXTREMUM_DOCS[how],
        "output": _OUTPUT[how].format(lib=lib),
        "saved_doc": "the table, the output and each bag's count" if mask else "each bag's winner",
        "saved_fields": fields,
        "count_initial": ([f"count = count + {lib}.where(filled & (extremum == -math.inf), 1, 0)  # the -inf "
                           f"fill counted where a bag's max is -inf (JAX's segment_max)"]
                          if rule.count_initial else []),
        "forward_doc": kernel.bag.forward_doc,
        **_names(op),
    }
