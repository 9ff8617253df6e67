"""The CUDA backend's segment kernels (windows given by an index: scatter_max, segment_max):
segment.cu.jinja and the loader's partial _loader_segment.py.jinja.

The loader runs the NumPy module's layout (host/_segment_*) on the index, on the host, with the
float inputs' shapes and dtypes only, and sorts the src rows by segment (a stable order: index
order within a segment) into CSR offsets.  forward: one thread per (segment, column) scans its
segment's initial element and then its rows in index order, twice (the extremum, then its hits),
as the NumPy module's and the cpu backend's passes do; the winner is the first or last hit in that
order, never a race.  backward: one thread per element of src and of the initial rows reads its
segment's winner (or output and count): a gather, each element written once, no atomics.  jvp: one
thread per output, its segment's terms added in index order.  Saved is the NumPy module's, field
for field, in CuPy arrays."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lower import EXTREMUM, GRAD_OUTPUT, V, COUNT, WindowKernel
from ..cfamily.segment import PICK_DOCS, picked, rounds_apart_in_float16
from ..common import wrap
from ..host.segment import SEGMENT_INITIAL, layout_of, refuse_start
from .printer import CUDA_REAL_TYPES, cuda_code

if TYPE_CHECKING:
    from ...ops import Op


def _functions(kernel: WindowKernel) -> tuple[list[str], list[dict]]:
    """(their docs, per compute type its functions): sg_combine (the extremum, NaN spreading),
    sg_hit (an element attains it) and, for a mask, sg_weight (an element's share)."""
    sel, rule = kernel.selection, kernel.segment
    count = [COUNT] if sel.counts else []
    specs = [("sg_combine(best, v): the segment's extremum so far, NaN spreading", "{rt}", "sg_combine",
              ("best", "v"), sel.combine, []),
             ("sg_hit(v, extremum): an element attains its segment's extremum", "bool", "sg_hit",
              (str(V), str(EXTREMUM)), rule.hit, [])]
    if sel.form == "mask":
        specs.append((f"sg_weight(grad_output, v, extremum{', count' if sel.counts else ''}): the gradient "
                      f"of element v of a segment", "{rt}", "sg_weight",
                      tuple(map(str, (GRAD_OUTPUT, V, EXTREMUM, *count))), sel.weight,
                      [f"const bool hit = sg_hit({V}, {EXTREMUM});"]))
    real_types = [{"name": rt, "functions": [
        {"ret": ret.format(rt=rt), "name": name, "params": ", ".join(f"const {rt} {p}" for p in params),
         "body": [*prelude, f"return {cuda_code(result, rt)};"]}
        for _, ret, name, params, result, prelude in specs]} for rt in CUDA_REAL_TYPES]
    return [s[0] for s in specs], real_types


def _gradients(scan: bool, counts: bool) -> tuple[str, str]:
    """(a src element's gradient, an initial element's) in the compute type, at output o."""
    g = "tr::load(grad_output[o])"
    if scan:
        return f"winner[o] == e ? {g} : (acc)0", f"winner[o] == -1 ? {g} : (acc)0"
    count = ", (acc)count[o]" if counts else ""
    weight = f"sg_weight({g}, tr::load({{}}), tr::load(output[o]){count})"
    return weight.format("src[e * C + c]"), f"taking[j] ? {weight.format('initial[o]')} : (acc)0"


def _saves(kernel: WindowKernel) -> str:
    """forward's saved value per output o: the winner (scan), or the count of hits (mask), with
    the initial element counted where it takes no part under the framework's rule."""
    if kernel.selection.form == "scan":
        return "has ? at : -2"
    if not kernel.segment.count_initial:
        return "count"
    return "count + (!taking[j] && sg_hit(tr::load(initial[o]), tr::load(out[o])))"


def segment_context(op: Op, kernel: WindowKernel, ctx: dict) -> dict:
    """The .cu source's and loader's finished strings, over the backend's base context (ctx)."""
    sel, rule = kernel.selection, kernel.segment
    refuse_start(op, rule, "cuda")
    scan = sel.form == "scan"
    docs, real_types = _functions(kernel)
    pick = sel.order if scan else rule.zeros
    src_gradient, initial_gradient = _gradients(scan, sel.counts)
    inputs = op.spec.inputs
    layout = layout_of(op, rule)
    saved_doc = ("each segment's winner per column (-2 none, -1 its initial element, e >= 0 src row e)" if scan
                 else "the src and initial rows, the output rows and each segment's count of hits per column")
    reads = ([("long long", "winner")] if scan else
             [("unsigned char", "taking"), ("T", "src"), ("T", "initial"), ("T", "output"),
              ("long long", "count")])
    return ctx | SEGMENT_INITIAL[layout] | {
        "template": "cuda/segment.cu.jinja", "loader_geometry_partial": "cuda/_loader_segment.py.jinja",
        "host_layout_partial": SEGMENT_INITIAL[layout]["layout_partial"],
        "index_types_doc": False, "layouts_doc": False,
        "selection_doc": docs, "real_types": real_types, "scan": scan,
        "preferred": "!sg_signbit(v)" if sel.extremum == "max" else "sg_signbit(v)",
        "picked": picked(pick, "first", "last", "preferred"), "pick_doc": PICK_DOCS[pick],
        "saves": _saves(kernel),
        # where the extremum is NaN the output is it (the NaN rule's winner need not be NaN)
        "nan_extremum": "sg_isnan(ext)",
        "saved_state": wrap(f"Saved state: {saved_doc}, and the keys; backward in gather form reads them "
                            f"(and grad_output), jvp also the CSR order the loader makes again from the keys.",
                            96, ""),
        "saved_param_doc": ("its segment's winner (-2 none, -1 the initial element, e >= 0 src row e)"
                            if scan else "its segment's count of hits"),
        "saved_doc": saved_doc,
        "gather_doc": "winner" if scan else "output and count",
        "jvp_doc": ("the tangent of each segment's winner" if scan else
                    "each segment's weights applied to the tangents, added in index order, the initial element first"),
        "reads": "".join(f"const {t}* __restrict__ {n}, " for t, n in reads),
        "reads_of": {dt["name"]: "".join(f"const {dt['ctype'] if t == 'T' else t}* __restrict__ {n}, "
                                         for t, n in reads) for dt in ctx["dtypes"]},
        "count_arg": ", (acc)count[o]" if sel.counts else "",
        "reads_doc": "".join(f"const {t}* {n}, " for t, n in reads),
        "read_args": ", ".join(n for _, n in reads),
        "src_gradient": src_gradient, "initial_gradient": initial_gradient,
        "extremum": sel.extremum, "fill": f"np.{rule.fill}".replace("np.-inf", "-np.inf"),
        # the initial rows on the device: the input's (scatter) or the fill's (from the host layout)
        "initial_rows": ("cp.moveaxis(input, lay.dim, 0).reshape(lay.initial.shape)" if layout == "input"
                         else "cp.asarray(lay.initial)"),
        "index_name": next(n for n in inputs if n in op.spec.constant_inputs),
        "float_names": [n for n in inputs if n not in op.spec.constant_inputs],
        "src_name": [n for n in inputs if n not in op.spec.constant_inputs][-1],
        "forward_params": ", ".join(inputs),
        # the host layout's arguments: the index on the host, stand-ins of the float inputs
        "host_args": ", ".join(f"_host_index(cp, {n})" if n in op.spec.constant_inputs else f"_stand_in({n})"
                               for n in inputs),
        "initial_tangent_rows": (f'cp.moveaxis(_as_tangent(cp, "tangent_{inputs[0]}", tangent_{inputs[0]}, saved, '
                                 f'saved.output_shape), d, 0)' if layout == "input"
                                 else "cp.zeros(saved.output_shape, dtype=saved.dtype)"),
        "jvp_params": ", ".join(f"tangent_{n}" for n in inputs),
        "float16_refused": repr(rounds_apart_in_float16(kernel)),
    }
