"""multi_margin_loss, p=1 (issue 30): per row (1/C) sum_{i != y} w[y] max(0, (margin - x[y]) + x[i]),
composed of relu's generated module (the hinges' weights) and NumPy (symgrad/multi_margin.py).

Oracles: PyTorch 2.13's F.multi_margin_loss (CPU: float32 and float64 only) and the expression a
JAX user writes (JAX and optax have none; written out in _jax_loss), bit for bit (signs of zero,
NaN where NaN) on rows of -inf, -1, -0.5, +-0, 0.5, 1, 2, +inf, NaN (C = 4: many hinges exactly
at z = 0), weights with 0, negative and fractional entries, grad_output 1, -0.5, +-0, inf, the
reductions; a brute-force loop from the definition under every policy; finite differences.
JAX's sums are bit for bit where they are exact (C = 4, N a power of two for 'mean'): XLA adds a
row in its own order, which NumPy's may differ from in the last bit of an inexact sum.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import symgrad
from symgrad.policy import POLICIES
from conftest import assert_same_values

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
VALUES = [-np.inf, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, np.inf, np.nan]
FINITE = [-1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0]
GRADS = [1.0, -0.5, 0.0, -0.0, np.inf]
WEIGHT = np.array([1.0, 0.5, -2.0, 0.0])
SLOW = pytest.mark.slow


def _rows(n, values=VALUES, seed=0, C=4):
    rng = np.random.default_rng(seed)
    return rng.choice(values, (n, C)), rng.integers(0, C, n)


def _grad_output(reduction, n, dtype, seed=1):
    if reduction != "none":
        return np.asarray(-0.5, dtype)
    return np.random.default_rng(seed).choice(GRADS, n).astype(dtype)


def _ours(module, x, y, g):
    out, saved = module.forward(x, y)
    gx, gy = module.backward(g, saved)
    assert gy is None  # the target only selects
    return out, gx


def _torch(x, y, g, margin, weight, reduction):
    tx = torch.tensor(x, requires_grad=True)
    w = None if weight is None else torch.tensor(weight.astype(x.dtype))
    out = F.multi_margin_loss(tx, torch.tensor(y), margin=margin, weight=w, reduction=reduction)
    (gx,) = torch.autograd.grad(out, tx, torch.tensor(g))
    return out.detach().numpy(), gx.numpy()


def _jax_loss(margin, weight, reduction):
    def loss(x, y):  # F.multi_margin_loss(p=1) as a JAX user writes it
        z = jnp.maximum(0, margin - jnp.take_along_axis(x, y[:, None], 1) + x)
        if weight is not None:
            z = z * jnp.asarray(weight, x.dtype)[y][:, None]
        rows = jnp.sum(jnp.where(jnp.arange(x.shape[1]) == y[:, None], 0, z), axis=-1) / x.shape[1]
        return rows if reduction == "none" else getattr(jnp, reduction)(rows)
    return loss


def _jax(x, y, g, margin, weight, reduction):
    dt = jnp.bfloat16 if x.dtype == BF16 else x.dtype
    out, pullback = jax.vjp(lambda v: _jax_loss(margin, weight, reduction)(v, jnp.asarray(y)),
                            jnp.asarray(x, dt))
    (gx,) = pullback(jnp.asarray(g, dt))
    return np.asarray(out).astype(x.dtype), np.asarray(gx).astype(x.dtype)


def _params(frameworks_dtypes, default):
    for convention, dtypes in frameworks_dtypes:
        for dtype in dtypes:
            for reduction in ("none", "mean", "sum"):
                for margin, weight in ((1.0, None), (0.5, WEIGHT)):
                    name = np.dtype(dtype).name
                    key = (convention, name, reduction, weight is not None)
                    yield pytest.param(convention, dtype, reduction, margin, weight,
                                       marks=() if key in default else (SLOW,),
                                       id=f"{convention}-{name}-{reduction}-margin{margin}-"
                                          f"{'weight' if weight is not None else 'noweight'}")


@pytest.mark.parametrize("convention,dtype,reduction,margin,weight", list(_params(
    [("torch", (np.float64, np.float32)), ("jax", (np.float64, np.float32, np.float16, BF16))],
    # (JAX's variants are slow only: its op-by-op compiles take 3-4 s on the loaded 2-core
    # machine; test_hinge30 keeps a JAX preset in the default run)
    {("torch", "float32", "none", True), ("torch", "float64", "mean", False)})))
def test_presets_equal_the_frameworks_bit_for_bit(convention, dtype, reduction, margin, weight):
    n = 2048  # (a power of two: JAX's mean divides exactly, its sums are exact)
    x, y = _rows(n)
    x = x.astype(dtype)
    g = _grad_output(reduction, n, dtype)
    module = symgrad.load("multi_margin_loss", convention=convention, margin=margin, weight=weight,
                          reduction=reduction)
    want = (_torch if convention == "torch" else _jax)(x, y, g, margin, weight, reduction)
    for what, a, b in zip(("forward", "grad input"), _ours(module, x, y, g), want):
        assert_same_values(a, b, f"{convention} {np.dtype(dtype).name} {reduction} {what}")


@pytest.mark.parametrize("reduction", ["none", pytest.param("mean", marks=SLOW)])
def test_one_row_input_as_pytorch(reduction):
    """A (C,) input with a 0-d target: a 0-d loss, as F.multi_margin_loss gives it."""
    x, y = np.array([0.5, -0.5, 1.0, np.nan, 0.0]), np.int64(3)
    x[3] = 0.5  # z = 0 at 0 and 2: the kinks
    module = symgrad.load("multi_margin_loss", convention="torch", reduction=reduction)
    g = np.asarray(-0.5)
    want = _torch(x, np.asarray(y), g, 1.0, None, reduction)
    for what, a, b in zip(("forward", "grad"), _ours(module, x, np.asarray(y), g), want):
        assert_same_values(a, b, what)


def _reference(x, y, margin, weight, ties):
    """The definition, a row and a hinge at a time: max(0, z) with the 0 piece first, its
    derivative by the README's policies."""
    C = x.shape[1]
    out, grad = np.zeros(len(x)), np.zeros_like(x)
    for r, (row, t) in enumerate(zip(x.tolist(), y.tolist())):
        w = 1.0 if weight is None else weight[t]
        for i in range(C):
            if i == t:
                continue
            z = margin - row[t] + row[i]
            dz = 1.0 if z > 0 else 0.0 if z < 0 else {"first": 0.0, "last": 1.0, "split": 0.5, "all": 1.0}[ties]
            out[r] += w * max(0.0, z) / C
            grad[r, i] += w * dz / C
            grad[r, t] -= w * dz / C
    return out, grad


