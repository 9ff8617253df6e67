"""hardswish (issue 30): x * (min(max(x, -3), 3) + 3) / 6, its output and gradient per region of
the max/min (regions.Regions).

Oracles: PyTorch 2.13 (F.hardswish: its scalar path on a strided view, its SIMD lanes on a
contiguous tensor) and JAX (jax.nn.hard_swish) on the CPU under the presets, bit for bit (the sign
of a zero included, any NaN equal to any NaN) in float64/32/16 and bfloat16 on the kinks, their
neighbours, +-0, +-inf, NaN and random points; the documented exceptions (conventions.py) checked
to be exactly where and as large as stated.  A brute-force walk through the two max/min nodes from
the README's policy definitions under every policy; symgrad.check under every policy and a planted
wrong kink value it must catch; central finite differences against F.hardswish away from the kinks;
the cpu and torch backends against the NumPy module.
"""

from __future__ import annotations

import shutil

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
SPECIALS = [-np.inf, -7.0, -3.0, -1.5, -0.5, -0.0, 0.0, 0.5, 2.5, 3.0, 6.0, np.inf, np.nan]
GRADS = [-1.0, 0.5, -0.0, 0.0, 3.0, 0.1, 2.0, np.inf]


def _same(a, b):
    a, b = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    nan = np.isnan(a)
    return (nan == np.isnan(b)) & (nan | ((a == b) & (np.signbit(a) == np.signbit(b))))


def _inputs(dtype, n_random=600):
    """SPECIALS and the floats next to -3 and 3 in the dtype, each with every gradient, and random
    points with random gradients."""
    kinks = np.array([-3.0, 3.0]).astype(dtype)
    near = [np.nextafter(kinks.astype(np.float32), d).astype(dtype) for d in (-np.inf, np.inf)] \
        if dtype == BF16 else [np.nextafter(kinks, d) for d in (-np.inf, np.inf)]
    pts = np.concatenate([np.array(SPECIALS).astype(dtype), *near])
    rng = np.random.default_rng(3)
    x = np.concatenate([np.repeat(pts, len(GRADS)), rng.uniform(-4, 4, n_random).astype(dtype)])
    g = np.concatenate([np.tile(np.array(GRADS), pts.size), rng.uniform(-3, 3, n_random)]).astype(dtype)
    return x, g


def _ours(module, x, g):
    y, saved = module.forward(x)
    (gx,) = module.backward(g, saved)
    return y, gx


def _torch(x, g, contiguous):
    dt = torch.bfloat16 if x.dtype == BF16 else getattr(torch, np.dtype(x.dtype).name)
    back = lambda v: v.detach().to(torch.float64).numpy().astype(x.dtype)  # noqa: E731 (exact)
    if contiguous:  # SIMD lanes
        t = torch.tensor(x.astype(np.float64)).to(dt).requires_grad_()
        y = F.hardswish(t)
        y.backward(torch.tensor(g.astype(np.float64)).to(dt))
        return back(y), back(t.grad)
    base = torch.tensor(np.repeat(x.astype(np.float64), 2)).to(dt).requires_grad_()
    view = base[::2]  # a strided view: PyTorch's scalar path
    y = F.hardswish(view)
    y.backward(torch.tensor(g.astype(np.float64)).to(dt))
    return back(y), back(base.grad[::2])


def _jax(x, g):
    dt = jnp.bfloat16 if x.dtype == BF16 else x.dtype
    y, pullback = jax.vjp(jax.nn.hard_swish, jnp.asarray(x, dt))
    (gx,) = pullback(jnp.asarray(g, dt))
    return np.asarray(y).astype(x.dtype), np.asarray(gx).astype(x.dtype)


