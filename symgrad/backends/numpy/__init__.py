"""The NumPy backend: each op's kernel printed by the host layer's ``NumpyPrinter``
(``host/printer.py``; this backend has no printer of its own) into the context of its template
(``templates/``: vectorized NumPy; the module needs nothing else), which includes the Python pieces
the cpu and CUDA loaders share (``host/...``: checks, Saved, layouts, bfloat16, geometry; their
context from ``host/__init__.py``).  The window kinds share skeletons, each kind a geometry
partial ``_geometry_<geometry>``: ``window.py.jinja`` (pooling, maxout: phase planes),
``gather.py.jinja`` (fractional pooling, reductions: each window's elements gathered as one row);
adaptive pooling has ``adaptive.py.jinja``."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import sympy as sp

from ... import naming
from ...geometry import S
from ...indicators import Literal
from ...lower import BEST, HIT, V, ElementwiseKernel, Product, Quotient, UnpoolKernel, WindowKernel, backward_plan
from ..common import (docstring, environment, expression_docstring, expression_header,
                      grad_start_comment, header, python_geometry, special_docstring)
from ..host import (BFLOAT16_ADDS, ELEMENTWISE_BFLOAT16, NUMPY_ARRAYS, TORCH_TANGENT_SUM_DOC,
                    adaptive_window_code, bfloat16_context, bfloat16_kernels, fractional_window_code,
                    host_partials, lse_half_partial, preamble_context)
from ..host.printer import (numpy_arg_extremum, numpy_code, numpy_extremum_fold, numpy_extremum_reduce,
                            numpy_extremum_step, numpy_fold_winner, numpy_integer_code, numpy_scan_winner)
from ..printing import bare
from .segment import segment_context
from .bag import bag_context
from ..common import order_docstring
from ...lower import OrderKernel
from .order import context as order_context

if TYPE_CHECKING:  # annotations only: the lowering makes the Artifacts a backend reads
    from ...ops import Op
    from ...lower import Artifacts


def _templates():
    return environment("numpy", Path(__file__).parent / "templates")


def file_names(op: Op) -> tuple[str, ...]:
    return (naming.module_name(op) + ".py",)


def render(art: Artifacts) -> dict[str, str]:
    """{file name: file text}: the NumPy module of an op."""
    ctx = bfloat16_context(art) | context(art)
    ctx |= preamble_context(ctx["header"], None, tuple(f"import {m}" for m in sorted(
        [*ctx["imports"], "os", *(["threading"] if ctx["xla_sum_to"] or ctx.get("lse_half_partial", "").endswith("_jax.py.jinja") else [])])))  # (_xla_sum_to's)
    ctx |= NUMPY_ARRAYS
    return {file_names(art.op)[0]: _templates().get_template(ctx["template"]).render(**ctx)}


def _numpy_base_context(op: Op, header: list[str], docstring: list[str]) -> dict:
    """What every NumPy module's template gets: provenance header, docstring, the op's names."""
    return {"header": header, "docstring": docstring, "op": op.name, "ties": op.ties,
            "params": repr(op.params), "summary": op.spec.summary, "imports": [],
            "inputs_tuple": repr(tuple(op.spec.inputs))}


def _forward_quiet(kernel: ElementwiseKernel) -> str:
    """Why forward computes under np.errstate(invalid="ignore"), or "": a Literal parameter of 0
    multiplies an input (x * 0 is NaN at x = +-inf, silently, as the frameworks compute it)."""
    values = [kernel.output] + [a.expr for a in kernel.intermediates]
    if any(lit.value == 0 for e in values for lit in e.atoms(Literal)):
        return "x * 0 is NaN at x = +-inf, as the frameworks compute it"
    inputs = set(kernel.inputs)
    if any(isinstance(n, (sp.Add, sp.Mul)) and len({str(s) for s in n.free_symbols} & inputs) > 1
           for e in values for n in sp.preorder_traversal(e)):
        return "input - target is NaN where both are the same infinity, as the frameworks compute it"
    nodes = {a.name for a in kernel.intermediates}
    if any(isinstance(n, (sp.Mul, Product)) and {str(s) for s in n.free_symbols} & inputs
           and {str(s) for s in n.free_symbols} & nodes for n in sp.preorder_traversal(kernel.output)):
        return "x times a clamp of x is NaN at x = +-inf where the clamp is 0, as the frameworks compute it"
    return ""


def _widened(name: str) -> str:
    """An array as float32 where it is float16 (else itself): float16 computed in float32."""
    return f"{name}.astype(np.float32) if {name}.dtype == np.float16 else {name}"


_GRADIENTS_DOC = "The gradient of every input that backward returns, in grad_output's shape (or a scalar)."


def _output_kernel(name: str, doc: str, intermediates: list, output: str) -> dict:
    """One function computing forward's output (elementwise.py.jinja): its name, docstring,
    temporaries [(name, code)] and output."""
    return {"name": name, "doc": doc, "intermediates": intermediates, "output": output}


def _gradient_kernel(name: str, doc: str, backward_intermediates: list, grads: list) -> dict:
    """One function computing the gradients (elementwise.py.jinja): its name, docstring,
    temporaries before the errstate block and the gradients' lines [(name, code)]."""
    return {"name": name, "doc": doc, "backward_intermediates": backward_intermediates, "grads": grads}


