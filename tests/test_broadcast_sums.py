"""The gradient of a broadcast input of maximum/minimum: the per-element gradients summed back to
the input's shape.

Oracles: PyTorch 2.13 CPU and JAX. Under convention="torch" the sum is PyTorch's autograd's
(at::sum_to: one at::sum over the broadcast dims, SumKernel.cpp's order), float16 in float32 and
rounded once: bit for bit with PyTorch in float16, float32 and float64, on the NumPy and cpu
backends. Under convention="jax" the sum is XLA's CPU reduce's (in the gradient's dtype, each add
rounded, windows of 32 along a long dim): bit for bit with JAX in every dtype, bfloat16 included;
where XLA's order depends on the shape alone (its vectorized reduce over several short dims) a
test shows JAX contradicting itself."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch")

SHAPES = [((512, 300), (300,)), ((64, 33, 17), (1, 33, 1)), ((1000, 7), (1, 7)), ((3, 5), (3, 1))]
# more of at::sum_to's cases: leading dims only, non-adjacent and adjacent broadcast dims (each
# short and long against the 8 or 4 lanes of a vector), a broadcast dim of size 1 kept, a size-1
# leading dim, both inputs broadcast
MORE_SHAPES = [((7, 40, 3), (3,)), ((5, 6, 7, 9), (5, 1, 7, 1)), ((12, 3, 50), (1, 3, 1)),
               ((4, 9, 2, 11), (9, 1, 1)), ((33, 1, 10), (1, 1, 1)), ((1, 30), (30,)), ((6, 1), (1, 40)),
               ((300, 2, 5), (300, 1, 5))]


def _axes(big, small):
    small = (1,) * (len(big) - len(small)) + tuple(small)
    return tuple(i for i, (n, m) in enumerate(zip(big, small)) if m == 1 and n != 1)


def _case(rng, op, shape_a, shape_b, dtype):
    a = rng.integers(-2, 3, size=shape_a).astype(dtype)  # ties: the split 1/2 terms
    b = rng.integers(-2, 3, size=shape_b).astype(dtype)
    g = rng.standard_normal(np.broadcast_shapes(shape_a, shape_b)).astype(dtype)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    getattr(torch, op)(ta, tb).backward(torch.tensor(g))
    return a, b, g, tb.grad.numpy()


def _need_compiler(backend):
    if backend == "cpu" and not any(shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))):
        pytest.skip("no C compiler: the cpu backend is not available")


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("shape_a,shape_b", SHAPES + MORE_SHAPES)
def test_float16_broadcast_gradient_equals_pytorch(op, shape_a, shape_b, backend):
    _need_compiler(backend)
    m = symgrad.load(op, backend=backend, convention="torch")
    rng = np.random.default_rng(len(shape_a))
    a, b, g, want = _case(rng, op, shape_a, shape_b, np.float16)
    _, gb = m.backward(g, m.forward(a, b)[1])
    assert gb.dtype == np.float16
    np.testing.assert_array_equal(gb, want)


# shapes where at::sum of a float16 gradient adds in an order of its own: rows under and over its
# vectors of 16 elements (loaded as 8 float32 lanes), columns under and over 16, all of a 2-d
# gradient, two reduced dims innermost (the float32 copy summed: sum_out's acc buffer)
CANCELLING_SHAPES = [((9,), (1,)), ((40,), (1,)), ((300,), (1,)), ((3, 64), (3, 1)), ((64, 3), (1, 3)),
                     ((17, 20), (1, 20)), ((40, 12), (1, 12)), ((5, 6), (1, 1)), ((12, 3, 50), (1, 3, 1)),
                     ((6, 33), (33,))] + MORE_SHAPES


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_float16_broadcast_gradient_of_cancelling_terms_equals_pytorch(backend):
    """maximum's gradient of b, which wins everywhere (b's gradient: g summed to its shape), with g
    of cancelling terms (+-2^14 first and last, small ones of both signs between: the order of
    the float32 sum decides the rounded result) bit for bit with PyTorch's autograd."""
    _need_compiler(backend)
    m = symgrad.load("maximum", backend=backend, convention="torch")
    rng = np.random.default_rng(28)
    for shape_a, shape_b in CANCELLING_SHAPES:
        for _ in range(3):
            a, b = np.full(shape_a, -5, np.float16), np.zeros(shape_b, np.float16)
            full = np.broadcast_shapes(shape_a, shape_b)
            g = rng.choice([-1.0, 1.0], full) * np.exp2(rng.uniform(-4, 0, full))
            g.reshape(-1)[0], g.reshape(-1)[-1] = 2.0 ** 14, -(2.0 ** 14)
            g = g.astype(np.float16)
            ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
            torch.maximum(ta, tb).backward(torch.tensor(g))
            _, gb = m.backward(g, m.forward(a, b)[1])
            assert gb.dtype == np.float16 and gb.tobytes() == tb.grad.numpy().tobytes(), (shape_a, shape_b)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape_a,shape_b", SHAPES + MORE_SHAPES)
