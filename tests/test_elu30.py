"""elu and celu (issue 30): W of max(0, x) times (alpha * expm1(x / s), x), s = 1 (elu) or alpha
(celu), each region's value and gradient as the framework computes them (regions.Regions).

Oracles: PyTorch 2.13 (F.elu, F.celu: its scalar path on a strided view and its SIMD lanes on a
contiguous tensor) and JAX (jax.nn.elu) on the CPU under the presets, in float64/32/16 and
bfloat16.  exp/expm1 are NumPy's in the preset, libm's or SLEEF's in PyTorch and XLA's in JAX: the
kink values (x = +-0), NaN, +-inf and the linear piece (x > 0) are bit for bit; the smooth piece is
within the bounds below (each at or above the largest difference measured on 20,000 random points
of x < 0).  A brute-force walk of max(0, x) from the README's policy
definitions under every policy; symgrad.check under every policy and a planted wrong kink value it
must catch; central finite differences against F.elu/F.celu; the torch backend against the NumPy
module within the same ulps.
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from symgrad.policy import POLICIES

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.float64, np.float32, np.float16, BF16]
SPECIALS = [-np.inf, -20.0, -3.0, -1.0, -1e-8, -0.0, 0.0, 1e-8, 0.5, 2.0, np.inf, np.nan]
GRADS = [-1.0, 0.5, -0.0, 0.0, 3.0, 2.0, np.inf, -np.inf]
# (op, alpha, PyTorch); JAX: jax.nn.elu and jax.nn.celu
CASES = [("elu", 1.0, lambda t: F.elu(t)), ("elu", 2.5, lambda t: F.elu(t, 2.5)),
         ("celu", 2.5, lambda t: F.celu(t, 2.5)), ("celu", 0.5, lambda t: F.celu(t, 0.5))]
IDS = [f"{op}-{a}" for op, a, _ in CASES]
# ulps of the smooth piece (x < 0): PyTorch (value, gradient) in ulps of its result; JAX value in
# ulps of its result, gradient in ulps of |alpha * g| ((alpha * g) * (expm1(x) + 1) cancels)
TORCH_ULPS = {np.float64: 3, np.float32: 4, np.float16: 1, BF16: 1}
JAX_ULPS = {np.float64: (5, 3), np.float32: (7, 3), np.float16: (3, 2), BF16: (2, 2)}


SLOW = pytest.mark.slow


def _grid(cases, ids, dtypes, default):
    """Every (case, dtype) pair, those outside ``default`` (case id, dtype name) @pytest.mark.slow."""
    return [pytest.param(c, d, id=f"{i}-{np.dtype(d).name}",
                         marks=() if (i, np.dtype(d).name) in default else SLOW)
            for c, i in zip(cases, ids) for d in dtypes]


def _same(a, b):
    a, b = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    nan = np.isnan(a)
    return (nan == np.isnan(b)) & (nan | ((a == b) & (np.signbit(a) == np.signbit(b))))


def _ulp(v, dtype):
    v = np.abs(np.asarray(v, np.float64))
    if dtype == BF16:
        return np.exp2(np.floor(np.log2(np.maximum(v, 2.0 ** -126))) - 7)
    with np.errstate(invalid="ignore"):
        return np.spacing(v.astype(dtype)).astype(np.float64)


def _inputs(dtype, n_random=400):
    pts = np.array(SPECIALS).astype(dtype)
    rng = np.random.default_rng(4)
    x = np.concatenate([np.repeat(pts, len(GRADS)), (-rng.exponential(3, n_random)).astype(dtype),
                        rng.uniform(-1e-3, 1e-3, n_random // 4).astype(dtype)])
    g = np.concatenate([np.tile(np.array(GRADS), pts.size), rng.uniform(-3, 3, x.size - pts.size * len(GRADS))])
    return x, g.astype(dtype)


def _ours(module, x, g):
    y, saved = module.forward(x)
    (gx,) = module.backward(g, saved)
    return y, gx


def _torch(fn, x, g, contiguous):
    dt = torch.bfloat16 if x.dtype == BF16 else getattr(torch, np.dtype(x.dtype).name)
    back = lambda v: v.detach().to(torch.float64).numpy().astype(x.dtype)  # noqa: E731 (exact)
    if contiguous:
        t = torch.tensor(x.astype(np.float64)).to(dt).requires_grad_()
        y = fn(t)
        y.backward(torch.tensor(g.astype(np.float64)).to(dt))
        return back(y), back(t.grad)
    base = torch.tensor(np.repeat(x.astype(np.float64), 2)).to(dt).requires_grad_()
    y = fn(base[::2])
    y.backward(torch.tensor(g.astype(np.float64)).to(dt))
    return back(y), back(base.grad[::2])


def _within(a, b, exact_where, ulps, scale, dtype, what):
    """Bit for bit where exact_where holds, else within ulps of the dtype's spacing at scale."""
    ok = _same(a, b)
    assert ok[exact_where].all(), f"{what}: at {np.flatnonzero(exact_where & ~ok)[:6]}: {a[exact_where & ~ok][:6]} vs {b[exact_where & ~ok][:6]}"
    with np.errstate(invalid="ignore"):  # (inf - inf, NaN: where ok holds)
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        assert (ok | (diff <= ulps * _ulp(scale, dtype))).all(), f"{what}: beyond {ulps} ulps"


