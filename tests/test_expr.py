"""Expression mode (symgrad.derive_expr / load_expr / generate_expr, `--expr`).

Oracles, all independent of symgrad's derivation:

* finite differences of a NumPy forward written here by hand, at random points away from every
  kink (each case lists the functions whose zeros are its kinks);
* at ties and kinks, the policy's W evaluated in the test: the pieces' values and gradients by
  SymPy (sympy.diff of pieces written here), the winners picked by the README's definition of
  each policy; for Heaviside, sign, Abs, relu and clamp the README's table of kink values;
* PyTorch 2.13 CPU where an op with the same convention exists (relu, maximum, clamp, abs, silu);
* the CUDA kernels, run on the CPU by tests/cuda_harness, against the NumPy module.

Hostile strings are refused by the API (ValueError) and the CLI (exit 2, one line) without
creating a file or starting a process.
"""

from __future__ import annotations

import builtins
import importlib.util
import os
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

import cuda_harness as harness
import symgrad
from cuda_harness.check import mismatch

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("first", "last", "split", "all")
N_POINTS = int(os.environ.get("SYMGRAD_EXPR_POINTS", "300"))


def run_cli(args, cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["SYMGRAD_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "symgrad", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def import_file(path: Path):
    spec = importlib.util.spec_from_file_location(f"expr_test_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- finite differences

def _maxn(*a):
    return np.maximum.reduce(np.broadcast_arrays(*[np.asarray(v, dtype=np.float64) for v in a]))


def _minn(*a):
    return np.minimum.reduce(np.broadcast_arrays(*[np.asarray(v, dtype=np.float64) for v in a]))


def _sig(v):
    return 1 / (1 + np.exp(-v))


def _pw_poly(x):
    return np.where(x < 1, x**2, np.where(x < 3, 2 * x - 1, np.sqrt(np.abs(x)) + 5 - np.sqrt(3)))


# (expression, forward written by hand, kinks: functions whose zeros are the kinks)
FD_CASES = [
    ("Max(x*y, x + y, 0)", lambda x, y: _maxn(x * y, x + y, 0),
     [lambda x, y: x * y - x - y, lambda x, y: x * y, lambda x, y: x + y]),
    ("Min(Max(x - y, -1), 1)**2 + 0.1*Abs(x)",  # a clipped loss
     lambda x, y: np.clip(x - y, -1, 1) ** 2 + 0.1 * np.abs(x),
     [lambda x, y: x - y - 1, lambda x, y: x - y + 1, lambda x, y: x]),
    ("Max(2*x - y + 1, -x + 3*y, 0.5*x + 0.5*y - 2)",  # maxout of affine pieces
     lambda x, y: _maxn(2 * x - y + 1, -x + 3 * y, 0.5 * x + 0.5 * y - 2),
     [lambda x, y: 3 * x - 4 * y + 1, lambda x, y: 1.5 * x - 1.5 * y + 3,
      lambda x, y: -1.5 * x + 2.5 * y + 2]),
    ("0.3*log(exp(x) + exp(y)) + 0.7*Max(x, y)",  # a soft/hard max mixture
     lambda x, y: 0.3 * np.logaddexp(x, y) + 0.7 * np.maximum(x, y), [lambda x, y: x - y]),
    ("Abs(sin(x))*exp(-y)", lambda x, y: np.abs(np.sin(x)) * np.exp(-y), [lambda x, y: np.sin(x)]),
    ("Piecewise((x**2, x < 1), (2*x - 1, x < 3), (sqrt(x) + 5 - sqrt(3), True))*tanh(y)",
     lambda x, y: _pw_poly(x) * np.tanh(y), [lambda x, y: x - 1, lambda x, y: x - 3]),
    ("Heaviside(x - 0.5)*y**2 + sign(y)*x", lambda x, y: np.heaviside(x - 0.5, 0.5) * y**2 + np.sign(y) * x,
     [lambda x, y: x - 0.5, lambda x, y: y]),
    ("relu(x)*sigmoid(y) + Min(x, y, 0.5)", lambda x, y: np.maximum(x, 0) * _sig(y) + _minn(x, y, 0.5),
     [lambda x, y: x, lambda x, y: x - y, lambda x, y: x - 0.5, lambda x, y: y - 0.5]),
    ("Max(Min(x, y), Abs(x - y) - 1, exp(x) - 2)",
     lambda x, y: _maxn(np.minimum(x, y), np.abs(x - y) - 1, np.exp(x) - 2),
     [lambda x, y: x - y, lambda x, y: np.minimum(x, y) - np.abs(x - y) + 1,
      lambda x, y: np.minimum(x, y) - np.exp(x) + 2, lambda x, y: np.abs(x - y) - 1 - np.exp(x) + 2]),
    ("Abs(x*y) + Max(exp(x*y), 1)*x", lambda x, y: np.abs(x * y) + np.maximum(np.exp(x * y), 1) * x,
     [lambda x, y: x * y]),
]


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("case", FD_CASES, ids=[c[0] for c in FD_CASES])
def test_finite_differences_off_the_kinks(case, ties):
    expr, f, kinks = case
    rng = np.random.default_rng(abs(hash((expr, ties))) % 2**32)
    x, y = rng.normal(scale=2.0, size=(2, N_POINTS))
    if "sqrt(x)" in expr:
        x = np.abs(x) * 2
    far = np.all([np.abs(k(x, y)) > 1e-3 for k in kinks], axis=0)
    x, y = x[far], y[far]
    assert x.size > N_POINTS // 3
    m = symgrad.load_expr(expr, ties=ties)
    out, saved = m.forward(x, y)
    np.testing.assert_allclose(out, f(x, y), rtol=1e-13, atol=1e-13)
    gx, gy = m.backward(np.ones_like(out), saved)
    h = 1e-6
    fdx = (f(x + h, y) - f(x - h, y)) / (2 * h)
    fdy = (f(x, y + h) - f(x, y - h)) / (2 * h)
    np.testing.assert_allclose(gx, fdx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gy, fdy, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- ties: the policy's W

X, Y = sp.symbols("x y", real=True)


def policy_weights(values, ties, kind="max"):
    """The README's definition: who gets the gradient among the pieces attaining the extremum."""
    best = max(values) if kind == "max" else min(values)
    tied = [i for i, v in enumerate(values) if v == best]
    w = [Fraction(0)] * len(values)
    if ties == "first":
        w[tied[0]] = Fraction(1)
    elif ties == "last":
        w[tied[-1]] = Fraction(1)
    else:
        for i in tied:
            w[i] = Fraction(1, len(tied)) if ties == "split" else Fraction(1)
    return w


TIE_CASES = [
    # (expression, pieces written with SymPy, max/min, points with ties)
    ("Max(x*y, x + y, 0)", [X * Y, X + Y, sp.S.Zero], "max",
     [(0, 0), (2, 2), (-1, 1), (3, 1.5), (-2, 2), (1, -1), (0, 5), (0.5, -0.5)]),
    ("Min(2*x, x + y, y - 1)", [2 * X, X + Y, Y - 1], "min",
     [(0, 0), (1, 2), (-1, 0), (-1, -2), (2, 3), (0.25, 1.25)]),
    ("Max(x, y, 0)", [X, Y, sp.S.Zero], "max", [(0, 0), (1, 1), (0, -1), (-1, 0), (2, -3)]),
    # a piece with a constant factor: the split's count is then divided by it in the partial
    ("Max(x, 0.5*y)", [X, Y / 2], "max", [(1, 2), (0, 0), (-1, -2), (3, 1)]),
    ("Min(0.25*x, y, 1)", [X / 4, Y, sp.S.One], "min", [(4, 1), (0, 0), (-4, -1), (8, 3)]),
]


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("case", TIE_CASES, ids=[c[0] for c in TIE_CASES])
def test_at_ties_the_policy_decides(case, ties):
    expr, pieces, kind, points = case
    m = symgrad.load_expr(expr, inputs=("x", "y"), ties=ties)
    xs = np.array([p[0] for p in points], dtype=np.float64)
    ys = np.array([p[1] for p in points], dtype=np.float64)
    out, saved = m.forward(xs, ys)
    gx, gy = m.backward(np.ones_like(out), saved)
    for k, (px, py) in enumerate(points):
        at = {X: sp.nsimplify(px), Y: sp.nsimplify(py)}
        values = [p.subs(at) for p in pieces]
        w = policy_weights(values, ties, kind)
        want_x = sum(float(wi) * float(sp.diff(p, X).subs(at)) for wi, p in zip(w, pieces))
        want_y = sum(float(wi) * float(sp.diff(p, Y).subs(at)) for wi, p in zip(w, pieces))
        best = max(values) if kind == "max" else min(values)
        assert out[k] == float(best)
        assert gx[k] == pytest.approx(want_x, rel=1e-15, abs=0), (expr, ties, (px, py))
        assert gy[k] == pytest.approx(want_y, rel=1e-15, abs=0), (expr, ties, (px, py))


def test_sympy_max_derivative_is_wrong_at_a_three_way_tie_and_split_is_not():
    """SymPy's d Max/dv sums to 3/2 at a 3-way tie (Heaviside(0) = 1/2); split's weights sum to 1."""
    z = sp.Symbol("z", real=True)
    sym = sum(sp.diff(sp.Max(X, Y, z), v) for v in (X, Y, z)).subs({X: 0, Y: 0, z: 0})
    assert sym == sp.Rational(3, 2)
    m = symgrad.load_expr("Max(x, y, z)", ties="split")
    out, saved = m.forward(np.zeros(1), np.zeros(1), np.zeros(1))
    assert sum(float(g[0]) for g in m.backward(np.ones(1), saved)) == 1.0


# the README's table of kink values (gradient of the op at its kink, per policy)
KINK_TABLE = {
    "relu": {"first": 0.0, "last": 1.0, "split": 0.5, "all": 1.0},
    "abs": {"first": 1.0, "last": -1.0, "split": 0.0, "all": 0.0},
    "clamp": {"first": 1.0, "last": 0.0, "split": 0.5, "all": 1.0},
}


@pytest.mark.parametrize("ties", POLICIES)
def test_kink_values_of_the_rewritten_functions(ties):
    z = np.zeros(1)
    # relu(x) = max(0, x); Heaviside(x) is its derivative under the policy
    m = symgrad.load_expr("relu(x)", ties=ties)
    assert m.backward(np.ones(1), m.forward(z)[1])[0][0] == KINK_TABLE["relu"][ties]
    m = symgrad.load_expr("Heaviside(x)*y", ties=ties)
    out, saved = m.forward(z, np.full(1, 3.0))
    assert out[0] == 3.0 * KINK_TABLE["relu"][ties]
    assert m.backward(np.ones(1), saved)[1][0] == KINK_TABLE["relu"][ties]
    # Abs(x) = max(x, -x); sign(x) is its derivative under the policy
    m = symgrad.load_expr("Abs(x)", ties=ties)
    assert m.backward(np.ones(1), m.forward(z)[1])[0][0] == KINK_TABLE["abs"][ties]
    m = symgrad.load_expr("sign(x)*y", ties=ties)
    out, saved = m.forward(z, np.full(1, 3.0))
    assert out[0] == 3.0 * KINK_TABLE["abs"][ties]
    assert m.backward(np.ones(1), saved)[1][0] == KINK_TABLE["abs"][ties]
    # clamp = Min(Max(x, lo), hi), at both bounds
    m = symgrad.load_expr("Min(Max(x, -1), 2)", ties=ties)
    g = m.backward(np.ones(2), m.forward(np.array([-1.0, 2.0]))[1])[0]
    assert list(g) == [KINK_TABLE["clamp"][ties]] * 2
    # Heaviside with its value at 0 given: the policy does not apply (np.heaviside)
    m = symgrad.load_expr("Heaviside(x, 0.25)*y", ties=ties)
    xs = np.array([-1.0, 0.0, 2.0, np.nan])
    out, saved = m.forward(xs, np.full(4, 2.0))
    np.testing.assert_array_equal(out, 2.0 * np.heaviside(xs, 0.25))
    # its a.e. derivative is 0 (no delta is kept), NaN input included
    np.testing.assert_array_equal(m.backward(np.ones(4), saved)[0], [0.0, 0.0, 0.0, 0.0])


# Heaviside/sign of a function of the inputs (u non-affine: (x+1)**2 was expanded in one place and
# not in another, a KeyError in lower.py): (expression, forward written by hand with H and S the
# Heaviside and sign functions it is given, the arguments u of H/sign)
COMPOSED_CASES = [
    ("Heaviside((x+1)**2)*y", lambda x, y, H, S: H((x + 1) ** 2) * y, [lambda x, y: (x + 1) ** 2]),
    ("sign((x - y)**2)*x", lambda x, y, H, S: S((x - y) ** 2) * x, [lambda x, y: (x - y) ** 2]),
    ("x*y*Heaviside(-(x+1)**2) + sign(2*(x-y)**2 + 1)*y", lambda x, y, H, S: x * y * H(-(x + 1) ** 2)
     + S(2 * (x - y) ** 2 + 1) * y, [lambda x, y: -(x + 1) ** 2, lambda x, y: 2 * (x - y) ** 2 + 1]),
    ("x**2*Heaviside(x*y - 1) + sign(x**3 - y)*y", lambda x, y, H, S: x**2 * H(x * y - 1) + S(x**3 - y) * y,
     [lambda x, y: x * y - 1, lambda x, y: x**3 - y]),
]


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("case", COMPOSED_CASES, ids=[c[0] for c in COMPOSED_CASES])
def test_heaviside_and_sign_of_a_function_of_the_inputs(case, ties, tmp_path, capsys):
    """Heaviside(u) and sign(u) for u a non-affine function of the inputs load and generate (they
    raised KeyError; the CLI printed a traceback and exited 1). Oracle: the forward written here
    with the README's kink values (H(0), sign(0) by policy); away from the kinks the gradient is
    the finite differences of it; on a kink (u = 0 exactly) it is the a.e. derivative (H and sign
    contribute 0): finite differences with H(u) and sign(u) held at their values there."""
    from symgrad import cli
    expr, f, us = case
    h0, s0 = KINK_TABLE["relu"][ties], KINK_TABLE["abs"][ties]

    def H(u):
        return np.where(u > 0, 1.0, np.where(u < 0, 0.0, h0))

    def S(u):
        return np.where(u > 0, 1.0, np.where(u < 0, -1.0, s0))

    rng = np.random.default_rng(7)
    x, y = rng.normal(scale=1.5, size=(2, 60))
    kx = np.array([-1.0, 2.0, 1.0, 0.5, -1.0, 1.0, 0.0])  # points on the kinks of the cases
    ky = np.array([3.0, 2.0, 1.0, 2.0, -1.0, -0.5, 0.0])
    x, y = np.concatenate([x, kx]), np.concatenate([y, ky])
    m = symgrad.load_expr(expr, ties=ties)
    out, saved = m.forward(x, y)
    np.testing.assert_allclose(out, f(x, y, H, S), rtol=1e-13, atol=1e-13)
    gx, gy = m.backward(np.ones_like(out), saved)
    on = np.any([u(x, y) == 0 for u in us], axis=0)
    far = np.all([np.abs(u(x, y)) > 1e-3 for u in us], axis=0)
    assert on.sum() >= 1 and far.sum() > 30
    held_h, held_s = [H(u(x, y)) for u in us], [S(u(x, y)) for u in us]

    def frozen(a, b):
        """f with each H(u_k), sign(u_k) (called in the order of us) held at its value at (x, y)."""
        k = iter(range(len(us)))
        return f(a, b, lambda u: held_h[next(k)], lambda u: held_s[next(k)])
    d = 1e-6
    for g, where in ((lambda a, b: f(a, b, H, S), far), (frozen, on)):
        np.testing.assert_allclose(gx[where], ((g(x + d, y) - g(x - d, y)) / (2 * d))[where], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(gy[where], ((g(x, y + d) - g(x, y - d)) / (2 * d))[where], rtol=1e-5, atol=1e-5)
    assert cli.main(["generate", "--expr", expr, "--name", "k", "--ties", ties, "--out", str(tmp_path)]) == 0
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("ties", POLICIES)
def test_piecewise_boundary_follows_the_condition_as_written(ties):
    strict = symgrad.load_expr("Piecewise((2*x, x < 1), (3*x - 1, True))", ties=ties)
    loose = symgrad.load_expr("Piecewise((2*x, x <= 1), (3*x - 1, True))", ties=ties)
    xs = np.array([0.0, 1.0, 2.0])
    for m, at_one in ((strict, 3.0), (loose, 2.0)):
        out, saved = m.forward(xs)
        np.testing.assert_array_equal(out, [0.0, 2.0, 5.0])
        np.testing.assert_array_equal(m.backward(np.ones(3), saved)[0], [2.0, at_one, 3.0])


def test_derivation_has_no_delta_left_and_every_group_cancelled():
    d = symgrad.derive_expr("Max(x*y, x + y, 0) + Heaviside(x)*sign(y) + Abs(x - y)", ties="split")
    assert isinstance(d, symgrad.api.Derivation)
    final = dict(next(s for s in d.steps if s.title == "final partials").items)
    for e in final.values():
        assert not e.has(sp.DiracDelta) and not e.has(sp.Heaviside)
    sifted = [e for label, e in next(s for s in d.steps if s.title == "delta elimination").items
              if "sifted" in label]
    assert sifted and all(e == 0 for e in sifted)
    assert any("cancelled" in c for c in d.checks)
    notes = " ".join(str(e) for _, e in next(s for s in d.steps if s.title == "non-smooth nodes").items)
    assert "H(0) = 0 first, 1 last, 1/2 split" in notes and "sign(0) = +1 first" in notes


def test_common_subexpressions_are_computed_once():
    m = symgrad.load_expr("exp(x*y) + Max(exp(x*y), 1) + sigmoid(x*y)*exp(x*y)")
    source = Path(m.__file__).read_text()
    forward = source[source.index("def forward"):source.index("def _gradients")]
    backward = source[source.index("def _gradients"):]  # backward's arithmetic is in _gradients
    assert forward.count("np.exp(x*y)") == 1 and backward.count("np.exp(x*y)") == 1
    assert forward.count("np.exp(-(x*y))") == 1


# ----------------------------------------------------------------------------- wrt, broadcasting

def test_wrt_returns_none_for_the_other_inputs_and_skips_their_work():
    m = symgrad.load_expr("x*exp(y) + Max(x, y)", wrt=("y",))
    x, y = np.array([1.0, 2.0]), np.array([0.5, 3.0])
    out, saved = m.forward(x, y)
    gx, gy = m.backward(np.ones(2), saved)
    assert gx is None
    np.testing.assert_allclose(gy, x * np.exp(y) + (y > x), rtol=1e-15)
    assert "grad_x =" not in Path(m.__file__).read_text()
    full = symgrad.load_expr("x*exp(y) + Max(x, y)")
    assert full.backward(np.ones(2), full.forward(x, y)[1])[0] is not None


# ----------------------------------------------------------------------------- PyTorch

try:
    import torch
except ImportError:  # the PyTorch cases skip, the rest of this file runs
    torch = None


def torch_grads(fn, inputs, g):
    ts = [torch.tensor(v, requires_grad=True) for v in inputs]
    out = fn(*ts)
    out.backward(torch.tensor(g))
    return out.detach().numpy(), [t.grad.numpy() for t in ts]


TORCH_CASES = [] if torch is None else [
    # (expression, policy, torch function, input shapes, exact)
    ("relu(x)", "first", lambda x: torch.relu(x), [(5, 6)], True),
    ("Max(x, 0)", "last", lambda x: torch.relu(x), [(5, 6)], True),
    ("Max(x, y)", "split", torch.maximum, [(3, 1), (4,)], True),
    ("Min(x, y)", "split", torch.minimum, [(2, 3, 1), (1, 4)], True),
    ("Min(Max(x, -1), 1)", "first", lambda x: torch.clamp(x, -1, 1), [(5, 6)], True),
    ("Abs(x)", "split", torch.abs, [(5, 6)], True),
    ("x*sigmoid(x)", "first", torch.nn.functional.silu, [(5, 6)], False),
    ("Abs(x - y) + x*sigmoid(y)", "split", lambda x, y: torch.abs(x - y) + x * torch.sigmoid(y),
     [(3, 4), (4,)], False),
]


@pytest.mark.parametrize("case", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
def test_matches_pytorch(case):
    if torch is None:
        pytest.skip("PyTorch is not installed (pip install torch==2.13.0)")
    expr, ties, fn, shapes, exact = case
    rng = np.random.default_rng(7)
    m = symgrad.load_expr(expr, ties=ties)
    for dtype in (np.float64, np.float32):
        for tie_heavy in (True, False):
            xs = [(rng.integers(-2, 3, size=s) if tie_heavy else rng.normal(size=s)).astype(dtype)
                  for s in shapes]
            out, saved = m.forward(*xs)
            g = rng.integers(-3, 4, size=out.shape).astype(dtype)
            got = m.backward(g, saved)
            t_out, t_grads = torch_grads(fn, xs, g)
            for a, b in zip((out, *got), (t_out, *t_grads)):
                assert a.shape == b.shape and a.dtype == b.dtype
                if exact:
                    np.testing.assert_array_equal(a, b)
                else:
                    np.testing.assert_allclose(a, b, rtol=1e-12 if dtype == np.float64 else 2e-6,
                                               atol=1e-12 if dtype == np.float64 else 2e-6)


# ----------------------------------------------------------------------------- hostile strings

HOSTILE = [
    "__import__('os').system('touch PWNED')",
    "__import__",
    "x.__class__",
    "x.__class__.__bases__[0].__subclasses__()",
    "(lambda: 1)()",
    "open('f','w')",
    "open(x)",
    "[x for x in ()]",
    "eval('1')",
    "eval(x)",
    "exec(x)",
    "globals()",
    "x if x else y",
    "f'{x}'",
    "f\"{__import__('os').system('touch PWNED')}\"",
    "x[0]",
    "Max(x, key=y)",
    "Max(*x)",
    "(x := 1)",
    "x and y",
    "not x",
    "x < y",
    "'x'",
    "b'x'",
    "1j*x",
    "True*x",
    "_x + 1",
    "__x__",
    "sympify(x)",
    "S(x)",
    "Symbol(x)",
    "x; import os",
    "x\\\n+1",
    "x # comment",
    "foo(x)",
    "Max(x, zz)",
    "exp",
    "x ** 10 ** 10",
    "2 ** 2 ** 2 ** 2 ** 2 ** 2",
    "1/0 + x",
    "log(-1) + x",
    "(-8)**(1/3)*x",
    "sqrt(-2)*x",
    "x" + " + x" * 600,  # too long
    "(" * 250 + "x" + ")" * 250,  # beyond the parser's nesting limit
    "-" * 1999 + "x",
    "Max(" * 40 + "x" + ")" * 40,
    "exp(" * 40 + "x" + ")" * 40,
    "x+" * 600 + "x",
    "a" * 100000,
    "",
    "   ",
    "Piecewise((x, x < 1))",
    "Piecewise((x, x), (1, True))",
    "Piecewise((x, 0 < x < 1), (1, True))",
    "y\x00",
    "x\u200b + 1",
    "ｘ + 1",
]


class _Forbidden(Exception):
    pass


@pytest.fixture
def no_processes(monkeypatch):
    """Starting a process (or evaluating code) fails the test."""
    def forbid(name):
        def f(*a, **k):
            raise _Forbidden(f"{name} was called")
        return f
    monkeypatch.setattr(subprocess, "Popen", forbid("subprocess.Popen"))
    for name in ("system", "popen", "fork", "forkpty", "execv", "execve", "execl", "execle", "execlp",
                 "execlpe", "execvp", "execvpe", "spawnv", "spawnve", "spawnl", "spawnle",
                 "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, forbid(f"os.{name}"))
    monkeypatch.setattr(builtins, "eval", forbid("eval"))
    monkeypatch.setattr(builtins, "exec", forbid("exec"))


@pytest.mark.parametrize("text", HOSTILE, ids=[repr(h)[:40] for h in HOSTILE])
def test_hostile_strings_are_refused_by_the_api(text, tmp_path, monkeypatch, no_processes):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    xy = ("x", "y")
    calls = [lambda: symgrad.derive_expr(text, inputs=xy),
             lambda: symgrad.load_expr(text, name="hostile", inputs=xy),
             lambda: symgrad.generate_expr(text, out, name="hostile", backend="cuda", inputs=xy)]
    if "zz" not in text:  # an undeclared name is refused only where inputs are declared
        calls.append(lambda: symgrad.load_expr(text))
    for call in calls:
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert message and "\n" not in message
    assert sorted(os.listdir(tmp_path)) == []
    assert not Path("PWNED").exists()


def test_non_strings_and_bad_settings_are_refused():
    for bad, exc in ((None, TypeError), (3, TypeError), (b"x", TypeError)):
        with pytest.raises(exc):
            symgrad.derive_expr(bad)
    cases = [dict(inputs=("x", "x")), dict(inputs=("x", "print")), dict(inputs=("x", "s0")),
             dict(inputs=("x", "exp")), dict(inputs=("x", "_y")),
             dict(inputs=("x", "expf")), dict(inputs=("x", "NAN")), dict(inputs=("x", "M_PI")),
             dict(inputs=("x", "np")), dict(inputs=("x", "dtype")), dict(inputs=("x", "grad_x")), dict(inputs=("x", "y z")),
             dict(wrt=("z",)), dict(ties="most"), dict(convention="torch"), dict(nan="keep"),
             dict(inputs=("x",)), dict(name="Bad-Name")]
    for kwargs in cases:
        with pytest.raises((ValueError, TypeError)):
            symgrad.load_expr("x*y", **kwargs)


def test_hostile_strings_are_refused_by_the_cli(tmp_path):
    """Each run in its own empty directory, which stays empty; exit 2 with one error line."""
    from concurrent.futures import ThreadPoolExecutor
    cache = tmp_path / "cache"
    runs = []
    for text in ["__import__('os').system('touch PWNED')", "x.__class__", "Max(" * 40 + "x" + ")" * 40]:
        runs += [["derive", "--expr", text],
                 ["generate", "--expr", text, "--name", "h", "--backend", "all", "--out", "out"]]
    runs += [["generate", "--expr", "x*y", "--out", "o"],  # no --name
             ["generate", "--expr", "x*y", "--name", "../x", "--out", "o"],
             ["generate", "--expr", "x*y", "--name", "ok", "--out", "o", "--order", "reversed"],
             ["derive", "relu", "--expr", "x"],
             ["derive", "--expr", "x*y", "--kernel-size", "2"],
             ["derive", "--expr", "x*y", "--wrt", "q"],
             ["derive", "relu", "--wrt", "x"]]
    dirs = []
    for k in range(len(runs)):
        dirs.append(tmp_path / f"run{k}")
        dirs[-1].mkdir()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda a: run_cli(a[0], a[1], cache), zip(runs, dirs)))
    for args, cwd, r in zip(runs, dirs, results):
        assert r.returncode == 2, (args, r.stderr)
        assert r.stdout == "" and "Traceback" not in r.stderr
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("symgrad: error:"), (args, r.stderr)
        assert os.listdir(cwd) == [], args


# ----------------------------------------------------------------------------- CUDA

EXACT_CUDA = ["Max(x*y, x + y, 0)", "Min(Max(x - y, -1), 1)**2 + Abs(x)",
              "Heaviside(x)*y + sign(y)*x + Heaviside(y, 0.25)",
              "Piecewise((x*y, x < 1), (2*x - 1, x <= 2), (y, True))", "Max(sqrt(x**2 + y**2), 1)"]
TRANSCENDENTAL_CUDA = ["0.3*log(exp(x) + exp(y)) + 0.7*Max(x, y)", "relu(x)*sigmoid(y) + tanh(Min(x, y))"]


@pytest.fixture(scope="module")
def cupy_on_cpu(tmp_path_factory):
    if harness.find_cxx() is None:
        pytest.skip("no C++ compiler: the CPU execution harness needs one")
    return harness.fake_cupy(tmp_path_factory.mktemp("expr-cuda-host"))


def _cuda_inputs(rng, specials):
    x = rng.integers(-2, 3, size=(4, 5)).astype(np.float64) / 2
    y = rng.integers(-2, 3, size=(5,)).astype(np.float64) / 2  # broadcast
    if specials:
        for a in (x, y):
            flat = a.reshape(-1)
            where = rng.random(flat.size) < 0.2
            flat[where] = rng.choice([np.nan, np.inf, -np.inf, -0.0], size=int(where.sum()))
    return x, y


def test_cuda_input_named_like_a_selection_variable_keeps_its_type(cupy_on_cpu, monkeypatch):
    """An input called hit (the name of the mask's condition in window kernels) is a number in
    the CUDA kernels, not a bool: 0.25 stays 0.25, as in the NumPy module."""
    monkeypatch.setitem(sys.modules, "cupy", cupy_on_cpu)
    expr = "Max(hit, 0)*3"
    ref = symgrad.load_expr(expr, inputs=("hit",))
    dev = symgrad.load_expr(expr, inputs=("hit",), backend="cuda")
    x = np.array([-0.5, 0.0, 0.25, 2.0])
    out, saved = dev.forward(x)
    out_ref, saved_ref = ref.forward(x)
    np.testing.assert_array_equal(out, out_ref)
    np.testing.assert_array_equal(out, 3 * np.maximum(x, 0))  # the math, independently
    np.testing.assert_array_equal(dev.backward(np.ones(4), saved)[0], ref.backward(np.ones(4), saved_ref)[0])


@pytest.mark.parametrize("expr", EXACT_CUDA + TRANSCENDENTAL_CUDA)
def test_cuda_kernels_on_the_cpu_match_the_numpy_module(expr, cupy_on_cpu, monkeypatch):
    """Bit for bit where the math is exact (+ - * /, comparisons); transcendentals (exp, log, tanh)
    may differ in the last place between NumPy's and the C library's implementations."""
    monkeypatch.setitem(sys.modules, "cupy", cupy_on_cpu)
    exact = expr in EXACT_CUDA
    rng = np.random.default_rng(3)
    for ties in POLICIES:
        ref = symgrad.load_expr(expr, ties=ties, inputs=("x", "y"))
        dev = symgrad.load_expr(expr, ties=ties, inputs=("x", "y"), backend="cuda")
        for specials in (False, True):
            x, y = _cuda_inputs(rng, specials)
            for dtype in (np.float64, np.float32, np.float16):
                work = np.float32 if dtype == np.float16 else dtype
                xs = [x.astype(dtype), y.astype(dtype)]
                # the specials make inf * 0, inf - inf (NaN) and log(0) (-inf), as intended: NumPy's warnings muted
                with np.errstate(invalid="ignore", divide="ignore"):
                    out_ref, saved_ref = ref.forward(*[a.astype(work) for a in xs])
                g = rng.integers(-3, 4, size=out_ref.shape).astype(dtype)
                grads_ref = ref.backward(g.astype(work), saved_ref)
                out, saved = dev.forward(*xs)
                grads = dev.backward(g, saved)
                ts = [rng.integers(-3, 4, size=a.shape).astype(dtype) for a in xs]
                tangent = dev.jvp(*ts, saved)
                tangent_ref = ref.jvp(*[t.astype(work) for t in ts], saved_ref)
                pairs = [(out, out_ref)] + list(zip(grads, grads_ref)) + [(tangent, tangent_ref)]
                for k, (a, b) in enumerate(pairs):
                    b = b.astype(dtype)
                    assert a.shape == b.shape and a.dtype == b.dtype
                    if exact and dtype == np.float16 and k == 2:
                        # y is broadcast: its float16 gradients are rounded per element, then
                        # summed (README, CUDA backend); the reference sums in float32
                        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32),
                                                   rtol=5e-3, atol=5e-3, equal_nan=True)
                    elif exact:
                        assert mismatch(a, b) == "", (expr, ties, dtype, k, mismatch(a, b))
                    else:
                        tol = {np.float64: 1e-13, np.float32: 1e-5, np.float16: 2e-3}[dtype]
                        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, equal_nan=True)


def test_cuda_source_compiles_with_nvcc(tmp_path):
    nvcc = harness.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    for k, expr in enumerate(("Max(x*y, x + y, 0)", TRANSCENDENTAL_CUDA[1])):
        path = symgrad.generate_expr(expr, tmp_path, name=f"e{k}", backend="cuda")
        cu = next(tmp_path.glob(f"e{k}_*.cu"))
        assert path.name.endswith("_cuda.py")
        r = subprocess.run([nvcc, "--fatbin", "-gencode=arch=compute_80,code=sm_80", "--fmad=false",
                            "-Werror", "all-warnings", str(cu), "-o", str(tmp_path / f"e{k}.fatbin")],
                           capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]


# ----------------------------------------------------------------------------- done when

def test_done_when_generate_gated_all_backends(tmp_path, cupy_on_cpu, monkeypatch):
    """`symgrad generate --expr "Max(x*y, x + y, 0)" --name gated --backend all --out DIR`: every
    module (NumPy, CUDA, cpu) matches finite differences off the kinks and the policy's W on them."""
    out = tmp_path / "out"
    r = run_cli(["generate", "--expr", "Max(x*y, x + y, 0)", "--name", "gated", "--backend", "all",
                 "--out", out, "--ties", "split"], tmp_path, tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(out))
    assert names == ["gated_split.c", "gated_split.cu", "gated_split.py", "gated_split_cpu.py", "gated_split_cuda.py",
                     "gated_split_jax.py", "gated_split_torch.py"]
    for name in names:
        head = (out / name).read_text().splitlines()[:5]
        assert any("Max(x*y, x + y, 0)" in line for line in head)
    monkeypatch.setitem(sys.modules, "cupy", cupy_on_cpu)
    monkeypatch.syspath_prepend(str(out))
    numpy_module = import_file(out / "gated_split.py")
    cuda_module = import_file(out / "gated_split_cuda.py")
    cpu_module = import_file(out / "gated_split_cpu.py")
    rng = np.random.default_rng(11)
    x, y = rng.normal(scale=2, size=(2, 200))
    far = (np.abs(x * y - x - y) > 1e-3) & (np.abs(x * y) > 1e-3) & (np.abs(x + y) > 1e-3)
    x, y = x[far], y[far]
    pieces = [X * Y, X + Y, sp.S.Zero]
    ties_x = np.array([0.0, 2.0, -1.0, 3.0, -2.0, 1.0])
    ties_y = np.array([0.0, 2.0, 1.0, 1.5, 2.0, -1.0])
    for m in (numpy_module, cuda_module, cpu_module):
        f = lambda a, b: m.forward(a, b)[0]  # noqa: E731
        out_, saved = m.forward(x, y)
        gx, gy = m.backward(np.ones_like(out_), saved)
        h = 1e-6
        np.testing.assert_allclose(gx, (f(x + h, y) - f(x - h, y)) / (2 * h), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(gy, (f(x, y + h) - f(x, y - h)) / (2 * h), rtol=1e-5, atol=1e-5)
        out_, saved = m.forward(ties_x, ties_y)
        gx, gy = m.backward(np.ones_like(out_), saved)
        for k in range(ties_x.size):
            at = {X: sp.nsimplify(ties_x[k]), Y: sp.nsimplify(ties_y[k])}
            w = policy_weights([p.subs(at) for p in pieces], "split")
            assert gx[k] == pytest.approx(sum(float(wi * sp.Rational(str(sp.diff(p, X).subs(at))))
                                              for wi, p in zip(w, pieces)), rel=1e-15)
            assert gy[k] == pytest.approx(sum(float(wi * sp.Rational(str(sp.diff(p, Y).subs(at))))
                                              for wi, p in zip(w, pieces)), rel=1e-15)


def test_cli_derive_expr_prints_the_steps(tmp_path):
    r = run_cli(["derive", "--expr", "Max(x*y, x + y, 0)", "--ties", "last", "--wrt", "x", "--full"], tmp_path,
                tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    for needle in ("expression: Max(x*y, x + y, 0)", "tie policy: last", "== W-form ==",
                   "sifted and cancelled: 0", "gradients returned for: x", "== checks =="):
        assert needle in r.stdout
    assert os.listdir(tmp_path) == ["cache"] or os.listdir(tmp_path) == []


def test_generated_expression_files_are_deterministic(tmp_path):
    a = symgrad.generate_expr("Abs(x - y) + exp(Min(x, 0))", tmp_path / "a", name="det", backend="numpy")
    b = symgrad.generate_expr("Abs(x  -  y) + exp(Min(x, 0))", tmp_path / "b", name="det", backend="numpy")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_text().startswith("# Generated by symgrad")


@pytest.mark.parametrize("name", ["output_shape", "input_shape", "jvp", "constexpr", "asm", "static_cast",
                                  "decltype", "thread_local", "xor", "bitand", "not_eq", "NULL", "EOF",
                                  "INT_MAX", "SYMGRAD_STORAGE_TYPES"])
def test_names_that_break_generated_code_are_reserved(name):
    """A Saved field (output_shape made every forward fail) or a C++ keyword/macro (nvcc rejected
    the .cu) as an input name: one ValueError naming it, before any code is generated."""
    with pytest.raises(ValueError, match=f"input name {name!r} is reserved"):
        symgrad.load_expr(f"Max({name}, y)", inputs=[name, "y"])


# ----------------------------------------------------------------------------- constants (issue 16)

def _heaviside(u, h0):
    return np.where(u > 0, 1.0, np.where(u == 0, h0, 0.0))


# expression, its forward written with NumPy (floats, as written), inputs
CONSTANT_CASES = [
    ("x*Heaviside(1)", lambda x: x * 1.0),
    ("x + sign(2)", lambda x: x + np.sign(2.0)),
    ("x*Heaviside(-3) + x*sign(-0.5)", lambda x: x * 0.0 + x * np.sign(-0.5)),
    ("x*Heaviside(0, 0.25)", lambda x: x * _heaviside(np.float64(0), 0.25)),
    ("x*Max(2, exp(1)) + Min(1, 3)", lambda x: x * max(2.0, np.e) + 1.0),
    ("x*exp(10**29)", lambda x: x * np.exp(1e29)),
    ("(10**29)**x", lambda x: 1e29 ** x),
    ("x*1e308*1e308", lambda x: x * np.inf),
    ("x*exp(-exp(3)) + x*tanh(10**29) - atan(10**29)", lambda x: x * np.exp(-np.exp(3.0)) + x - np.pi / 2),
    ("x/exp(800) + x*sqrt(2)", lambda x: x / np.inf + x * np.sqrt(2.0)),
    ("Piecewise((x, 1 < 2), (2*x, True))", lambda x: x),
    ("Piecewise((2*x, 10**29 < 1), (x, x < 0), (3*x, True))", lambda x: np.where(x < 0, x, 3 * x)),
]


@pytest.mark.parametrize("text,oracle", CONSTANT_CASES, ids=[c[0] for c in CONSTANT_CASES])
def test_constant_parts_are_numbers(text, oracle):
    """Constant sub-expressions (Heaviside(1), sign(2), exp(10**29), 1e308*1e308, a constant
    Piecewise condition) are numbers in the generated code: forward equals NumPy evaluating the
    expression as written (inf where a constant overflows), backward equals central differences
    (here every case is linear or exponential in x, away from its kinks)."""
    with np.errstate(all="ignore"):
        m = symgrad.load_expr(text)
        x = np.array([-2.5, -0.75, 0.5, 1.25, 3.0])
        out, saved = m.forward(x)
        np.testing.assert_allclose(out, oracle(x), rtol=1e-14, equal_nan=False)
        (g,) = m.backward(np.ones_like(x), saved)
        h = 1e-6
        fd = (oracle(x + h) - oracle(x - h)) / (2 * h)
    finite = np.isfinite(fd)
    np.testing.assert_allclose(g[finite], fd[finite], rtol=1e-6)
    assert np.array_equal(np.isinf(g), np.isinf(fd) | (np.isnan(fd) & np.isinf(out))) or not finite.all()


@pytest.mark.parametrize("ties", POLICIES)
def test_heaviside_and_sign_of_zero_are_the_policy_values(ties):
    """Heaviside(0) and sign(0) written as constants take the README's kink values."""
    h0 = {"first": 0.0, "last": 1.0, "split": 0.5, "all": 1.0}[ties]
    s0 = {"first": 1.0, "last": -1.0, "split": 0.0, "all": 0.0}[ties]
    m = symgrad.load_expr("x*Heaviside(0) + 3*x*sign(1 - 1) + Heaviside(0)", ties=ties)
    x = np.array([-1.0, 2.0])
    out, saved = m.forward(x)
    np.testing.assert_array_equal(out, x * h0 + 3 * x * s0 + h0)
    np.testing.assert_array_equal(m.backward(np.ones(2), saved)[0], np.full(2, h0 + 3 * s0))


@pytest.mark.parametrize("text", ["x*exp(10**29)", "(10**29)**x + y", "x*1e308*1e308 - Max(y, 1e308*1e308)",
                                  "x*12345678901234567890123 + y/98765432109876543210",
                                  "Max(x, exp(1000)) + y*exp(-1000)"])
def test_numbers_in_generated_code_are_float_literals(text, tmp_path):
    """No integer literal beyond a double's exact range (a Python int NumPy refuses, a 617-digit
    literal) in either backend; inf where a constant overflows; the .cu compiles with nvcc."""
    py = symgrad.generate_expr(text, tmp_path, name="big", backend="numpy")
    symgrad.generate_expr(text, tmp_path, name="big", backend="cuda")
    cu = next(tmp_path.glob("big_*.cu"))
    import io
    import tokenize
    numbers = [t.string for t in tokenize.generate_tokens(io.StringIO(py.read_text()).readline)
               if t.type == tokenize.NUMBER]
    c_code = re.sub(r"//[^\n]*|/\*.*?\*/", "", cu.read_text(), flags=re.S)
    numbers += re.findall(r"(?<![\w.])\d[\d.]*(?:e[+-]?\d+)?f?", c_code)
    assert numbers and not [n for n in numbers if len(n.rstrip("f").split("e")[0].replace(".", "")) > 17]
    nvcc = harness.find_nvcc()
    if nvcc is not None:
        r = subprocess.run([nvcc, "--fatbin", "-gencode=arch=compute_80,code=sm_80", "-Werror",
                            "all-warnings", str(cu), "-o", str(tmp_path / "big.fatbin")],
                           capture_output=True, text=True, cwd=tmp_path, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]


# ----------------------------------------------------------------------------- bounded cost

def test_expression_cost_is_bounded():
    """Max(exp(x), (x+y+...)**64): the derivation does not expand the power (56 s with 4 inputs,
    killed at 6 GB with 8); run in a subprocess under a 2 GB address-space limit and 120 s."""
    code = (
        "import resource, time, numpy as np, symgrad\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
        "t = time.time()\n"
        "m = symgrad.load_expr('Max(exp(a), (a+b+c+d+e+f+g+h)**64)', ties='split')\n"
        "v = [np.array([0.2 * k]) for k in range(8)]\n"
        "out, saved = m.forward(*v)\n"
        "s = sum(0.2 * k for k in range(8))\n"
        "assert np.allclose(out, s ** 64), out\n"
        "g = m.backward(np.ones(1), saved)\n"
        "assert all(np.allclose(gi, 64 * s ** 63) for gi in g), g\n"
        "print(time.time() - t)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.split()[-1]) < 60


# ----------------------------------------------------------------------------- domain

DOMAIN_CASES = [
    # (text, its forward written with NumPy as written)
    ("sqrt(z)*sqrt(z)", lambda z: np.sqrt(z) * np.sqrt(z)),
    ("(-(z**(1/3)))**3", lambda z: (-(z ** (1 / 3))) ** 3),
    ("exp(log(z))", lambda z: np.exp(np.log(z))),
    ("sqrt(z)**2 + z", lambda z: np.sqrt(z) ** 2 + z),
    ("Piecewise((sqrt(z)**2, z < -1), (sqrt(z), True))", lambda z: np.where(z < -1, np.sqrt(z) ** 2, np.sqrt(z))),
    ("Max(sqrt(z)*sqrt(z), 1)", lambda z: np.maximum(np.sqrt(z) * np.sqrt(z), 1)),
    ("z**(1/4)*z**(3/4)", lambda z: z ** 0.25 * z ** 0.75),
    # kept by SymPy: accepted, and NaN where the written expression is NaN
    ("sqrt(z)*sqrt(z)*sqrt(z)", lambda z: np.sqrt(z) * np.sqrt(z) * np.sqrt(z)),
    ("sqrt(2*z) + z", lambda z: np.sqrt(2 * z) + z),
    ("log(exp(z))", lambda z: np.log(np.exp(z))),
    ("sqrt(z**2)", lambda z: np.sqrt(z ** 2)),
    ("sqrt(z)*log(z)", lambda z: np.sqrt(z) * np.log(z)),
]


@pytest.mark.parametrize("text,oracle", DOMAIN_CASES, ids=[c[0] for c in DOMAIN_CASES])
def test_simplification_keeps_the_domain_or_is_refused(text, oracle):
    """SymPy's automatic simplification (sqrt(z)*sqrt(z) -> z, (-(z**(1/3)))**3 -> -z) must not
    give numbers where the expression as written is NaN: either forward is NaN exactly where
    NumPy evaluating the written expression is, or the expression is refused, naming the domain."""
    z = np.array([-4.0, -2.0, -0.5, 0.25, 0.5, 2.0, 9.0])
    with np.errstate(all="ignore"):
        want = oracle(z)
        try:
            m = symgrad.load_expr(text)
        except ValueError as exc:
            assert "domain" in str(exc) and "\n" not in str(exc)
            assert np.isnan(want).any()  # refused only where the domain would really change
            return
        out, saved = m.forward(z)
        g = m.backward(np.ones_like(z), saved)[0]
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_allclose(out[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-12)
    assert np.isnan(g[np.isnan(want)]).all()


# ----------------------------------------------------------------------------- repeated pieces (issue 15)

REPEATED = [
    # (text, pieces written with SymPy in the order written, kind, points)
    ("Max(x, x)", [X, X], "max", [(1.5, 0), (-2, 0), (0, 0)]),
    ("Min(x, x)", [X, X], "min", [(1.5, 0), (-2, 0)]),
    ("Max(x, y, x)", [X, Y, X], "max", [(1, 1), (2, 1), (1, 2), (0, 0), (-1, -1)]),
    ("Min(x, y, x)", [X, Y, X], "min", [(1, 1), (2, 1), (1, 2), (-3, -3)]),
    ("Max(y, x, x, y)", [Y, X, X, Y], "max", [(1, 1), (2, 1), (1, 2)]),
    ("Max(x + y, y + x, 2*x)", [X + Y, X + Y, 2 * X], "max", [(1, 1), (2, 1), (1, 2), (0, 0)]),
    ("Max(x, 1, 1)", [X, sp.S.One, sp.S.One], "max", [(1, 0), (2, 0), (0, 0)]),
    ("Min(x*y, x*y, x)", [X * Y, X * Y, X], "min", [(1, 1), (2, 3), (2, 0.5), (-1, 2)]),
]


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("case", REPEATED, ids=[c[0] for c in REPEATED])
def test_repeated_pieces_keep_their_identity(case, ties):
    """A piece written twice is two pieces, in the order written (README): the gradient is the
    W-form applied by hand to the pieces as written (policy_weights above), at ties and off."""
    text, pieces, kind, points = case
    names = [s.name for s in (X, Y) if any(p.has(s) for p in pieces)]
    m = symgrad.load_expr(text, ties=ties, inputs=names)
    for point in points:
        env = dict(zip(("x", "y"), point))
        values = [float(p.subs({X: env["x"], Y: env["y"]})) for p in pieces]
        w = policy_weights(values, ties, kind)
        args = [np.array([float(env[n])]) for n in names]
        out, saved = m.forward(*args)
        grads = m.backward(np.ones(1), saved)
        for n, g in zip(names, grads):
            s = sp.Symbol(n, real=True)
            want = sum(float(wi) * float(sp.diff(p, s).subs({X: env["x"], Y: env["y"]}))
                       for wi, p in zip(w, pieces))
            assert g[0] == pytest.approx(want, abs=1e-12), (text, ties, point, n)


@pytest.mark.parametrize("ties", POLICIES)
def test_max_of_x_and_x_is_maximum_of_a_and_a(ties):
    """Max(x, x) gives what maximum(a, a) gives in total (1 to each piece under 'all')."""
    a = np.array([-1.0, 0.0, 2.0])
    m = symgrad.load("maximum", ties=ties)
    out, saved = m.forward(a, a)
    want = sum(m.backward(np.ones(3), saved))
    e = symgrad.load_expr("Max(x, x)", ties=ties)
    out2, saved2 = e.forward(a)
    np.testing.assert_array_equal(out2, out)
    np.testing.assert_array_equal(e.backward(np.ones(3), saved2)[0], want)


# ----------------------------------------------------------------------------- exact constants (issue 28)

def exact_double(value) -> float:
    """value(mpmath), computed by mpmath with 4000 bits (the exact value for a double: 10**308 is
    exact there, sin(2*pi) within 2**-3990 of 0) and rounded once to a double."""
    import mpmath
    with mpmath.workprec(4000):
        return float(value(mpmath))


# a constant written in an expression, its value (mpmath, independent of SymPy and symgrad)
EXACT_CONSTANTS = [("sin(2*pi)", lambda m: m.sin(2 * m.pi)), ("sin(pi)", lambda m: m.sin(m.pi)),
                   ("tan(pi)", lambda m: m.tan(m.pi)), ("cos(pi/2)", lambda m: m.cos(m.pi / 2)),
                   ("sin(pi/2 + pi/2)", lambda m: m.sin(m.pi)), ("cos(3*pi/2)", lambda m: m.cos(3 * m.pi / 2)),
                   ("sin(1e308)", lambda m: m.sin(m.mpf(10) ** 308)),
                   ("cos(1e22)*tan(12345678901234567890)", lambda m: m.cos(m.mpf(10) ** 22) * m.tan(m.mpf(12345678901234567890))),
                   ("sin(pi/7)", lambda m: m.sin(m.pi / 7)), ("exp(1) - 2.718281828459045", lambda m: m.e - m.mpf(2718281828459045) / 10**15)]


@pytest.mark.parametrize("text,value", EXACT_CONSTANTS, ids=[t for t, _ in EXACT_CONSTANTS])
def test_constant_parts_are_exact_values_rounded_once(text, value):
    """A constant part is its exact value rounded once to a double (issue 28): sin(2*pi), sin(pi),
    tan(pi), cos(pi/2) are 0 (not +-1e-34), sin(1e308) is sin(10**308) = -0.7876... (not 0.47, from
    10**308 rounded to 113 bits), a cancellation keeps its leading bits.  Oracle: mpmath with 4000
    bits; the forward of x + c at x = 0, +-1e-300 (where a 1e-34 shows) and 1 equals NumPy's x + c."""
    c = exact_double(value)
    x = np.array([0.0, 1e-300, -1e-300, 1.0])
    out, _ = symgrad.load_expr(f"x + {text}").forward(x)
    assert not mismatch(out, x + c), (text, out, x + c)


def test_a_tie_with_an_exact_zero_constant_follows_the_policy():
    """Max(x, sin(2*pi)) at x = 0 is a tie (sin(2*pi) is 0): under 'last' the constant wins and x's
    gradient is 0 there (issue 28: it was 1, sin(2*pi) being -1.7e-34).  Oracle: the README's 'last'
    (the last piece among the maxima wins), brute force over the pieces [x, sin(2*pi)] (mpmath)."""
    c = exact_double(lambda m: m.sin(2 * m.pi))
    x = np.array([-1.0, -0.0, 0.0, 1e-300, 1.0])
    m = symgrad.load_expr("Max(x, sin(2*pi))", ties="last")
    out, saved = m.forward(x)
    (g,) = m.backward(np.ones_like(x), saved)
    for xi, yi, gi in zip(x, out, g):
        pieces = [xi, c]
        winner = max(k for k, p in enumerate(pieces) if p == max(pieces))
        assert yi == max(pieces) and gi == (1.0 if winner == 0 else 0.0), (xi, yi, gi)


@pytest.mark.parametrize("text", ["x*tan(pi/2)", "x + tan(3*pi/2)", "Max(x, tan(-pi/2))"])
def test_a_constant_at_a_pole_is_refused(text):
    """tan(pi/2) has no value (issue 28: it was 2.3e34): one ValueError line naming the constant."""
    with pytest.raises(ValueError, match=r"constant part 'tan\(-?3?\*?pi/2\)' is undefined") as info:
        symgrad.load_expr(text)
    assert "\n" not in str(info.value)
