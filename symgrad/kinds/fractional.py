"""Fractional max pooling: static windows of kernel_size elements whose starts, per (N, C) plane,
follow PyTorch's pseudo-random sequence from the random_samples input."""

from __future__ import annotations

import numpy as np

from .. import geometry
from .base import Kind, describe_static, spatial_cell, window_backward
from .pool import _window_size

FRACTIONAL_WINDOWS = (
    "per (N, C) plane and axis, window i starts at int((i + u) * alpha) - int(u * alpha), alpha = "
    "(in - k) / (out - 1), computed in the input's dtype from that plane's sample u, the last at "
    "in - k (PyTorch's sequence); windows may overlap")
# which of a plane's random samples drives each spatial axis (PyTorch's kernels: 2-d reads the
# width's sample first, 3-d reads them in axis order)
FRACTIONAL_SAMPLE_OF = {2: (1, 0), 3: (0, 1, 2)}
EXAMPLE_SAMPLE = 0.5  # fractional pooling's worked example: every plane's sample, along every axis


def _describe(op: "Op", listed: int) -> list[str]:
    return describe_static(op, listed) + [f"windows: {FRACTIONAL_WINDOWS}"]


class FixedSamples:
    """A fractional pooling module with its random samples fixed (EXAMPLE_SAMPLE): the worked
    example's windows and gradients are then those of a one-input window op."""

    def __init__(self, mod):
        self.mod = mod

    def samples(self, x):
        batched = x.shape if x.ndim == self.mod.SPATIAL + 2 else (1,) + x.shape
        return np.full(batched[:2] + (self.mod.SPATIAL,), EXAMPLE_SAMPLE, dtype=x.dtype)

    def forward(self, x):
        return self.mod.forward(x, self.samples(x))

    def backward(self, g, saved):
        return self.mod.backward(g, saved)[:1]


def _example(op: "Op", mod):
    """Fractional pooling, with every sample EXAMPLE_SAMPLE: the smallest input (from 4 elements
    along each axis) with at least two outputs along each axis; its windows read off the module's
    own starts."""
    sp_ = op.spec.spatial
    L = 4
    while True:
        try:
            y, saved = mod.forward(np.zeros((1,) + (L,) * sp_))
            if min(y.shape[1:]) >= 2:
                break
        except ValueError:
            pass
        L += 1
    starts = [s[0] for s in mod.mod._windows((1, 1) + (L,) * sp_, (1, 1) + y.shape[1:], saved.samples)]
    windows = []
    for opos in np.ndindex(*y.shape[1:]):
        windows.append([(0, (0,) + tuple(int(starts[a][p]) + k for a, (p, k) in enumerate(zip(opos, offs))))
                        for offs in np.ndindex(*op.params["kernel_size"])])
    cell = spatial_cell(sp_)
    return ([(1,) + (L,) * sp_], windows, (lambda e: cell(e[1][1:])), (lambda o: cell(o[1:])), {},
            y.shape)


def _docs_windows(op: "Op") -> str:
    return (f"Each output is the {op.spec.extremum} of one window of {op.window_size()} input "
            f"elements (kernel_size {op.params['kernel_size']}), numbered in row-major (scan) "
            f"order of the window. Windows start at PyTorch's pseudo-random positions: "
            f"{FRACTIONAL_WINDOWS}. The worked example takes every sample u = {EXAMPLE_SAMPLE}; "
            f"random_samples get no gradient.")


# fractional pooling's presets are adaptive pooling's (torch: first, last NaN; jax: split, nan)
FRACTIONAL = Kind("fractional", windows="sampled", runtime_windows=True,
                  overlaps=True, plane_inputs=("samples",), sampling=FRACTIONAL_WINDOWS,
                  sample_of=FRACTIONAL_SAMPLE_OF.__getitem__,
                  window_size=_window_size, static=True, window_param="kernel_size",
                  describe=_describe, backward=window_backward,
                  windows_doc=f"Windows: {FRACTIONAL_WINDOWS}.",
                  conventions_family="adaptive_max_pool1d", docs_windows=_docs_windows,
                  example=_example, example_module=FixedSamples,
                  axes=lambda params: geometry.FRACTIONAL)
