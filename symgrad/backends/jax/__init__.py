"""The jax backend: an op's lowered kernel printed by ``printer.JaxCodePrinter`` as a JAX module
(jax.numpy and lax only: no host callback, no branch on array values), so it runs under jit, vmap,
grad and on every device JAX has.  Its interface is the NumPy module's: ``forward(*inputs) ->
(output, saved)``, ``backward(grad_output, saved)``, ``jvp(*tangents, saved)``, with the same
results bit for bit on the CPU.

It builds the kernels whose form is ``lower.ElementwiseKernel`` (the elementwise ops and
expressions) and the ``lower.WindowKernel`` of strided windows (max pooling: ``window.py.jinja``,
forward a fold over the windows' strided slices, backward in gather form by ``lax.pad``), of
blocks (maxout: the same template, each piece of a group one slice) and of
rows (the reductions amax, amin, max, min: ``rows.py.jinja``, the NumPy module's closed forms
per row; under the torch preset of amax/amin jvp adds in PyTorch's at::sum order, as the NumPy
module, each sequential sum a lax.scan: ``_torch_sum.py.jinja``; nanmax/nanmin too) and
of segments (scatter_max, segment_max: ``segment.py``, the pyg preset included, backward in gather
form; segment_max with num_segments given only), of bags (embedding_bag_max, roi_max_pool:
``bag.py``, every element kept in place, backward a gather per gathered row, then a scatter-add
onto the table in index order) and of spans (adaptive max pooling: ``adaptive.py``, the NumPy module's
box passes as gathers, backward in gather form over each element's holding windows), of
sampled windows (fractional max pooling: ``fractional.py``, each plane's window starts computed
from its samples as the NumPy module computes them, then adaptive pooling's fold and gathers),
unpooling (``lower.UnpoolKernel``: ``unpool.py``, the writer that stays in each slot found by an
integer scatter min/max, forward, backward and jvp as gathers but the jvp of ties='all', a
scatter-add in order) and the order statistics (``lower.OrderKernel``: sort, topk, cummax,
cummin, kthvalue, median, nanmedian: ``order.py``, a stable argsort of the NumPy module's
total-order key, backward in gather form from the saved ranks; split/all need jax_enable_x64 for
their float64 tie-block sums); for the others ``render`` raises a ValueError naming the numpy
backend."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import sympy as sp

from ... import naming
from ...lower import (BEST, HIT, V, ElementwiseKernel, LogSumExpKernel, OrderKernel, UnpoolKernel, WindowKernel,
                     backward_plan, bag_layout)
from ..common import (docstring, environment, grad_start_comment, header, order_docstring, python_geometry,
                      special_docstring)
from ..host import preamble_context
from ..printing import python_integer_code

# the paragraph the module's docstring ends with
JAX_NOTE = [
    "A JAX module (jax.numpy only: no host callback, no branch on array values), so forward, backward",
    "and jvp run under jax.jit, jax.vmap and jax.grad, on every device JAX has; on the CPU they give",
    "the NumPy backend's module's results bit for bit (where a broadcast input's gradient is summed,",
    "XLA adds in its own order: the same bits where the sums are exact)."]
from .printer import jax_code, jax_extremum_reduce, jax_fold_winner, jax_scan_winner
from . import segment  # noqa: E402  (segments: windows given by an index)
from . import bag  # noqa: E402  (bags: windows given by offsets into table rows)

if TYPE_CHECKING:  # the lowering hands its Artifacts to the backends
    from ...lower import Artifacts


# the templates, by the type of the lowered kernel (window kernels: by the form of the windows,
# lower.WINDOW_FORMS)
_TEMPLATES = {ElementwiseKernel: "jax/elementwise.py.jinja", UnpoolKernel: "jax/unpool.py.jinja",  # (unpool.py)
              OrderKernel: "jax/order.py.jinja",  # (order statistics: order.py)
              LogSumExpKernel: "jax/logsumexp.py.jinja"}  # (logsumexp.py)
_WINDOW_TEMPLATES = {"strided": "jax/window.py.jinja", "blocks": "jax/window.py.jinja", "rows": "jax/rows.py.jinja",
                     "spans": "jax/adaptive.py.jinja",  # (spans: adaptive.py)
                     "sampled": "jax/fractional.py.jinja"}  # (sampled: fractional.py)
_WINDOW_TEMPLATES["segments"] = "jax/segment.py.jinja"  # windows given by an index (segment.py)
_WINDOW_TEMPLATES["bags"] = "jax/bag.py.jinja"  # windows given by offsets into table rows (bag.py)
WINDOW_FORMS = tuple(_WINDOW_TEMPLATES)  # the forms of windows it builds (symgrad.jax's native path)
FORMS = tuple(t.__name__ for t in _TEMPLATES) + WINDOW_FORMS  # (lower.kernel_form)


def _form(kernel) -> str:
    """The kernel's type, and a window kernel's form of windows, in words."""
    if isinstance(kernel, WindowKernel):
        return f"WindowKernel of {kernel.windows} windows"
    return type(kernel).__name__


def refuses(op) -> bool:
    """Whether it refuses an op of a form it builds (Backend.builds: --backend all leaves it out):
    segment_max without num_segments, a bag op of a layout it has no partial for
    (bag.builds_layout)."""
    return segment.refuses(op) or not bag.builds_layout(bag_layout(op))


def _template(art: Artifacts) -> str | None:
    """The template of an op's module, or None where the jax backend does not build its kernel."""
    kernel = art.kernel
    if segment.refuses(art.op) or not bag.builds_layout(bag_layout(art.op)):  # (a variant it does not build)
        return None
    if isinstance(kernel, WindowKernel):
        return _WINDOW_TEMPLATES.get(kernel.windows)
    return _TEMPLATES.get(type(kernel))


