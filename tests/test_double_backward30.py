"""Double backward of the ops smooth between their kinks (issue 30): hardswish, elu, celu in
symgrad.torch (torch.autograd.grad with create_graph=True) and symgrad.jax (grad-of-grad, jit,
vmap, hessian), symgrad/curvature.py.

Oracles: PyTorch 2.13's own double backward (convention='torch') and JAX's (convention='jax') on
the CPU, on the kinks, +-0, +-inf, NaN, exp's overflow and random points, with finite, zero and
infinite g: bit for bit (the sign of a zero included) but for exp's smooth piece of elu/celu
(finite x < 0), which is within test_elu30's ulps (PyTorch's exp is SLEEF's or libm's, the
preset's backward NumPy's or torch's).  JAX's jax.nn.celu is max(x, 0) + alpha * expm1(min(x, 0) /
alpha): at x = +-0 its min/max split the tie twice (a quarter of the exp piece's value) and for
x > 0 an infinite g meets a weight 0 (NaN) and a zero's sign is its sum's; the preset keeps the where() form of its first derivative
(test_elu30), so those points are the stated exceptions.  Under each tie policy: SymPy's second
derivative of the README's definition on each region, and at a kink the README's policy weights
times each region's.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from symgrad.policy import POLICIES

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import symgrad.jax as sj  # noqa: E402
import symgrad.torch as st  # noqa: E402

SLOW = pytest.mark.slow
SPECIALS = [-np.inf, -1000.0, -20.0, -3.0, -1.5, -0.5, -0.0, 0.0, 0.5, 3.0, 100.0, 1000.0, np.inf, np.nan]
GRADS = [2.0, -0.5, 0.0, np.inf]
# (op, params, PyTorch, JAX)
CASES = [("hardswish", {}, F.hardswish, jax.nn.hard_swish),
         ("elu", {"alpha": 2.5}, lambda t: F.elu(t, 2.5), lambda x: jax.nn.elu(x, 2.5)),
         ("celu", {"alpha": 0.5}, lambda t: F.celu(t, 0.5), lambda x: jax.nn.celu(x, 0.5))]
ULPS = {np.float64: 3, np.float32: 4}  # test_elu30's PyTorch bound (JAX's is wider: (5, 3), (7, 3))
JAX_ULPS = {np.float64: 5, np.float32: 7}


def _same(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nan = np.isnan(a)
    return (nan == np.isnan(b)) & (nan | ((a == b) & (np.signbit(a) == np.signbit(b))))


def _points(dtype, n=300):
    """(x, g, v): every special x with every g, then random points below 3 (mostly the exp piece)."""
    rng = np.random.default_rng(7)
    x = np.concatenate([np.repeat(SPECIALS, len(GRADS)), rng.uniform(-12, 3, n)])
    g = np.concatenate([np.tile(GRADS, len(SPECIALS)), rng.uniform(-3, 3, n)])
    v = rng.uniform(-3, 3, x.size)
    return x.astype(dtype), g.astype(dtype), v.astype(dtype)


def _torch_dd(fn, x, g, v, strided=False):
    """PyTorch's double backward; strided: on every other element of a tensor twice as long (its
    scalar path: elu's SIMD lanes give NaN at NaN, its scalar path and the preset 0)."""
    base = torch.tensor(np.repeat(x, 2) if strided else x, requires_grad=True)
    t = base[::2] if strided else base
    (gx,) = torch.autograd.grad(fn(t), t, torch.tensor(g), create_graph=True)
    return torch.autograd.grad(gx, t, torch.tensor(v))[0].numpy()


def _jax_dd(fn, x, g, v):
    def grad(z):
        return jax.vjp(fn, z)[1](jnp.asarray(g))[0]
    return np.asarray(jax.vjp(grad, jnp.asarray(x))[1](jnp.asarray(v))[0])


def _check(got, want, exact, ulps, what):
    ok = _same(got, want)
    assert ok[exact].all(), f"{what}: {got[exact & ~ok][:5]} vs {want[exact & ~ok][:5]}"
    with np.errstate(invalid="ignore"):
        close = np.abs(got - want) <= ulps * np.spacing(np.abs(want))
    assert (ok | close).all(), f"{what}: beyond {ulps} ulps: {got[~(ok | close)][:5]} vs {want[~(ok | close)][:5]}"