@pytest.mark.parametrize("ties", [pytest.param(t, marks=() if t == "split" else (SLOW,)) for t in POLICIES])
def test_every_policy_follows_the_definition(ties):
    x, y = _rows(300, FINITE, seed=2)
    for margin, weight in ((1.0, None), (0.5, WEIGHT)):
        module = symgrad.load("multi_margin_loss", ties=ties, margin=margin, weight=weight)
        out, gx = _ours(module, x, y, np.ones(len(x)))
        want_out, want_g = _reference(x, y, margin, weight, ties)
        np.testing.assert_allclose(out, want_out, rtol=1e-15, atol=0)
        np.testing.assert_allclose(gx, want_g, rtol=1e-15, atol=0, err_msg=f"{ties} {margin}")


def test_finite_differences_away_from_the_kinks():
    rng = np.random.default_rng(3)
    x, y, h = rng.standard_normal((20, 5)), rng.integers(0, 5, 20), 1e-6
    f = lambda v: F.multi_margin_loss(torch.tensor(v), torch.tensor(y), reduction="sum").item()  # noqa: E731
    for ties in POLICIES:
        module = symgrad.load("multi_margin_loss", ties=ties, reduction="sum")
        gx = _ours(module, x, y, np.asarray(1.0))[1]
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[i] = h
            fd[i] = (f(x + e) - f(x - e)) / (2 * h)
        np.testing.assert_allclose(gx, fd, atol=1e-6)