def _templates():
    return environment("jax", Path(__file__).parent / "templates")


def file_names(op) -> tuple[str, ...]:
    """The module (``<module name>_jax.py``: beside the NumPy module's file in one folder)."""
    return (naming.module_name(op) + "_jax.py",)


def render(art: Artifacts) -> dict[str, str]:
    """{file name: file text}: the JAX module of an op."""
    template = _template(art)
    if template is None and segment.refuses(art.op):
        raise ValueError(f"{art.op.name}: the jax backend builds segments with num_segments given only "
                         f"(as jax.ops.segment_max needs under jit); pass num_segments, or use "
                         f"backend='numpy' (symgrad.jax.op runs it through a host callback)")
    if template is None:
        raise ValueError(f"{art.op.name}: the jax backend builds elementwise kernels (ops and "
                         f"expressions), max pooling (strided, adaptive and fractional), maxout, reductions, "
                         f"segments, embedding bags, unpooling, order statistics and logsumexp only, not a {_form(art.kernel)}; use "
                         f"backend='numpy' (symgrad.jax.op runs it through a host callback)")
    if isinstance(art.kernel, WindowKernel):
        from .adaptive import adaptive_context
        from .fractional import fractional_context
        ctx = {"spans": adaptive_context, "sampled": fractional_context}.get(art.kernel.windows, window_context)(art)
    elif isinstance(art.kernel, OrderKernel):
        ctx = _order_context(art)
    elif isinstance(art.kernel, UnpoolKernel):
        ctx = _unpool_context(art)
    elif isinstance(art.kernel, LogSumExpKernel):
        ctx = _logsumexp_context(art)
    else:
        ctx = context(art)
    return {file_names(art.op)[0]: _templates().get_template(template).render(**ctx)}


def _order_context(art: Artifacts) -> dict:
    """The template context of an order statistic's module (order.py)."""
    from .order import order_context
    op = art.op
    return {**preamble_context(header(op, "jax"), JAX_NOTE, ()),
            "docstring": order_docstring(op, art.derivation, art.kernel), "op": op.name, "ties": op.ties,
            "params": repr(op.params), "piecewise_linear": art.piecewise_linear, **order_context(op, art.kernel)}


def _logsumexp_context(art: Artifacts) -> dict:
    """The template context of logsumexp's module (logsumexp.py)."""
    from .logsumexp import logsumexp_context
    op = art.op
    return {**preamble_context(header(op, "jax"), JAX_NOTE, ()),
            "docstring": special_docstring(op, art.derivation, art.kernel), "op": op.name, "ties": op.ties,
            "params": repr(op.params), "piecewise_linear": art.piecewise_linear, **logsumexp_context(op, art.kernel)}


