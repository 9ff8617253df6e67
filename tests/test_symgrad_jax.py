"""symgrad.jax: JAX functions with custom_jvp, reverse mode by transposition, jit, vmap and
grad-of-grad.

Oracles: JAX's own ops under convention="jax" (forward, grad and grad-of-grad under jit, float64,
tie-heavy inputs with NaN, +-inf and +-0), a Python loop for vmap, finite differences off ties.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

if os.environ.get("CI"):
    import jax
else:
    jax = pytest.importorskip("jax", reason="JAX is not installed (pip install jax jaxlib)")

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import symgrad  # noqa: E402
import symgrad.jax as sj  # noqa: E402
from conftest import tie_free, tie_heavy  # noqa: E402

SPECIALS = [-np.inf, -6.0, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 6.0, 7.0, np.inf, np.nan]


def _pool(k, s, pads):
    def f(v):
        lead = v.ndim - len(k)
        return lax.reduce_window(v, -jnp.inf, lax.max, (1,) * lead + k, (1,) * lead + s,
                                 [(0, 0)] * lead + pads)
    return f


def _adaptive(shape, out):
    """PyTorch's adaptive windows, each reduced by jnp.max (JAX has no adaptive max pooling)."""
    bounds = [[((i * n) // o, -(-((i + 1) * n) // o)) for i in range(o)] for n, o in zip(shape, out)]

    def f(x):
        return jnp.stack([jnp.stack([jnp.max(x[..., h0:h1, w0:w1], axis=(-2, -1)) for w0, w1 in bounds[1]], -1)
                          for h0, h1 in bounds[0]], -2)
    return f


# Results whose sign of zero differs from JAX's, as issue 15 lists them (compared with +0 == -0):
# JAX's relu/relu6/abs of -0.0, maximum/minimum (and clip) of +-0, amax([0., -0.]) and JAX's max
# pooling forward over +-0, JAX's gradients where g * 0 is -0.0 (the first-order gradient and its
# derivative with respect to g, W v).
_MINMAX_ZEROS = {"y", "grad0", "grad1", "d_g"}
_REDUCE_ZEROS = {"y", "grad0"}

# (id, op, params, JAX function, input shapes, values, reference, results with issue 15's signed
# zeros).  reference: "jit" (JAX's own op under jit), or "eager" for jnp.max / jnp.min, whose VJP
# XLA changes under jit (the NaN, 0/0, of a slice holding NaN becomes 0); the preset follows the
# eager VJP.
CASES = [
    ("relu", "relu", {}, jax.nn.relu, [(40,)], "specials", "jit", {"y"}),
    ("relu6", "relu6", {}, jax.nn.relu6, [(40,)], "specials", "jit", {"y"}),
    ("leaky_relu", "leaky_relu", {}, jax.nn.leaky_relu, [(40,)], "specials", "jit", set()),
    ("leaky_relu-0.5", "leaky_relu", {"negative_slope": 0.5}, lambda x: jax.nn.leaky_relu(x, 0.5), [(40,)],
     "specials", "jit", set()),
    ("leaky_relu-neg", "leaky_relu", {"negative_slope": -0.5}, lambda x: jax.nn.leaky_relu(x, -0.5), [(40,)],
     "specials", "jit", set()),
    ("leaky_relu-2", "leaky_relu", {"negative_slope": 2.0}, lambda x: jax.nn.leaky_relu(x, 2.0), [(40,)],
     "specials", "jit", set()),
    ("hardtanh", "hardtanh", {}, jax.nn.hard_tanh, [(40,)], "specials", "jit", set()),
    ("clamp", "clamp", {"min": -1.0, "max": 2.0}, lambda x: jnp.clip(x, -1.0, 2.0), [(40,)], "specials", "jit",
     _MINMAX_ZEROS),
    ("clamp-min", "clamp", {"min": 0.0}, lambda x: jnp.clip(x, 0.0, None), [(40,)], "specials", "jit", _MINMAX_ZEROS),
    ("clamp-max", "clamp", {"max": 0.0}, lambda x: jnp.clip(x, None, 0.0), [(40,)], "specials", "jit", _MINMAX_ZEROS),
    ("abs", "abs", {}, jnp.abs, [(40,)], "specials", "jit", {"y"}),
    ("maximum", "maximum", {}, jnp.maximum, [(6, 5), (6, 5)], "specials", "jit", _MINMAX_ZEROS),
    ("maximum-broadcast", "maximum", {}, jnp.maximum, [(1, 5), (6, 1)], "specials", "jit", _MINMAX_ZEROS),
    ("minimum-broadcast", "minimum", {}, jnp.minimum, [(6, 5), (5,)], "specials", "jit", _MINMAX_ZEROS),
    ("amax", "amax", {"dim": 1}, lambda x: jnp.max(x, axis=1), [(3, 4, 2)], "ints", "eager", _REDUCE_ZEROS),
    ("amax-dims-keepdim", "amax", {"dim": (0, 2), "keepdim": True},
     lambda x: jnp.max(x, axis=(0, 2), keepdims=True), [(3, 4, 2)], "ints", "eager", _REDUCE_ZEROS),
    ("amax-all", "amax", {}, jnp.max, [(3, 4)], "ints", "eager", _REDUCE_ZEROS),
    ("amin", "amin", {"dim": -1}, lambda x: jnp.min(x, axis=-1), [(3, 5)], "ints", "eager", _REDUCE_ZEROS),
    ("max_pool1d", "max_pool1d", {"kernel_size": 2}, _pool((2,), (2,), [(0, 0)]), [(2, 3, 8)], "ints", "jit", {"y"}),
    ("max_pool1d-padded", "max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1},
     _pool((3,), (2,), [(1, 1)]), [(2, 3, 9)], "ints", "jit", {"y"}),
    ("max_pool2d", "max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1},
     _pool((3, 3), (2, 2), [(1, 1), (1, 1)]), [(2, 2, 7, 7)], "ints", "jit", {"y"}),
    ("max_pool2d-unbatched", "max_pool2d", {"kernel_size": 2, "stride": 1},
     _pool((2, 2), (1, 1), [(0, 0), (0, 0)]), [(3, 5, 5)], "ints", "jit", {"y"}),
    ("max_pool3d", "max_pool3d", {"kernel_size": 2}, _pool((2, 2, 2), (2, 2, 2), [(0, 0)] * 3), [(1, 2, 4, 4, 4)],
     "ints", "jit", {"y"}),
    ("adaptive_max_pool2d", "adaptive_max_pool2d", {"output_size": (3, 4)}, _adaptive((7, 5), (3, 4)),
     [(2, 2, 7, 5)], "ints", "eager", _REDUCE_ZEROS),
    ("maxout", "maxout", {"pieces": 2}, lambda x: jnp.max(x.reshape(2, 3, 2, 3), axis=2), [(2, 6, 3)], "ints",
     "eager", _REDUCE_ZEROS),
]


def _values(rng, shape, kind):
    if kind == "ints":
        x = tie_heavy(rng, shape)
        where = rng.random(shape) < 0.15
        x[where] = rng.choice([np.nan, np.inf, -np.inf, -0.0], size=int(where.sum()))
        return x
    return rng.choice(SPECIALS, size=shape)


def _grads(rng, shape):
    """Multiples of 12: a split among up to 4 tied elements is exact, in any order of sums."""
    return rng.integers(-3, 4, size=shape).astype(np.float64) * 12


def _labels(n):
    """Names of _results' entries for n inputs."""
    return ["y", *(f"grad{k}" for k in range(n)), "d_g", *(f"d{k}" for k in range(n))]


def _results(fn, xs, g, v, jit=True):
    """Forward, grad, and the grad of <grad, v> with respect to g (W v) and the inputs."""
    xs = tuple(jnp.asarray(x) for x in xs)
    compile = jax.jit if jit else (lambda f: f)  # noqa: E731

    def grads(xs, g):
        return jax.vjp(fn, *xs)[1](g)

    def inner(xs, g):
        return sum((gr * vi).sum() for gr, vi in zip(grads(xs, g), v))

    y = compile(fn)(*xs)
    first = compile(grads)(xs, jnp.asarray(g))
    d_xs, d_g = compile(jax.grad(inner, argnums=(0, 1)))(xs, jnp.asarray(g))
    return [np.asarray(a) for a in (y, *first, d_g, *d_xs)]


def _transpose_of_first_order(jax_fn, x, v):
    """W v built from JAX's own first-order VJP, W^T: (W v)_j = <VJP(e_j), v>."""
    y, pullback = jax.vjp(jax_fn, jnp.asarray(x))
    eye = jnp.eye(y.size, dtype=y.dtype).reshape((y.size,) + y.shape)
    rows = np.asarray(jax.vmap(lambda e: pullback(e)[0])(eye))
    return np.tensordot(rows, v, axes=v.ndim).reshape(y.shape)


def _signed_zeros(a, b) -> int:
    """How many entries are zeros of opposite signs."""
    return int(((a == 0) & (b == 0) & (np.signbit(a) != np.signbit(b))).sum())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_jax_convention_equals_jax(case):
    """Ours under jit equals JAX's op bit for bit (NaN == NaN), forward, grad and grad-of-grad; a
    sign of zero may differ only where issue 15 lists it."""
    _, name, params, jax_fn, shapes, kind, reference, signed_zeros = case
    rng = np.random.default_rng(0)
    ours = sj.op(name, convention="jax", **params)
    for _ in range(3):
        xs = [_values(rng, s, kind) for s in shapes]
        y = np.asarray(jax_fn(*xs))
        g = _grads(rng, y.shape)
        v = [_grads(rng, x.shape) for x in xs]
        want = _results(jax_fn, xs, g, v, jit=reference == "jit")
        got = _results(ours, xs, g, v)
        if name.startswith("max_pool"):
            # JAX contradicts itself here: its grad-of-grad (select_and_gather_add) is not the
            # transpose of its own VJP (select_and_scatter_add) in some windows holding NaN (NaN
            # then padding); there the oracle is that transpose, which the generated jvp is by
            # contract
            d_g = _labels(1).index("d_g")
            transposed = _transpose_of_first_order(jax_fn, xs[0], v[0])
            contradicted = ~((want[d_g] == transposed) | (np.isnan(want[d_g]) & np.isnan(transposed)))
            holds_nan = np.asarray(jax_fn(np.isnan(xs[0]).astype(np.float64))) > 0
            assert not (contradicted & ~holds_nan).any()
            want[d_g] = np.where(contradicted, transposed, want[d_g])
        for label, a, b in zip(_labels(len(xs)), got, want):
            assert a.shape == b.shape, (label, a.shape, b.shape)
            np.testing.assert_array_equal(a, b, err_msg=f"{name}: {label}")  # NaN == NaN, 0.0 == -0.0
            assert label in signed_zeros or _signed_zeros(a, b) == 0, f"{name}: {label}: sign of zero"


@pytest.mark.parametrize("jax_lse", [jax.nn.logsumexp, jax.scipy.special.logsumexp],
                         ids=["jax.nn", "jax.scipy.special"])
def test_logsumexp_first_order_and_no_higher(jax_lse):
    """Forward and grad as JAX's, NaN and +-inf where JAX has them, within 8 ulps (NumPy's and XLA's
    exp and log round differently, so not bit for bit); grad-of-grad is refused."""
    rng = np.random.default_rng(1)
    ours = jax.jit(sj.op("logsumexp", convention="jax", dim=-1))
    grad = jax.jit(jax.grad(lambda z: (ours(z) * jnp.arange(1.0, 5.0)).sum()))
    for _ in range(4):
        x = jnp.asarray(_values(rng, (4, 5), "ints"))
        want_y = jax_lse(x, axis=-1)
        want_g = jax.grad(lambda z: (jax_lse(z, axis=-1) * jnp.arange(1.0, 5.0)).sum())(x)
        for got, want in ((ours(x), want_y), (grad(x), want_g)):
            got, want = np.asarray(got), np.asarray(want)
            np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
            np.testing.assert_array_equal(got[~np.isfinite(got)], want[~np.isfinite(want)])
            finite = np.isfinite(want)
            assert (np.abs(got[finite] - want[finite]) <= 8 * np.spacing(np.abs(want[finite]))).all()
    with pytest.raises(NotImplementedError, match="beyond the first are supported for piecewise-linear"):
        jax.grad(lambda z: jax.grad(lambda w: ours(w).sum())(z).sum())(x)
    with pytest.raises(NotImplementedError, match="beyond the first"):
        jax.hessian(lambda z: sj.expr("exp(x) + Max(x, 0)", inputs=["x"])(z).sum())(jnp.ones(3))


def test_vmap_equals_a_loop():
    """vmap of the op, its grad, its jvp and its grad-of-grad, and grad of a vmap, equal a loop."""
    rng = np.random.default_rng(2)
    f = sj.op("max_pool2d", kernel_size=2, ties="split")
    xs = jnp.asarray(tie_heavy(rng, (4, 2, 6, 6)))
    w = jnp.asarray(rng.standard_normal((2, 3, 3)))

    def loss(x):
        return (f(x) ** 2 * w).sum()
    gg = jax.grad(lambda x: (jax.grad(loss)(x) ** 2).sum())
    np.testing.assert_array_equal(jax.vmap(f)(xs), np.stack([f(x) for x in xs]))
    np.testing.assert_array_equal(jax.jit(jax.vmap(jax.grad(loss)))(xs), np.stack([jax.grad(loss)(x) for x in xs]))
    np.testing.assert_array_equal(jax.jit(jax.vmap(gg))(xs), np.stack([gg(x) for x in xs]))
    np.testing.assert_array_equal(jax.grad(lambda x: jax.vmap(loss)(x).sum())(xs),
                                  np.stack([jax.grad(loss)(x) for x in xs]))
    tangents = jnp.asarray(rng.standard_normal(xs.shape))
    got = jax.vmap(lambda x, t: jax.jvp(f, (x,), (t,))[1])(xs, tangents)
    np.testing.assert_array_equal(got, np.stack([jax.jvp(f, (x,), (t,))[1] for x, t in zip(xs, tangents)]))
    # one input batched, the other not
    m = sj.op("maximum", ties="split")
    a, b = xs[:, 0, 0], xs[0, 1, 0]
    grads = jax.vmap(jax.grad(lambda u, v: (m(u, v) * w[0, 0, 0]).sum(), argnums=(0, 1)), in_axes=(0, None))(a, b)
    loop = [jax.grad(lambda u, v: (m(u, v) * w[0, 0, 0]).sum(), argnums=(0, 1))(u, b) for u in a]
    for k in range(2):
        np.testing.assert_array_equal(grads[k], np.stack([gr[k] for gr in loop]))


def test_jit_retraces_for_a_new_shape():
    """The callbacks' result shapes follow the input shapes: one jitted function, two shapes."""
    f = sj.op("max_pool2d", kernel_size=3, stride=2, padding=1, ties="split")
    fn, grad = jax.jit(f), jax.jit(jax.grad(lambda x: (f(x) ** 2).sum()))
    for shape in [(1, 1, 4, 4), (2, 3, 7, 9)]:
        x = jnp.asarray(np.arange(np.prod(shape), dtype=np.float64).reshape(shape) % 5)
        np.testing.assert_array_equal(fn(x), _pool((3, 3), (2, 2), [(1, 1), (1, 1)])(x))
        np.testing.assert_array_equal(grad(x), jax.grad(lambda z: (f(z) ** 2).sum())(x))
        assert grad(x).shape == shape


def test_jvp_and_grad_match_finite_differences_off_ties():
    rng = np.random.default_rng(3)
    f = sj.expr("Max(x, 2*y, 0) - Min(x, y)", inputs=["x", "y"])
    x, y = (jnp.asarray(tie_free(rng, (4, 5), gap=0.1) + 0.03 * k) for k in range(2))
    tx, ty = (jnp.asarray(rng.standard_normal((4, 5))) for _ in range(2))
    eps = 1e-6
    fd = (f(x + eps * tx, y + eps * ty) - f(x - eps * tx, y - eps * ty)) / (2 * eps)
    np.testing.assert_allclose(jax.jvp(f, (x, y), (tx, ty))[1], fd, rtol=1e-6, atol=1e-6)
    gx, gy = jax.grad(lambda a, b: f(a, b).sum(), argnums=(0, 1))(x, y)
    np.testing.assert_allclose((gx * tx).sum() + (gy * ty).sum(), fd.sum(), rtol=1e-6)


def test_jvp_and_grad_of_catalog_ops_match_finite_differences_off_ties():
    rng = np.random.default_rng(4)
    x = jnp.asarray(tie_free(rng, (2, 3, 7, 7), gap=0.01))
    t = jnp.asarray(rng.standard_normal(x.shape))
    for f in (sj.op("max_pool2d", kernel_size=3, stride=2, padding=1), sj.op("logsumexp", dim=(2, 3)),
              sj.op("adaptive_max_pool2d", output_size=(3, 2), ties="split")):
        eps = 1e-6
        fd = (f(x + eps * t) - f(x - eps * t)) / (2 * eps)
        np.testing.assert_allclose(jax.jvp(f, (x,), (t,))[1], fd, rtol=1e-6, atol=1e-7)
        g = jnp.asarray(rng.standard_normal(fd.shape))
        np.testing.assert_allclose((jax.grad(lambda z: (f(z) * g).sum())(x) * t).sum(), (fd * g).sum(), rtol=1e-6)


def test_unpool_equals_scatter_with_set():
    """JAX has no max_unpool: the preset is zeros.at[indices].set(input) (distinct indices here)."""
    f = sj.op("max_unpool2d", convention="jax", kernel_size=2)
    rng = np.random.default_rng(5)
    p = jnp.asarray(rng.standard_normal((2, 3, 2, 2)))
    idx = jnp.asarray(np.stack([rng.choice(16, size=4, replace=False) for _ in range(6)]).reshape(2, 3, 2, 2))

    def scatter(q):
        flat = jnp.zeros((6, 16)).at[jnp.arange(6)[:, None], idx.reshape(6, 4)].set(q.reshape(6, 4))
        return flat.reshape(2, 3, 4, 4)
    g = jnp.asarray(rng.standard_normal((2, 3, 4, 4)))
    np.testing.assert_array_equal(jax.jit(f)(p, idx), scatter(p))
    ours = jax.jit(jax.grad(lambda q: (f(q, idx) * g).sum()))(p)
    np.testing.assert_array_equal(ours, jax.grad(lambda q: (scatter(q) * g).sum())(p))

    def grad_of_grad(fn):
        return jax.grad(lambda q: (jax.grad(lambda r: (fn(r) ** 2).sum())(q) * g[..., :2, :2]).sum())(p)
    np.testing.assert_array_equal(grad_of_grad(lambda r: f(r, idx)), grad_of_grad(scatter))


@pytest.mark.parametrize("d", [1, 2, 3])
def test_unpool_duplicate_indices_credit_the_last_writer_as_jax(d):
    """zeros.at[indices].set(input) with duplicate indices: the last write in row-major order stays
    and JAX's scatter JVP credits only that writer (the others get 0), in the generated module's
    forward, backward and jvp under convention="jax" and through symgrad.jax."""
    import symgrad
    rng = np.random.default_rng(11 + d)
    k = (2,) * d
    n, c, length = 2, 3, 6
    # input (n, c, length, 1, ...); output (n, c, length + 1, 2, ...) (kernel 2, stride 1); every
    # element writes to slot 0 or 1 of its plane: many duplicates per slot
    p = rng.standard_normal((n, c, length) + (1,) * (d - 1))
    idx = rng.integers(0, 2, size=p.shape)
    out = (n, c, length + 1) + (2,) * (d - 1)
    params = dict(kernel_size=k, stride=1)
    m = symgrad.load(f"max_unpool{d}d", convention="jax", **params)
    assert m.TIES == "last"
    # row-major order of the flat (N, C) planes: JAX scatters the updates in that order
    width = int(np.prod(out[2:]))

    def scatter(q):
        flat = jnp.zeros((n * c, width), q.dtype).at[
            jnp.arange(n * c)[:, None], jnp.asarray(idx).reshape(n * c, -1)].set(q.reshape(n * c, -1))
        return flat.reshape(out)
    g = rng.standard_normal(out)
    t = rng.standard_normal(p.shape)
    want_y, vjp = jax.vjp(scatter, jnp.asarray(p))
    (want_g,) = vjp(jnp.asarray(g))
    y, saved = m.forward(p, idx)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(m.backward(g, saved)[0], want_g)
    np.testing.assert_array_equal(m.jvp(t, None, saved),
                                  jax.jvp(scatter, (jnp.asarray(p),), (jnp.asarray(t),))[1])
    f = sj.op(f"max_unpool{d}d", convention="jax", **params)
    np.testing.assert_array_equal(jax.grad(lambda q: (f(q, jnp.asarray(idx)) * g).sum())(jnp.asarray(p)),
                                  want_g)
    assert np.count_nonzero(np.asarray(want_g) == 0) > 0  # some writer was overwritten


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.float32])
def test_float16_and_float32_keep_their_dtype_and_equal_jax(dtype):
    f = sj.op("max_pool2d", kernel_size=2, convention="jax")
    rng = np.random.default_rng(6)
    x = jnp.asarray(tie_heavy(rng, (2, 2, 4, 4)), dtype=dtype)
    g = jnp.asarray(rng.integers(-3, 4, size=(2, 2, 2, 2)), dtype=dtype)
    ref = _pool((2, 2), (2, 2), [(0, 0), (0, 0)])

    def results(fn):
        """Forward, grad, jvp and grad-of-grad."""
        return [fn(x), jax.grad(lambda z: (fn(z) * g).sum())(x), jax.jvp(fn, (x,), (x,))[1],
                jax.grad(lambda z: (jax.grad(lambda w: (fn(w) ** 2 * g).sum())(z) * x).sum())(x)]
    for got, want in zip(results(jax.jit(f)), results(ref)):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)


