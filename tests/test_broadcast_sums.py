"""The gradient of a broadcast input of maximum/minimum: the per-element gradients summed back to
the input's shape.

Oracles: PyTorch 2.13 CPU and JAX. Under convention="torch" the sum is PyTorch's autograd's
(at::sum_to: one at::sum over the broadcast dims, SumKernel.cpp's order), float16 in float32 and
rounded once: bit for bit with PyTorch in float16, float32 and float64, on the NumPy and cpu
backends. Under convention="jax" float32 adds in NumPy's order, JAX in XLA's (the documented
exception, README): the difference is bounded by a few float32 units of the sum of the terms'
magnitudes, and JAX's own sum of symgrad's per-element gradients is its gradient bit for bit (so
the terms are equal)."""

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
               ((4, 9, 2, 11), (9, 1, 1)), ((33, 1, 10), (1, 1, 1)), ((1, 30), (30,)), ((6, 1), (1, 70)),
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


@pytest.mark.parametrize("shape_a,shape_b", SHAPES)
def test_float32_broadcast_gradient_is_within_the_bound_of_jaxs(shape_a, shape_b):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    m = symgrad.load("maximum", convention="jax")
    rng = np.random.default_rng(8)
    a, b, g, _ = _case(rng, "maximum", shape_a, shape_b, np.float32)
    _, gb = m.backward(g, m.forward(a, b)[1])
    want = np.asarray(jax.vjp(lambda v: jnp.maximum(jnp.asarray(a), v), jnp.asarray(b))[1](jnp.asarray(g))[0])
    _, terms = m.backward(g, m.forward(a, np.broadcast_to(b, g.shape).copy())[1])
    axes = _axes(g.shape, shape_b)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(terms).sum(axes, keepdims=True)).reshape(want.shape), want)
    bound = 4 * np.finfo(np.float32).eps * np.abs(terms.astype(np.float64)).sum(axes, keepdims=True)
    assert np.all(np.abs(gb.astype(np.float64) - want) <= bound.reshape(want.shape))


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