def _smooth(op, x):
    """Where the exp piece is computed (elu/celu's finite x < 0): within ulps; elsewhere exact."""
    return (op != "hardswish") & np.isfinite(x) & (x < 0)


def _grid(default):
    """(case, dtype) pairs, all but ``default`` (op, dtype) @pytest.mark.slow."""
    return [pytest.param(c, d, id=f"{c[0]}-{np.dtype(d).name}", marks=() if (c[0], d) == default else SLOW)
            for c in CASES for d in (np.float64, np.float32)]


@pytest.mark.parametrize("case,dtype", _grid(("elu", np.float64)))
def test_torch_preset_equals_pytorchs_double_backward(case, dtype):
    op, params, theirs, _ = case
    x, g, v = _points(dtype)
    got = _torch_dd(st.op(op, convention="torch", **params), x, g, v)
    for strided in (True, False):
        want = _torch_dd(theirs, x, g, v, strided)
        if not strided and op != "hardswish":  # the SIMD lanes: NaN at NaN
            assert np.isnan(want[np.isnan(x)]).all()
            want = np.where(np.isnan(x), got, want)
        _check(got, want, ~_smooth(op, x), ULPS[dtype], f"{op} {np.dtype(dtype).name} strided={strided}")


@pytest.mark.parametrize("case,dtype", _grid(("celu", np.float32)))
def test_the_torch_backend_path_equals_pytorchs_double_backward(case, dtype):
    """The torch backend's autograd.Functions (off the CPU eagerly, and the one torch.compile
    traces; called here on CPU tensors): their backward's derivative is curvature.py's, as the
    eager path's, not autograd's of the generated code (NaN where exp overflows off its piece,
    the exp piece's value at +-0)."""
    op, params, theirs, _ = case
    x, g, v = _points(dtype)
    fn = st.op(op, convention="torch", **params)
    want = _torch_dd(theirs, x, g, v, strided=True)
    for k in (0, 1):  # (the eager form, with forward-mode AD; the traced form)
        got = _torch_dd(fn._native[k].apply, x, g, v)
        _check(got, want, ~_smooth(op, x), ULPS[dtype], f"{op} {np.dtype(dtype).name} native {k}")


@pytest.mark.parametrize("case,dtype", _grid(None))
def test_jax_preset_equals_jaxs_grad_of_grad(case, dtype):
    op, params, _, theirs = case
    x, g, v = _points(dtype)
    got, want = _jax_dd(sj.op(op, convention="jax", **params), x, g, v), _jax_dd(theirs, x, g, v)
    exact = ~_smooth(op, x)
    if op == "celu":  # the stated exceptions: x = +-0 (a quarter in JAX), infinite g off 0 (NaN in JAX)
        zero, inf_g = x == 0, (x != 0) & np.isinf(g) & ~(x < 0)
        np.testing.assert_array_equal(want[zero & np.isfinite(g)], got[zero & np.isfinite(g)] / 4)
        assert np.isnan(want[inf_g & (x > 0)]).all() and (got[inf_g & (x > 0)] == 0).all()
        linear = (x > 0) & ~inf_g  # 0 in both, -0 or +0 in JAX (its sum of two weighted terms)
        assert (got[linear] == 0).all() and (want[linear] == 0).all()
        keep = ~zero & ~inf_g & ~linear
        got, want, exact, x = got[keep], want[keep], exact[keep], x[keep]
    _check(got, want, exact, JAX_ULPS[dtype], f"{op} {np.dtype(dtype).name}")


def _definition(op, alpha=2.0):
    """(the pieces' values as SymPy expressions of x, the region of x: piece index or a kink)."""
    x = sp.Symbol("x", real=True)
    if op == "hardswish":
        return x, [sp.S.Zero, x * (x + 3) / 6, x]
    s = alpha if op == "celu" else 1
    return x, [alpha * (sp.exp(x / s) - 1), x]


# the README's policy weights of a tie between two pieces: (the first's, the second's)
WEIGHTS = {"first": (1, 0), "last": (0, 1), "split": (0.5, 0.5), "all": (1, 1)}