def test_without_x64():
    """JAX's default (no x64): 64-bit saved indices travel as int32 and come back as int64."""
    code = """if True:
        import jax, jax.numpy as jnp, numpy as np, symgrad.jax as sj
        up, pool = sj.op("max_unpool1d", kernel_size=2), sj.op("max_pool1d", kernel_size=2)
        x = jnp.asarray([[3.0, 1.0, 2.0, 2.0]])
        assert jax.jit(jax.grad(lambda z: (pool(z) * jnp.asarray([[1.0, 2.0]])).sum()))(x).tolist() == [[1, 0, 2, 0]]
        idx = jnp.asarray([[0, 3]])
        assert up(x[:, :2], idx).dtype == jnp.float32
        assert jax.grad(lambda q: (up(q, idx) * jnp.arange(4.0)).sum())(x[:, :2]).tolist() == [[0, 3]]
        print("ok")
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_errors():
    f = sj.op("relu")
    with pytest.raises(TypeError, match="x must be a float16, bfloat16, float32 or float64 array, got int32"):
        f(jnp.ones(3, dtype=jnp.int32))
    with pytest.raises(TypeError, match=r"expected 1 array\(s\) \(x\), got 2"):
        f(jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match="kernel_size"):
        sj.op("max_pool2d", kernel_size=0)
    with pytest.raises(TypeError, match="expected a generated NumPy module"):
        sj.wrap(object())


def test_misspelled_names_get_did_you_mean():
    """symgrad.jax.op: the CLI's suggestion for a misspelled op name or keyword, in one line."""
    for call, kind, right in [(lambda: sj.op("max_pool2d", kernel_size=2, tie="split"), TypeError, "ties"),
                              (lambda: sj.op("max_pool2d", kernel_size=2, paddin=1), TypeError, "padding"),
                              (lambda: sj.op("relu", convension="jax"), TypeError, "convention"),
                              (lambda: sj.op("rleu"), ValueError, "relu")]:
        with pytest.raises(kind) as err:
            call()
        assert "\n" not in str(err.value) and f"did you mean {right!r}?" in str(err.value), err.value


