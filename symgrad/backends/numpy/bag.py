"""The NumPy module of a bag kernel (embedding_bag_max: windows given by offsets into gathered
table rows, kinds/bag.py): bag.py.jinja with the partial of its selection (``_bag_scan``: each
bag's winner saved; ``_bag_mask``: the output and count of hits saved).  What a bag shares with a
segment (the hit, the weight, the pick among the hits) comes from segment_context."""

from __future__ import annotations

from ...lower import BagKernel
from .segment import segment_context

# each bag's extremum, hits and picked element: NaN propagating (symgrad's rules), or as PyTorch's
# CPU kernel reads it ('keep': a later row takes over on a strict comparison, so NaN never does
# and a NaN that comes first keeps its bag)
_EXTREMUM = {
    "propagating": ["extremum = np.{reduce}.reduceat(v, starts, axis=0)",
                    "hit = _hit(v, extremum[seg])",
                    "return extremum, hit, _picked(v, hit, starts)"],
    # torchvision's roi_pool: the running max starts at FLOOR (-FLT_MAX) with no winner and an
    # element takes over on a strict >: NaN and elements at or below FLOOR never win (a bin of
    # them has output FLOOR and no gradient)
    "floor": ["extremum = np.{skip}(np.{skip}.reduceat(v, starts, axis=0), FLOOR)  # NaN never takes over",
              "hit = (v == extremum[seg]) & (v > FLOOR)",
              "return extremum, hit, _picked(v, hit, starts)"],
    "keep": ["extremum = np.{skip}.reduceat(v, starts, axis=0)  # NaN never takes over",
             "hit = _hit(v, extremum[seg])",
             "first_nan = np.isnan(v[starts])  # a NaN that comes first keeps its bag",
             "return extremum, hit, np.where(first_nan, starts[:, None], _picked(v, hit, starts))"],
}
_EXTREMUM_DOCS = {"propagating": "the extremum propagates NaN",
                  "floor": "the running max starts at FLOOR; NaN never wins (torchvision's CPU rule)",
                  "keep": "NaN is skipped unless it comes first, which then wins (PyTorch's CPU rule)"}


def _inputs(op, kernel: BagKernel) -> dict:
    """The strings naming the op's float input and its constant inputs, and its layout partial
    (lower.BagRule)."""
    inputs, constants = op.spec.inputs, op.spec.constant_inputs
    floating = next(n for n in inputs if n not in constants)
    return {"float_name": floating, "constant_inputs": list(constants),
            "constant_names": " and ".join(f"tangent_{n}" for n in constants),
            "grads_doc": ", ".join(f"grad_{n}" if n == floating else "None" for n in inputs),
            "returns": ", ".join("_table(grad_rows, saved)" if n == floating else "None" for n in inputs),
            "layout_partial": f"host/_{kernel.bag.layout}_layout.py.jinja",
            "forward_doc": kernel.bag.forward_doc}


def bag_context(op, kernel: BagKernel) -> dict:
    """bag.py.jinja's finished strings."""
    seg = segment_context(op, kernel)
    mask = kernel.selection.form == "mask"
    floor = kernel.bag.floor
    how = "floor" if floor else "keep" if op.nan == "keep" else "propagating"
    fields = (["table: np.ndarray  # the table (by reference: weight, or a view of the input)",
               "output: np.ndarray  # the output (B, F)",
               "count: np.ndarray  # each bag's hits per column (int64)"] if mask else
              ["winner: np.ndarray  # each bag's winner per column (B, F): -1 none, e >= 0 element e"])
    return {
        "template": "numpy/bag.py.jinja",
        "selection_partial": f"numpy/_bag_{kernel.selection.form}.py.jinja",
        "imports": [],
        **{k: seg[k] for k in ("extremum", "weight", "pick_lines", "pick_doc", "params_list",
                               "forward_params", "jvp_params")},
        "hit": "v == extremum" if how in ("keep", "floor") else seg["hit"],
        "extremum_lines": [line.format(reduce=seg["reduce"], skip="f" + seg["reduce"][:3])
                           for line in _EXTREMUM[how]],
        "extremum_doc": _EXTREMUM_DOCS[how],
        "output": {"keep": "chosen", "floor": "np.where(picked < v.shape[0], chosen, extremum)"}.get(
            how, "np.where(np.isnan(extremum), extremum, chosen)"),
        "floor_line": [f"FLOOR = {floor}  # where the running max starts (torchvision's -FLT_MAX)"] if floor else [],
        "saved_doc": ("the table (by reference), the output and each bag's count" if mask
                      else "each bag's winner"),
        "saved_fields": fields,
        **_inputs(op, kernel),
        "count_initial": (["count[bags] += extremum == -np.inf  # the -inf fill counted where a bag's "
                           "max is -inf (JAX's segment_max)"] if kernel.segment.count_initial else []),
    }
