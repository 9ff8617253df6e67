"""multi_margin_loss (p=1) in the frameworks (issue 30): symgrad.torch's multi_margin_loss and
MultiMarginLoss, symgrad.jax's multi_margin_loss (symgrad/framework_multi_margin.py).

Oracles: PyTorch 2.13's F.multi_margin_loss on the CPU (float32/float64: its CPU kernel refuses
float16 and bfloat16, which are checked against the NumPy module's torch arithmetic, itself
checked against F.multi_margin_loss and the definition in test_multi_margin30) and the expression
a JAX user writes (written out in _jnp_loss), bit for bit (signs of zero, NaN where NaN) on rows of
-inf, -1, -0.5, +-0, 0.5, 1, 2, +inf, NaN (C = 5: many hinges at z = 0) and on random rows
(inexact sums: aten's order of the additions), grad_output 1, -0.5, +-0, inf; torch.compile
(fullgraph) from the first call; jit, grad, vmap with no callback in the jaxpr.
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import symgrad.jax as sj  # noqa: E402
import symgrad.torch as st  # noqa: E402

SLOW = pytest.mark.slow
BF16 = np.dtype(ml_dtypes.bfloat16)
VALUES = [-np.inf, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, np.inf, np.nan]
GRADS = [1.0, -0.5, 0.0, -0.0, np.inf]
WEIGHT = np.array([1.0, 0.5, -2.0, 0.0, 3.0])
MARGIN = 0.75


def _same(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nan = np.isnan(a)
    return bool(((nan == np.isnan(b)) & (nan | ((a == b) & (np.signbit(a) == np.signbit(b))))).all())


def _inputs(n=256, seed=0, exact=False):
    """(x, y): tie-heavy rows, then (unless exact) random rows whose sums round."""
    rng = np.random.default_rng(seed)
    x = rng.choice(VALUES, (n, 5))
    if not exact:
        x[n // 2:] = rng.standard_normal((n - n // 2, 5)) * 3
    return x, rng.integers(0, 5, n)


def _grad(reduction, n, seed=1):
    return np.random.default_rng(seed).choice(GRADS, n) if reduction == "none" else np.asarray(-0.7)


def _torch(fn, x, y, g, weight, dtype):
    t = torch.tensor(x.astype(dtype), requires_grad=True)
    w = None if weight is None else torch.tensor(weight.astype(dtype))
    out = fn(t, torch.tensor(y), w)
    (gx,) = torch.autograd.grad(out, t, torch.tensor(np.asarray(g, dtype)))
    return out.detach().numpy(), gx.numpy()


def _ours(reduction, convention="torch"):
    return lambda t, y, w: st.multi_margin_loss(t, y, margin=MARGIN, weight=w, reduction=reduction,
                                                convention=convention)


def _grid(dtypes, default):
    return [pytest.param(d, r, w, id=f"{np.dtype(d).name}-{r}-{'weight' if w is not None else 'noweight'}",
                         marks=() if (np.dtype(d).name, r, w is not None) in default else SLOW)
            for d in dtypes for r in ("none", "mean", "sum") for w in (None, WEIGHT)]


@pytest.mark.parametrize("dtype,reduction,weight", _grid(
    (np.float64, np.float32), {("float32", "none", True), ("float64", "mean", False)}))
def test_torch_equals_F_multi_margin_loss(dtype, reduction, weight):
    x, y = _inputs()
    g = _grad(reduction, len(x))
    theirs = lambda t, y, w: F.multi_margin_loss(t, y, margin=MARGIN, weight=w, reduction=reduction)  # noqa: E731
    got, want = (_torch(fn, x, y, g, weight, dtype) for fn in (_ours(reduction), theirs))
    for what, a, b in zip(("loss", "grad"), got, want):
        assert _same(a, b), f"{what}: {a[:8]} vs {b[:8]}"


@pytest.mark.parametrize("dtype,reduction,weight", _grid((np.float16, BF16), {("float16", "none", True)}))
def test_half_dtypes_equal_the_numpy_modules_torch_arithmetic(dtype, reduction, weight):
    """float16/bfloat16 (PyTorch's CPU kernel has none): the NumPy module's steps, on inputs whose
    float32 partial sums are exact (the rows are added in float64 here, in float32 there)."""
    x, y = _inputs(exact=True)
    g = _grad(reduction, len(x))
    dt = torch.bfloat16 if dtype == BF16 else torch.float16
    t = torch.tensor(x.astype(np.float32)).to(dt).requires_grad_(True)
    w = None if weight is None else torch.tensor(weight).to(dt)
    out = st.multi_margin_loss(t, torch.tensor(y), margin=MARGIN, weight=w, reduction=reduction, convention="torch")
    (gx,) = torch.autograd.grad(out, t, torch.tensor(g).to(dt))
    module = symgrad.load("multi_margin_loss", convention="torch", margin=MARGIN, weight=weight, reduction=reduction)
    want_out, saved = module.forward(x.astype(dtype), y)
    want_g = module.backward(np.asarray(g).astype(dtype), saved)[0]
    assert _same(out.detach().float().numpy(), want_out.astype(np.float32))
    assert _same(gx.float().numpy(), want_g.astype(np.float32))


def test_one_row_input_and_the_nn_module():
    """A (C,) input with a 0-d target (a 0-d loss, as F's); MultiMarginLoss with its weight buffer
    and PyTorch's default reduction 'mean'."""
    x, y = np.array([0.5, -0.5, 1.0, 0.5, 0.0]), np.array(3)  # z = 0 at 0 and 2: the kinks
    for reduction in ("none", "mean"):
        got, want = (_torch(fn, x, y, -0.5, None, np.float64) for fn in (
            _ours(reduction), lambda t, y, w: F.multi_margin_loss(t, y, margin=MARGIN, reduction=reduction)))
        assert all(_same(a, b) for a, b in zip(got, want)), (reduction, got, want)
    x, y = _inputs(64, seed=3)
    ours = st.MultiMarginLoss(margin=MARGIN, weight=torch.tensor(WEIGHT), convention="torch")
    theirs = torch.nn.MultiMarginLoss(margin=MARGIN, weight=torch.tensor(WEIGHT))
    got, want = (_torch(lambda t, y, w, m=m: m(t, y), x, y, 1.0, None, np.float64) for m in (ours, theirs))
    assert all(_same(a, b) for a, b in zip(got, want))
    assert "margin=0.75, reduction='mean', ties='first'" in repr(ours)


def test_double_backward_is_linear_in_grad_output():
    """backward is h * grad_output with h constant in the input (k piecewise constant): its
    derivative in grad_output is each row's h summed against v, in the input zero (PyTorch
    refuses multi_margin_loss_backward's derivative)."""
    x, y = _inputs(32, seed=4)
    t = torch.tensor(x, requires_grad=True)
    g = torch.tensor(np.linspace(-1, 1, 32), requires_grad=True)
    (gx,) = torch.autograd.grad(st.multi_margin_loss(t, torch.tensor(y), reduction="none", convention="torch"), t,
                              g, create_graph=True)
    v = torch.tensor(np.random.default_rng(5).standard_normal(x.shape))
    dg, dx = torch.autograd.grad(gx, (g, t), v, allow_unused=True)
    ones = torch.autograd.grad(F.multi_margin_loss(t, torch.tensor(y), reduction="none"), t,
                               torch.ones(32, dtype=torch.float64))[0]
    np.testing.assert_allclose(dg.numpy(), (ones * v).sum(1).numpy(), rtol=1e-14)
    assert dx is None or not dx.any()


def test_errors_are_one_line():
    x, y = torch.ones(2, 3), torch.tensor([0, 1])
    with pytest.raises(ValueError, match=r"^multi_margin_loss: p must be 1 \(the hinge"):
        st.multi_margin_loss(x, y, p=2)
    with pytest.raises(ValueError, match=r"^multi_margin_loss: reduction must be one of 'none', 'mean', 'sum', got 'avg'$"):
        st.MultiMarginLoss(reduction="avg")
    with pytest.raises(ValueError, match=r"^multi_margin_loss: target out of range: every class must be in \[0, 3\), got 3$"):
        st.multi_margin_loss(x, torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"^multi_margin_loss: target must be an integer array of the class per row"):
        st.multi_margin_loss(x, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"^multi_margin_loss: weight must hold one value per class \(3\)"):
        st.multi_margin_loss(x, y, weight=torch.ones(4))
    with pytest.raises(ValueError, match=r"^multi_margin_loss: input must be a float array of shape"):
        sj.multi_margin_loss(jnp.ones((2, 3, 4)), jnp.array([0, 1]))
    with pytest.raises(TypeError, match=r"^multi_margin_loss: margin must be a real number, got '1'$"):
        sj.multi_margin_loss(jnp.ones((2, 3)), jnp.array([0, 1]), margin="1")
    with pytest.raises(ValueError, match=r"^MultiMarginLoss: size_average/reduce \(deprecated\) is not supported"):
        st.MultiMarginLoss(size_average=True)


def _jnp_loss(x, y, weight, reduction):
    """F.multi_margin_loss(p=1) as a JAX user writes it (test_multi_margin30's)."""
    z = jnp.maximum(0, MARGIN - jnp.take_along_axis(x, y[:, None], 1) + x)
    if weight is not None:
        z = z * jnp.asarray(weight, x.dtype)[y][:, None]
    rows = jnp.sum(jnp.where(jnp.arange(x.shape[1]) == y[:, None], 0, z), axis=-1) / x.shape[1]
    return rows if reduction == "none" else getattr(jnp, reduction)(rows)


def _jax(fn, x, y, g):
    out, pullback = jax.vjp(lambda v: fn(v, jnp.asarray(y)), x)
    return np.asarray(out), np.asarray(pullback(jnp.asarray(g, x.dtype))[0])


@pytest.mark.parametrize("dtype,reduction,weight", _grid((np.float64, np.float32, np.float16, BF16), ()))
def test_jax_equals_the_jnp_expression(dtype, reduction, weight):
    """Bit for bit where XLA's sums are exact (the tie-heavy rows, N a power of two), for finite
    grad_output: an infinite one meets jnp.maximum's weight 0 in a product (NaN) where symgrad's
    relu selects (0, as jax.nn.relu does), the stated exception.  Slow only:
    JAX's op-by-op compiles take over 10 s on the loaded 2-core machine (test_hinge30 keeps a
    JAX preset in the default run)."""
    x, y = _inputs(exact=True)
    x = jnp.asarray(x.astype(np.float32), jnp.bfloat16 if dtype == BF16 else dtype)
    g = np.where(np.isinf(_grad(reduction, len(y))), 2.0, _grad(reduction, len(y)))
    ours = lambda v, t: sj.multi_margin_loss(v, t, margin=MARGIN, weight=weight, reduction=reduction,  # noqa: E731
                                             convention="jax")
    got, want = _jax(ours, x, y, g), _jax(lambda v, t: _jnp_loss(v, t, weight, reduction), x, y, g)
    for what, a, b in zip(("loss", "grad"), got, want):
        assert _same(a.astype(np.float64), b.astype(np.float64)), what


@SLOW
def test_jit_grad_vmap_and_no_callback():
    x, y = _inputs(16, exact=True)
    x, y = jnp.asarray(x), jnp.asarray(y)
    ours = jax.grad(lambda v: sj.multi_margin_loss(v, y, margin=MARGIN, weight=WEIGHT, convention="jax"))
    want = jax.grad(lambda v: _jnp_loss(v, y, WEIGHT, "mean"))(x)
    assert _same(jax.jit(ours)(x), want)
    assert "callback" not in str(jax.make_jaxpr(ours)(x))
    rows = jax.vmap(lambda v, t: sj.multi_margin_loss(v, t, margin=MARGIN, convention="jax"))(x, y)  # a row each
    assert _same(rows, jax.vmap(lambda v, t: _jnp_loss(v[None], t[None], None, "mean"))(x, y))


@SLOW
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_the_nn_module_under_torch_compile_fullgraph(reduction):
    """Compiled before any eager call (the op made in the constructor): F's loss and gradient bit
    for bit, on random rows whose sums round."""
    x, y = _inputs(128, seed=6)
    module = st.MultiMarginLoss(margin=MARGIN, weight=torch.tensor(WEIGHT), reduction=reduction, convention="torch")
    compiled = torch.compile(module, fullgraph=True)
    def theirs(t, y, w):
        return F.multi_margin_loss(t, y, margin=MARGIN, weight=torch.tensor(WEIGHT), reduction=reduction)
    g = _grad(reduction, len(y))
    got = _torch(lambda t, y, w: compiled(t, y), x, y, g, None, np.float64)
    want = _torch(theirs, x, y, g, None, np.float64)
    assert all(_same(a, b) for a, b in zip(got, want))
