"""The jax backend's adaptive max pooling (``lower.WindowKernel`` of windows "spans"): the template
context of ``adaptive.py.jinja``.

The windows are PyTorch's adaptive ones (host.adaptive_window_code: the NumPy module's integer
geometry), computed with NumPy from the input's static shape while tracing, so their index
arrays are constants of the jaxpr.  Forward is the NumPy module's "box" strategy: one gather per
element of the window box (the largest window along each axis) over all windows at once, in
row-major order, masked where a window is smaller; backward is in gather form, one pass per
holding window (each input element's m-th window), in the order the NumPy module adds an
element's windows' gradients (WindowKernel.grad_order).  No scatter, no callback, no branch on
array values.  Every start of a sum is behind an optimization barrier: XLA drops an add of a
constant +0.0, which is not the identity at -0.0."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import sympy as sp

from ...lower import BEST
from ..common import docstring, grad_start_comment, header
from ..host import adaptive_window_code, preamble_context
from .printer import JAX, jax_code

if TYPE_CHECKING:
    from ...lower import Artifacts, WindowKernel

# the paragraph the module's docstring ends with
NOTE = [
    "A JAX module (jax.numpy and lax only: no host callback, no scatter, no branch on array values):",
    "forward gathers each element of the window box from every window at once and folds them in the",
    "NumPy module's scan order, backward gathers each input element's windows' gradients in the order",
    "the NumPy module adds them, so forward, backward and jvp run under jax.jit, jax.vmap and",
    "jax.grad, on every device JAX has, and equal the NumPy backend's module bit for bit on the CPU."]


# the largest window box whose fold forward unrolls (a larger one runs in lax.fori_loop): an
# unrolled fold of a global pooling (64 x 64 planes of 16 x 16, output size 1) under the torch
# preset made jit(grad) of max_pool2d then adaptive_max_pool2d take 12 s, XLA recomputing the
# 256 steps for every input element in backward; 50 ms in a loop
UNROLLED = 16


def _step(op, sel, a: str) -> str:
    """a folded with v by the NumPy module's rule for whole rows (host.printer.numpy_extremum_step,
    the same for every dtype), or the zeros rule's lowered fold (op.zeros)."""
    if op.zeros is not None:
        return jax_code(sel.combine.xreplace({BEST: sp.Symbol(a, real=True)}))
    return JAX.extremum_step(sel.extremum, a, "v")


def _indices(return_indices: bool) -> list[str]:
    if not return_indices:
        return []
    return ["", "", "def indices(saved: Saved) -> jax.Array:",
            '    """PyTorch\'s indices (return_indices=True): the flat position of each window\'s winner in its',
            "    (N, C) plane of the input, in JAX's default integer type (int64 under jax_enable_x64, else",
            '    int32)."""',
            "    plan = _plan(saved.input_shape)",
            "    index = saved.index.reshape(plan.out_plane)",
            "    flat = np.arange(math.prod(plan.planes[1:])).reshape(plan.planes[1:])",
            "    out = jnp.zeros(index.shape, jnp.int_)",
            "    for k, where, _ in _elements(plan):",
            "        out = jnp.where(index == k, flat[where[1:]], out)",
            "    return out.reshape(saved.output_shape)"]


