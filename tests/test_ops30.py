"""fmax/fmin (issue 30): the NaN-ignoring max/min under the NaN rule 'lose'.

Oracles: PyTorch 2.13 (torch.fmax/fmin) and JAX (jnp.fmax/fmin) on the CPU under the presets, bit
for bit (the sign of a zero included, any NaN equal to any NaN) in float64/32/16 and bfloat16,
forward and backward, on every pair of tie-heavy specials (NaN, +-inf, +-0) and broadcast shapes;
a brute-force loop written from the README's definition of 'lose' (a NaN loses to every number;
where both operands are NaN the first keeps the gradient) under every tie policy; symgrad.check
under every policy, and a planted wrong tie value it must catch; central finite differences away
from ties; the cpu backend against the NumPy module.
"""

from __future__ import annotations

import itertools
import shutil

import numpy as np
import pytest

import symgrad
from conftest import assert_same_values, same_values
from symgrad.policy import POLICIES

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
SPECIALS = [-np.inf, -1.0, -0.0, 0.0, 0.5, 1.0, np.inf, np.nan]
# every ordered pair of specials: ties of numbers, of +-0, of infinities and of NaNs, and each NaN
# against each number on either side
PAIRS = np.array(list(itertools.product(SPECIALS, SPECIALS))).T
GRADS = [-1.0, 0.5, -0.0, 0.0, 3.0, 0.1]  # 0.1: a rounding gradient (broadcast sums)
DTYPES = [np.float64, np.float32, np.float16, BF16]
OPS = ("fmax", "fmin")


def _inputs(dtype, rng, broadcast):
    if broadcast:  # (3, 1) against (4,): b's gradient is a sum over 3 rows, a's over 4 columns
        a = rng.choice(SPECIALS + [0.1, 1.0], size=(3, 1))
        b = rng.choice(SPECIALS + [0.1, 1.0], size=(4,))
        g = rng.choice(GRADS, size=(3, 4))
    else:
        a, b = PAIRS
        g = np.resize(np.array(GRADS), a.shape)
    return a.astype(dtype), b.astype(dtype), g.astype(dtype)


def _torch_dtype(dtype):
    return torch.bfloat16 if dtype == BF16 else {np.float64: torch.float64, np.float32: torch.float32,
                                                 np.float16: torch.float16}[dtype]


def _torch(name, a, b, g):
    dt = _torch_dtype(a.dtype.type if a.dtype != BF16 else BF16)
    ta, tb = (torch.tensor(v.astype(np.float64)).to(dt).requires_grad_() for v in (a, b))
    y = getattr(torch, name)(ta, tb)
    y.backward(torch.tensor(g.astype(np.float64)).to(dt))
    back = lambda t: t.detach().to(torch.float64).numpy().astype(a.dtype)  # noqa: E731 (exact)
    return back(y), back(ta.grad), back(tb.grad)


def _jax(name, a, b, g):
    dt = jnp.bfloat16 if a.dtype == BF16 else a.dtype
    y, pullback = jax.vjp(getattr(jnp, name), jnp.asarray(a, dt), jnp.asarray(b, dt))
    ga, gb = pullback(jnp.asarray(g, dt))
    return tuple(np.asarray(v).astype(a.dtype) for v in (y, ga, gb))


def _ours(module, a, b, g):
    y, saved = module.forward(a, b)
    return (y,) + tuple(module.backward(g, saved))


