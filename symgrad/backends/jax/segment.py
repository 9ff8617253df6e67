"""The jax backend's segments (``lower.WindowKernel`` of windows "segments": scatter_max/min,
segment_max/min): the template context of ``segment.py.jinja``, printed as jax.numpy code.

Elements are flat (dim moved first, row-major), so a segment's elements are in index order.
Forward: each segment's extremum by a scatter max/min (``.at[key].max``, NaN propagating), its
first/last hit by an integer scatter min/max of positions and its count of hits by an integer
scatter-add: exact, the same on every device.  Backward in gather form: each element reads its
segment's winner (first/last) or output and count (split/all): no scatter-add of gradients,
deterministic on a GPU.  No host callback and no branch on array values under jit or vmap (the
index's range is checked where its values are known)."""

from __future__ import annotations


from ...lower import WindowKernel
from ..host.segment import SYMBOLS, framework_names, framework_pick, framework_start, layout_of
from ..host.segment import sized_by_values as refuses  # noqa: F401 (segment.refuses: jax/__init__)
from .printer import jax_code

_LAYOUTS = {"input": "jax/_segment_scatter.py.jinja", "fill": "jax/_segment_fill.py.jinja",
            "csr": "jax/_segment_csr.py.jinja"}

# the initial elements' tangent, flat, in the working dtype
_INITIAL_TANGENT = {
    "input": ('jnp.zeros(saved.taking.shape, work) if tangent_input is None else '
              '_flat(_as_given("tangent_input", tangent_input, saved.output_shape, saved.dtype), saved.dim)'),
    "fill": "jnp.zeros(saved.taking.shape, work)",
}

# the pyg preset's output elements that no src element reaches (csr: an empty segment)
_EMPTY = "jnp.zeros(out.shape, jnp.int32).at[lay.key].add(1) == 0"

# the paragraph the module's docstring ends with
SEGMENT_NOTE = [
    "A JAX module (jax.numpy and lax only: no host callback, no branch on array values): forward a",
    "scatter max/min per segment (its extremum) and integer scatters (its first/last hit, its count),",
    "backward a gather per element of its segment's winner or output and count (no scatter-add:",
    "deterministic on every device), so forward, backward and jvp run under jax.jit, jax.vmap and",
    "jax.grad, on every device JAX has, and equal the NumPy backend's module bit for bit on the CPU;",
    "a split/all jvp adds with a scatter-add (atomic on a GPU)."]



def segment_context(op, kernel: WindowKernel, weight_lines: list) -> dict:
    """segment.py.jinja's finished strings (weight_lines: the mask's weight's first lines)."""
    sel, rule = kernel.selection, kernel.segment
    mask = sel.form == "mask"
    fields = (["src: jax.Array  # the src elements",
               "initial: jax.Array  # the initial elements",
               "output: jax.Array  # the output elements",
               "count: jax.Array  # each segment's hits (int32)"] if mask else
              ["winner: jax.Array  # each segment's winner: -2 none, -1 its initial element, e >= 0 src element e"])
    return {
        "note_lines": ["", *SEGMENT_NOTE],
        "layout_partial": _LAYOUTS[layout_of(op, rule)],
        "selection_partial": f"jax/_segment_{sel.form}.py.jinja",
        "extremum": sel.extremum,
        "reduce": sel.extremum,
        "hit": jax_code(rule.hit.xreplace(SYMBOLS)),
        "weight": jax_code(sel.weight) if mask else "grad_output",
        "weight_lines": weight_lines if mask else [],
        **framework_pick(sel.order if sel.form == "scan" else rule.zeros, sel.extremum, "jnp", rule),
        "saved_doc": ("the src and initial elements, the output and each segment's count" if mask
                      else "each segment's winner"),
        "saved_fields": fields,
        "count_initial": (["count = count + (~lay.taking & _hit(lay.initial, out))  # the initial element "
                           "counted where it takes no part (the framework's count)"]
                          if rule.count_initial else []),
        **framework_names(op, rule),
        "initial_tangent": _INITIAL_TANGENT[rule.initial],
        **framework_start(op, rule, sel.extremum, "jnp", "jax", _EMPTY),
    }