def _elementwise_bfloat16(kernel: ElementwiseKernel, ctx: dict, back_inter, grads) -> dict:
    """An elementwise op under a preset that computes float16 in float16 (Preset.half "half": JAX,
    and NumPy's float16) computes bfloat16 in bfloat16 too: functions of its own on float32 arrays
    holding bfloat16 values, each number rounded to bfloat16 and each product, sum and quotient
    rounded to bfloat16 (_bf16), as XLA and PyTorch's clamp compute bfloat16; built where that can
    differ from the float32 code rounded once (host.bfloat16_kernels)."""
    def bf16(expr, select=True):
        return numpy_code(expr, select=select, bfloat16=True)
    output = _output_kernel("_output_bf16", "forward's output computed in bfloat16 (float32 arrays holding "
                            "bfloat16 values).", [(a.name, bf16(a.expr)) for a in kernel.intermediates],
                            bf16(kernel.output))
    gradients = _gradient_kernel("_gradients_bf16", "_gradients computed in bfloat16 (float32 arrays holding "
                                 "bfloat16 values).", [(a.name, bf16(a.expr, False)) for a in back_inter],
                                 [(a.name, bf16(a.expr)) for a in grads])
    return {"output_kernels": ctx["output_kernels"] + [output],
            "gradient_kernels": ctx["gradient_kernels"] + [gradients],
            "bfloat16_kernels": dict(ELEMENTWISE_BFLOAT16),
            "bfloat16_note": [
                "Under this preset a bfloat16 op is computed in bfloat16 instead, as the framework does:",
                "_forward_bf16, _backward_bf16 and _jvp_bf16 (above), whose numbers are rounded to",
                "bfloat16 and whose products, sums and quotients are each rounded to bfloat16."]}


# how _backward_bf16 ranks each winner's window among the windows holding its element, by the
# windows' form: strided windows by the winner's offset in its window; windows found at run time by
# sorting the winners by element
_BFLOAT16_RANKS = {"strided": "numpy/_bfloat16_offsets.py.jinja", "spans": "numpy/_bfloat16_sorted.py.jinja",
                   "sampled": "numpy/_bfloat16_sorted.py.jinja"}


def _window_bfloat16(kernel: WindowKernel) -> dict:
    """Max pooling under a preset that adds bfloat16 gradients in bfloat16 (WindowKernel
    bfloat16_adds, conventions.BFLOAT16_ADDS): backward's bfloat16 function (_bfloat16_adds), the
    forward and jvp the float32 ones rounded once (no add rounds there)."""
    if kernel.bfloat16_adds != "bfloat16":
        return {"bfloat16_adds": False}
    return {"bfloat16_adds": True,
            "bfloat16_ranks": _BFLOAT16_RANKS[kernel.windows],
            "bfloat16_kernels": dict(BFLOAT16_ADDS),
            "bfloat16_note": [
                "Under this preset a bfloat16 gradient is added up in bfloat16 instead, as the framework",
                "does: _backward_bf16 (above) adds each window's gradient to its winner's in output",
                "order, each add rounded to bfloat16."]}