def _unpool_context(art: Artifacts) -> dict:
    """The template context of an unpooling module (unpool.py)."""
    from .unpool import NOTE, unpool_context
    return {**preamble_context(header(art.op, "jax"), NOTE, ()), **unpool_context(art)}


_GRADIENTS_DOC = "The gradient of every input that backward returns, in grad_output's shape (or a scalar)."


def _low_precision(op) -> dict:
    """How float16 and bfloat16 are computed, as the NumPy module computes them: in float32 and
    rounded once where the op computes half in float (a preset's half_in_float: both) or where
    it is bfloat16 outside a preset (the NumPy module's bfloat16 path); else in the dtype
    itself, each operation rounded (float16 in NumPy; bfloat16 under a preset, as JAX and
    PyTorch's clamp compute it)."""
    if op.half_in_float:
        wide = ("float16", "bfloat16")
        note = "float16 and bfloat16 are computed in float32 and rounded once (the op's convention)."
    elif op.convention:
        wide = ()
        note = ("float16 and bfloat16 are computed in their own dtype, each product, sum and "
                "quotient rounded (the op's convention, as the framework computes them).")
    else:
        wide = ("bfloat16",)
        note = ("bfloat16 is computed in float32 and rounded once; float16 in float16, each "
                "product, sum and quotient rounded (as NumPy computes float16).")
    return {"wide": repr(wide), "low_precision_note": note}


def context(art: Artifacts) -> dict:
    """The template context of an op's JAX module: finished strings only."""
    op, d, kernel = art.op, art.derivation, art.kernel
    wrt = tuple(kernel.wrt) if kernel.wrt is not None else tuple(kernel.inputs)
    # an expression shares nothing between its gradients' statements beyond what the NumPy module
    # shares: the same plan, so the same operations in the same order
    back_inter, shared, grads = backward_plan(kernel, wrt)
    inputs = list(kernel.inputs)
    output_lines = [(a.name, jax_code(a.expr)) for a in kernel.intermediates]
    gradient_lines = [(a.name, jax_code(a.expr)) for a in back_inter + shared + grads]
    code = "\n".join([c for _, c in output_lines + gradient_lines] + [jax_code(kernel.output)])
    helpers = [name for name in ("_maximum", "_minimum") if f"{name}(" in code]
    return {
        **preamble_context(header(op, "jax"), JAX_NOTE, ()),
        "docstring": docstring(op, d, kernel),
        "op": op.name, "ties": op.ties, "params": repr(op.params),
        "inputs": inputs,
        "inputs_tuple": repr(tuple(inputs)),
        "wrt_tuple": repr(wrt),
        "returned": [name for name in inputs if name in wrt],
        "piecewise_linear": art.piecewise_linear,
        "output_intermediates": output_lines,
        "output": jax_code(kernel.output),
        "gradient_lines": gradient_lines,
        "helpers": helpers,
        **_low_precision(op),
    }


def _scan_output(kernel: WindowKernel) -> dict:
    """The scan's output where it is the NaN-propagating fold rather than the winner's value
    (Selection.winner_is_output false): the lines that start and step the fold beside the scan,
    and what forward returns."""
    sel = kernel.selection
    if sel.form != "scan" or sel.winner_is_output:
        return {"start": [], "step": [], "result": "best"}
    fold = jax_code(sel.combine.xreplace({BEST: sp.Symbol("out", real=True)}))
    return {"start": ["out = best  # under this NaN rule the winner of a NaN window need not be the NaN"],
            "step": [f"folded = {fold}",
                     "if e.valid is not None:",
                     "    folded = jnp.where(e.valid, folded, out)  # padding never wins",
                     "if e.first is not None:",
                     "    folded = jnp.where(e.first, v, folded)",
                     "out = folded"],
            "result": "out"}


# the selection partials' prefix by the form of windows (jax/_<prefix>_<scan|mask>.py.jinja)
_PARTS = {"strided": "window", "blocks": "window", "rows": "rows"}