def _scan(op, kernel: WindowKernel) -> dict:
    sel = kernel.selection
    fold = not sel.winner_is_output  # the output is the NaN-propagating fold (keep/replace)
    result = "out" if fold else "best"
    saved = "Saved(index.reshape(plan.out_batched), tuple(x.shape), plan.out_shape, dtype)"
    return_indices = bool(op.params.get("return_indices"))
    return {
        "data_fields": '"index"', "saved_fields": ["index: jax.Array"],
        "saved_doc": "each output's winner as an index into its window's box (the largest window\n"
                     "    extent along each axis, row-major), in the smallest unsigned type holding it",
        "body_helpers": [],
        "forward_doc": "a running scan over the window box's elements in row-major order, the\n"
                       "    winner replaced where a later element of the window takes over",
        "carry": "best, index, out" if fold else "best, index",
        "forward_start": ["index_dtype = _index_dtype(len(elements))",
                          "index = jnp.zeros(best.shape, index_dtype)",
                          *(["out = best  # under this NaN rule the winner of a NaN window need not be the NaN"]
                            if fold else [])],
        "forward_step": [f"take = {jax_code(sel.take)}",
                         "if valid is not None:",
                         "    take = take & valid  # a window without this element",
                         "best = jnp.where(take, v, best)",
                         "index = jnp.where(take, jnp.asarray(k, index_dtype), index)",
                         *([f"folded = {_step(op, sel, 'out')}",
                            "out = folded if valid is None else jnp.where(valid, folded, out)"] if fold else [])],
        "forward_end": [f"output = {result}.astype(dtype).reshape(plan.out_shape)",
                        f"saved = {saved}",
                        "return (output, indices(saved)), saved  # return_indices=True" if return_indices
                        else "return output, saved"],
        "backward_doc": "the gradient",
        "backward_start": ["index = saved.index.reshape(plan.out_plane)"],
        "backward_step": ["hit = index[where] == local",
                          "if valid is not None:",
                          "    hit = hit & valid",
                          "grad = jnp.where(hit, grad + g[where], grad)"],
        "jvp_doc": "the tangent of each window's winner",
        "jvp_start": ["index = saved.index.reshape(plan.out_plane)"],
        "jvp_step": ["out = jnp.where(index == k, planes[where], out)  # a winner is always inside its window"],
        "indices_lines": _indices(return_indices),
    }


def _mask(op, kernel: WindowKernel, rounding: list[str]) -> dict:
    from . import _weight_lines
    sel = kernel.selection
    count = (["elements = _elements(plan)",
              "if len(elements) > UNROLLED:  # one integer sum over the stacked box (exact in any order)",
              "    values, valid = _stacked(x, elements, plan)",
              "    count = jnp.sum(_hit(values, extremum) & valid[:, None], axis=0, dtype=jnp.int32)",
              "else:",
              "    count = jnp.zeros(extremum.shape, jnp.int32)",
              "    for k, where, valid in elements:",
              "        hit = _hit(x[where], extremum)",
              "        count = count + (hit if valid is None else hit & valid)",
              "return count.astype(jnp.promote_types(extremum.dtype, jnp.float32))"]
             if sel.counts else ["return None"])
    helpers = ["def _hit(v, extremum):",
               '    """An element attains its window\'s extremum."""',
               f"    return {jax_code(sel.hit)}", "", "",
               "def _weight(grad_output, hit, count, extremum):",
               '    """The gradient an element receives from one window holding it (linear in grad_output)."""',
               *("    " + line for line in _weight_lines(sel)),
               f"    return {jax_code(sel.weight)}", "", "",
               "def _count(x, extremum, plan: _Plan):",
               '    """How many elements of each window attain its extremum, counted exactly, held in at least',
               '    float32 (as the NumPy module); None where the weight needs no count."""',
               *("    " + line for line in count), "", ""]
    state = ["x = saved.x.astype(work).reshape(plan.planes)",
             "extremum = saved.output.astype(work).reshape(plan.out_plane)",
             "count = _count(x, extremum, plan)"]
    return {
        "data_fields": '"x", "output"', "saved_fields": ["x: jax.Array", "output: jax.Array"],
        "saved_doc": "the input and the output",
        "body_helpers": helpers,
        "forward_doc": "the window box's elements folded in row-major order",
        "carry": "best,",
        "forward_start": [],
        "forward_step": [f"combined = {_step(op, sel, 'best')}",
                         "best = combined if valid is None else jnp.where(valid, combined, best)"],
        "forward_end": ["output = best.astype(dtype).reshape(plan.out_shape)",
                        "return output, Saved(x, output, tuple(x.shape), plan.out_shape, dtype)"],
        "backward_doc": "its weight",
        "backward_start": state,
        "backward_step": ["e = extremum[where]",
                          # each window's count gathered behind a barrier: XLA turns a division by a
                          # broadcast (output size 1: every element's window is one) into a product
                          # with its reciprocal
                          "held = None if count is None else lax.optimization_barrier(count[where])",
                          "weight = _weight(g[where], _hit(x, e), held, e)",
                          *rounding,
                          "added = (grad + weight).astype(work)",
                          "grad = added if valid is None else jnp.where(valid, added, grad)"],
        "jvp_doc": "each window's weights (backward's, with the tangent of each element in\n"
                   "    place of grad_output) summed over the window box in row-major order",
        "jvp_start": state,
        "jvp_step": ["added = (out + _weight(planes[where], _hit(x[where], extremum), count, extremum)).astype(work)",
                     "out = added if valid is None else jnp.where(valid, added, out)"],
        "indices_lines": [],
    }