def _second(op, at, ties, alpha=2.0):
    """v * g * f''(at) (v = g = 1) from SymPy on each region; at a kink the policy's weights."""
    x, pieces = _definition(op, alpha)
    d2 = [float(sp.diff(p, x, 2).subs(x, at)) for p in pieces]
    if op == "hardswish":  # Min(3, Max(-3, x)): the bound is the first piece of each node
        if at in (-3.0, 3.0):
            w_bound, w_x = WEIGHTS[ties]
            return w_x * d2[1]  # the middle region's weight; the bounds' regions have f'' = 0
        return d2[0] if at < -3 else d2[1] if at < 3 else d2[2]
    if at == 0:  # Max(0, x): the exp piece (0's) first
        w0, w1 = WEIGHTS[ties]
        return w0 * d2[0] + w1 * d2[1]
    return d2[0] if at < 0 else d2[1]


@pytest.mark.parametrize("op,ties", [pytest.param(o, t, marks=SLOW)
                                     for o in ("hardswish", "elu", "celu") for t in POLICIES])
def test_every_policy_follows_sympy_and_the_definition(op, ties):
    """symgrad.torch and symgrad.jax: SymPy's second derivative on each region, the policy's
    weights at the kinks (0 for elu/celu, -3 and 3 for hardswish), no NaN where exp overflows
    off its region."""
    params = {} if op == "hardswish" else {"alpha": 2.0}
    x = np.array([-7.0, -3.0, -2.0, -0.5, -0.0, 0.0, 0.7, 3.0, 4.0, 800.0])
    ones = np.ones_like(x)
    want = np.array([_second(op, a, ties) for a in x])
    fn = st.op(op, ties=ties, **params)
    got_t = _torch_dd(fn, x, ones, ones)
    np.testing.assert_array_equal(_torch_dd(fn._native[1].apply, x, ones, ones), got_t)  # the torch backend path
    got_j = _jax_dd(sj.op(op, ties=ties, **params), x, ones, ones)
    np.testing.assert_allclose(got_t, want, rtol=1e-14, atol=0, err_msg=f"torch {op} {ties}")
    np.testing.assert_allclose(got_j, want, rtol=1e-14, atol=0, err_msg=f"jax {op} {ties}")


def test_jitted_grad_of_grad_equals_jax_on_the_specials():
    """jax.jit(grad-of-grad) of elu's jax preset against JAX's at 0, +-0, +-inf and NaN (the
    default run's; every op and dtype on more points: test_jax_preset_equals_jaxs_grad_of_grad)."""
    x = jnp.asarray(SPECIALS)
    for op, params, _, theirs in CASES[1:2]:
        ours = sj.op(op, convention="jax", **params)
        got, want = (jax.jit(jax.grad(lambda z, f=f: jax.grad(lambda u: f(u).sum())(z).sum()))(x)
                     for f in (ours, theirs))
        assert _same(got, want).all(), (op, got, want)


@SLOW
def test_jax_transformations_and_third_order():
    """grad-of-grad under jit, vmap of it, jax.hessian (forward over reverse) and jacfwd twice agree;
    symgrad.torch's double backward is differentiable again (create_graph), as PyTorch's."""
    f = sj.op("elu", convention="jax", alpha=2.5)
    x = jnp.array([-2.0, -0.5, 0.0, 1.5])
    want = _jax_dd(lambda z: jax.nn.elu(z, 2.5), np.asarray(x), np.ones(4), np.ones(4))
    dd = jax.grad(lambda z: jax.grad(lambda u: f(u).sum())(z).sum())
    np.testing.assert_allclose(jax.jit(dd)(x), want, rtol=1e-15)
    np.testing.assert_allclose(jax.vmap(jax.grad(jax.grad(f)))(x), want, rtol=1e-15)
    np.testing.assert_allclose(np.diag(jax.hessian(lambda z: f(z).sum())(x)), want, rtol=1e-15)
    np.testing.assert_allclose(np.diag(jax.jacfwd(jax.jacfwd(lambda z: f(z).sum()))(x)), want, rtol=1e-15)
    ours, theirs = st.op("celu", convention="torch", alpha=0.5), (lambda t: F.celu(t, 0.5))
    third = []
    for fn in (ours, theirs):
        t = torch.tensor([-2.0, -0.5, 1.0], dtype=torch.float64, requires_grad=True)
        (g1,) = torch.autograd.grad(fn(t).sum(), t, create_graph=True)
        (g2,) = torch.autograd.grad(g1.sum(), t, create_graph=True)
        third.append(torch.autograd.grad(g2.sum(), t)[0].numpy())
    np.testing.assert_allclose(*third, rtol=1e-14)
