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


from ...lower import WindowKernel
from ..host.segment import SYMBOLS, framework_names, framework_pick, framework_start, layout_of
from ..host.segment import sized_by_values as refuses
from .window import GEOMETRY, _code

# the layout partial of each initial element (lower.SegmentRule.initial); GEOMETRY names one for
# the form (test_contract: a geometry for each window form the backend builds)
_LAYOUTS = {"input": "torch/_segment_scatter.py.jinja", "fill": "torch/_segment_fill.py.jinja",
            "csr": "torch/_segment_csr.py.jinja"}
GEOMETRY["segments"] = _LAYOUTS["input"]

# the initial elements' tangent, flat, in the working dtype
_INITIAL_TANGENT = {
    "input": ('torch.zeros(saved.taking.shape, dtype=work, device=saved.key.device) if tangent_input is None '
              'else _flat(_as_given("tangent_input", tangent_input, saved.output_shape, saved.dtype), saved.dim)'),
    "fill": "torch.zeros(saved.taking.shape, dtype=work, device=saved.key.device)",
}

# the pyg preset's output elements that no src element reaches (csr: an empty segment)
_EMPTY = "torch.zeros(out.shape, dtype=torch.int64, device=out.device).index_add(0, lay.key, torch.ones_like(lay.key)) == 0"

# the paragraph the module's docstring ends with
SEGMENT_NOTE = [
    "A PyTorch module (torch operations only: no .numpy(), no .item() and no branch on a tensor's",
    "values under torch.compile): forward a scatter_reduce per segment (its extremum) and integer",
    "scatters (its first/last hit, its count), backward a gather per element of its segment's winner",
    "or output and count (no scatter-add, no atomics: deterministic on every device), so forward,",
    "backward and jvp trace under torch.compile(fullgraph=True), run on every device, and equal the",
    "NumPy backend's module bit for bit on the CPU; a split/all jvp adds with index_add (atomic on a",
    "GPU)."]



def segment_context(op, kernel: WindowKernel) -> dict:
    """segment.py.jinja's finished strings."""
    if refuses(op):
        raise ValueError(f"{op.name}: the torch backend builds segments with num_segments given only "
                         f"(the output's size is not read from the ids' values); pass num_segments, "
                         f"or use backend='numpy'")
    sel, rule = kernel.selection, kernel.segment
    mask = sel.form == "mask"
    fields = (["src: torch.Tensor  # the src elements",
               "initial: torch.Tensor  # the initial elements",
               "output: torch.Tensor  # the output elements",
               "count: torch.Tensor  # each segment's hits (int64)"] if mask else
              ["winner: torch.Tensor  # each segment's winner: -2 none, -1 its initial element, e >= 0 src element e"])
    return {
        "note_lines": ["", *SEGMENT_NOTE],
        "layout_partial": _LAYOUTS[layout_of(op, rule)],
        "selection_partial": f"torch/_segment_{sel.form}.py.jinja",
        "extremum": sel.extremum,
        "reduce": "amax" if sel.extremum == "max" else "amin",
        "hit": _code(rule.hit.xreplace(SYMBOLS)),
        "weight": _code(sel.weight) if mask else "grad_output",
        **framework_pick(sel.order if sel.form == "scan" else rule.zeros, sel.extremum, "torch", rule),
        "saved_doc": ("the src and initial elements, the output and each segment's count" if mask
                      else "each segment's winner"),
        "saved_fields": fields,
        "count_initial": (["count = count + (~lay.taking & _hit(lay.initial, out)).to(torch.int64)  # the "
                           "initial element counted where it takes no part (the framework's count)"]
                          if rule.count_initial else []),
        **framework_names(op, rule),
        "initial_tangent": _INITIAL_TANGENT[rule.initial],
        **framework_start(op, rule, sel.extremum, "torch", "torch", _EMPTY),
    }