def _rows_strings(op, kernel: WindowKernel) -> dict:
    """A reduction's closed forms (the NumPy module's, in jax.numpy): the scan's winner, the
    NaN-propagating fold's winner where it gives the output (keep/replace), the mask's output."""
    sel = kernel.selection
    scan = sel.form == "scan"
    fold = scan and not sel.winner_is_output
    return {"scan_winner": jax_scan_winner(sel.extremum, sel.order, sel.nan) if scan else "",
            "scan_order": sel.order or "first",
            "fold_winner_blocks": [jax_fold_winner(sel.extremum, op.zeros)] if fold else [],
            "output_fold": ["winner = _fold_winner(rows)  # under this NaN rule the output is the fold's, "
                            "not the winner"] if fold else [],
            # (NaN skipped: of +0 and -0 the second, as the NumPy module, where no rule is given)
            "mask_output": "" if scan else jax_extremum_reduce(
                sel.extremum, "rows", op.zeros or ("second" if kernel.skips_nan else None), kernel.skips_nan),
            "nan_words": ("NaN skipped; NaN where the row holds only NaN" if kernel.skips_nan
                          else "NaN propagating"),
            **_element_args(sel, kernel),
            "count_lines": ["count = jnp.sum(hit, axis=-1, keepdims=True).astype(jnp.promote_types(work, "
                            "jnp.float32))  # counted exactly, in >= float32",
                            "# one per element, behind a barrier: XLA turns a division by a broadcast "
                            "into a product with its reciprocal",
                            "count = lax.optimization_barrier(jnp.broadcast_to(count, v.shape))"]
            if sel.counts else []}


def _element_args(sel, kernel: WindowKernel) -> dict:
    """Where the mask's weight or jvp term reads the element itself (nanmax/nanmin's 'fill'): the
    parameter, and the argument passing the saved input's rows."""
    if sel.form != "mask" or not any(V in e.free_symbols for e in (sel.weight, kernel.tangent_term)
                                     if e is not None):
        return {"element_param": "", "element_arg": "", "term_lines": _TERM_HIT}
    # ('fill': the term selects by the hit, a Boolean)
    return {"element_param": ", v", "element_arg": ", _rows(saved.x.astype(work), *_layout(saved.input_shape)[:3])",
            "term_lines": []}


# the first line of the torch preset's jvp term hit * t: the hit as a number of the dtype
_TERM_HIT = ["hit = jnp.where(hit, 1.0, 0.0).astype(grad_output.dtype)  # (a product: 0 * inf is NaN)"]


def _weight_lines(sel) -> list[str]:
    """The mask's weight's first lines: where it multiplies by the hit (the split as arithmetic,
    0 * NaN is NaN), the hit as a number of the dtype made by a select, as XLA rewrites a product
    with a converted bool into a select (0 where NumPy's product is NaN)."""
    if sel.form != "mask" or not any(isinstance(m, sp.Mul) and HIT in m.args
                                     for m in sp.preorder_traversal(sel.weight)):
        return []
    return ["hit = jnp.where(hit, 1.0, 0.0).astype(grad_output.dtype)  # (a product: 0 * NaN is NaN)"]