def _ulp(v, dtype):
    """The spacing of the dtype at |v| (bfloat16: 2**-7 of its binade)."""
    v = np.abs(np.asarray(v, np.float64))
    if dtype == BF16:
        return np.exp2(np.floor(np.log2(np.maximum(v, 2.0 ** -126))) - 7)
    return np.spacing(v.astype(dtype)).astype(np.float64)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_torch_preset_equals_pytorch_bit_for_bit(dtype):
    """The scalar path everywhere; the SIMD lanes everywhere but the gradient at NaN (NaN there,
    the scalar path's g: the preset's, documented)."""
    x, g = _inputs(dtype)
    got = _ours(symgrad.load("hardswish", convention="torch"), x, g)
    for contiguous in (False, True):
        want = _torch(x, g, contiguous)
        for what, a, b in zip(("forward", "grad"), got, want):
            ok = _same(a, b)
            if contiguous and what == "grad":
                assert (np.isnan(b) & ~np.isnan(a) == ~ok).all() and (np.isnan(x) == ~ok).all()
                continue
            assert ok.all(), (f"{np.dtype(dtype).name} contiguous={contiguous} {what}: at x={x[~ok][:6]}, "
                              f"g={g[~ok][:6]}: got {a[~ok][:6]}, want {b[~ok][:6]}")


@pytest.mark.parametrize("dtype", [pytest.param(np.float64, marks=pytest.mark.slow), np.float32,
                                   np.float16, pytest.param(BF16, marks=pytest.mark.slow)],
                         ids=lambda d: np.dtype(d).name)
def test_jax_preset_equals_jax_within_the_documented_exceptions(dtype):
    """float16: bit for bit.  float32/float64: the forward and, off the middle region and at the
    kinks and specials, the gradient bit for bit; in the middle XLA's fused multiply-add of g * hs
    and the select, which the preset rounds apart, within half an ulp of g * hs plus one of the
    result.  bfloat16: XLA multiplies by 1/6 held in float32 (the preset: 1/6 in bfloat16), within
    2 bfloat16 ulps of the output and 4 of the gradient's larger term |g| * (hs + |x| / 6) (measured
    on 200,000 random points: 2 and 3)."""
    x, g = _inputs(dtype)
    (y, gx), (jy, jg) = _ours(symgrad.load("hardswish", convention="jax"), x, g), _jax(x, g)
    xf, gf = x.astype(np.float64), g.astype(np.float64)
    middle = (xf + 3 > 0) & (xf + 3 < 6) & np.isfinite(gf)
    exact_y, exact_g = _same(y, jy), _same(gx, jg)
    if dtype == np.float16:
        assert exact_y.all() and exact_g.all()
        return
    hs = np.minimum(np.maximum(xf + 3, 0), 6) / 6
    off = ~exact_g
    if dtype == BF16:
        with np.errstate(invalid="ignore"):
            term = np.abs(gf) * (hs + np.abs(xf) / 6)
        for a, b, scale, ulps, ok in ((y, jy, jy, 2, exact_y), (gx, jg, term, 4, exact_g)):
            diff = np.abs(a[~ok].astype(np.float64) - b[~ok].astype(np.float64))
            assert (diff <= ulps * _ulp(scale[~ok], BF16)).all()
        assert not exact_y.all() and not exact_g.all()  # the exception is real
        return
    assert exact_y.all()
    assert exact_g[~middle].all(), x[~middle & ~exact_g]
    with np.errstate(invalid="ignore"):  # (inf * 0 where g or x is infinite: not in the middle)
        bound = _ulp(gf * hs, dtype) / 2 + _ulp(jg, dtype)
    assert (np.abs(gx[off].astype(np.float64) - jg[off].astype(np.float64)) <= bound[off]).all()
    assert off.any()  # the fused multiply-add is real


def _node(kind, p, q, dp, dq, ties):
    """One max/min of two pieces as the README defines the policies (a NaN beats a number)."""
    beats = (lambda a, b: a > b) if kind == "max" else (lambda a, b: a < b)
    if np.isnan(p) != np.isnan(q):
        return (p, dp) if np.isnan(p) else (q, dq)
    if not np.isnan(p) and beats(p, q):
        return p, dp
    if not np.isnan(p) and beats(q, p):
        return q, dq
    wp, wq = {"first": (1, 0), "last": (0, 1), "split": (0.5, 0.5), "all": (1, 1)}[ties]
    return p, wp * dp + wq * dq


