"""Max pooling: the extremum of one static window of kernel_size elements per output."""

from __future__ import annotations

import math

import numpy as np

from .. import geometry
from .base import Kind, describe_static, spatial_cell, window_backward


def _window_size(params: dict) -> int:
    return math.prod(params["kernel_size"])


def _pool_windows(op: "Op", in_spatial: tuple, out_spatial: tuple):
    k, s, p, dil = (op.params[n] for n in ("kernel_size", "stride", "padding", "dilation"))
    windows, pads = [], {}
    for o, opos in enumerate(np.ndindex(*out_spatial)):
        elems, pad = [], []
        for offs in np.ndindex(*k):
            c = tuple(op_ * st + j * d - pd for op_, st, j, d, pd in zip(opos, s, offs, dil, p))
            if all(0 <= ci < L for ci, L in zip(c, in_spatial)):
                elems.append((0, (0,) + c))
            else:
                elems.append(None)
                pad.append(c)
        windows.append(elems)
        pads[o] = pad
    return windows, pads


def _example(op: "Op", mod):
    sp_ = op.spec.spatial
    target = 3 if sp_ == 1 else 2
    L = 1
    while True:
        try:
            y, _ = mod.forward(np.zeros((1,) + (L,) * sp_))
            if min(y.shape[1:]) >= target and L >= 4 - (sp_ == 3) * 2:
                break
        except ValueError:
            pass
        L += 1
    in_sp, out_sp = (L,) * sp_, y.shape[1:]
    windows, pads = _pool_windows(op, in_sp, out_sp)
    cell = spatial_cell(sp_)
    return ([(1,) + in_sp], windows, (lambda e: cell(e[1][1:])), (lambda o: cell(o[1:])),
            {o: [cell(c) for c in cs] for o, cs in pads.items()}, y.shape)


def _docs_windows(op: "Op") -> str:
    k = op.params["kernel_size"]
    offs = list(np.ndindex(*k))
    shown = offs if len(offs) <= 9 else offs[:4] + [None] + offs[-1:]
    parts = []
    for o in shown:
        if o is None:
            parts.append(r"$\ldots$")
        else:
            at = ", ".join(map(str, o))
            parts.append(r"$x_{%d} \leftarrow \left(%s\right)$" % (offs.index(o), at))
    return (f"Each output is the max of one window of {len(offs)} input elements, numbered in "
            f"row-major (scan) order of the window by their offset in it: " + ", ".join(parts)
            + ". Padding never wins.")


def _overlaps(params: dict) -> bool:
    """Whether two windows can hold one element: along some axis a window spans more than the
    stride ((kernel_size - 1) * dilation + 1 > stride)."""
    return any((k - 1) * d + 1 > s for k, s, d in
               zip(params["kernel_size"], params["stride"], params["dilation"]))


POOL = Kind("pool", windows="strided", overlaps=_overlaps, window_size=_window_size, static=True,
            window_param="kernel_size",
            preset_padding=True, describe=describe_static, backward=window_backward,
            conventions_family="max_pool1d", docs_windows=_docs_windows, example=_example,
            docs_apart="these windows do not overlap (stride >= kernel size), so each input is in "
                       "at most one window",
            axes=lambda params: geometry.pool(bool(params["ceil_mode"])))