def _quiet(op, kernel: WindowKernel) -> dict:
    """The mask form's errstate blocks, backward's and jvp's: {"open": the block's lines (none where
    no operation inside can raise NumPy's floating-point warnings), "shift": its body's extra
    indentation}.  What can, from the lowered weight and the geometry: a division by a count of 0
    (a window without a hit: under a NaN rule where comparisons with NaN are false, or from a
    saved state that forward did not make), inf times a hit of 0 (the weight as arithmetic), inf -
    inf where terms are added inside the block (backward: overlapping windows' terms on one
    element; jvp: a window's terms)."""
    sel = kernel.selection
    divides = sel.weight.has(Quotient) and sel.counts
    multiplies = any(isinstance(m, sp.Mul) and HIT in m.args for m in sp.preorder_traversal(sel.weight))
    weighted = [reason for reason, present in (
        ("0 / 0 where a window has no hit (its count is 0 under this NaN rule)",
         divides and kernel.count_can_be_zero),
        ("g / 0 where saved was not made by forward (under this NaN rule forward's windows always "
         "have a hit)", divides and not kernel.count_can_be_zero),
        ("inf * 0 where an element is not hit", multiplies)) if present]
    overlap = kernel.overlaps
    adds_in_block = kernel.windows not in _GATHER  # gather.py.jinja adds outside the block

    def block(reasons: list[str]) -> dict:
        if not reasons:
            return {"open": [], "shift": 0}
        flags = 'divide="ignore", invalid="ignore"' if divides else 'invalid="ignore"'
        comment = textwrap.wrap(f"NaN, silently: {'; '.join(reasons)}", 84, initial_indent="# ",
                                subsequent_indent="#   ")
        return {"open": [*comment, f"with np.errstate({flags}):"], "shift": 4}

    return {"backward": block(weighted + (["inf - inf where overlapping windows' terms add"]
                                          if adds_in_block and overlap else [])),
            "jvp": block(weighted + (["inf - inf where a window's terms add"] if adds_in_block else []))}


def context(art: Artifacts) -> dict:
    """The template context of an op's NumPy module: finished strings only."""
    op, d, kernel = art.op, art.derivation, art.kernel
    if op.spec.strategy.expression:
        return _expression_context(art)
    if isinstance(kernel, OrderKernel):  # order statistics (numpy/order.py)
        return (_numpy_base_context(op, header(op, "numpy"), order_docstring(op, d, kernel))
                | {"piecewise_linear": art.piecewise_linear} | order_context(op, kernel))
    if op.spec.strategy.special:
        return _special_context(art)
    ctx = _numpy_base_context(op, header(op, "numpy"), docstring(op, d, kernel))
    ctx["piecewise_linear"] = art.piecewise_linear
    if isinstance(kernel, ElementwiseKernel):
        return _elementwise_context(art, ctx)
    assert isinstance(kernel, WindowKernel)
    if kernel.windows == "bags":  # windows given by offsets into table rows (bag.py)
        return ctx | bag_context(op, kernel)
    if kernel.segment is not None:  # windows given by an index (segment.py)
        return ctx | segment_context(op, kernel)
    return _window_context(op, kernel, ctx)


def _elementwise_context(art: Artifacts, ctx: dict) -> dict:
    """An elementwise op's module (elementwise.py.jinja): its output and gradient functions, in
    float32 for float16 where the op computes so, and in bfloat16 where that rounds apart."""
    op, kernel = art.op, art.kernel
    back_inter, shared, grads = backward_plan(kernel, kernel.inputs)  # shared: temporaries
    # float16 in float32 (op.half_in_float): forward reads widened copies of the inputs (it
    # saves the inputs themselves), backward rebinds its arguments to widened ones; the
    # results are rounded to float16 once, where they are stored
    wide = {s: sp.Symbol(f"{s}_f32", real=True) for s in kernel.inputs} if op.half_in_float else {}
    forward_wide = [(f"{s}_f32", _widened(s)) for s in wide]
    backward_wide = [(s, _widened(s)) for s in ("grad_output", *wide)]
    sub = {sp.Symbol(s, real=True): w for s, w in wide.items()}
    ctx.update(
        template="numpy/elementwise.py.jinja",
        inputs=list(kernel.inputs),
        inputs_tuple=repr(tuple(kernel.inputs)),
        output_kernels=[_output_kernel(
            "_output", "forward's output in dtype.",
            forward_wide + [(a.name, numpy_code(a.expr.xreplace(sub), select=True))
                            for a in kernel.intermediates],
            numpy_code(kernel.output.xreplace(sub), select=True))],
        gradient_kernels=[_gradient_kernel(
            "_gradients", _GRADIENTS_DOC,
            (backward_wide if wide else []) + [(a.name, numpy_code(a.expr)) for a in back_inter],
            [(a.name, numpy_code(a.expr, select=True)) for a in shared + grads])],
        broadcast=kernel.broadcast,
        torch_sum_to=kernel.broadcast_sum == "torch",  # (conventions.BROADCAST_SUMS)
        forward_quiet=_forward_quiet(kernel),
        returns=[(name, True) for name in kernel.inputs],
        gradient_values=["next(grads)" for _ in kernel.inputs],  # every input in wrt
    )
    if bfloat16_kernels(art):  # (host.bfloat16_kernels: where bfloat16 rounds apart)
        ctx.update(_elementwise_bfloat16(kernel, ctx, back_inter, shared + grads))
    return ctx


