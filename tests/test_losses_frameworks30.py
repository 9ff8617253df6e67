"""The margin losses in the frameworks (issue 30): symgrad.torch's and symgrad.jax's l1_loss,
margin_ranking_loss, hinge_embedding_loss (and torch's L1Loss, MarginRankingLoss,
HingeEmbeddingLoss), symgrad/framework_losses.py.

Oracles: torch.nn.functional's losses (convention='torch') and the jnp expressions a JAX user
writes (convention='jax': jnp.abs(a - b), jnp.maximum(0, margin - y * (a - b)),
jnp.where(t != 1, jnp.maximum(0, margin - x), 0) + jnp.where(t != -1, x, 0), under jnp.mean /
jnp.sum) on the CPU, on inputs full of ties and kinks (quarter steps), NaN, +-inf and +-0: the
loss and every input's gradient bit for bit (the sign of a zero included, any NaN equal to any
NaN), under each reduction; PyTorch's default reduction 'mean'; jit, vmap and
torch.compile(fullgraph=True); the errors.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import symgrad.jax as sj  # noqa: E402
import symgrad.torch as st  # noqa: E402

SLOW = pytest.mark.slow
REDUCTIONS = ("mean", "sum", "none")


def _inputs(dtype, n=48):
    rng = np.random.default_rng(11)
    a, b = (np.round(rng.uniform(-2, 2, n) * 4) / 4 for _ in range(2))
    a[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.5, 1.0]
    b[:6] = [0.0, 1.0, np.inf, 0.0, 0.5, np.nan]
    y = rng.choice([-1.0, 1.0], n)
    return a.astype(dtype), b.astype(dtype), y.astype(dtype)


# name: (symgrad.torch's, F's, symgrad.jax's, the jnp expression), each fn(reduction, convention)
LOSSES = {
    "l1_loss": (lambda r, c: lambda a, b, y: st.l1_loss(a, b, reduction=r, convention=c),
                lambda r: lambda a, b, y: F.l1_loss(a, b, reduction=r),
                lambda r, c: lambda a, b, y: sj.l1_loss(a, b, reduction=r, convention=c),
                lambda a, b, y: jnp.abs(a - b)),
    "margin_ranking_loss": (
        lambda r, c: lambda a, b, y: st.margin_ranking_loss(a, b, y, 0.5, reduction=r, convention=c),
        lambda r: lambda a, b, y: F.margin_ranking_loss(a, b, y, 0.5, reduction=r),
        lambda r, c: lambda a, b, y: sj.margin_ranking_loss(a, b, y, 0.5, reduction=r, convention=c),
        lambda a, b, y: jnp.maximum(0.0, 0.5 - y * (a - b))),
    "hinge_embedding_loss": (
        lambda r, c: lambda a, b, y: st.hinge_embedding_loss(a, y.detach(), 0.5, reduction=r, convention=c),
        lambda r: lambda a, b, y: F.hinge_embedding_loss(a, y.detach(), 0.5, reduction=r),
        lambda r, c: lambda a, b, y: sj.hinge_embedding_loss(a, jax.lax.stop_gradient(y), 0.5, reduction=r,
                                                             convention=c),
        lambda a, b, y: jnp.where(jax.lax.stop_gradient(y) != 1, jnp.maximum(0.0, 0.5 - a), 0.0)
        + jnp.where(jax.lax.stop_gradient(y) != -1, a, 0.0)),
}


def _same(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nan = np.isnan(a)
    return bool(((nan == np.isnan(b)) & (nan | ((a == b) & (np.signbit(a) == np.signbit(b))))).all())


def _torch(fn, xs):
    ts = [torch.tensor(x, requires_grad=True) for x in xs]
    out = fn(*ts)
    out.backward(torch.ones_like(out))
    return [out.detach().numpy()] + [t.grad.numpy() if t.grad is not None else np.zeros_like(x)
                                     for t, x in zip(ts, xs)]


def _jax(fn, xs):
    out, pullback = jax.vjp(fn, *[jnp.asarray(x) for x in xs])
    return [np.asarray(out)] + [np.asarray(v) for v in pullback(jnp.ones_like(out))]


def _reduced(expr, reduction):
    if reduction == "none":
        return expr
    return lambda *xs: getattr(jnp, reduction)(expr(*xs))


@pytest.mark.parametrize("dtype", [np.float64, pytest.param(np.float32, marks=SLOW)])
@pytest.mark.parametrize("name", [n if n == "hinge_embedding_loss" else pytest.param(n, marks=SLOW) for n in LOSSES])
def test_torch_equals_torch_nn_functional(name, dtype):
    ours, theirs = LOSSES[name][:2]
    xs = _inputs(dtype)
    for reduction in REDUCTIONS:
        got, want = _torch(ours(reduction, "torch"), xs), _torch(theirs(reduction), xs)
        for k, (a, b) in enumerate(zip(got, want)):
            assert _same(a, b), (name, reduction, k, a, b)


@SLOW
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("name", LOSSES)
def test_jax_equals_the_jnp_expression(name, dtype):
    """Each gradient bit for bit; the loss too (XLA's and NumPy's orders of these sums agree on
    these quarter-step values, where every partial sum is exact)."""
    ours, expr = LOSSES[name][2], LOSSES[name][3]
    xs = _inputs(dtype)
    for reduction in REDUCTIONS:
        got, want = _jax(ours(reduction, "jax"), xs), _jax(_reduced(expr, reduction), xs)
        for k, (a, b) in enumerate(zip(got, want)):
            assert _same(a, b), (name, reduction, k, a, b)


def test_defaults_and_errors():
    """reduction defaults to 'mean' (PyTorch's); the nn.Modules; one-line errors for a wrong
    reduction or margin."""
    a, b, y = _inputs(np.float64, 8)
    a, b = a[6:], b[6:]
    ta, tb = torch.tensor(a), torch.tensor(b)
    assert _same(st.l1_loss(ta, tb, convention="torch"), F.l1_loss(ta, tb))
    assert _same(st.L1Loss(reduction="sum", convention="torch")(ta, tb), F.l1_loss(ta, tb, reduction="sum"))
    assert _same(st.MarginRankingLoss(0.5, convention="torch")(ta, tb, torch.tensor(y[6:])),
                 F.margin_ranking_loss(ta, tb, torch.tensor(y[6:]), 0.5))
    with pytest.raises(ValueError, match=r"^l1_loss: reduction must be one of 'none', 'mean', 'sum', got 'avg'$"):
        st.l1_loss(ta, tb, reduction="avg")
    with pytest.raises(TypeError, match=r"^hinge_embedding_loss: margin must be a real number, got '1'$"):
        sj.hinge_embedding_loss(a, y[6:], "1")


@SLOW
def test_jit_and_vmap():
    a, b, _ = _inputs(np.float64, 8)
    grad = jax.grad(lambda u, v: sj.l1_loss(u, v, convention="jax"))
    want = jax.grad(lambda u, v: jnp.mean(jnp.abs(u - v)))(a, b)
    assert _same(jax.jit(grad)(a, b), want)
    assert _same(jax.vmap(grad)(a[None], b[None])[0], want)


@SLOW
def test_torch_compile_fullgraph():
    """The nn.Modules (their op made in the constructor) under torch.compile(fullgraph=True)."""
    xs = _inputs(np.float64, 16)
    modules = {"l1_loss": lambda: st.L1Loss(convention="torch"),
               "margin_ranking_loss": lambda: st.MarginRankingLoss(0.5, convention="torch"),
               "hinge_embedding_loss": lambda: st.HingeEmbeddingLoss(0.5, convention="torch")}
    for name, make in modules.items():
        module = make()
        call = (lambda a, b, y: module(a, b)) if name == "l1_loss" else \
            (lambda a, b, y: module(a, y.detach())) if name == "hinge_embedding_loss" else module
        fn = torch.compile(call, fullgraph=True)
        got, want = _torch(fn, xs), _torch(LOSSES[name][1]("mean"), xs)
        for k, (u, v) in enumerate(zip(got, want)):
            assert _same(u, v), (name, k, u, v)
