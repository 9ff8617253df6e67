"""Adaptive max pooling: PyTorch's windows for a given output size (geometry.ADAPTIVE), which may
overlap and differ in size and depend on the input length known only at run time: derived on a
representative window, as the reductions are."""

from __future__ import annotations

import numpy as np

from .. import geometry
from .base import Kind, representative, spatial_cell, window_backward


def _describe(op: "Op", listed: int) -> list[str]:
    return [f"windows: PyTorch's adaptive windows, [floor(i*L/out), ceil((i+1)*L/out)) per "
            f"axis, overlapping and of varying size; derived on a representative window "
            f"of {op.window_size()} elements (the rule is the same for every size)"]


def _example(op: "Op", mod):
    """Adaptive pooling: each input length is its output size + 2, so that windows overlap and
    differ in size.  Each window is listed over the window box (the largest extent along each
    axis, row-major), None where the window has no element there (it never wins)."""
    sp_ = op.spec.spatial
    lengths = tuple(4 if o is None else o + 2 for o in op.params["output_size"])
    y, _ = mod.forward(np.zeros((1,) + lengths))
    outs = y.shape[1:]
    axes = []
    for L, o in zip(lengths, outs):
        bounds = np.array(geometry.ADAPTIVE.windows(L, o))
        axes.append((bounds[:, 0], bounds[:, 1] - bounds[:, 0]))
    box = tuple(int(size.max()) for _, size in axes)
    windows = []
    for opos in np.ndindex(*outs):
        elems = []
        for offs in np.ndindex(*box):
            inside = all(k < size[p] for k, p, (_, size) in zip(offs, opos, axes))
            c = tuple(int(start[p]) + k for k, p, (start, _) in zip(offs, opos, axes))
            elems.append((0, (0,) + c) if inside else None)
        windows.append(elems)
    cell = spatial_cell(sp_)
    return ([(1,) + lengths], windows, (lambda e: cell(e[1][1:])), (lambda o: cell(o[1:])), {},
            y.shape)


def _docs_windows(op: "Op") -> str:
    return ("Each output is the max of one of PyTorch's adaptive windows: along an axis of "
            r"length $L$ with $n$ outputs, window $i$ covers $\left\lfloor i L / n \right\rfloor "
            r"\leq j < \left\lceil \left(i + 1\right) L / n \right\rceil$"
            ", so windows overlap and differ in size, and their size is known only at run time. "
            f"Elements are numbered in row-major (scan) order of the window; the rule is shown on "
            f"a representative window of {op.window_size()} elements and is the same for every "
            f"window size.")


ADAPTIVE = Kind(
    "adaptive", windows="spans", runtime_windows=True, overlaps=True, grad_orders=True,
    window_size=representative, describe=_describe, backward=window_backward,
    windows_doc="Windows: along an axis of length L with out outputs, window i covers [floor(i*L/out), "
                "ceil((i+1)*L/out)), as PyTorch's; L is known only at run time, so the rule below is "
                "derived on a representative window and holds for every window size.",
    representative_note=(
        "adaptive windows (start floor(i*L/out), end ceil((i+1)*L/out) per axis) overlap and "
        "differ in size, and depend on the input length known only at run time: the rule is "
        "derived on a representative window of {n} elements, whose weights "
        "have one factor per other element at any length, and is lowered to a running scan "
        "(first/last) or a mask of the elements attaining the extremum (split/all), valid for "
        "every window length"),
    conventions_family="adaptive_max_pool1d", docs_windows=_docs_windows, example=_example,
    windows_vary=True, axes=lambda params: geometry.ADAPTIVE)