@pytest.mark.parametrize("ties", POLICIES)
def test_every_policy_follows_the_definition(ties):
    """min(3, max(-3, x)) node by node, each piece carrying its region's derivative (0 for -3,
    x/3 + 1/2 for x, 1 for 3), the output x * (u + 3) / 6."""
    x = np.array([v for v in SPECIALS if np.isfinite(v)] + [-4.0, 1.0, -2.9])
    y, gx = _ours(symgrad.load("hardswish", ties=ties), x, np.ones_like(x))
    for i, v in enumerate(x):
        u, du = _node("max", -3.0, v, 0.0, v / 3 + 0.5, ties)
        u, du = _node("min", 3.0, u, 1.0, du, ties)
        assert y[i] == v * (u + 3) / 6 and gx[i] == pytest.approx(du, rel=1e-15), (ties, v, gx[i], du)


# the checker's one-sided differences (second order) are exact on the curved piece x * (x + 3) / 6
# (a parabola): its default tolerance; the policies' kink values differ by 1/2
RTOL = 1e-6


@pytest.mark.parametrize("ties", POLICIES)
def test_check_passes_every_policy(ties):
    module = symgrad.load("hardswish", ties=ties)
    report = symgrad.check(module, np.array([-3.0, 3.0, -1.5, 0.0, 2.0, -4.0, 5.0]), modes="both", rtol=RTOL)
    assert report.ok, str(report)


def test_check_catches_a_wrong_kink_value():
    """A backward that gives both kinks the other policy's values while claiming 'first' fails."""
    ours = symgrad.load("hardswish", ties="last")
    pair = (lambda x: ours.forward(x)[0], lambda g, x: ours.backward(g, ours.forward(x)[1]))
    x = np.array([-3.0, 3.0, 1.0])
    report = symgrad.check(pair, x, ties="first", op="hardswish", rtol=RTOL)
    assert {f.index for f in report.failures if f.kind in ("tie", "kink")} == {(0,), (1,)}, str(report)
    assert symgrad.check(pair, x, ties="last", op="hardswish", rtol=RTOL).ok


def test_finite_differences_away_from_the_kinks():
    x = np.random.default_rng(5).uniform(-5, 5, 80)
    x = x[np.abs(np.abs(x) - 3) > 1e-3]
    h = 1e-6
    f = lambda v: F.hardswish(torch.tensor(v)).numpy()  # noqa: E731 (the value only)
    for settings in [{"ties": t} for t in POLICIES] + [{"convention": "torch"}, {"convention": "jax"}]:
        (gx,) = _ours(symgrad.load("hardswish", **settings), x, np.ones_like(x))[1:]
        np.testing.assert_allclose(gx, (f(x + h) - f(x - h)) / (2 * h), atol=1e-6, err_msg=str(settings))


SLOW = pytest.mark.slow


@pytest.mark.parametrize("backend,settings", [
    pytest.param("cpu", {"convention": "torch"}, marks=SLOW), pytest.param("cpu", {"convention": "jax"}, marks=SLOW),
    pytest.param("cpu", {"ties": "split"}, marks=SLOW), ("torch", {"convention": "torch"}),
    ("torch", {"convention": "jax"}), ("torch", {"ties": "split"}),
], ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_backends_equal_the_numpy_module(backend, settings):
    if backend == "cpu" and not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler")
    other, ref = symgrad.load("hardswish", backend=backend, **settings), symgrad.load("hardswish", **settings)
    for dtype in (np.float64, np.float32, np.float16):
        x, g = _inputs(dtype, 200)
        if backend == "torch":
            y, saved = other.forward(torch.tensor(x))
            got = (y.numpy(), other.backward(torch.tensor(g), saved)[0].numpy())
        else:
            got = _ours(other, x, g)
        for what, a, b in zip(("forward", "grad"), got, _ours(ref, x, g)):
            assert _same(a, b).all(), f"{backend} {settings} {np.dtype(dtype).name} {what}"
