"""The gradient of a broadcast input of maximum/minimum: the per-element gradients summed back to
the input's shape.

Oracles: PyTorch 2.13 CPU and JAX. float16 is summed in float32 and rounded once, as PyTorch's sum
does: bit for bit with PyTorch under convention="torch" on these shapes. float32 adds in NumPy's
order, PyTorch and JAX in their own (the documented exception, README): the difference is bounded
by a few float32 units of the sum of the terms' magnitudes, and the frameworks' own sums of
symgrad's per-element gradients are their gradients bit for bit (so the terms are equal)."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch")

SHAPES = [((512, 300), (300,)), ((64, 33, 17), (1, 33, 1)), ((1000, 7), (1, 7)), ((3, 5), (3, 1))]


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


@pytest.mark.parametrize("op", ["maximum", "minimum"])
@pytest.mark.parametrize("shape_a,shape_b", SHAPES)
def test_float16_broadcast_gradient_equals_pytorch(op, shape_a, shape_b):
    m = symgrad.load(op, convention="torch")
    rng = np.random.default_rng(len(shape_a))
    a, b, g, want = _case(rng, op, shape_a, shape_b, np.float16)
    _, gb = m.backward(g, m.forward(a, b)[1])
    assert gb.dtype == np.float16
    np.testing.assert_array_equal(gb, want)


@pytest.mark.parametrize("shape_a,shape_b", SHAPES)
def test_float32_broadcast_gradient_is_a_sum_in_another_order(shape_a, shape_b):
    m = symgrad.load("maximum", convention="torch")
    rng = np.random.default_rng(7)
    a, b, g, want = _case(rng, "maximum", shape_a, shape_b, np.float32)
    _, gb = m.backward(g, m.forward(a, b)[1])
    # the terms: the gradient of b broadcast, i.e. with b expanded to the output's shape
    wide = np.broadcast_to(b, g.shape).copy()
    _, terms = m.backward(g, m.forward(a, wide)[1])
    axes = _axes(g.shape, shape_b)
    framework_sum = torch.tensor(terms).sum(axes, keepdim=True).reshape(want.shape).numpy()
    np.testing.assert_array_equal(framework_sum, want)  # equal terms, PyTorch's order
    bound = 4 * np.finfo(np.float32).eps * np.abs(terms.astype(np.float64)).sum(axes, keepdims=True)
    assert np.all(np.abs(gb.astype(np.float64) - want) <= bound.reshape(want.shape))


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
