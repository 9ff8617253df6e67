"""The ``Kind`` object and what several kinds share (see the package's docstring)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

# ops.py imports this package: the functions here take an ops.Op (named "Op" in their annotations)
# and, for the docs' worked example, a generated NumPy module ("mod")

# the window a reduction, adaptive window or logsumexp is derived on: its length is known only at
# run time, and the rule derived on it is the same for every length
REPRESENTATIVE_REDUCTION_WINDOW = 4


def _none(*_) -> list[str]:
    return []


def _same(mod):
    return mod


@dataclass(frozen=True)
class Kind:
    name: str
    # how it derives and lowers: a max/min of pieces of the named inputs (derive.py, an
    # ElementwiseKernel), its own rule (derive_special.py, lower.lower_special, docs_special.py),
    # a user's expression (expr.py), or else a window's extremum (derive.py, lower.WindowKernel)
    elementwise: bool = False  # the argument order applies
    special: bool = False  # not a max/min of pieces (unpool, logsumexp)
    expression: bool = False
    # forward scatters the input into the slots an integer input `indices` names (unpooling): the
    # writers of a slot tie by their indices, not their values
    scatter: bool = False
    # how derive.derive derives it (derive.DERIVATIONS): "pieces" (a max/min of pieces, or a
    # window's extremum: the W-form), "special" (its own rule, derive_special.py) or "expression"
    derivation: str = "pieces"
    # the lowering of lower.LOWERINGS that makes its kernel: "elementwise" (an ElementwiseKernel
    # of its max/min nodes), "window" (a WindowKernel of the kind's windows), "expression" (a
    # user's expression, node by node), "scatter" (unpooling's UnpoolKernel), "logsumexp"
    lowering: str = "window"
    # a window kind: the form of its windows in the lowered WindowKernel (lower.WINDOW_FORMS:
    # what the windows are, "strided", "blocks", "sampled", "rows" or "spans"), by which the
    # backends choose their templates ("" where it has no windows)
    windows: str = ""
    # its windows never overlap, whatever the parameters (maxout's groups of channels): one
    # winner per window can write its gradient instead of adding it (conventions.GRAD_STARTS)
    disjoint: bool = False
    # its windows are known only at run time, per input (adaptive: from the input's length;
    # fractional: from the random samples): the backends gather each window's elements by index
    runtime_windows: bool = False
    # its windows may overlap (by the parameters or the input): an element's gradient adds the
    # terms of the windows holding it, which conventions.BFLOAT16_ADDS may round one by one; a
    # function of the parameters where they decide it (pooling: a window wider than the stride)
    overlaps: bool | Callable[[dict], bool] = False
    # the order an element's windows' gradients are added is a convention (conventions.GRAD_ORDERS:
    # windows that differ in size, adaptive pooling's)
    grad_orders: bool = False
    # jvp's sum along a window follows conventions.TANGENT_SUMS (the reductions' slices)
    tangent_sums: bool = False
    # the inputs each (N, C) plane of its windows is placed by besides x, as the generated kernels
    # name them (fractional pooling's random samples: "samples")
    plane_inputs: tuple[str, ...] = ()
    # windows placed per plane by samples: how their starts are drawn (the generated code's docs),
    # and which sample drives each spatial axis, from the number of spatial axes
    sampling: str = ""
    sample_of: Callable[[int], tuple[int, ...]] | None = None
    window_size: Callable[[dict], int] | None = None  # the window derived on, from the parameters
    # the windows along each axis (symgrad.geometry: output size, starts, coordinates, holders),
    # from the parameters; None where the kind has no axis geometry (reductions, elementwise)
    axes: Callable[[dict], Any] = lambda params: None
    static: bool = False  # one window of window_param elements, known when the code is generated
    window_param: str = ""  # the parameter that sizes a static window (bounded by ops.MAX_WINDOW)
    preset_padding: bool = False  # a framework preset decides whether padding takes part
    # refuses settings the kind does not define: settings(op name, ties, nan)
    settings: Callable[[str, str, str], None] = _none
    # `symgrad derive`: lines on the windows (op, the largest window listed in full), on backward
    describe: Callable[["Op", int], list[str]] = _none
    backward: Callable[["Op"], list[str]] = _none
    # the module docstring's paragraph on the windows (after the forward's summary)
    windows_doc: str = ""
    # the check a derivation on a representative window adds (format field n: its size)
    representative_note: str = ""
    # the op whose rows of the conventions table (table.SITUATIONS) stand for this kind's ops
    conventions_family: str = ""
    # docs page: the paragraph on the windows ($...$: inline math); the worked example's windows,
    # example(op, mod) -> (input shapes, windows by multi-index, cell, out_cell, pads, output
    # shape); the module the example runs; what the example says when its windows do not overlap;
    # whether windows differ in size
    docs_windows: Callable[["Op"], str] | None = None
    example: Callable | None = None
    example_module: Callable = _same
    docs_apart: str = ""
    windows_vary: bool = False
    # without a preset, tied +0 and -0 give the slice's first zero (the zeros rule 'first'; the
    # winner's, the last, under ties 'last'), one rule for every backend (ops.plain_zeros)
    first_zero: bool = False

    def window(self, op: "Op") -> int:
        if self.window_size is None:
            raise ValueError(f"{op.name} has no window")
        return self.window_size(op.params)


def representative(params: dict) -> int:
    return REPRESENTATIVE_REDUCTION_WINDOW


def describe_static(op: "Op", listed: int) -> list[str]:
    offs = [f"x{i}={o}" for i, o in enumerate(itertools.product(*map(range, op.params["kernel_size"])))]
    if len(offs) > listed:  # derived on a representative window: first and last
        offs = offs[:2] + ["..."] + offs[-1:]
    return [f"window elements (row-major scan order): {', '.join(offs)}"]


def window_backward(op: "Op") -> list[str]:
    return ["", "== backward ==",
            "  grad_x[i] = sum over the windows w holding i of w_k(i) * grad_output[w]"
            "  (W^T g; overlapping windows accumulate)"
            + ("; random_samples: None" if op.spec.constant_inputs else "")]


def spatial_cell(spatial: int):
    """The docs picture's cell of a pooling element: spatial coordinates -> (panel, row, col)."""
    def cell(c):
        c = tuple(c)
        if spatial == 1:
            return (0, 0, c[0])
        if spatial == 2:
            return (0, c[0], c[1])
        return c
    return cell
