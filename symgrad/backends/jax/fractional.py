"""The jax backend's fractional max pooling (``lower.WindowKernel`` of windows "sampled"): the
template context of ``fractional.py.jinja``.

The windows are PyTorch's pseudo-random ones: each plane's window starts computed from its random
samples as the NumPy module computes them (alpha a NumPy constant from the static shape; each
floating-point operation of the samples rounded to the working dtype by lax.reduce_precision, so
XLA keeps no excess precision: no difference seen without it on the CPU), so they are arrays of the jaxpr.  Forward, backward and jvp are
adaptive pooling's (``adaptive.py``: the same fold, gather-form backward and jvp lines) over these
windows: one gather per window element, backward one pass per holding window (each input
element's m-th window along each axis, found by searchsorted in its plane's starts) in output
order, each window's weight rounded to the dtype first.  No scatter, no callback, no branch on
array values."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..common import python_geometry
from .adaptive import adaptive_context

if TYPE_CHECKING:
    from ...lower import Artifacts

_ROUNDING = ["weight = weight.astype(work)  # a window's gradient rounded to the dtype, then added"]


# PyTorch's indices from saved.index and the windows' starts, by integer arithmetic
_INDICES = ["", "", "def indices(saved: Saved) -> jax.Array:",
            '    """PyTorch\'s indices (return_indices=True): the flat position of each window\'s winner in its',
            "    (N, C) plane of the input, in JAX's default integer type (int64 under jax_enable_x64, else",
            '    int32)."""',
            "    plan = _check_saved(saved)",
            "    index = saved.index.reshape(plan.out_plane).astype(jnp.int_)",
            "    position = jnp.zeros(index.shape, jnp.int_)",
            "    step = 1  # element stride of a plane along the axis",
            "    for axis in reversed(range(SPATIAL)):",
            "        k = KERNEL_SIZE[axis]",
            "        index, offset = index // k, index % k",
            "        position = position + (_along(plan.starts[axis], axis).astype(jnp.int_) + offset) * step",
            "        step *= plan.planes[axis + 1]",
            "    return position.reshape(saved.output_shape)"]


def _scan(ctx: dict) -> None:
    """Adaptive pooling's scan-form lines with fractional pooling's Saved (the samples too)."""
    end = ctx["forward_end"]
    ctx["forward_end"] = [end[0], "saved = Saved(index.reshape(plan.out_shape), samples, tuple(x.shape), "
                                  "plan.out_shape, dtype)", *end[2:]]
    if ctx["indices_lines"]:
        ctx["indices_lines"] = _INDICES


def _mask(ctx: dict) -> None:
    """Adaptive pooling's mask-form lines with fractional pooling's Saved, and each window's weight
    rounded to the dtype before it is added (the NumPy module's add.at of rounded weights)."""
    step = [line for line in ctx["backward_step"] if not line.startswith("added")]
    at = step.index("grad = added if valid is None else jnp.where(valid, added, grad)")
    step[at:at + 1] = _ROUNDING + ["grad = jnp.where(valid, grad + weight, grad)"]
    ctx["backward_step"] = step
    ctx["forward_end"] = [ctx["forward_end"][0],
                          "return output, Saved(x, output, samples, tuple(x.shape), plan.out_shape, dtype)"]


def fractional_context(art: Artifacts) -> dict:
    """The template context of a fractional max pooling module: finished strings only."""
    op, kernel = art.op, art.kernel
    if kernel.grad_start != "+0" or kernel.grad_order != "output":
        raise ValueError(f"{op.name}: the jax backend has no gradient start {kernel.grad_start!r} "
                         f"in order {kernel.grad_order!r} for sampled windows")
    ctx = adaptive_context(art)
    scan = kernel.selection.form == "scan"
    (_scan if scan else _mask)(ctx)
    ctx["data_fields"] += ', "samples"'
    ctx["saved_fields"] = ctx["saved_fields"] + ["samples: jax.Array  # (N, C, SPATIAL) in the input's dtype"]
    return {**ctx, **python_geometry(kernel), "window": op.window_size(),
            "backward_adds": "the gradient (where it is the winner)" if scan else "its weight",
            "sample_of": repr(kernel.sample_of),
            "windows_doc": f"PyTorch's window starts along one axis, per plane: {kernel.sampling}."}