def test_out_of_range_unpooling_indices(caplog):
    """Eagerly (and eager grad): the module's one-line ValueError itself (JAX may append its note
    on filtered frames), with no callback traceback logged; under jit the values are not known
    while tracing and the native module reads none (symgrad.jax's docstring says so): the call
    runs, its result unspecified."""
    f = sj.op("max_unpool2d", kernel_size=2)
    x = jnp.ones((1, 1, 2, 2))
    want = r"^max_unpool2d: indices must be in \[0, 16\) .*, got {}$"
    for bad in (99, -1):
        i = jnp.array([[[[0, 1], [bad, 3]]]])
        caplog.clear()
        with caplog.at_level("DEBUG"):
            with pytest.raises(ValueError) as err:
                f(x, i)
            assert re.match(want.format(bad), str(err.value).splitlines()[0])
            with pytest.raises(ValueError) as err:  # jax.grad appends its note on filtered frames
                jax.grad(lambda x: f(x, i).sum())(x)
            assert re.match(want.format(bad), str(err.value).splitlines()[0])
        assert "pure_callback failed" not in caplog.text
        assert jax.block_until_ready(jax.jit(f)(x, i)).shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(f(x, jnp.array([[[[0, 1], [4, 3]]]]))[0, 0, :2],  # valid ones still run
                                  [[1, 1, 0, 1], [1, 0, 0, 0]])