@pytest.mark.parametrize("case,dtype", _grid(CASES, IDS, DTYPES, {("elu-2.5", "float32"), ("celu-2.5", "bfloat16"),
                                                                ("celu-0.5", "float16"), ("elu-1.0", "float64")}))
def test_torch_preset_equals_pytorch(case, dtype):
    op, alpha, fn = case
    x, g = _inputs(dtype)
    got = _ours(symgrad.load(op, convention="torch", alpha=alpha), x, g)
    xf = x.astype(np.float64)
    exact = ~(np.isfinite(xf) & (xf < 0))  # 0, -0, NaN, +-inf and x > 0
    for contiguous in (False, True):
        want = _torch(fn, x, g, contiguous)
        for what, a, b in zip(("forward", "grad"), got, want):
            simd_nan = contiguous and what == "grad"  # its SIMD lanes: NaN at NaN (the preset: g)
            if simd_nan:
                assert np.isnan(b[np.isnan(x)]).all() and _same(a, g)[np.isnan(x)].all()
            keep = ~np.isnan(x) if simd_nan else np.ones(x.shape, bool)
            _within(a[keep], b[keep], exact[keep], TORCH_ULPS[dtype], b[keep], dtype,
                    f"{op} {alpha} {np.dtype(dtype).name} contiguous={contiguous} {what}")


JAX_CASES = [("elu", 1.0), ("elu", 2.5), ("celu", 2.5), ("celu", 0.5)]


@pytest.mark.parametrize("case,dtype", _grid(JAX_CASES, ["elu-1.0", "elu-2.5", "celu-2.5", "celu-0.5"], DTYPES,
                                             {("elu-2.5", "float32"), ("celu-0.5", "float16")}))
def test_jax_preset_equals_jax(case, dtype):
    """jax.nn.elu; jax.nn.celu (max(x, 0) + alpha * expm1(min(x, 0) / alpha)) against the preset's
    where() form, which differs exactly at the output at x = -0 (+0 in JAX) and the gradient where
    x != 0 and g = +-inf (NaN in JAX: g times the other node's weight 0)."""
    op, alpha = case
    x, g = _inputs(dtype)
    got = _ours(symgrad.load(op, convention="jax", alpha=alpha), x, g)
    jd = jnp.bfloat16 if dtype == BF16 else dtype
    y, pullback = jax.vjp(lambda v: getattr(jax.nn, op)(v, alpha), jnp.asarray(x, jd))
    want = np.asarray(y).astype(dtype), np.asarray(pullback(jnp.asarray(g, jd))[0]).astype(dtype)
    xf = x.astype(np.float64)
    exact = ~(np.isfinite(xf) & (xf < 0))
    if op == "celu":
        # JAX's g * 0 (the max's or min's weight off x = 0) is NaN for an infinite g
        zero, inf_g = (xf == 0) & np.signbit(xf), (xf != 0) & np.isinf(g.astype(np.float64))
        assert (want[0][zero] == 0).all() and not np.signbit(want[0][zero].astype(np.float64)).any()
        assert inf_g.any() and np.isnan(want[1][inf_g]).all() and _same(got[1], g)[inf_g & (xf > 0)].all()
        keep = ~zero & ~inf_g
        x, g, xf, exact = x[keep], g[keep], xf[keep], exact[keep]
        got, want = (got[0][keep], got[1][keep]), (want[0][keep], want[1][keep])
    uy, ug = JAX_ULPS[dtype]
    _within(got[0], want[0], exact, uy, want[0], dtype, "forward")
    _within(got[1], want[1], exact, ug, alpha * g.astype(np.float64), dtype, "grad")