def _doc(text: str) -> list[str]:
    """A docstring's lines (its quotes included), wrapped as the module's text."""
    return textwrap.wrap(f'"""{text}"""', 94)


_SLICES_START = ["inside = _all([(a.holders == a.out) & (a.out > 0) for a in plan.axes])",
                 "start = np.where(True if inside is None else inside, -0.0, 0.0)",
                 "return lax.optimization_barrier(jnp.broadcast_to(jnp.asarray(start, dtype), plan.planes))"]


def adaptive_context(art: Artifacts) -> dict:
    """The template context of an adaptive max pooling module: finished strings only."""
    op, kernel = art.op, art.kernel
    if kernel.grad_start not in ("+0", "slices") or kernel.grad_order not in ("output", "reversed"):
        raise ValueError(f"{op.name}: the jax backend has no gradient start {kernel.grad_start!r} "
                         f"in order {kernel.grad_order!r} for adaptive windows")
    reversed_order = kernel.grad_order == "reversed"
    # reversed (JAX's slices): each window's weight rounded to the dtype before it is added
    rounding = ["weight = weight.astype(work)  # a window's gradient: an array of the dtype"] if reversed_order else []
    bfloat16_adds = kernel.bfloat16_adds == "bfloat16"
    form = _scan(op, kernel) if kernel.selection.form == "scan" else _mask(op, kernel, rounding)
    order = ("reversed output order, each window's weight rounded to the dtype first" if reversed_order
             else "output (row-major) order")
    form["backward_doc"] = _doc(
        f"Return (grad_x,): each input element adds {form['backward_doc']} of every window holding it, "
        f"in gather form (one pass per holding window over all elements at once), visiting its windows "
        f"in {order}, as the NumPy module adds them.")
    return {
        **preamble_context(header(op, "jax"), NOTE, ()),
        **adaptive_window_code(),
        "docstring": docstring(op, art.derivation, kernel),
        "op": op.name, "ties": op.ties, "params": repr(op.params),
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "piecewise_linear": art.piecewise_linear,
        "spatial": op.spec.spatial,
        "unrolled": UNROLLED,
        "x_parameter": "x", "x_shape_shown": "{tuple(x.shape)}",
        "grad_start_doc": _doc("Every input element's gradient before its windows' terms are added: "
                               f"{grad_start_comment(kernel.grad_start)}."),
        "grad_start_lines": _SLICES_START if kernel.grad_start == "slices" else ["return _zeros(plan.planes, dtype)"],
        "holders_in_order": "reversed(_holders(plan))" if reversed_order else "_holders(plan)",
        "backward_work": "saved.dtype  # bfloat16 adds each rounded to bfloat16 (the preset's)"
        if bfloat16_adds else "_work(saved.dtype)",
        **form,
    }
