"""The NumPy module of a segment kernel (windows given by an index: scatter_max, segment_max):
segment.py.jinja with the layout partial of its initial element (``_segment_scatter``: an input
tensor; ``_segment_fill``: the op's identity) and the partial of its selection (``_segment_scan``:
each segment's winner saved; ``_segment_mask``: its output and count of hits saved)."""

from __future__ import annotations


from ...lower import WindowKernel
from ..host.printer import numpy_code
from ..host.segment import SEGMENT_INITIAL, SYMBOLS, layout_of, start_context

# which hit the output (and a scan's winner) is: its sorted position per segment
_PICKS = {
    "first": ["return np.minimum.reduceat(np.where(hit, pos, n), starts, axis=0)"],
    "second": ["return np.maximum.reduceat(np.where(hit, pos, -1), starts, axis=0)"],
}
_PICK_DOCS = {"first": "first hit", "second": "last hit",
              "ordered": "first hit that is +0 where the extremum is a zero (-0 below +0)"}


def _ordered(extremum: str) -> list[str]:
    """The zeros rule 'ordered': of tied +0 and -0, +0 is the max and -0 the min."""
    sign = "~np.signbit(v)" if extremum == "max" else "np.signbit(v)"
    return ["first = np.minimum.reduceat(np.where(hit, pos, n), starts, axis=0)",
            f"preferred = np.minimum.reduceat(np.where(hit & {sign}, pos, n), starts, axis=0)",
            "return np.where(preferred < n, preferred, first)"]


def segment_context(op, kernel: WindowKernel) -> dict:
    """segment.py.jinja's finished strings."""
    sel, rule = kernel.selection, kernel.segment
    pick = (sel.order if sel.form == "scan" else rule.zeros)
    pick = {"last": "second"}.get(pick, pick)
    inputs = op.spec.inputs
    float_inputs = [name for name in inputs if name not in op.spec.constant_inputs]
    mask = sel.form == "mask"
    fields = (["src: np.ndarray  # the src rows (E, C), with dim first (a view where it can be)",
               "initial: np.ndarray  # the initial rows (K, C)",
               "output: np.ndarray  # the output rows (K, C)",
               "count: np.ndarray  # each segment's hits per column (int64)"] if mask else
              ["winner: np.ndarray  # each segment's winner per column (K, C): -2 none, -1 its initial element, e >= 0 src row e"])
    return {
        "template": "numpy/segment.py.jinja",
        "selection_partial": f"numpy/_segment_{sel.form}.py.jinja",
        "imports": [],
        "extremum": sel.extremum,
        "reduce": "maximum" if sel.extremum == "max" else "minimum",
        "fill": f"np.{rule.fill}".replace("np.-inf", "-np.inf"),
        "hit": numpy_code(rule.hit.xreplace(SYMBOLS)),
        "weight": numpy_code(sel.weight, select=True) if mask else "grad_output",
        "pick_lines": _PICKS.get(pick) or _ordered(sel.extremum),
        "pick_doc": _PICK_DOCS[pick],
        "nan_doc": "last" if rule.nan_last else "first",
        "nan_at": ("np.maximum.reduceat(np.where(np.isnan(v), pos, -1), starts, axis=0)" if rule.nan_last else
                   "np.minimum.reduceat(np.where(np.isnan(v), pos, n), starts, axis=0)"),
        "saved_doc": ("the src and initial elements (by reference), the output and each segment's count"
                      if mask else "each segment's winner"),
        "saved_fields": fields + ["src_shape: tuple"],
        "count_initial": (["count += ~lay.taking[:, None] & _hit(lay.initial, out)  # the initial "
                           "element counted where it takes no part (the framework's count)"]
                          if rule.count_initial else []),
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "forward_params": ", ".join(inputs), "forward_args": ", ".join(inputs),
        "jvp_params": ", ".join(f"tangent_{n}" for n in inputs),
        "index_name": next(n for n in inputs if n in op.spec.constant_inputs),
        "src_name": float_inputs[-1],
        **SEGMENT_INITIAL[layout_of(op, rule)],
        **start_context(rule, sel.extremum, layout_of(op, rule)),
    }
