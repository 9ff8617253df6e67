"""The torch backend's bags (``lower.BagKernel``, windows "bags": embedding_bag_max): the template
context of ``bag.py.jinja``, printed as plain PyTorch code.

Every element of the index list stays in place, in index order (padding_idx's take no part), so
the shapes are the inputs': no branch on a tensor's values, nothing sized by them.  Forward: each
bag's extremum by ``scatter_reduce`` (NaN propagating, or skipping NaN where the NaN rule is
PyTorch's 'keep'), its first/last hit by an integer ``scatter_reduce`` and its count of hits by an
integer scatter: exact, the same on every device.  Backward in gather form: each gathered row
reads its bag's winner (first/last) or output and count (split/all); the rows' gradients are then
added onto their table rows by ``index_add``, in index order on the CPU (the NumPy module's
np.add.at, bit for bit)."""

from __future__ import annotations

from pathlib import Path

from ...lower import BagKernel
from ..host.segment import SYMBOLS
from .window import GEOMETRY, _code

GEOMETRY["bags"] = "torch/_bag_layout.py.jinja"  # (the layout partial of embedding_bag_max's bags)


def builds_layout(layout: str | None) -> bool:
    """Whether it builds a bag op of this layout (lower.bag_layout; None: not a bag op): where
    its layout partial _<layout>_layout.py.jinja exists."""
    return layout is None or (Path(__file__).parent / "templates" / f"_{layout}_layout.py.jinja").is_file()

# each bag's extremum, hits and picked element by how the NaN rule reads NaN (the NumPy module's
# numpy/bag.py _EXTREMUM, as scatter_reduce calls over the elements that take part)
_SKIPPING = "_per_bag(torch.where(taking & ~torch.isnan(v), v, FILL), bag, num, FILL, {reduce!r})"
_EXTREMUM = {
    "propagating": [f"extremum = {_SKIPPING.replace('taking & ~torch.isnan(v)', 'taking')}",
                    "hit = taking & _hit(v, torch.index_select(extremum, 0, bag))",
                    "return extremum, hit, _picked(v, hit, bag, num)"],
    "floor": [f"extremum = torch.fmax({_SKIPPING}, torch.tensor(FLOOR, dtype=v.dtype))  # NaN never takes over",
              "hit = taking & _hit(v, torch.index_select(extremum, 0, bag)) & (v > FLOOR)",
              "return extremum, hit, _picked(v, hit, bag, num)"],
    "keep": [f"extremum = {_SKIPPING}  # NaN never takes over",
             "hit = taking & _hit(v, torch.index_select(extremum, 0, bag))",
             "first = _first_hit(taking.expand(v.shape), bag, num)  # each bag's first element",
             "first_nan = torch.isnan(_at(v, first))  # a NaN that comes first keeps its bag",
             "return extremum, hit, torch.where(first_nan, first, _picked(v, hit, bag, num))"],
}
_EXTREMUM_DOCS = {"propagating": "the extremum propagates NaN",
                  "floor": "the running max starts at FLOOR; NaN never wins (torchvision's CPU rule)",
                  "keep": "NaN is skipped unless it comes first, which then wins (PyTorch's CPU rule)"}
_OUTPUT = {"propagating": "torch.where(torch.isnan(extremum), extremum, chosen)", "keep": "chosen",
           "floor": "torch.where(picked >= 0, chosen, extremum)"}

# the element each bag's output (and a scan's winner) is, among its hits
_PICKS = {"first": ["return _first_hit(hit, bag, num)"], "second": ["return _last_hit(hit, bag, num)"]}
_PICK_DOCS = {"first": "first hit", "second": "last hit",
              "ordered": "first hit that is +0 where the extremum is a zero (-0 below +0), else its first hit"}


def _pick(pick: str, extremum: str) -> list[str]:
    """_picked's lines: the first or last hit, or under the zeros rule 'ordered' the first +0
    (max; min: -0) among them, else the first."""
    sign = "~torch.signbit(v)" if extremum == "max" else "torch.signbit(v)"
    return _PICKS.get(pick) or ["first = _first_hit(hit, bag, num)",
                                f"preferred = _first_hit(hit & {sign}, bag, num)",
                                "return torch.where(preferred >= 0, preferred, first)"]


def _names(op) -> dict:
    """The strings naming the op's float input and its integer inputs."""
    inputs, constants = op.spec.inputs, op.spec.constant_inputs
    floating = next(n for n in inputs if n not in constants)
    return {"float_name": floating, "constant_inputs": list(constants),
            "constant_names": " and ".join(f"tangent_{n}" for n in constants),
            "grads_doc": ", ".join(f"grad_{n}" if n == floating else "None" for n in inputs),
            "returns": ", ".join("_table(grad_rows, saved)" if n == floating else "None" for n in inputs),
            "wrt_tuple": repr((floating,)),
            "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
            "forward_params": ", ".join(inputs), "forward_args": ", ".join(inputs),
            "jvp_params": ", ".join(f"tangent_{n}" for n in inputs),
            "jvp_args": ", ".join(f"tangent_{n}" for n in inputs)}


def how_nan(op, kernel: BagKernel) -> str:
    """How a bag's extremum reads NaN: "floor" (a framework's running max from a floor), "keep"
    (PyTorch's CPU rule) or "propagating"."""
    return "floor" if kernel.bag.floor else "keep" if op.nan == "keep" else "propagating"


def bag_context(op, kernel: BagKernel) -> dict:
    """bag.py.jinja's finished strings."""
    sel, rule = kernel.selection, kernel.segment
    mask = sel.form == "mask"
    how = how_nan(op, kernel)
    reduce = "amax" if sel.extremum == "max" else "amin"
    pick = {"last": "second"}.get(sel.order if sel.form == "scan" else rule.zeros,
                                  sel.order if sel.form == "scan" else rule.zeros)
    fields = (["table: torch.Tensor  # the table (weight)",
               "output: torch.Tensor  # the output rows (B, F)",
               "count: torch.Tensor  # each bag's hits per column (int64)"] if mask else
              ["winner: torch.Tensor  # each bag's winner per column (B, F): -1 none, e >= 0 element e"])
    return {
        "template": "torch/bag.py.jinja",
        "layout_partial": f"torch/_{kernel.bag.layout}_layout.py.jinja",
        "selection_partial": f"torch/_bag_{sel.form}.py.jinja",
        "extremum": sel.extremum,
        "fill": "-math.inf" if sel.extremum == "max" else "math.inf",
        "floor_line": ([f"FLOOR = {kernel.bag.floor}  # where the running max starts (torchvision's -FLT_MAX)"]
                       if kernel.bag.floor else []),
        "hit": "v == extremum" if how != "propagating" else _code(rule.hit.xreplace(SYMBOLS)),
        "weight": _code(sel.weight) if mask else "grad_output",
        "pick_lines": _pick(pick, sel.extremum), "pick_doc": _PICK_DOCS[pick],
        "extremum_lines": [line.format(reduce=reduce) for line in _EXTREMUM[how]],
        "extremum_doc": _EXTREMUM_DOCS[how],
        "output": _OUTPUT[how],
        "saved_doc": ("the table, the output and each bag's count" if mask else "each bag's winner"),
        "saved_fields": fields,
        "count_initial": (["count = count + (filled & (extremum == -math.inf)).to(torch.int64)  # the -inf "
                           "fill counted where a bag's max is -inf (JAX's segment_max)"]
                          if rule.count_initial else []),
        "forward_doc": kernel.bag.forward_doc,
        **_names(op),
    }
