"""The jax backend's fractional max pooling (windows "sampled"): forward, Saved, backward and jvp
under jax.jit bit for bit equal to the NumPy backend's module (itself checked against brute force
and PyTorch in test_fractional) on inputs with ties, NaN, +-0 and +-inf, every policy, NaN rule
and preset, float16, bfloat16, float32 and float64, the samples given as an input as the NumPy
module takes them; float16 samples whose rounded starts repeat; a window larger than UNROLLED
(the fold in lax.fori_loop); PyTorch's indices; symgrad.jax's native path (no callback in the
jaxpr, vmap of grad equals a loop)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import symgrad  # noqa: E402
from test_jax_backend import DTYPES, GRADS, _id, _same, _window_inputs, _window_settings  # noqa: E402

FRACTIONALS = [("fractional_max_pool2d", {"kernel_size": 3, "output_ratio": 0.5}, (2, 3, 7, 6)),
               ("fractional_max_pool3d", {"kernel_size": 2, "output_size": (3, 2, 3)}, (1, 2, 5, 6, 7)),
               ("fractional_max_pool2d", {"kernel_size": 5, "output_size": (2, 3)}, (2, 3, 9, 8))]  # > UNROLLED
ALL = [(name, params, s, shape) for name, params, shape in FRACTIONALS for _, _, s in _window_settings(name, params)]
REPRESENTATIVE = [v for v in ALL if v[1] == FRACTIONALS[0][1] and v[2] in ({"convention": "jax"}, {"convention": "torch"})]
SLOW = [v for v in ALL if v not in REPRESENTATIVE]
# float16 samples near 1: i + u rounds up to the next integer, so starts repeat (alpha = 1 here) and
# a coordinate has more holding windows than a window has elements
NEAR_ONE = np.array([0.99951171875, 0.9990234375, 0.5, 0.0])


def _samples(rng, shape, spatial):
    batched = shape if len(shape) == spatial + 2 else (1,) + shape
    return rng.random(batched[:2] + (spatial,))


def _check(name, params, s, shape, dtypes=DTYPES, samples=None, seed=7):
    kw = dict(ties=s.get("ties"), nan=s.get("nan"), convention=s.get("convention"), **params)
    numpy_module = symgrad.load(name, **kw)
    jax_module = symgrad.load(name, backend="jax", **kw)
    assert jax_module.BACKEND == "jax" and "pure_callback" not in open(jax_module.__file__).read()

    @jax.jit
    def results(x, u, g, t):  # one compilation per signature: forward, backward and jvp
        y, saved = jax_module.forward(x, u)
        grads = jax_module.backward(g, saved)
        assert grads[1] is None  # random_samples get no gradient
        return [y, grads[0], jax_module.jvp(t, None, saved), saved]
    rng, bad = np.random.default_rng(seed), []
    for dtype in dtypes:
        for x in _window_inputs(shape, rng):
            x = x.astype(dtype)
            u = (_samples(rng, shape, numpy_module.SPATIAL) if samples is None else samples).astype(dtype)
            with np.errstate(all="ignore"):
                y, saved = numpy_module.forward(x, u)
                g = rng.choice(GRADS, y.shape).astype(dtype)
                t = rng.choice(GRADS[:-1], x.shape).astype(dtype)
                want = [y, numpy_module.backward(g, saved)[0], numpy_module.jvp(t, None, saved)]
            *got, saved_j = results(x, u, g, t)
            fields = [f for f in ("index", "x", "output") if f in saved._fields]
            want += [getattr(saved, f) for f in fields]
            got += [getattr(saved_j, f) for f in fields]
            for label, a, w in zip(["forward", "backward", "jvp"] + [f"saved.{f}" for f in fields], got, want):
                why = _same(a, w)
                if why:
                    bad.append(f"{np.dtype(dtype).name} {label}: {why}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("variant", REPRESENTATIVE[:1], ids=[_id(v[:3]) for v in REPRESENTATIVE[:1]])
def test_jax_fractional_module_equals_the_numpy_module_bit_for_bit_in_float32(variant):
    """One preset in float32 only: each dtype is one more XLA compilation; every variant and
    dtype under -m slow."""
    with jax.enable_x64(True):
        _check(*variant, dtypes=[np.float32])


@pytest.mark.slow
@pytest.mark.parametrize("variant", REPRESENTATIVE + SLOW, ids=[_id(v[:3]) for v in REPRESENTATIVE + SLOW])
def test_jax_fractional_module_equals_the_numpy_module_every_variant(variant):
    with jax.enable_x64(True):
        _check(*variant)


@pytest.mark.slow
@pytest.mark.parametrize("ties", ["first", "split"])
def test_float16_starts_that_repeat(ties):
    u = np.stack([np.tile(NEAR_ONE, 3).reshape(4, 3), np.zeros((4, 3))], axis=-1)[..., ::-1]  # axis 0 reads sample 1
    with jax.enable_x64(True):
        _check("fractional_max_pool2d", {"kernel_size": (1, 1), "output_size": (5, 2)}, {"ties": ties},
               (4, 3, 5, 3), dtypes=[np.float16], samples=np.ascontiguousarray(u))


@pytest.mark.slow
def test_fractional_indices_are_the_numpy_modules():
    kw = dict(kernel_size=(2, 1), output_size=(4, 5), return_indices=True, convention="torch")
    rng = np.random.default_rng(0)
    a, u = rng.choice([-np.inf, 0.0, -0.0, 1.0, 2.0], size=(3, 7, 9)), rng.random((1, 3, 2))
    (y_np, i_np), _ = symgrad.load("fractional_max_pool2d", **kw).forward(a, u)
    with jax.enable_x64(True):
        (y_j, i_j), _ = jax.jit(symgrad.load("fractional_max_pool2d", backend="jax", **kw).forward)(a, u)
        assert np.array_equal(np.asarray(y_j), y_np) and np.array_equal(np.asarray(i_j), i_np)


@pytest.mark.slow  # (symgrad.jax and three compilations)
def test_symgrad_jax_runs_fractional_pooling_natively():
    """symgrad.jax's fractional pooling: jit(grad) holds no callback; vmap of grad equals a loop;
    the gradient is the NumPy module's."""
    import symgrad.jax as sj
    fn = sj.op("fractional_max_pool2d", kernel_size=2, output_size=(2, 3), ties="split")
    u = jnp.asarray(np.random.default_rng(2).random((1, 2, 2)), jnp.float32)
    f = lambda x: (fn(x, u) * jnp.arange(6.0).reshape(2, 3)).sum()  # noqa: E731
    xs = jnp.asarray(np.random.default_rng(1).choice([0.0, 1.0, 2.0], size=(3, 2, 5, 7)), jnp.float32)
    text = str(jax.make_jaxpr(jax.jit(jax.grad(f)))(xs[0]))
    assert "callback" not in text
    np.testing.assert_array_equal(jax.jit(jax.vmap(jax.grad(f)))(xs), np.stack([jax.grad(f)(x) for x in xs]))
    mod = symgrad.load("fractional_max_pool2d", kernel_size=2, output_size=(2, 3), ties="split")
    _, saved = mod.forward(np.asarray(xs[0]), np.asarray(u))
    want = mod.backward(np.broadcast_to(np.arange(6.0, dtype=np.float32).reshape(2, 3), (2, 2, 3)).copy(), saved)[0]
    assert _same(jax.grad(f)(xs[0]), want) is None