def test_a_missing_jax_is_explained():
    code = ("import sys; import symgrad; assert 'jax' not in sys.modules; sys.modules['jax'] = None\n"
            "try:\n    import symgrad.jax\nexcept ModuleNotFoundError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 'pip install ".[jax]" from symgrad\'s checkout' in out.stdout


def test_grad_with_respect_to_one_input_of_two():
    """A constant input has no tangent: only the differentiated inputs are linear arguments."""
    f = sj.op("maximum", ties="split")
    a, b = jnp.asarray([1.0, 2.0, 3.0]), jnp.asarray([2.0, 2.0, 2.0])
    np.testing.assert_array_equal(jax.grad(lambda u: f(u, b).sum())(a), [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(jax.jit(jax.grad(lambda v: f(a, v).sum()))(b), [1.0, 0.5, 0.0])
    np.testing.assert_array_equal(jax.jvp(lambda v: f(a, v), (b,), (jnp.ones(3),))[1], [1.0, 0.5, 0.0])
    # grad-of-grad with the other input constant: d/du of 2 f(u, b) w(u) with the split weight w
    # (0, 1/2, 1) constant almost everywhere is 2 w^2
    np.testing.assert_array_equal(jax.grad(lambda u: jax.grad(lambda w: (f(w, b) ** 2).sum())(u).sum())(a),
                                  [0.0, 0.5, 2.0])


def test_an_input_outside_wrt_is_refused_when_differentiated():
    f = sj.expr("Max(x, 2*y)", inputs=["x", "y"], wrt=["x"])
    x, y = jnp.asarray([1.0, 3.0]), jnp.asarray([1.0, 1.0])
    np.testing.assert_array_equal(jax.grad(lambda u: f(u, y).sum())(x), [0.0, 1.0])
    with pytest.raises(ValueError, match=r"y is not differentiated \(wrt=\['x'\]\)"):
        jax.grad(lambda v: f(x, v).sum())(y)


# ----------------------------------------------------------------------------- the cpu backend for float arrays

def _compiler() -> bool:
    import shutil
    return any(shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang")))


@pytest.mark.skipif(not _compiler(), reason="no C compiler: the cpu backend is not available")
@pytest.mark.parametrize("ties", ["first", "split"])
def test_ops_run_through_the_cpu_backend_with_the_numpy_modules_bits(monkeypatch, ties):
    """SYMGRAD_CPU_BACKEND=cpu (and auto, the default, with a compiler) runs float arrays through
    the cpu backend's kernels, =numpy through the NumPy module: the same output, grad (reverse
    mode: backward) and jvp (forward mode) bit for bit, float32 and float64, under jit; float16
    stays with the NumPy module.  (max pooling takes the native path in symgrad.jax.op: its
    callback path, which every op can take, is symgrad.jax._callback_op.)"""
    settings = {"ties": ties, "kernel_size": 3, "stride": 2, "padding": 1}
    calls = []
    rng = np.random.default_rng(6)
    x0 = rng.integers(0, 3, size=(2, 3, 9, 8)).astype(np.float64)
    w = rng.standard_normal((2, 3, 5, 4))
    t0 = rng.standard_normal(x0.shape)
    results = {}
    for choice in ("numpy", "cpu", "auto"):
        monkeypatch.setenv("SYMGRAD_CPU_BACKEND", choice)
        f = sj._callback_op("max_pool2d", **settings)
        # auto: the cpu backend where its saved state has the NumPy module's fields (not split's counts)
        on_cpu = choice == "cpu" or (choice == "auto" and ties == "first")
        assert hasattr(f, "cpu_op") == on_cpu
        if on_cpu:  # the cpu backend's module, its kernel calls counted
            real = f.cpu_op.module._call

            def counted(role, *args, real=real):
                calls.append(role)
                return real(role, *args)
            monkeypatch.setattr(f.cpu_op.module, "_call", counted)
        for dtype in (jnp.float32, jnp.float64, jnp.float16):
            x, t = jnp.asarray(x0, dtype), jnp.asarray(t0, dtype)
            y = jax.jit(f)(x)
            gx = jax.grad(lambda v: jnp.sum(f(v).astype(jnp.float64) * w))(x)
            _, ty = jax.jvp(f, (x,), (t,))
            results.setdefault(dtype, {})[choice] = [np.asarray(a).tobytes() for a in (y, gx, ty)]
        if not on_cpu:
            assert calls == []
        else:
            assert {"forward", "backward", "jvp"} <= set(calls), calls
            calls.clear()
    for dtype, by_choice in results.items():
        assert by_choice["cpu"] == by_choice["numpy"] == by_choice["auto"], dtype


def test_without_a_compiler_ops_fall_back_to_numpy(monkeypatch, tmp_path):
    """No C compiler: auto gives the NumPy module's op (the same results); cpu raises the cpu
    backend's error naming what to install."""
    settings = {"kernel_size": 2, "stride": 1, "padding": 1, "ties": "last"}
    module = symgrad.load("max_pool2d", backend="cpu", **settings)
    monkeypatch.setattr(module, "_library", None)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    monkeypatch.setenv("SYMGRAD_CPU_BACKEND", "auto")
    f = sj._callback_op("max_pool2d", **settings)
    x = jnp.arange(24.0).reshape(1, 2, 3, 4)
    numpy_module = symgrad.load("max_pool2d", **settings)
    want, _ = numpy_module.forward(np.asarray(x))
    assert f.module is numpy_module and np.array_equal(np.asarray(f(x)), want)
    monkeypatch.setenv("SYMGRAD_CPU_BACKEND", "cpu")
    with pytest.raises(RuntimeError, match=r"needs a C compiler .* install one"):
        sj._callback_op("max_pool2d", **settings)
