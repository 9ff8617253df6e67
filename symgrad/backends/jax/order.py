"""The jax backend's order statistics (``lower.OrderKernel``: sort, topk, cummax, cummin,
kthvalue, median, nanmedian): the template context of ``order.py.jinja`` and the body the kernel
picks, printed as jax.numpy and lax code with the NumPy module's results bit for bit on the CPU.

Forward ranks each row by the NumPy module's total-order key (the float's bits as an integer of
its width: NaN above +inf, every NaN equal; -0 below +0 or equal to it) with jnp.argsort(stable=
True) (ties in index order; "last": the row reversed, positions mapped back), or, for the
cumulative ops, a running maximum of the key (lax.cummax).  Backward is in gather form from the
saved ranks or indices (a permutation's writes: each element written once; no scatter-add); the
tie blocks' sums are added in float64 in the NumPy module's order (a running sum along the ranks,
lax.scan), each result rounded once to the dtype (float16 from float64 by way of float32 rounded
to odd: XLA's own convert rounds twice); those float64 sums need jax_enable_x64 (without it the
module says so in one line).  An add into +0 is written as a select (XLA drops x + 0.0).  No host
callback, no branch on an array's values: forward, backward and jvp trace under jax.jit and vmap;
indices are JAX's default integer (int64 under jax_enable_x64, else int32)."""

from __future__ import annotations

from ...lower import OrderKernel
from ..host.order import OrderDialect
from ..host.order import order_context as _context
from .printer import jax_code

_NUMBERS = "jnp.sum(~jnp.isnan(v), axis=-1, keepdims=True, dtype=jnp.arange(0).dtype)"
JAX_ORDER = OrderDialect(
    templates="jax", code=jax_code,
    ranked={"first": "jnp.argsort(key, axis=-1, stable=True)",
            "last": "key.shape[-1] - 1 - jnp.argsort(jnp.flip(key, -1), axis=-1, stable=True)"},
    rising="rising = jnp.concatenate([jnp.ones(takes.shape[:-1] + (min(takes.shape[-1], 1),), bool), "
           "best[..., 1:] > best[..., :-1]], -1)",
    grad_values={"written": "g", "added": "_from_zero(g)", "negated": "jnp.where(g == 0, jnp.array(-0.0, g.dtype), g)"},
    grad_zeros={"written": "jnp.zeros", "added": "jnp.zeros", "negated": "-jnp.zeros"},
    numbers=f"numbers = {_NUMBERS}",
    rank_k="jnp.full(v.shape[:-1] + (1,), K - 1, jnp.arange(0).dtype)",
    middle_low="jnp.where(nan_row, numbers, (n - 1) // 2)", middle_high="jnp.where(nan_row, numbers, n // 2)",
    numbers_low="jnp.maximum(numbers - 1, 0) // 2",
    concat="jnp.concatenate([{a}, {b}], -1)",
    pair_value="(chosen[..., 0] + chosen[..., 1]) * jnp.array(0.5, v.dtype)",
    selected_nan="jnp.isnan(jnp.take_along_axis(_saved_rows(saved), picked[..., :1], axis=-1))",
    canonical="canonical = jnp.where(canonical == 0, jnp.zeros((), v.dtype), canonical)  # -0 as +0",
    nan_top="jnp.where(jnp.isnan(v), np.iinfo(_BITS[v.dtype.itemsize]).max, ~_key(v))",
    module="jnp", accumulate="lax.{f}(v, axis=last)",
    kept="lax.cummax({a}.astype(np.int8), axis=last) > 0", to_dtype="{a}.astype(v.dtype)",
    zero_where="{name} = jnp.where({cond}, jnp.zeros((), {name}.dtype), {name})")


def order_context(op, kernel: OrderKernel) -> dict:
    """What order.py.jinja and its body place (host.order, in jax.numpy and lax)."""
    return _context(op, kernel, JAX_ORDER)
