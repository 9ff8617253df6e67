"""The jax backend's adaptive max pooling (windows "spans"): forward, Saved, backward and jvp under
jax.jit bit for bit equal to the NumPy backend's module (itself checked against brute force and
PyTorch in test_adaptive) on inputs with ties, NaN, +-0 and +-inf, every policy, NaN rule and
preset, float16, bfloat16, float32 and float64 (test_jax_backend's _check_window_variant); PyTorch's
indices; symgrad.jax's native path (no callback in the jaxpr, vmap of grad equals a loop)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import symgrad  # noqa: E402
from test_jax_backend import POOL_SHAPES, _check_window_variant, _id, _window_settings  # noqa: E402

POOL_SHAPE = POOL_SHAPES[2]  # (2, 3, 7, 6)

ADAPTIVES = [("adaptive_max_pool2d", {"output_size": (3, 4)}), ("adaptive_max_pool1d", {"output_size": 4}),
             ("adaptive_max_pool3d", {"output_size": (2, 3, None)}),  # (1, 2, 4, 5, 5): coordinates in every window
             ("adaptive_max_pool2d", {"output_size": 1})]  # the benchmark CNN's
ALL = [v for name, params in ADAPTIVES for v in _window_settings(name, params)]
REPRESENTATIVE = [v for v in ALL if v[1] == ADAPTIVES[0][1] and (
    "convention" in v[2] or v[2] in ({"ties": "first", "nan": "keep"}, {"ties": "last", "nan": "replace"},
                                     {"ties": "split", "nan": "dominate"}, {"ties": "all", "nan": "zero"}))]
SLOW = [v for v in ALL if v not in REPRESENTATIVE]


@pytest.mark.parametrize("variant", REPRESENTATIVE[1:2], ids=[_id(v) for v in REPRESENTATIVE[1:2]])
def test_jax_adaptive_module_equals_the_numpy_module_bit_for_bit_in_float32(variant, monkeypatch):
    """The jax preset (the mask form, its reversed order and -0.0 starts) in float32 only: each
    dtype is one more XLA compilation (about 2 s); the scan form's forward under the torch preset
    in the indices test; every variant and dtype under -m slow."""
    import test_jax_backend
    monkeypatch.setattr(test_jax_backend, "DTYPES", [np.float32])
    with jax.enable_x64(True):
        _check_window_variant(variant, np.random.default_rng(7))


@pytest.mark.slow
@pytest.mark.parametrize("variant", REPRESENTATIVE, ids=[_id(v) for v in REPRESENTATIVE])
def test_jax_adaptive_module_equals_the_numpy_module_bit_for_bit(variant):
    with jax.enable_x64(True):
        _check_window_variant(variant, np.random.default_rng(7))


@pytest.mark.slow
@pytest.mark.parametrize("variant", SLOW, ids=[_id(v) for v in SLOW])
def test_jax_adaptive_module_equals_the_numpy_module_bit_for_bit_every_variant(variant):
    with jax.enable_x64(True):
        _check_window_variant(variant, np.random.default_rng(8))


@pytest.mark.parametrize("settings", [{"convention": "torch"}])
def test_adaptive_indices_are_the_numpy_modules(settings):
    kw = dict(output_size=(5, 3), return_indices=True, **settings)
    a = np.random.default_rng(0).choice([-np.inf, 0.0, -0.0, 1.0, 2.0], size=(2, 3, 7, 6))
    (y_np, i_np), _ = symgrad.load("adaptive_max_pool2d", **kw).forward(a)
    with jax.enable_x64(True):
        (y_j, i_j), _ = jax.jit(symgrad.load("adaptive_max_pool2d", backend="jax", **kw).forward)(a)
        assert np.array_equal(np.asarray(y_j), y_np) and np.array_equal(np.asarray(i_j), i_np)


@pytest.mark.slow  # (about 15 s: symgrad.jax and three compilations)
def test_symgrad_jax_runs_adaptive_pooling_natively():
    """symgrad.jax's adaptive pooling: jit(grad) holds no callback; vmap of grad equals a loop."""
    import symgrad.jax as sj
    fn = sj.op("adaptive_max_pool2d", output_size=(2, 3), ties="split")
    f = lambda x: (fn(x) * jnp.arange(6.0).reshape(2, 3)).sum()  # noqa: E731
    xs = jnp.asarray(np.random.default_rng(1).choice([0.0, 1.0, 2.0], size=(3, 2, 5, 7)), jnp.float32)
    text = str(jax.make_jaxpr(jax.jit(jax.grad(f)))(xs[0]))
    assert "callback" not in text
    np.testing.assert_array_equal(jax.jit(jax.vmap(jax.grad(f)))(xs), np.stack([jax.grad(f)(x) for x in xs]))


@pytest.mark.parametrize("settings", [{"convention": "torch"},
                                      pytest.param({"ties": "split", "nan": "dominate"}, marks=pytest.mark.slow)],
                         ids=["torch", "split"])
def test_a_large_window_box_folds_in_a_loop_bit_for_bit(settings, monkeypatch):
    """A global pooling (output size 1: a box of 42 elements, over the module's UNROLLED) folds
    forward in lax.fori_loop (unrolled, XLA fused the fold into backward's gathers and recomputed
    it for every input element: 12 s for a (64, 64, 32, 32) max_pool2d then adaptive_max_pool2d
    jit(grad) under the torch preset), with the unrolled fold's results bit for bit: equal to the
    NumPy module, float32 (the scan form with its NaN fold, and the mask form)."""
    import test_jax_backend
    variant = ("adaptive_max_pool2d", {"output_size": 1}, settings)
    module = symgrad.load("adaptive_max_pool2d", backend="jax", output_size=1, **settings)
    text = str(jax.make_jaxpr(lambda v: module.forward(v)[0])(jnp.zeros(POOL_SHAPE, jnp.float32)))
    assert 7 * 6 > module.UNROLLED and ("while[" in text or "scan[" in text)
    monkeypatch.setattr(test_jax_backend, "DTYPES", [np.float32])
    with jax.enable_x64(True):
        _check_window_variant(variant, np.random.default_rng(9))