def _window_context(op: Op, kernel: WindowKernel, ctx: dict) -> dict:
    """A window op's module (window.py.jinja, gather.py.jinja or adaptive.py.jinja, by the
    windows' form): the selection's strings, the form's partials, then what the form adds."""
    sel = kernel.selection
    ctx.update(_selection_strings(op, kernel))
    ctx.update(_window_bfloat16(kernel))
    ctx.update(_form_partials(kernel))
    # the mask form's lines that count each window's hits, where the weight shares the gradient
    ctx.update(host_partials(kernel))
    if sel.form == "mask":
        ctx["quiet"] = _quiet(op, kernel)
    # the scan's output where it is the NaN-propagating fold, not the winner (keep/replace): the
    # lines that start and step it, and what forward stores
    ctx["scan_output"] = _scan_output(sel.form == "scan" and not sel.winner_is_output, ctx["fold_out"])
    if op.spec.spatial:  # pooling over (N, C, *spatial)
        ctx["spatial"] = op.spec.spatial
    if kernel.windows in _GATHER:
        ctx["gather"] = _gather_words(op, kernel)
    if kernel.runtime_windows or kernel.windows in _GATHER:  # whole-row calls (gathered)
        ctx.update(_whole_row_strings(op, kernel))
    if kernel.windows == "spans":
        ctx.update(_spans_strings(kernel))
    ctx.update(python_geometry(kernel))
    ctx.update(_FORM_GEOMETRY.get(kernel.windows, lambda kernel: {})(kernel))
    ctx["imports"] = _WINDOW_TEMPLATES[kernel.windows]["imports"]
    return ctx


def _fold(op: Op, sel, a: str, b: str, step=numpy_extremum_fold) -> str:
    """a folded with b: NumPy's own call, or the zeros rule's select (op.zeros)."""
    if op.zeros is None:
        return step(sel.extremum, a, b)
    names = {BEST: sp.Symbol(a, real=True), V: sp.Symbol(b, real=True)}
    return numpy_code(sel.combine.xreplace(names))


def _selection_strings(op: Op, kernel: WindowKernel) -> dict:
    """The selection as NumPy code (the scan's take and arg-extremum, the mask's hit and weight,
    the folds), the gradient's start and the write path's lines, the op's parameters."""
    sel = kernel.selection
    return dict(
        template=_WINDOW_TEMPLATES[kernel.windows]["template"],
        window=kernel.window,
        index_dtype=kernel.index_dtype or "",
        take=numpy_code(sel.take) if sel.form == "scan" else "",
        combine=_fold(op, sel, "best", "v"),
        fold_out=_fold(op, sel, "out", "v"),  # the output folded on its own
        hit=numpy_code(sel.hit, select=True) if sel.form == "mask" else "",
        weight=numpy_code(sel.weight, select=True) if sel.form == "mask" else "",
        tangent_term=numpy_code(kernel.tangent_term, select=True) if kernel.tangent_term is not None else "",
        # the mask's weight or jvp term reads the element itself (nanmax/nanmin's 'fill'): its
        # parameter, and the argument that passes the saved input's rows
        element={"param": ", v", "arg": ", _gathered(saved.x, view)"} if sel.form == "mask" and any(
            V in e.free_symbols for e in (sel.weight, kernel.tangent_term) if e is not None)
        else {"param": "", "arg": ""},
        padding_takes_part=kernel.padding_takes_part,
        grad_start="-0.0" if kernel.grad_start == "-0" else "0",
        grad_start_comment=grad_start_comment(kernel.grad_start),
        # the write path (disjoint windows): a -0.0 gradient lands as +0.0 (0 + g), unless the
        # winner's gradient is grad_output itself, written (WindowKernel.grad_start "written")
        write_zero={"start": [], "block": [], "element": []} if kernel.grad_start == "written" else {
            "start": ["nonzero = np.empty((block,) + plan.out_plane, dtype=bool)"],
            "block": ["np.not_equal(grads[b0:b1], 0, out=nonzero[:n])  # a -0.0 gradient lands as +0.0 (0 + g)"],
            "element": ["won[:n] &= nonzero[:n]"]},
        padding_comment=("padding is -inf and takes part in every window (the gradient it wins is "
                         "dropped)" if kernel.padding_takes_part else
                         "padding never wins: a window's winner is always inside the input"),
        scan_order=sel.order or "first",  # the scan's winner among equal elements
        arg_extremum=numpy_arg_extremum(sel.extremum, sel.order or "first", "xr") if sel.form == "scan" else "",
        reduce=numpy_extremum_reduce(sel.extremum, "xr", op.zeros),
        params_list=[(k.upper(), repr(v)) for k, v in op.params.items()],
        return_indices=bool(op.params.get("return_indices")),  # forward returns (output, indices)
    )