def window_context(art: Artifacts) -> dict:
    """The template context of a window op's JAX module (window.py.jinja): the selection's strings
    (the scan's take or the mask's hit and weight, the fold), the geometry's, the gradient's start."""
    op, d, kernel = art.op, art.derivation, art.kernel
    if kernel.segment is not None:  # windows given by an index (segment.py) or bags (bag.py)
        form = (bag.bag_context(op, kernel, _weight_lines) if kernel.windows == "bags" else
                segment.segment_context(op, kernel, _weight_lines(kernel.selection)))
        return {**preamble_context(header(op, "jax"), None, ()), "docstring": docstring(op, d, kernel),
                "op": op.name, "ties": op.ties, "params": repr(op.params),
                "piecewise_linear": art.piecewise_linear, "inputs_tuple": repr(tuple(op.spec.inputs)),
                **form}
    sel, g = kernel.selection, kernel.axes
    scan = sel.form == "scan"
    bfloat16_adds = kernel.bfloat16_adds == "bfloat16"
    return {
        **preamble_context(header(op, "jax"), JAX_WINDOW_NOTES[kernel.windows], ()),
        **python_geometry(kernel),
        "docstring": docstring(op, d, kernel),
        "op": op.name, "ties": op.ties, "params": repr(op.params),
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "piecewise_linear": art.piecewise_linear,
        "selection_partial": f"jax/_{_PARTS[kernel.windows]}_{sel.form}.py.jinja",
        "window": kernel.window, "spatial": op.spec.spatial,
        "index_dtype": kernel.index_dtype or "",
        "padding_takes_part": kernel.padding_takes_part,
        "padding_comment": ("padding is -inf and takes part in every window (the gradient it wins is "
                            "dropped)" if kernel.padding_takes_part else
                            "padding never wins: a window's winner is always inside the input"),
        # the identity -0.0 where the sum is exact ("-0") or the winner's term written ("written")
        "grad_start": "-0.0" if kernel.grad_start in ("-0", "written") else "0.0",
        "grad_start_comment": grad_start_comment(kernel.grad_start),
        "geometry_partial": f"jax/_geometry_{kernel.windows}.py.jinja",
        # strided windows: element j of window o is at input coordinate c, inside where 0 <= c < length
        **({"coordinate": python_integer_code(g.coordinate, {"i": "o"}),
            "inside": python_integer_code(g.inside, {"x": "c"})} if kernel.windows == "strided" else {}),
        # blocks: the groups of a channel count c
        **({"maxout_groups": python_integer_code(g.output_size, {"length": "c", "k": "PIECES"})}
           if kernel.windows == "blocks" else {}),
        "x_parameter": "x", "x_shape_shown": "{tuple(x.shape)}",
        "take": jax_code(sel.take) if scan else "",
        "combine": jax_code(sel.combine),
        "output_fold": _scan_output(kernel),
        "backward_work": "saved.dtype  # bfloat16 adds each rounded to bfloat16 (the preset's)"
        if bfloat16_adds else "_work(saved.dtype)",
        "bfloat16_adds_doc": ("; a bfloat16 gradient added in bfloat16, each add rounded, as the "
                              "preset's framework adds it") if bfloat16_adds else "",
        "hit": "" if scan else jax_code(sel.hit),
        "weight": "" if scan else jax_code(sel.weight),
        # the torch preset (conventions.TANGENT_SUMS "torch"): jvp adds these terms in at::sum's order
        "tangent_term": jax_code(kernel.tangent_term) if kernel.tangent_term is not None else "",
        # the mask's count of each window's hits, where the weight shares the gradient among them
        "count_lines": ["count = jnp.zeros(extremum.shape, work)", "for hit in hits:",
                        "    count = count + hit.astype(work)"] if sel.counts else [],
        **(_rows_strings(op, kernel) if kernel.windows == "rows" else {}),
        "weight_lines": _weight_lines(sel),
        # an element's gradient summed from +0.0 ("+0"): its zero made +0.0 (_from_zero)
        "finished_grad": "_from_zero(grad)" if kernel.grad_start == "+0" else "grad",
        "return_indices": bool(op.params.get("return_indices")),  # forward returns (output, indices)
        "count_arg": ", count" if sel.counts else "",
        "count_doc": ", how many" if sel.counts else "",
    }


# the paragraph a window module's docstring ends with, by the form of its windows
JAX_WINDOW_NOTES = {
    "strided": [
        "A JAX module (jax.numpy and lax only: no host callback, no scatter, no branch on array values):",
        "forward folds the windows' strided slices in the NumPy module's scan order, backward puts each",
        "window element's gradient plane back with lax.pad and adds them in output order, so forward,",
        "backward and jvp run under jax.jit, jax.vmap and jax.grad, on every device JAX has, and equal",
        "the NumPy backend's module bit for bit on the CPU."],
    "blocks": [
        "A JAX module (jax.numpy and lax only: no host callback, no scatter, no branch on array values):",
        "forward folds the pieces of each group of channels in order, backward puts each piece's",
        "gradient back with lax.pad, so forward, backward and jvp run under jax.jit, jax.vmap and",
        "jax.grad, on every device JAX has, and equal the NumPy backend's module bit for bit on the CPU."],
    "rows": [
        "A JAX module (jax.numpy and lax only: no host callback, no scatter, no branch on array values):",
        "each slice along the reduced dims is a row, its winner found by the NumPy module's closed forms,",
        "so forward, backward and jvp run under jax.jit, jax.vmap and jax.grad, on every device JAX has,",
        "and equal the NumPy backend's module bit for bit on the CPU, except the sign of a zero output",
        "of a split/all row holding both +0 and -0 (np.max's sign there follows its SIMD lanes)."],
}
