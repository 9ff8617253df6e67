"""The torch backend's fractional max pooling (``lower.WindowKernel`` of windows "sampled"): the
template context of ``fractional.py.jinja``, printed as plain PyTorch code.

The windows are PyTorch's pseudo-random ones: each plane's window starts computed from its
random samples in the input's dtype, as the NumPy module computes them (``_starts``: the same
floating-point operations, here on tensors), so they stay on the inputs' device.  Forward is a
fold over the window's elements in row-major order, each one gather over all windows at once;
backward is in gather form, one pass per holding window (each input element's m-th window along
each axis, found by searchsorted in its plane's starts), in output (row-major) order, as the NumPy
module adds them.  No scatter, no atomics, no ``.item()``, no branch on a tensor's values."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..common import python_geometry
from ..printing import PYTHON, integer_code
from .adaptive import adaptive_context

if TYPE_CHECKING:
    from ...lower import WindowKernel

# the starts' arithmetic on tensors: the samples (one per plane) in the working dtype
_TENSORS = replace(PYTHON, real=lambda s: f"torch.tensor({s}, dtype=u.dtype, device=u.device)",
                   trunc=lambda s: f"({s}).to(torch.int64)")


def fractional_context(op, kernel: WindowKernel) -> dict:
    """The template context of a fractional max pooling module: finished strings only."""
    if kernel.grad_start != "+0" or kernel.grad_order != "output":
        raise ValueError(f"{op.name}: the torch backend has no gradient start {kernel.grad_start!r} "
                         f"in order {kernel.grad_order!r} for sampled windows")
    return {**adaptive_context(op, kernel),
            "window": op.window_size(),
            "wrt_tuple": repr(tuple(n for n in op.spec.inputs if n not in op.spec.constant_inputs)),
            "sample_of": repr(kernel.sample_of),
            "starts": {f: integer_code(getattr(kernel.axes, f), _TENSORS, {"u": "u[:, None]"})
                           for f in ("alpha", "start", "last_start")},
            "windows_doc": f"PyTorch's window starts along one axis, per plane: {kernel.sampling}.",
            **python_geometry(kernel)}
