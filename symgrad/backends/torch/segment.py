"""The torch backend's segments (``lower.WindowKernel`` of windows "segments": scatter_max/min,
segment_max/min): the template context of ``segment.py.jinja``, printed as plain PyTorch code.

Elements are flat (dim moved first, row-major), so a segment's elements are in index order.
Forward: each segment's extremum by ``scatter_reduce`` (NaN propagating), its first/last hit by an
integer ``scatter_reduce`` ("amin"/"amax" of positions) and its count of hits by an integer
``scatter_add``: exact, the same on every device.  Backward in gather form: each element reads
its segment's winner (first/last) or output and count (split/all): no scatter-add of gradients,
no atomics, deterministic on a GPU.  No ``.item()`` and no branch on a tensor's values in what
torch.compile traces (the index's range is checked eagerly only)."""

from __future__ import annotations

import sympy as sp

from ...lower import EXTREMUM, V, WindowKernel
from ..host.segment import SEGMENT_INITIAL
from .window import GEOMETRY, _code

# the layout partial of each initial element (lower.SegmentRule.initial); GEOMETRY names it for
# the form (test_contract: a geometry for each window form the backend builds)
_LAYOUTS = {"input": "torch/_segment_scatter.py.jinja", "fill": "torch/_segment_fill.py.jinja"}
GEOMETRY["segments"] = "torch/_segment_scatter.py.jinja"

# the initial elements' tangent, flat, in the working dtype
_INITIAL_TANGENT = {
    "input": ('torch.zeros(saved.taking.shape, dtype=work, device=saved.key.device) if tangent_input is None '
              'else _flat(_as_given("tangent_input", tangent_input, saved.output_shape, saved.dtype), saved.dim)'),
    "fill": "torch.zeros(saved.taking.shape, dtype=work, device=saved.key.device)",
}

# the element each segment's output (and a scan's winner) is, among its hits
_PICKS = {"first": ["return _first_hit(hit_src, hit_initial, lay.key)"],
          "second": ["return _last_hit(hit_src, hit_initial, lay.key)"]}
_PICK_DOCS = {"first": "first hit", "second": "last hit",
              "ordered": "first hit that is +0 where the extremum is a zero (-0 below +0), else its first hit"}


def _ordered(extremum: str) -> list[str]:
    """The zeros rule 'ordered': of tied +0 and -0, +0 is the max and -0 the min."""
    sign = "~torch.signbit({})" if extremum == "max" else "torch.signbit({})"
    return ["first = _first_hit(hit_src, hit_initial, lay.key)",
            f"preferred = _first_hit(hit_src & {sign.format('lay.src')}, "
            f"hit_initial & {sign.format('lay.initial')}, lay.key)",
            "return torch.where(preferred != -2, preferred, first)"]


def refuses(op) -> bool:
    """segment_max without num_segments: the output's size would be read from the ids' values."""
    return op.params.get("num_segments", 0) is None


def segment_context(op, kernel: WindowKernel) -> dict:
    """segment.py.jinja's finished strings."""
    if refuses(op):
        raise ValueError(f"{op.name}: the torch backend builds segments with num_segments given only "
                         f"(the output's size is not read from the ids' values); pass num_segments, "
                         f"or use backend='numpy'")
    sel, rule = kernel.selection, kernel.segment
    names = {V: sp.Symbol("v", real=True), EXTREMUM: sp.Symbol("extremum", real=True)}
    pick = sel.order if sel.form == "scan" else rule.zeros  # (a scan's order: first or last)
    pick = "second" if pick == "last" else pick
    inputs = op.spec.inputs
    floats = [n for n in inputs if n not in op.spec.constant_inputs]
    mask = sel.form == "mask"
    fields = (["src: torch.Tensor  # the src elements",
               "initial: torch.Tensor  # the initial elements",
               "output: torch.Tensor  # the output elements",
               "count: torch.Tensor  # each segment's hits (int64)"] if mask else
              ["winner: torch.Tensor  # each segment's winner: -2 none, -1 its initial element, e >= 0 src element e"])
    initial = SEGMENT_INITIAL[rule.initial]
    return {
        "layout_partial": _LAYOUTS[rule.initial],
        "selection_partial": f"torch/_segment_{sel.form}.py.jinja",
        "extremum": sel.extremum,
        "reduce": "amax" if sel.extremum == "max" else "amin",
        "fill": "-math.inf" if rule.fill == "-inf" else "math.inf",
        "hit": _code(rule.hit.xreplace(names)),
        "weight": _code(sel.weight) if mask else "grad_output",
        "pick_lines": _PICKS.get(pick) or _ordered(sel.extremum),
        "pick_doc": _PICK_DOCS[pick],
        "saved_doc": ("the src and initial elements, the output and each segment's count" if mask
                      else "each segment's winner"),
        "saved_fields": fields,
        "count_initial": (["count = count + (~lay.taking & _hit(lay.initial, out)).to(torch.int64)  # the "
                           "initial element counted where it takes no part (the framework's count)"]
                          if rule.count_initial else []),
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "wrt_tuple": repr(tuple(floats)),
        "forward_params": ", ".join(inputs), "forward_args": ", ".join(inputs),
        "jvp_params": ", ".join(f"tangent_{n}" for n in inputs),
        "jvp_args": ", ".join(f"tangent_{n}" for n in inputs),
        "index_name": next(n for n in inputs if n in op.spec.constant_inputs),
        "src_name": floats[-1],
        "returns": initial["returns"], "grads_doc": initial["grads_doc"],
        "forward_doc": initial["forward_doc"],
        "initial_tangent": _INITIAL_TANGENT[rule.initial],
    }
