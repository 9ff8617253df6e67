"""The torch backend's window kernels (``lower.WindowKernel``): the template context of pooling
(windows "strided") and maxout (windows "blocks"), printed as plain PyTorch code.

Forward is a fold over the window's strided slices (a padded input's slice per window element,
one long tensor operation per element, in the window's row-major scan order); backward is in
gather form: each window element's gradient plane added into a zero tensor through the same
strided slice, the last element first, so each input element gets its windows' terms in output
(row-major) order, as the NumPy module adds them (window.py.jinja's _accumulate).  No scatter, no
atomics, no ``.item()``, no branch on a tensor's values."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

import sympy as sp

from ...lower import BEST
from ..common import grad_start_comment, python_geometry
from ..printing import bare, python_integer_code

if TYPE_CHECKING:
    from ...lower import WindowKernel

# the windows' forms this backend builds: {form: (geometry partial, what a plane is)}
GEOMETRY = {"strided": "torch/_geometry_pool.py.jinja", "blocks": "torch/_geometry_maxout.py.jinja",
            "rows": "host/_reduced_dims.py.jinja",  # (rows: the reduction's dims, rows.py)
            "spans": "torch/adaptive.py.jinja",  # (spans: its windows in Python ints, adaptive.py)
            "sampled": "torch/fractional.py.jinja"}  # (sampled: starts from the samples, fractional.py)

def _code(expr) -> str:
    from .printer import torch_code
    numbers: list = []
    code = torch_code(expr, numbers)
    if numbers:  # a window's selection compares and divides by counts: no inexact numbers
        raise ValueError(f"a window kernel's selection holds numbers {numbers}: not built by the torch backend")
    return code


def _fold(sel, a: str) -> str:
    """The running extremum folded with v (lowered Selection.combine, best renamed a)."""
    return _code(sel.combine.xreplace({BEST: sp.Symbol(a, real=True)}))


def _scan(kernel: WindowKernel) -> dict:
    """The scan form: take, and where the output is the NaN-propagating fold (keep/replace) rather
    than the winner, the fold's lines."""
    sel = kernel.selection
    output_is_fold = not sel.winner_is_output
    return {"take": _code(sel.take),
            "fold_start": ["out = best  # under this NaN rule the winner of a NaN window need not be the NaN"]
            if output_is_fold else [],
            "fold_step": [f"folded = {_fold(sel, 'out')}",
                          "if w.valid is not None:  # padding never wins",
                          "    folded = torch.where(w.valid, folded, out)",
                          "if w.first is not None:  # the first element inside the input starts the window",
                          "    folded = torch.where(w.first, v, folded)",
                          "out = folded"] if output_is_fold else [],
            "result": "out" if output_is_fold else "best"}


def _mask(kernel: WindowKernel) -> dict:
    sel = kernel.selection
    # the hits of each window counted in the working dtype (exact), where the weight shares the gradient
    count = ["count = torch.zeros(layout.out_plane, dtype=dtype, device=saved.x.device)",
             "for _, hit in hits:",
             "    count = count + hit.to(dtype)"] if sel.counts else ["count = None  # the weight needs no count"]
    # the tiled backward's count: a sum over the window axes of its (planes, o1, k1, ...) view
    tiled = (["count = hit.to(dtype).sum(tuple(range(2, 2 + 2 * SPATIAL, 2)), keepdim=True)  # (exact: small integers)"]
             if sel.counts else ["count = None  # the weight needs no count"])
    return {"combine": _fold(sel, "best"), "hit": _code(sel.hit), "weight": _code(sel.weight),
            "count_lines": count, "tiled_count_lines": tiled}


def _pool_geometry(kernel: WindowKernel) -> dict:
    """Pooling's geometry (symgrad.geometry) in the Python of the module's _axis."""
    g = kernel.axes
    along = {"i": "o", "s": "STRIDE[axis]", "p": "PADDING[axis]", "d": "DILATION[axis]"}
    return {"first_inside": python_integer_code(g.first_inside),
            "end_inside": python_integer_code(g.end_inside),
            "coordinate_of_window": python_integer_code(g.coordinate, along),
            "inside_plane": bare(python_integer_code(g.inside, {"x": "c", "length": "L"})),
            **python_geometry(kernel)}


def _maxout_geometry(kernel: WindowKernel) -> dict:
    return {"maxout_groups": python_integer_code(kernel.axes.output_size, {"length": "c", "k": "PIECES"})}


_FORM_GEOMETRY = {"strided": _pool_geometry, "blocks": _maxout_geometry}


def _tiles(op, kernel: WindowKernel) -> bool:
    """Whether pooling's windows tile the input (stride == kernel_size, no padding, dilation 1,
    floor mode: each element in at most one window), so backward is one select per element over
    the tiled view (_window_tiles) instead of a strided placement per window element, which
    Inductor fuses into one pass of a load per element (the benchmark CNN's 2x2 pools)."""
    p = op.params
    return (kernel.windows == "strided" and kernel.grad_start != "written" and not p.get("ceil_mode")
            and tuple(p["stride"]) == tuple(p["kernel_size"]) and not any(p["padding"])
            and all(d == 1 for d in p["dilation"]))


def window_context(op, kernel: WindowKernel) -> dict:
    """The template context of a pooling or maxout module: finished strings only."""
    sel = kernel.selection
    if kernel.grad_start not in ("+0", "-0", "written"):
        raise ValueError(f"{op.name}: the torch backend has no gradient start {kernel.grad_start!r}")
    written = kernel.grad_start == "written"  # (lower: only where windows never overlap)
    form = {"scan": _scan, "mask": _mask}[sel.form](kernel)
    return {
        "form": sel.form,
        "selection_partial": f"torch/_window_{sel.form}.py.jinja",
        "geometry_partial": GEOMETRY[kernel.windows],
        "window": kernel.window,
        "index_dtype": f"torch.{kernel.index_dtype}" if sel.form == "scan" else "",
        "padding_takes_part": kernel.padding_takes_part,
        "padding_comment": ("padding is -inf and takes part in every window (the gradient it wins is "
                            "dropped)" if kernel.padding_takes_part else
                            "padding never wins: a window's winner is always inside the input"),
        "grad_start": "-0.0" if kernel.grad_start == "-0" else "0.0",
        "grad_start_comment": grad_start_comment(kernel.grad_start),
        # the gradient of a window's winner: grad_output where it won, +0.0 elsewhere, added to
        # +0 (a -0 gradient lands as +0), or, written (WindowKernel.grad_start), grad_output itself
        "written": written,
        "bfloat16_adds": kernel.bfloat16_adds == "bfloat16",
        "bfloat16_doc": textwrap.wrap(
            "bfloat16: backward adds each window's gradient to its winner's in bfloat16, each add rounded "
            "(WindowKernel.bfloat16_adds); forward and jvp compute in float32 and round once"
            if kernel.bfloat16_adds == "bfloat16" else
            "bfloat16 is computed in float32 and rounded once, as the NumPy module computes it", 94),
        "params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
        "spatial": op.spec.spatial,
        # forward's result: (output, indices) where PyTorch's indices are asked for (return_indices)
        "forward_result": "(output, indices(saved))" if op.params.get("return_indices") else "output",
        "tiles": _tiles(op, kernel),
        **form,
        **_FORM_GEOMETRY[kernel.windows](kernel),
    }