def _form_partials(kernel: WindowKernel) -> dict:
    """The template's scan or mask parts, by the lowered form (window.py.jinja's: _window_scan/_mask,
    gather.py.jinja's: _gather_scan/_mask, with what Saved holds from host/_<geometry>_scan/_mask,
    the parts the cpu loaders share; adaptive.py.jinja's are all there), the docstrings' words of
    the form, window.py.jinja's plan or gather.py.jinja's view, the write path's limit."""
    form, templates = kernel.selection.form, _WINDOW_TEMPLATES[kernel.windows]
    form_doc = {site: words[form] for site, words in _FORM_DOCS.get(kernel.windows, {}).items()}
    if kernel.tangent_term is not None:  # (conventions.TANGENT_SUMS "torch")
        form_doc["jvp"] = TORCH_TANGENT_SUM_DOC
    return {"selection_partial": templates["selection"].format(form=form),
            "saved_partial": templates["saved"].format(form=form),
            "form_doc": form_doc,
            "geometry_partial": templates["geometry"],
            "write_up_to": _WRITE_UP_TO.get(kernel.windows, "")}


def _gather_words(op: Op, kernel: WindowKernel) -> dict:
    """gather.py.jinja's words and signatures (_GATHER), with the dtype of saved.index and the
    mask form's output."""
    sel = kernel.selection
    return _GATHER[kernel.windows] | {
        # the dtype of saved.index: the lowered one, or the one the module picks at run time
        "index_type": "INDEX_DTYPE" if kernel.index_dtype else "_index_dtype(view.n)",
        "mask_output": _first_nan_of(numpy_extremum_reduce(
            # (NaN skipped: of +0 and -0 the second, as the lowered fold, where no rule is given)
            sel.extremum, "rows", op.zeros or ("second" if kernel.skips_nan else None), kernel.skips_nan), kernel)
        if kernel.windows == "rows" else _FOLD_WINNER_OUTPUT,
        # a row's NaN output is its first NaN, bits and all (host/_first_nan.py.jinja)
        "first_nan": kernel.windows == "rows" and not kernel.skips_nan}


def _first_nan_of(reduce: str, kernel: WindowKernel) -> str:
    """A reduction's mask-form output with each NaN its row's first (the C and CUDA folds' NaN,
    lower.extremum_step's first_nan), where NaN is not skipped."""
    return reduce if kernel.skips_nan else f"_first_nan(rows, {reduce})"


def _whole_row_strings(op: Op, kernel: WindowKernel) -> dict:
    """The whole-row calls (gathered windows, or windows known at run time): the winner's and the
    fold's helpers, the folds for every dtype, the cost model, and the output's fold lines."""
    sel = kernel.selection
    fold_winner = (numpy_fold_winner(sel.extremum, zeros=op.zeros)  # the fold's output
                   if sel.form == "mask" or not sel.winner_is_output else "")
    fold_output = _fold(op, sel, "output", "v", numpy_extremum_step)
    # the scan's output where it is the NaN-propagating fold, not the winner (keep/replace):
    # the lines that start, step and per window compute it, and what forward returns
    output_is_fold = sel.form == "scan" and not sel.winner_is_output
    return {
        "scan_winner": (numpy_scan_winner(sel.extremum, sel.order, sel.nan)
                        if sel.form == "scan" else ""),
        "fold_winner": fold_winner,
        "combine": _fold(op, sel, "best", "v", numpy_extremum_step),  # the same rule for every dtype
        "fold_output": fold_output,
        "cost": repr(_NUMPY_ADAPTIVE_COST[sel.form]),
        "fold_winner_blocks": [fold_winner] if fold_winner else [],  # helper functions
        "output_fold": {
            "start": ["output = best.copy()  # under this NaN rule the winner of a NaN window need not be the NaN"]
            if output_is_fold else [],
            "step": [f"folded = {fold_output}",
                     "output = folded if valid is None else np.where(valid, folded, output)"] if output_is_fold else [],
            "result": "output" if output_is_fold else "best",
            "per_window": ["winner = _fold_winner(rows)  # under this NaN rule the output is the fold's, not the winner"]
            if output_is_fold else []}}