def test_check_modes_and_a_planted_wrong_value():
    """symgrad.check away from the kinks (at a kink z = 0 it reads the hinge as a tie of the
    elements x[i] and x[y], whose 'first' is not the hinge's 0 piece: no model of a row op there):
    forward and reverse mode agree, and a planted wrong gradient is caught."""
    x = np.array([[0.125, 1.0, 0.75, 2.0], [1.0, 0.375, 0.25, -1.0]])  # no z = 0
    y = np.array([1, 0])
    module = symgrad.load("multi_margin_loss", convention="torch", weight=WEIGHT)
    assert symgrad.check(module, x, y, ties="first", modes="both").ok

    class Planted:  # the active hinge of x[0, 2] given 1/8 instead of 1/4
        def forward(self, x, y):
            return module.forward(x, y)

        def backward(self, g, saved):
            gx = module.backward(g, saved)[0].copy()
            gx[0, 2] *= 0.5
            return gx, None
    bad = symgrad.check(Planted(), x, y, ties="first")
    assert not bad.ok and "[0, 2] <- output[0]: expected" in str(bad), str(bad)


def test_jvp_transposes_backward():
    x, y = _rows(6, FINITE, seed=4)
    t = np.random.default_rng(5).standard_normal(x.shape)
    for reduction in ("none", "mean"):
        module = symgrad.load("multi_margin_loss", convention="torch", reduction=reduction, weight=WEIGHT)
        _, saved = module.forward(x, y)
        g = np.arange(1.0, 7.0) if reduction == "none" else np.asarray(1.0)
        assert np.sum(module.jvp(t, None, saved) * g) == pytest.approx(
            float(np.sum(module.backward(g, saved)[0] * t)))


@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
@SLOW
def test_cpu_backend_equals_the_numpy_module():
    x, y = _rows(500)
    for convention in ("torch", "jax"):
        cpu = symgrad.load("multi_margin_loss", backend="cpu", convention=convention, weight=WEIGHT)
        ref = symgrad.load("multi_margin_loss", convention=convention, weight=WEIGHT)
        for dtype in (np.float64, np.float32, np.float16):
            g = _grad_output("none", len(x), dtype)
            for a, b in zip(_ours(cpu, x.astype(dtype), y, g), _ours(ref, x.astype(dtype), y, g)):
                assert_same_values(a, b, f"cpu {convention} {np.dtype(dtype).name}")


def test_errors_are_one_line():
    with pytest.raises(ValueError, match=r"^multi_margin_loss: p must be 1 \(the hinge; p=2 squares it"):
        symgrad.load("multi_margin_loss", p=2)
    with pytest.raises(TypeError, match=r"^multi_margin_loss: unexpected parameter 'lambd'"):
        symgrad.load("multi_margin_loss", lambd=1)
    with pytest.raises(ValueError, match=r"^multi_margin_loss: weight must be None or a 1-d array"):
        symgrad.load("multi_margin_loss", weight=np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"^multi_margin_loss is composed at the host level .* of "
                                         r"relu's generated module"):
        symgrad.generate("multi_margin_loss", "/nonexistent")
    module = symgrad.load("multi_margin_loss")
    with pytest.raises(ValueError, match=r"^multi_margin_loss: target out of range: every class must "
                                         r"be in \[0, 3\), got 3$"):
        module.forward(np.ones((2, 3)), np.array([0, 3]))
    with pytest.raises(ValueError, match=r"^multi_margin_loss: target must be an integer array"):
        module.forward(np.ones((2, 3)), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"^multi_margin_loss: input must be a float array of shape"):
        module.forward(np.ones((2, 3, 4)), np.array([0, 1]))
    _, saved = module.forward(np.ones((2, 3)), np.array([0, 1]))
    with pytest.raises(ValueError, match=r"^multi_margin_loss: grad_output must be a float array of "
                                         r"the output's shape \(2,\)"):
        module.backward(np.ones(3), saved)
