"""Reductions (amax, amin): the extremum of the elements along some dims; the window length is
known only at run time, so the rule is derived on a representative window."""

from __future__ import annotations

import numpy as np

from .base import Kind, representative, window_backward


def _settings(name: str, ties: str, nan: str) -> None:
    if ties in ("first", "last") and nan not in ("dominate", "skip"):  # (skip: nanmax/nanmin's own)
        raise ValueError(f"{name}: with ties={ties!r} a reduction follows NaN rule 'dominate' "
                         f"(NumPy's argmax/argmin): nan must be 'dominate', not {nan!r}")


def _describe(op: "Op", listed: int) -> list[str]:
    return [f"window: a representative slice of {op.window_size()} elements "
            f"(the rule is the same for every length)"]


def _example(op: "Op", mod):
    shape = (2, 4) if op.params["dim"] is not None else (2, 2)
    y, _ = mod.forward(np.zeros(shape))
    axes = [a % 2 for a in op.params["dim"]] if op.params["dim"] is not None else [0, 1]
    keep = [a for a in range(2) if a not in axes]
    windows = []
    for opos in np.ndindex(*[shape[a] for a in keep]):
        fixed = dict(zip(keep, opos))
        elems = []
        for rpos in np.ndindex(*[shape[a] for a in axes]):
            idx = dict(fixed)
            idx.update(zip(axes, rpos))
            elems.append((0, tuple(idx[a] for a in range(2))))
        windows.append(elems)
    out_shape = y.shape

    def out_cell(o, keep=keep):
        o = tuple(o)
        r = o[0] if (keep == [0] and o) else 0
        return (0, r, 0)
    return [shape], windows, (lambda e: (0,) + tuple(e[1])), out_cell, {}, out_shape


def _docs_windows(op: "Op") -> str:
    return (f"Each output is the {op.spec.extremum} of the elements along the reduced dims, numbered "
            f"in row-major order (shown on a window of {op.window_size()}; the rule is the same for "
            f"every length).")


REDUCTION = Kind("reduction", windows="rows", tangent_sums=True, window_size=representative, settings=_settings,
                 describe=_describe,
                 backward=window_backward, docs_windows=_docs_windows, example=_example,
                 first_zero=True)