def test_the_kink_values_are_the_frameworks():
    """At x = 0 (and -0): alpha in PyTorch's elu and JAX's (the exp piece, x <= 0), 1 in celu; at
    NaN g (PyTorch) and NaN (JAX); 0 at -inf, g at +inf."""
    x = np.array([0.0, -0.0, np.nan, -np.inf, np.inf])
    for op, alpha, want_t in (("elu", 2.5, [2.5, 2.5, 1, 0, 1]), ("celu", 2.5, [1, 1, 1, 0, 1])):
        gx = _ours(symgrad.load(op, convention="torch", alpha=alpha), x, np.ones_like(x))[1]
        np.testing.assert_array_equal(gx, want_t)
    gx = _ours(symgrad.load("elu", convention="jax", alpha=2.5), x, np.ones_like(x))[1]
    np.testing.assert_array_equal(gx, [2.5, 2.5, np.nan, 0, 1])


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op", ["elu", "celu"])
def test_every_policy_follows_the_definition(op, ties):
    """max(0, x), the 0 piece carrying alpha * expm1(x / s) and its derivative exp(x / s) * alpha / s,
    the x piece x and 1, as the README's policies weigh them at the tie x = 0."""
    alpha = 2.0
    s = alpha if op == "celu" else 1.0
    x = np.array([-3.0, -0.5, -0.0, 0.0, 0.5, 2.0])
    y, gx = _ours(symgrad.load(op, ties=ties, alpha=alpha), x, np.ones_like(x))
    w0, w1 = {"first": (1, 0), "last": (0, 1), "split": (0.5, 0.5), "all": (1, 1)}[ties]
    for i, v in enumerate(x):
        d0, d1 = alpha / s * np.exp(v / s), 1.0
        want = d0 if v < 0 else d1 if v > 0 else w0 * d0 + w1 * d1
        assert gx[i] == pytest.approx(want, rel=1e-15), (op, ties, v)
        assert y[i] == pytest.approx(alpha * np.expm1(v / s) if v < 0 else v, rel=1e-15)


RTOL = 1e-6  # the checker's default: its second-order one-sided differences on exp's curve are off
# by about step**2 * alpha / 3 (3e-8 at alpha = 2), its first-order ones were off by step * alpha / 2


@pytest.mark.parametrize("ties", POLICIES)
def test_check_passes_every_policy(ties):
    report = symgrad.check(symgrad.load("elu", ties=ties, alpha=2.0), np.array([0.0, -1.0, 0.5, -0.25]),
                           modes="both", rtol=RTOL)
    assert report.ok, str(report)


def test_check_catches_a_wrong_kink_value():
    """elu(alpha=2) at 0: 2 under 'first', 1 under 'last'; the other's backward claimed is caught."""
    ours = symgrad.load("elu", ties="last", alpha=2.0)
    pair = (lambda x: ours.forward(x)[0], lambda g, x: ours.backward(g, ours.forward(x)[1]))
    x = np.array([0.0, -1.0])
    report = symgrad.check(pair, x, ties="first", op="elu", params={"alpha": 2.0}, rtol=RTOL)
    assert [f.index for f in report.failures if f.kind in ("tie", "kink")] == [(0,)], str(report)
    assert symgrad.check(pair, x, ties="last", op="elu", params={"alpha": 2.0}, rtol=RTOL).ok


@pytest.mark.parametrize("case", [c if i == "celu-0.5" else pytest.param(c, marks=SLOW) for c, i in zip(CASES, IDS)],
                         ids=IDS)
def test_finite_differences_away_from_the_kink(case):
    op, alpha, fn = case
    x = np.random.default_rng(6).uniform(-4, 3, 60)
    x = x[np.abs(x) > 1e-3]
    h = 1e-6
    f = lambda v: fn(torch.tensor(v)).numpy()  # noqa: E731
    for settings in [{"ties": t} for t in POLICIES] + [{"convention": "torch"}]:
        gx = _ours(symgrad.load(op, alpha=alpha, **settings), x, np.ones_like(x))[1]
        np.testing.assert_allclose(gx, (f(x + h) - f(x - h)) / (2 * h), rtol=1e-6, atol=1e-7)


def test_torch_backend_within_the_ulps_of_the_numpy_module():
    """torch.exp/expm1 are SLEEF's: the torch backend's module equals the NumPy module at the kink,
    NaN, +-inf and x > 0 and within PyTorch's ulps on the smooth piece."""
    for op in ("elu", "celu"):
        other, ref = (symgrad.load(op, convention="torch", alpha=2.5, backend=b) for b in ("torch", "numpy"))
        for dtype in (np.float64, np.float32):
            x, g = _inputs(dtype, 200)
            y, saved = other.forward(torch.tensor(x))
            got = (y.numpy(), other.backward(torch.tensor(g), saved)[0].numpy())
            xf = x.astype(np.float64)
            for what, a, b in zip(("forward", "grad"), got, _ours(ref, x, g)):
                _within(a, b, ~(np.isfinite(xf) & (xf < 0)), TORCH_ULPS[dtype], b, dtype, f"{op} {what}")


def test_alpha_errors_are_one_line():
    with pytest.raises(ValueError, match=r"^celu: alpha must be non-zero, got 0.0$"):
        symgrad.load("celu", alpha=0.0)
    with pytest.raises(ValueError, match=r"^elu: alpha must be finite \(within the float64 range\), got inf$"):
        symgrad.load("elu", alpha=float("inf"))