@pytest.mark.parametrize("broadcast", [False, True], ids=["pairs", "broadcast"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("convention", ["torch", "jax"])
@pytest.mark.parametrize("name", OPS)
def test_presets_equal_the_frameworks_bit_for_bit(name, convention, dtype, broadcast):
    rng = np.random.default_rng(sum(map(ord, f"{name}{convention}{dtype}")))
    module = symgrad.load(name, convention=convention)
    framework = _torch if convention == "torch" else _jax
    for _ in range(4 if broadcast else 1):
        a, b, g = _inputs(dtype, rng, broadcast)
        if convention == "jax" and broadcast:
            # the documented exception (README): a broadcast input's summed gradient can differ
            # from JAX's in its last bits (its order of the sum); exact sums here (routing, signs)
            g = np.where(np.isclose(np.abs(g.astype(np.float64)), 0.1, rtol=0.01), 0.5, g).astype(dtype)
        got, want = _ours(module, a, b, g), framework(name, a, b, g)
        if convention == "torch" and dtype == BF16:
            # the documented exception (README, conventions.py): PyTorch's bfloat16 fmax/fmin
            # return the second of +0 and -0, every other dtype the first; the preset follows
            # those. Compared with the sign of those zeros left out, and checked to be that case
            zero_tie = np.broadcast_to((a == 0) & (b == 0), got[0].shape)
            second = np.broadcast_to(b.astype(np.float64), zero_tie.shape)[zero_tie]
            assert np.array_equal(np.signbit(want[0].astype(np.float64)[zero_tie]), np.signbit(second))
            got = (np.where(zero_tie, want[0], got[0]).astype(BF16),) + got[1:]
        for what, x, w in zip(("forward", "grad a", "grad b"), got, want):
            assert_same_values(x, w, f"{name} {convention} {np.dtype(dtype).name} {what} at a={a.tolist()}, "
                               f"b={b.tolist()}")


def _reference(name, ties, a, b, g):
    """The README's definition, one element at a time: a NaN loses to every number; where both are
    NaN the output is NaN and a gets the gradient; a tie of numbers goes by the policy; the output
    of a tie is a (np.fmax's +-0), the first operand."""
    beats = (lambda p, q: p > q) if name == "fmax" else (lambda p, q: p < q)
    a, b, g = np.broadcast_arrays(a, b, g)
    y = np.empty(a.shape)
    ga, gb = np.zeros(a.shape), np.zeros(a.shape)
    for i in np.ndindex(a.shape):
        p, q, gi = float(a[i]), float(b[i]), float(g[i])
        if np.isnan(p) and np.isnan(q):
            y[i], wa, wb = p, 1.0, 0.0
        elif np.isnan(p):
            y[i], wa, wb = q, 0.0, 1.0
        elif np.isnan(q) or beats(p, q):
            y[i], wa, wb = p, 1.0, 0.0
        elif beats(q, p):
            y[i], wa, wb = q, 0.0, 1.0
        else:
            y[i] = p
            wa, wb = {"first": (1.0, 0.0), "last": (0.0, 1.0), "split": (0.5, 0.5),
                      "all": (1.0, 1.0)}[ties]
        ga[i], gb[i] = wa * gi, wb * gi
    return y, ga, gb


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("name", OPS)
def test_every_policy_follows_the_definition(name, ties):
    module = symgrad.load(name, ties=ties)
    assert (module.TIES, module.OP) == (ties, name)
    rng = np.random.default_rng(3)
    for dtype in (np.float64, np.float32, np.float16):
        for broadcast in (False, True):
            a, b, g = _inputs(dtype, rng, broadcast)
            rounding = np.isclose(np.abs(g.astype(np.float64)), 0.1, rtol=0.01)
            g = np.where(rounding, 2.0, g).astype(dtype)  # sums exact in every order
            y, ga, gb = _ours(module, a, b, g)
            want_y, want_a, want_b = _reference(name, ties, a, b, g)
            assert_same_values(y, want_y.astype(dtype), f"{name} {ties} forward")
            # gradients are sums over the broadcast dims; the sign of a zero is the presets' (above)
            assert_same_values(ga, want_a.sum(axis=1, keepdims=True).astype(dtype) if broadcast else
                         want_a.astype(dtype), f"{name} {ties} grad a", zeros=False)
            assert_same_values(gb, want_b.sum(axis=0).astype(dtype) if broadcast else want_b.astype(dtype),
                         f"{name} {ties} grad b", zeros=False)


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("name", OPS)
def test_check_passes_every_policy_and_the_jvp_is_the_transpose(name, ties):
    module = symgrad.load(name, ties=ties)
    a = np.array([1.0, 2.0, -0.5, 0.0, 3.0, -2.0])
    b = np.array([1.0, 1.0, -0.5, 0.0, -1.0, 4.0])  # ties at 0, 2, 3
    report = symgrad.check(module, a, b)
    assert report.ok, str(report)
    # forward mode agrees with reverse mode at the ties and at NaN: <jvp(t), g> = <t, vjp(g)>
    x, y = PAIRS
    rng = np.random.default_rng(4)
    _, saved = module.forward(x, y)
    for _ in range(3):
        ta, tb, g = (rng.choice([-1.0, 2.0, 0.5], size=x.shape) for _ in range(3))
        ga, gb = module.backward(g, saved)
        assert np.dot(module.jvp(ta, tb, saved), g) == np.dot(ta, ga) + np.dot(tb, gb)


@pytest.mark.parametrize("name", OPS)
def test_check_catches_a_wrong_tie_value(name):
    """A planted fmax whose backward gives a tie to b while it claims 'first' fails the check."""
    ours = symgrad.load(name, ties="last")  # the gradient of the other policy

    def vjp(g, a, b):
        return ours.backward(g, ours.forward(a, b)[1])

    pair = (lambda a, b: ours.forward(a, b)[0], vjp)
    a, b = np.array([1.0, 2.0]), np.array([1.0, 0.0])
    report = symgrad.check(pair, a, b, ties="first", op=name)
    assert not report.ok
    assert any(f.index == (0,) and f.kind in ("tie", "kink") for f in report.failures), str(report)
    assert symgrad.check(pair, a, b, ties="last", op=name).ok


@pytest.mark.parametrize("name", OPS)
def test_finite_differences_away_from_ties(name):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(50), rng.standard_normal(50)
    h = 1e-6
    f = getattr(np, name)
    for ties in POLICIES:
        module = symgrad.load(name, ties=ties)
        ga, gb = module.backward(np.ones(50), module.forward(a, b)[1])
        np.testing.assert_allclose(ga, (f(a + h, b) - f(a - h, b)) / (2 * h), atol=1e-6)
        np.testing.assert_allclose(gb, (f(a, b + h) - f(a, b - h)) / (2 * h), atol=1e-6)


def test_settings_errors_are_one_line():
    with pytest.raises(ValueError, match=r"^fmax: nan must be 'lose' \(fmax/fmin ignore NaN"):
        symgrad.load("fmax", nan="dominate")
    with pytest.raises(ValueError, match=r"^NaN rule 'lose' is defined for fmax and fmin only"):
        symgrad.load("maximum", nan="lose")
    with pytest.raises(ValueError, match=r"^fmin: nan must be 'lose' .*, got nan='loses'$"):
        symgrad.load("fmin", nan="loses")
    with pytest.raises(ValueError, match=r"^unknown NaN rule 'loses'; expected one of: dominate, "):
        symgrad.load("maximum", nan="loses")


@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
@pytest.mark.parametrize("name,settings", [
    ("fmax", {"ties": "first"}), ("fmax", {"ties": "last"}), ("fmax", {"ties": "split"}),
    ("fmax", {"ties": "all"}), ("fmax", {"convention": "torch"}), ("fmin", {"convention": "jax"}),
], ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_cpu_backend_equals_the_numpy_module(name, settings):
    rng = np.random.default_rng(6)
    cpu, ref = symgrad.load(name, backend="cpu", **settings), symgrad.load(name, **settings)
    for dtype in (np.float64, np.float32, np.float16):
        for broadcast in (False, True):
            a, b, g = _inputs(dtype, rng, broadcast)
            for what, x, w in zip(("forward", "grad a", "grad b"), _ours(cpu, a, b, g),
                                  _ours(ref, a, b, g)):
                assert_same_values(x, w, f"cpu {name} {settings} {np.dtype(dtype).name} {what}")
