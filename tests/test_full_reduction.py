"""max and min: torch.max(x) / torch.min(x) without dim, next to amax / amin (torch.amax(x)).

Oracles: PyTorch 2.13 CPU (torch.max(x), torch.amax(x), ... with autograd) under
convention="torch", bit for bit, and jnp.max / jnp.min with jax.grad under convention="jax", on
tie-heavy inputs holding NaN, +-inf and +-0: the two torch ops differ exactly where a NaN is the
max (torch.max splits the gradient among the NaNs, torch.amax gives NaN everywhere)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch")

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 2.0])


def _inputs(rng, dtype):
    out = []
    for shape in [(5,), (3, 4), (2, 3, 4), (1,), ()]:
        x = rng.integers(0, 3, size=shape).astype(dtype)  # ties
        out.append(x)
        y = rng.choice(SPECIALS, size=shape).astype(dtype)  # NaN, inf, signed zeros
        out.append(y)
    out.append(np.array([np.nan, 1.0, np.nan, 2.0], dtype))
    out.append(np.array([-0.0, 0.0, -0.0], dtype))
    return out


def _bits(a):
    """An array's bytes with every NaN made one NaN: equal bit for bit, signs of zero included
    (a NaN's sign and payload are not compared: PyTorch's reductions may return -NaN)."""
    a = np.array(a)
    a[np.isnan(a)] = np.nan
    return a.tobytes()


def _torch(fn, x, g):
    t = torch.tensor(x, requires_grad=True)
    y = fn(t)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), t.grad.numpy()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("op,fn", [("max", torch.max), ("min", torch.min), ("amax", torch.amax),
                                   ("amin", torch.amin)])
def test_torch_preset_equals_pytorch_bit_for_bit(op, fn, dtype):
    m = symgrad.load(op, convention="torch")
    rng = np.random.default_rng(3)
    for x in _inputs(rng, dtype):
        g = dtype(rng.choice([1.0, -3.0, 0.5, 7.0]))
        want_y, want_g = _torch(fn, x, np.asarray(g))
        y, saved = m.forward(x)
        (got,) = m.backward(np.asarray(g), saved)
        assert y.shape == want_y.shape == () and y.dtype == dtype
        for a, b in ((y, want_y), (got, want_g)):
            assert _bits(a) == _bits(b.astype(dtype)), (op, x, a, b)


def test_max_and_amax_differ_where_a_nan_is_the_max():
    """The documented difference (README): torch.max(x) splits among the NaNs, torch.amax(x) is NaN."""
    x = np.array([np.nan, 1.0, np.nan], np.float32)
    g = np.float32(1.0)
    for op, want in (("max", [0.5, 0.0, 0.5]), ("amax", [np.nan] * 3)):
        m = symgrad.load(op, convention="torch")
        np.testing.assert_array_equal(m.backward(g, m.forward(x)[1])[0], np.array(want, np.float32))


@pytest.mark.parametrize("op", ["max", "min"])
def test_jax_preset_equals_jnp(op):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    fn = getattr(jnp, op)
    m = symgrad.load(op, convention="jax")
    rng = np.random.default_rng(4)
    for x in _inputs(rng, np.float32):
        y, saved = m.forward(x)
        (got,) = m.backward(np.float32(2.0), saved)
        want = jax.grad(lambda v: 2.0 * fn(v))(jnp.asarray(x))
        np.testing.assert_array_equal(y, fn(jnp.asarray(x)))
        np.testing.assert_array_equal(got, np.asarray(want))


def test_max_takes_no_dim():
    with pytest.raises(TypeError, match="unexpected parameter 'dim'"):
        symgrad.load("max", dim=0)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_amax_jvp_over_dims_apart_adds_in_pytorchs_order(backend):
    """amax over dims that are not adjacent, every element a tie: the jvp (the tangents' sum over
    the ties, divided by their count) of cancelling float32 tangents (+-1e4 first and last, tiny
    ones of both signs between) bit for bit with torch.func.jvp: at::sum adds line after line (the
    last run of reduced dims) into the output (host/_torch_sum.py.jinja's _torch_line)."""
    if backend == "cpu" and not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler: the cpu backend is not available")
    rng = np.random.default_rng(28)
    for shape, dim in [((40, 3, 70), (0, 2)), ((7, 3, 40, 5), (0, 2))]:
        module = symgrad.load("amax", backend=backend, convention="torch", dim=dim)
        for _ in range(3):
            x = np.zeros(shape, np.float32)
            t = (rng.choice([-1.0, 1.0], shape) * np.exp2(rng.uniform(-30, 0, shape))).astype(np.float32)
            t.reshape(-1)[0], t.reshape(-1)[-1] = 1e4, -1e4
            got = module.jvp(t, module.forward(x)[1])
            want = torch.func.jvp(lambda v: torch.amax(v, dim), (torch.tensor(x),), (torch.tensor(t),))[1]
            assert got.tobytes() == want.numpy().tobytes(), (shape, dim)