def _spans_strings(kernel: WindowKernel) -> dict:
    """Adaptive windows (spans): the gradient's start, the order backward adds in, and the
    windows' integer geometry with its docstring (host.adaptive_window_code)."""
    # the gradient's start (WindowKernel.grad_start): under "slices", -0.0 where an element is
    # inside every window (held by all of an axis's windows, along every axis)
    inside = ("sum(np.ix_(*[((a.holders == a.out) & (a.out > 0)).astype(np.intp) for a in axes]))"
              " == len(axes)")
    grad_zeros = (f"np.broadcast_to(np.where({inside}, saved.dtype.type(-0.0), "
                  f"saved.dtype.type(0)), batched).copy()"
                  if kernel.grad_start == "slices" else "np.zeros(batched, dtype=saved.dtype)")
    # the order backward adds an element's windows' gradients in (WindowKernel.grad_order):
    # the windows, and each element's m-th holders, in row-major order or reversed
    # and, reversed (JAX's slices), each window's gradient rounded to the dtype before it is added
    windows, holders = "_windows(axes)", "np.ndindex(*(a.most for a in axes))"
    rounding = []
    if kernel.grad_order == "reversed":
        windows, holders = f"reversed(list({windows}))", f"reversed(list({holders}))"
        rounding = ["weight = weight.astype(grad.dtype, copy=False)  # a window's gradient: an array of the dtype"]
    return dict(grad_zeros=grad_zeros, backward_windows=windows, backward_holders=holders,
                weight_rounding=rounding, **adaptive_window_code())


def _strided_geometry(kernel: WindowKernel) -> dict:
    """Pooling's phase planes (_geometry_pool.py.jinja)."""
    return dict(pool=_pool_code(kernel.axes))


def _blocks_geometry(kernel: WindowKernel) -> dict:
    """Maxout's groups (_geometry_maxout.py.jinja)."""
    return {"maxout_groups": numpy_integer_code(kernel.axes.output_size, {"length": "c", "k": "PIECES"})}


# the geometry strings a form of windows adds after python_geometry: {windows' form: builder}
_FORM_GEOMETRY = {"strided": _strided_geometry, "blocks": _blocks_geometry, "sampled": fractional_window_code}


def _pool_code(g) -> dict:
    """Pooling's geometry (symgrad.geometry) as the phase planes of _geometry_pool.py.jinja read
    it, per axis: element j's windows inside the input, its phase (the residue of its offset j*d
    from the window's start modulo the stride) and shift, coordinates of windows."""
    offset = g.coordinate - g.start  # element j's offset from its window's start
    along = {"s": "STRIDE[axis]", "p": "PADDING[axis]", "d": "DILATION[axis]"}
    return {
        "first_inside": numpy_integer_code(g.first_inside),
        "end_inside": numpy_integer_code(g.end_inside),
        "residue": numpy_integer_code(sp.Mod(offset, S)),
        "shift": numpy_integer_code(sp.floor(offset / S)),
        "coordinate": numpy_integer_code(g.coordinate),
        "coordinate_lo": numpy_integer_code(g.coordinate, {"i": "lo"}),
        "coordinate_last": numpy_integer_code(g.coordinate, {"i": "(hi - 1)"}),
        "origin": numpy_integer_code(g.start, {"i": "o"} | along),
        "coordinate_of_window": numpy_integer_code(g.coordinate, {"i": "o"} | along),
        "inside_plane": bare(numpy_integer_code(g.inside, {"x": "c", "length": "plan.plane_shape[axis]"})),
    }


# The adaptive NumPy modules' cost model for choosing, per input shape, between one pass per
# window-box element over all windows and one call per window (microseconds, fitted roughly to
# float32 timings of both on one x86 core, benchmarks/adaptive_numpy.py): a pass costs "pass" plus,
# per gathered element, "gathered" (forward) or "gathered_backward"; a window "window" plus, per
# row (plane), "row" and "element" per window element, or "scatter" (first/last backward: one
# winner per row).  A tuning choice only: both strategies give the same results bit for bit.
_NUMPY_ADAPTIVE_COST = {
    "scan": {"pass": 20.0, "gathered": 0.01, "gathered_backward": 0.01, "window": 40.0, "row": 0.06,
             "element": 0.006, "scatter": 0.02},
    "mask": {"pass": 20.0, "gathered": 0.004, "gathered_backward": 0.012, "window": 40.0, "row": 0.06,
             "element": 0.01},
}