def test_broadcast_gradient_equals_pytorchs_bit_for_bit(shape_a, shape_b, dtype, backend):
    _need_compiler(backend)
    for op in ("maximum", "minimum"):
        m = symgrad.load(op, backend=backend, convention="torch")
        rng = np.random.default_rng(len(shape_a) + len(shape_b))
        a, b, g, _ = _case(rng, op, shape_a, shape_b, dtype)
        ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
        getattr(torch, op)(ta, tb).backward(torch.tensor(g))
        ga, gb = m.backward(g, m.forward(a, b)[1])
        for got, want in ((ga, ta.grad.numpy()), (gb, tb.grad.numpy())):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.tobytes() == want.tobytes(), (op, np.abs(got - want).max())  # signs of zero too


# JAX's cases: one reduced dim (long: XLA's windows of 32, padded; short), several, leading dims,
# dims of size 1 kept, both inputs broadcast (none that XLA hands to YNNPACK: docs/conventions.md)
JAX_SHAPES = [((200, 5), (5,)), ((70, 5), (1, 5)), ((5, 70), (5, 1)), ((5, 5, 5), (5,)),
              ((5, 5, 5), (1, 5, 1)), ((10, 5), ()), ((100, 1), (1, 1)), ((6, 1), (1, 40)),
              ((1, 30), (30,)), ((40, 3, 5), (3, 1))]