# what backward and jvp do with a window, in the docstrings of the templates of their own, by the
# lowered form (a scan's winner or a mask's weights): {windows' form: {site: {form: words}}}
_FORM_DOCS = {
    "spans": {"jvp": {
        "scan": "the tangent of each window's winner",
        "mask": "each window's weights (backward's, with the tangent of each element in place of "
                "grad_output) summed over the window box in row-major order"}},
    "sampled": {
        "backward": {"scan": "each window's gradient added to its winner",
                     "mask": "each window's gradient added to its elements by their weights"},
        "jvp": {"scan": "the tangent of each window's winner",
                "mask": "each window's weights (backward's, with the tangent of each element in place "
                        "of grad_output) summed over its elements in row-major order"}},
    "rows": {
        "backward": {"scan": "each slice's gradient routed to its winner",
                     "mask": "each slice's gradient routed to its winners by their weights"},
        "jvp": {"scan": "the tangent of each slice's winner",
                "mask": "each slice's weights (backward's, with the tangent of each element in place of "
                        "grad_output) summed along it"}},
}


# window.py.jinja's scan backward writes disjoint windows of up to WRITE_UP_TO elements through one
# view of grad_x per window element (the phase-plane geometries; maxout's piece k is one slab)
_WRITE_UP_TO = {
    "blocks": "WRITE_UP_TO = PIECES  # piece k of every group is one contiguous slab",
    "strided": "WRITE_UP_TO = 2  # beyond, the strided views cost more than scattering",
}


def _scan_output(output_is_fold: bool, fold_out: str) -> dict:
    """window.py.jinja's scan: where the output is the NaN-propagating fold rather than the
    winner's value (Selection.winner_is_output false), the lines that start and step the fold
    beside the scan, and the array forward stores as the output."""
    if not output_is_fold:
        return {"start": [], "step": [], "result": "best"}
    return {"start": ["out = best.copy()  # under this NaN rule the winner of a NaN window need not be the NaN"],
            "step": [f"folded = {fold_out}",
                     "if w.valid is not None:",
                     "    for at in _outside(w.valid):  # padding never wins",
                     "        folded.reshape((n,) + plan.wide)[at] = out.reshape((n,) + plan.wide)[at]",
                     "if w.first is not None:  # the first element inside the input starts the window",
                     "    at = (slice(None),) + w.first",
                     "    folded.reshape((n,) + plan.wide)[at] = v.reshape((n,) + plan.wide)[at]",
                     "out = folded"],
            "result": "out"}


# the templates of each form of windows (WindowKernel.windows): the module's skeleton (window.py.jinja:
# phase planes; gather.py.jinja: each window's elements gathered as one row; adaptive.py.jinja) and
# its scan or mask partial, its geometry partial, the saved-state partial of the lowered form, the
# modules the skeleton imports
_WINDOW_TEMPLATES = {
    "strided": {"template": "numpy/window.py.jinja", "selection": "numpy/_window_{form}.py.jinja",
                "geometry": "numpy/_geometry_pool.py.jinja", "saved": "host/_pool_{form}.py.jinja",
                "imports": ["itertools", "math", "sys"]},
    "blocks": {"template": "numpy/window.py.jinja", "selection": "numpy/_window_{form}.py.jinja",
               "geometry": "numpy/_geometry_maxout.py.jinja", "saved": "host/_maxout_{form}.py.jinja",
               "imports": ["math", "sys"]},
    "sampled": {"template": "numpy/gather.py.jinja", "selection": "numpy/_gather_{form}.py.jinja",
                "geometry": "numpy/_geometry_fractional.py.jinja", "saved": "host/_fractional_{form}.py.jinja",
                "imports": ["math"]},
    "rows": {"template": "numpy/gather.py.jinja", "selection": "numpy/_gather_{form}.py.jinja",
             "geometry": "numpy/_geometry_reduction.py.jinja", "saved": "host/_reduction_{form}.py.jinja",
             "imports": []},
    "spans": {"template": "numpy/adaptive.py.jinja", "selection": "host/_adaptive_{form}.py.jinja",
              "geometry": "numpy/_geometry_adaptive.py.jinja", "saved": "host/_adaptive_{form}.py.jinja",
              "imports": []},
}