def _jax_case(rng, op, shape_a, shape_b, dtype):
    """Tie-heavy inputs with +-0 and +-inf, a gradient with +-0 and rounding values, and JAX's
    gradient of b (jax.vjp, the CPU)."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    levels = np.array([-2.0, -0.0, 0.0, 1.0, np.inf, -np.inf])
    a = rng.choice(levels, size=shape_a).astype(dtype)
    b = rng.choice(levels, size=shape_b).astype(dtype)
    shape = np.broadcast_shapes(shape_a, shape_b)
    g = (rng.standard_normal(shape) * np.exp2(rng.integers(-4, 9, shape))).astype(dtype)
    g.reshape(-1)[::7] = -0.0
    want = jax.vjp(getattr(jnp, op), jnp.asarray(a), jnp.asarray(b))[1](jnp.asarray(g))
    return a, b, g, [np.asarray(w) for w in want]


# the default run: windows along a long dim, several reduced dims, everything to one element
QUICK_JAX_SHAPES = [JAX_SHAPES[0], JAX_SHAPES[4], JAX_SHAPES[5]]


def test_jax_preset_broadcast_gradient_equals_jaxs_bit_for_bit():
    """Under convention="jax" every gradient of maximum/minimum/fmax/fmin, broadcast inputs
    summed, equals JAX's bit for bit (signs of zero included) (failed before: NumPy's pairwise
    float32 sum, rounded once); every dtype, op and shape, both backends: the slow test below."""
    _check_jax_sums("bfloat16", "numpy", QUICK_JAX_SHAPES, ops=("maximum",), swap=False)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_jax_preset_broadcast_gradient_equals_jaxs_in_every_dtype(dtype, backend):
    _check_jax_sums(dtype, backend, JAX_SHAPES)


def _check_jax_sums(dtype, backend, shapes, ops=("maximum", "minimum", "fmax", "fmin"), swap=True):
    _need_compiler(backend)
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    rng = np.random.default_rng(11)
    for k, (shape_a, shape_b) in enumerate(shapes):
        op = ops[k % len(ops)]
        m = symgrad.load(op, backend=backend, convention="jax")
        for x, y in ((shape_a, shape_b), (shape_b, shape_a))[:2 if swap else 1]:
            a, b, g, want = _jax_case(rng, op, x, y, dtype)
            got = m.backward(g, m.forward(a, b)[1])
            for u, w in zip(got, want):
                assert u.dtype == w.dtype and u.shape == w.shape, (op, x, y)
                assert u.tobytes() == w.tobytes(), (op, x, y, u, w)


def test_xla_sum_order_depends_on_the_shape():
    """JAX contradicts itself by shape (docs/conventions.md, broadcast_sum "jax"): the same four
    float16 terms summed by one reduce_sum as a (2, 2) block and as a row of 4 (both in row-major
    order, XLA's CPU) give different sums for some terms: its tiled emitter vectorizes a reduce
    over several dims whose minor one is short and reassociates it. symgrad's sum is the row's."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    m = symgrad.load("maximum", convention="jax")
    rng = np.random.default_rng(12)
    differ = 0
    for _ in range(40):
        g = (rng.standard_normal((2, 2)) * np.exp2(rng.integers(-3, 8, (2, 2)))).astype(np.float16)
        block = np.asarray(jax.lax.reduce_sum(jnp.asarray(g), (0, 1)))
        row = np.asarray(jax.lax.reduce_sum(jnp.asarray(g.reshape(4)), (0,)))
        differ += block.tobytes() != row.tobytes()
        _, gb = m.backward(g, m.forward(np.full((2, 2), -np.inf, np.float16), np.zeros((1, 1), np.float16))[1])
        assert gb.reshape(()).tobytes() == row.tobytes()
    assert differ > 0


def test_torch_order_sum_of_infinities_is_nan_silently_as_pytorch():
    """Under the torch preset a broadcast input's gradient summed over +inf and -inf terms is NaN,
    as PyTorch's autograd gives, and the generated module computes it without a RuntimeWarning
    (its sums run under np.errstate, as its other additions do)."""
    import warnings

    import torch

    m = symgrad.load("maximum", convention="torch")
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = np.array([5.0, 6.0], np.float32)
    g = np.array([[np.inf, 1.0], [-np.inf, 1.0]], np.float32)
    y, saved = m.forward(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, got = m.backward(g, saved)
    ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    torch.maximum(ta, tb).backward(torch.tensor(g))
    want = tb.grad.numpy()
    assert np.isnan(got[0]) and np.array_equal(got.view(np.uint32)[1:], want.view(np.uint32)[1:])
    assert np.isnan(want[0])


@pytest.mark.parametrize("convention", ["torch", "jax"])
def test_zero_size_broadcast_gradient_equals_the_frameworks(convention):
    """A broadcast input whose output has no elements (OpInfo's empty samples) gets zeros of its
    shape, as PyTorch and JAX give (failed before: ValueError from a reshape of -1)."""
    m = symgrad.load("maximum", convention=convention)
    for shape_a, shape_b in [((0, 3, 1), (3, 4)), ((2, 0, 3), (3,)), ((0,), (1,))]:
        a, b = np.ones(shape_a, np.float32), np.ones(shape_b, np.float32)
        y, saved = m.forward(a, b)
        got = m.backward(np.ones(y.shape, np.float32), saved)
        if convention == "torch":
            ta, tb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
            torch.maximum(ta, tb).backward(torch.ones(y.shape))
            want = [ta.grad.numpy(), tb.grad.numpy()]
        else:
            jax = pytest.importorskip("jax")
            import jax.numpy as jnp
            want = jax.vjp(jnp.maximum, jnp.asarray(a), jnp.asarray(b))[1](jnp.ones(y.shape, jnp.float32))
        for u, w in zip(got, want):
            w = np.asarray(w)
            assert u.shape == w.shape and u.dtype == w.dtype and u.tobytes() == w.tobytes()