# gather.py.jinja's words and signatures by the windows' form (the geometry partial gives the view
# itself): the inputs forward takes besides x and what jvp takes for them, backward's results
_GATHER = {
    "rows": {
        "forward_params": "x: np.ndarray", "forward_args": "x", "forward_doc": "",
        "grads": "grad_x,", "grads_type": "np.ndarray", "returns": "grad,", "backward_doc": "",
        "jvp_params": "tangent_x, saved: Saved", "jvp_doc": "", "jvp_checks": []},
    "sampled": {
        "forward_params": "x: np.ndarray, random_samples: np.ndarray",
        "forward_args": "x, random_samples",
        "forward_doc": ": each window's elements gathered, the window scanned in row-major\n    order",
        "grads": "grad_x, None", "grads_type": "np.ndarray, None", "returns": "grad, None",
        "backward_doc": ", in\n    output (row-major) order, as PyTorch's kernel adds overlapping windows; "
                        "random_samples get\n    None (the windows are integers)",
        "jvp_params": "tangent_x, tangent_random_samples, saved: Saved",
        "jvp_doc": " (tangent_random_samples must be None: the\n    windows are integers)",
        "jvp_checks": ["if tangent_random_samples is not None:",
                       '    raise ValueError(f"{OP}: tangent_random_samples must be None: the windows are integers")']},
}
# the mask form's output of fractional pooling: the element that the running fold returns
_FOLD_WINNER_OUTPUT = "np.take_along_axis(rows, _fold_winner(rows)[..., None], axis=-1)[..., 0]"

def _expression_context(art: Artifacts) -> dict:
    op, d, kernel = art.op, art.derivation, art.kernel
    wrt = tuple(op.params["wrt"])
    back_inter, adjoints, grads = backward_plan(kernel, wrt)
    return _numpy_base_context(op, expression_header(op, "numpy"), expression_docstring(op, d)) | {
        "template": "numpy/elementwise.py.jinja",
        "inputs": list(kernel.inputs),
        "inputs_tuple": repr(tuple(kernel.inputs)),
        "output_kernels": [_output_kernel("_output", "forward's output in dtype.",
                                          [(a.name, numpy_code(a.expr)) for a in kernel.intermediates],
                                          numpy_code(kernel.output))],
        "gradient_kernels": [_gradient_kernel("_gradients", _GRADIENTS_DOC,
                                              [(a.name, numpy_code(a.expr)) for a in back_inter],
                                              [(a.name, numpy_code(a.expr)) for a in adjoints + grads])],
        "broadcast": kernel.broadcast,
        "torch_sum_to": kernel.broadcast_sum == "torch",  # (conventions.BROADCAST_SUMS)
        "forward_quiet": "",
        "returns": [(name, name in wrt) for name in kernel.inputs],
        # backward's value per input where some are outside wrt: its gradient, or None
        "gradient_values": ["next(grads)" if name in wrt else "None" for name in kernel.inputs],
        "piecewise_linear": art.piecewise_linear,
    }


def _special_context(art: Artifacts) -> dict:
    op, d, kernel = art.op, art.derivation, art.kernel
    ctx = _numpy_base_context(op, header(op, "numpy"), special_docstring(op, d, kernel, half=True))
    ctx["piecewise_linear"] = art.piecewise_linear
    ctx["params_list"] = [(k.upper(), repr(v)) for k, v in op.params.items()]
    if isinstance(kernel, UnpoolKernel):
        # np.unique returns each key's first position: of the keys reversed, the last writer's
        stay = {"first": ["_, stay = np.unique(keys, return_index=True)"],
                "last": ["_, from_end = np.unique(keys[::-1], return_index=True)",
                         "stay = keys.size - 1 - from_end"]}[kernel.keep]
        ctx.update(template="numpy/unpool.py.jinja", spatial=kernel.spatial, keep=kernel.keep, imports=["math"],
                   stay_lines=stay,
                   each_writer=repr(kernel.each_writer),
                   # every writer of a slot gets its gradient, or the one that stayed (its wins saved)
                   **host_partials(kernel))
    else:
        t = op.params["temperature"]
        ctx.update(template="numpy/logsumexp.py.jinja", shift=numpy_code(kernel.shift), rows_doc_end="",
                   empty_slices=True,  # an empty slice is -inf, as torch.logsumexp
                   lse_half_partial=lse_half_partial(kernel),  # (where bfloat16_kernels: half names a framework)
                   term=numpy_code(kernel.term), output=numpy_code(kernel.output),
                   weight=numpy_code(kernel.weight),
                   formula=f"{t!r} * log(sum(exp(x / {t!r})))" if t != 1 else "log(sum(exp(x)))",
                   weight_text=f"exp((x - y) / {t!r})" if t != 1 else "exp(x - y)")
    return ctx
