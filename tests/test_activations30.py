"""rrelu (evaluation mode) and softshrink (issue 30): max/min of affine pieces.

Oracles: PyTorch 2.13 (F.rrelu(training=False), F.softshrink) and JAX on the CPU under the presets,
bit for bit (the sign of a zero included, any NaN equal to any NaN) in float64/32/16 and bfloat16,
forward and backward, on tie-heavy inputs (the kinks, +-0, +-inf, NaN); JAX has neither op, so its
presets follow jax.nn.leaky_relu(x, (lower + upper)/2) and the where() one writes for softshrink
(conventions.py); the documented exceptions are checked to be exactly those. A brute-force chain
rule through the two max/min nodes written from the README's policy definitions, under every
policy; symgrad.check under every policy and a planted wrong kink value it must catch; central
finite differences away from the kinks; double backward of symgrad.torch's op against PyTorch's;
the cpu backend against the NumPy module.
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
SPECIALS = [-np.inf, -7.0, -1.0, -0.5, -0.3, -0.0, 0.0, 0.3, 0.5, 1.0, 2.5, np.inf, np.nan]
GRADS = [-1.0, 0.5, -0.0, 0.0, 3.0, 0.1, 2.0]

# (op, params, PyTorch, JAX), the kinks of each set of parameters among SPECIALS
CASES = [
    ("rrelu", {}, lambda t: F.rrelu(t, training=False),
     lambda x: jax.nn.leaky_relu(x, (1 / 8 + 1 / 3) / 2)),
    ("rrelu", {"lower": 0.3, "upper": 0.3}, lambda t: F.rrelu(t, 0.3, 0.3, training=False),
     lambda x: jax.nn.leaky_relu(x, 0.3)),
    ("rrelu", {"lower": 0.0, "upper": 0.0}, lambda t: F.rrelu(t, 0.0, 0.0, training=False),
     lambda x: jax.nn.leaky_relu(x, 0.0)),  # slope 0: x * 0 (-0, NaN at -inf), as the frameworks
    ("rrelu", {"lower": 1.5, "upper": 2.5}, lambda t: F.rrelu(t, 1.5, 2.5, training=False),
     lambda x: jax.nn.leaky_relu(x, 2.0)),  # slope > 1: the envelope is a min
    ("softshrink", {}, lambda t: F.softshrink(t, 0.5),
     lambda x: jnp.where(x > 0.5, x - 0.5, jnp.where(x < -0.5, x + 0.5, 0.0))),
    ("softshrink", {"lambd": 0.3}, lambda t: F.softshrink(t, 0.3),
     lambda x: jnp.where(x > 0.3, x - 0.3, jnp.where(x < -0.3, x + 0.3, 0.0))),
    ("softshrink", {"lambd": 0}, lambda t: F.softshrink(t, 0.0),
     lambda x: jnp.where(x > 0, x - 0, jnp.where(x < -0, x + 0, 0.0))),
]
IDS = [f"{c[0]}-{'-'.join(f'{k}{v}' for k, v in c[1].items())}" for c in CASES]


def _same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return np.zeros(got.shape, bool)
    got, want = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(got)
    return (nan == np.isnan(want)) & (nan | ((got == want) & (np.signbit(got) == np.signbit(want))))


def _inputs(dtype):
    x = np.repeat(np.array(SPECIALS), len(GRADS))
    g = np.tile(np.array(GRADS), len(SPECIALS))
    return x.astype(dtype), g.astype(dtype)


def _torch(fn, x, g):
    dt = torch.bfloat16 if x.dtype == BF16 else getattr(torch, np.dtype(x.dtype).name)
    t = torch.tensor(x.astype(np.float64)).to(dt).requires_grad_()
    y = fn(t)
    y.backward(torch.tensor(g.astype(np.float64)).to(dt))
    back = lambda v: v.detach().to(torch.float64).numpy().astype(x.dtype)  # noqa: E731 (exact)
    return back(y), back(t.grad)


def _jax(fn, x, g):
    dt = jnp.bfloat16 if x.dtype == BF16 else x.dtype
    y, pullback = jax.vjp(fn, jnp.asarray(x, dt))
    (gx,) = pullback(jnp.asarray(g, dt))
    return np.asarray(y).astype(x.dtype), np.asarray(gx).astype(x.dtype)


def _ours(module, x, g):
    y, saved = module.forward(x)
    (gx,) = module.backward(g, saved)
    return y, gx


def _exception(name, params, convention, dtype, x, got, want):
    """The documented exceptions (conventions.py): where (forward, backward) may differ."""
    none = np.zeros(x.shape, bool)
    if name == "softshrink" and convention == "torch":
        # NaN: PyTorch's SIMD lanes give 0 (its scalar tail g, the preset's); float16/bfloat16:
        # x * 0 in the zero band, -0 where the preset gives +0; its backward compares with lambd
        # rounded to the dtype, its forward (and the preset) in float32
        zeros, band = np.zeros(x.shape, bool), np.zeros(x.shape, bool)
        if dtype in (np.float16, BF16):
            zeros = (got[0] == 0) & (want[0] == 0) & np.signbit(want[0].astype(np.float64))
            lam = params.get("lambd", 0.5)
            rounded = float(np.array(lam).astype(dtype).astype(np.float64))
            band = (np.abs(x.astype(np.float64)) == rounded) & (rounded != lam) & (want[1] == 0)
        return zeros, np.isnan(x) & (want[1] == 0) | band
    if name == "softshrink" and convention == "jax":
        return np.isnan(x) & (want[0] == 0), none  # where() gives 0 at NaN
    return none, none


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("convention", ["torch", "jax"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_presets_equal_the_frameworks_bit_for_bit(case, convention, dtype):
    name, params, torch_fn, jax_fn = case
    module = symgrad.load(name, convention=convention, **params)
    x, g = _inputs(dtype)
    got = _ours(module, x, g)
    want = _torch(torch_fn, x, g) if convention == "torch" else _jax(jax_fn, x, g)
    for what, a, b, exempt in zip(("forward", "grad"), got, want,
                                  _exception(name, params, convention, dtype, x, got, want)):
        ok = _same(a, b)
        assert (ok | exempt).all(), (f"{name} {params} {convention} {np.dtype(dtype).name} {what}: at x="
                                     f"{x[~ok].tolist()}, g={g[~ok].tolist()}: got {a[~ok].tolist()}, "
                                     f"want {b[~ok].tolist()}")


def _node(kind, p, q, dp, dq, ties):
    """One max/min of two pieces (values p, q with derivatives dp, dq), as the README defines the
    policies: the winner's derivative; at a tie (or two NaNs) first/last/split/all; a NaN beats a
    number (dominate)."""
    beats = (lambda a, b: a > b) if kind == "max" else (lambda a, b: a < b)
    if np.isnan(p) != np.isnan(q):
        return (p, dp) if np.isnan(p) else (q, dq)
    if not np.isnan(p) and beats(p, q):
        return p, dp
    if not np.isnan(p) and beats(q, p):
        return q, dq
    wp, wq = {"first": (1, 0), "last": (0, 1), "split": (0.5, 0.5), "all": (1, 1)}[ties]
    return p, wp * dp + wq * dq


def _reference(name, params, ties, x):
    """Output and derivative, one element at a time, through the op's max/min nodes."""
    y, d = np.empty(x.shape), np.empty(x.shape)
    for i, v in enumerate(map(float, x)):
        if name == "rrelu":
            s = (params.get("lower", 1 / 8) + params.get("upper", 1 / 3)) / 2
            # a slope of 0 without a preset is the number 0 (relu), not x * 0 (README)
            y[i], d[i] = _node("max" if s <= 1 else "min", v, s * v if s else 0.0, 1.0, s, ties)
        else:  # min(max(0, x - lambd), x + lambd)
            lam = params.get("lambd", 0.5)
            u, du = _node("max", 0.0, v - lam, 0.0, 1.0, ties)
            y[i], d[i] = _node("min", u, v + lam, du, 1.0, ties)
    return y, d


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_every_policy_follows_the_definition(case, ties):
    name, params = case[:2]
    module = symgrad.load(name, ties=ties, **params)
    # rrelu compares x with a*x through x (no tie at +-inf, README); softshrink's outer min compares
    # its node u = max(0, x - lambd) with x + lambd by value: at +inf both are inf, a tie
    x = np.array([v for v in SPECIALS if name == "softshrink" or not np.isinf(v)])
    y, gx = _ours(module, x, np.ones_like(x))
    want_y, want_g = _reference(name, params, ties, x)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(gx, want_g, err_msg=f"{name} {params} {ties} at {x.tolist()}")


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("case", CASES[:1] + CASES[4:5], ids=IDS[:1] + IDS[4:5])
def test_check_passes_every_policy(case, ties):
    name, params = case[:2]
    module = symgrad.load(name, ties=ties, **params)
    x = np.array([-1.0, -0.5, 0.0, 0.5, 1.0, 0.25])  # the kinks of both ops among them
    report = symgrad.check(module, x, modes="both")
    assert report.ok, str(report)


@pytest.mark.parametrize("name,params,kink", [("rrelu", {}, 0.0), ("softshrink", {}, 0.5),
                                              ("softshrink", {}, -0.5)])
def test_check_catches_a_wrong_kink_value(name, params, kink):
    """A backward that gives the kink the other policy's value while claiming 'first' fails."""
    ours = symgrad.load(name, ties="last", **params)  # the gradient of the other policy

    def vjp(g, x):
        return ours.backward(g, ours.forward(x)[1])

    pair = (lambda x: ours.forward(x)[0], vjp)
    x = np.array([kink, 2.0])
    report = symgrad.check(pair, x, ties="first", op=name, params=params)
    assert not report.ok
    assert any(f.index == (0,) and f.kind in ("tie", "kink") for f in report.failures), str(report)
    assert symgrad.check(pair, x, ties="last", op=name, params=params).ok


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_finite_differences_away_from_the_kinks(case):
    name, params, torch_fn = case[:3]
    rng = np.random.default_rng(5)
    x = rng.standard_normal(60)
    h = 1e-6
    f = lambda v: torch_fn(torch.tensor(v)).numpy()  # noqa: E731 (the value only)
    for ties in POLICIES:
        if params.get("lambd") == 0 and ties == "all":
            continue  # x - 0 and x + 0 coincide: every x > 0 is a tie, where 'all' counts both
        module = symgrad.load(name, ties=ties, **params)
        (gx,) = module.backward(np.ones_like(x), module.forward(x)[1])
        np.testing.assert_allclose(gx, (f(x + h) - f(x - h)) / (2 * h), atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_symgrad_torch_double_backward_equals_pytorch(case):
    """Piecewise linear: the second derivative is 0, the gradient's derivative in grad_output is
    the gradient's own weight; both as PyTorch's autograd gives them (create_graph=True)."""
    st = pytest.importorskip("symgrad.torch")
    name, params, torch_fn = case[:3]
    ours = st.op(name, convention="torch", **params)
    x0 = np.array([v for v in SPECIALS if not np.isnan(v)])
    rng = np.random.default_rng(7)
    g0, v0 = (rng.integers(-3, 4, size=x0.shape).astype(np.float64) for _ in range(2))
    results = []
    for fn in (ours, torch_fn):
        x, go = torch.tensor(x0, requires_grad=True), torch.tensor(g0, requires_grad=True)
        (gx,) = torch.autograd.grad(fn(x), x, go, create_graph=True)
        second = torch.autograd.grad((gx * torch.tensor(v0)).sum(), (go, x), allow_unused=True)
        results.append([gx.detach().numpy()] + [np.zeros(x0.shape) if s is None else s.detach().numpy()
                                                 for s in second])
    for a, b in zip(*results):
        assert _same(a, b).all(), (a.tolist(), b.tolist())


def test_parameter_errors_are_one_line():
    with pytest.raises(ValueError, match=r"^rrelu: lower must be <= upper, got lower=0.5, upper=0.25$"):
        symgrad.load("rrelu", lower=0.5, upper=0.25)
    with pytest.raises(ValueError, match=r"^rrelu: the slope \(lower \+ upper\)/2 must be finite in "
                       r"float64, got lower=1e\+308, upper=1.7e\+308$"):
        symgrad.load("rrelu", lower=1e308, upper=1.7e308)  # (was an AssertionError in derive)
    with pytest.raises(ValueError, match=r"^softshrink: lambd must be >= 0, got -1$"):
        symgrad.load("softshrink", lambd=-1)
    with pytest.raises(TypeError, match=r"^softshrink: unexpected parameter 'lambda'"):
        symgrad.load("softshrink", **{"lambda": 0.5})


@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
@pytest.mark.parametrize("name,settings", [
    ("rrelu", {"convention": "torch"}), ("rrelu", {"convention": "jax"}),
    ("softshrink", {"convention": "torch"}), ("softshrink", {"ties": "split"}),
    ("softshrink", {"ties": "all", "lambd": 0}),
], ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_cpu_backend_equals_the_numpy_module(name, settings):
    cpu, ref = symgrad.load(name, backend="cpu", **settings), symgrad.load(name, **settings)
    for dtype in (np.float64, np.float32, np.float16):
        x, g = _inputs(dtype)
        for what, a, b in zip(("forward", "grad"), _ours(cpu, x, g), _ours(ref, x, g)):
            assert _same(a, b).all(), f"cpu {name} {settings} {np.dtype(dtype).name} {what}"


FRAMEWORK_FNS = {  # the functions the new conventions-table rows stand for, per framework
    "fmax": (torch.fmax, jnp.fmax), "fmin": (torch.fmin, jnp.fmin),
    "rrelu": CASES[0][2:], "softshrink": CASES[4][2:],
    "hardshrink": (F.hardshrink, lambda x: jnp.where(jnp.abs(x) > 0.5, x, 0.0)),
    "hardswish": (F.hardswish, jax.nn.hard_swish),
    "elu": (lambda t: F.elu(t, 2.5), lambda x: jax.nn.elu(x, 2.5)),
}


def test_conventions_table_rows_are_the_frameworks_gradients():
    """The rows issue 30 adds to `symgrad conventions`: the torch and jax cells are PyTorch's and
    JAX's own gradients at those points (autograd, jax.vjp), and the last column says DIFFER
    exactly where they differ; PyTorch's forward mode of fmax at a tie (the table's note) gives the
    tie to b where its backward gives it to a, fmin's to a in both modes."""
    from symgrad import table
    md = table.markdown().splitlines()
    for op, params, situation, inputs in table.SITUATIONS:
        if op not in FRAMEWORK_FNS:
            continue
        row = next(ln for ln in md if ln.startswith((f"| `{op}` | {situation} |", f"| `{op}(")) and
                   f"` | {situation} |" in ln)  # (an op with parameters: `elu(alpha=2.5)`)
        cells = dict(zip(["torch", "jax"], row.split(" | ")[2:4]))
        t_fn, j_fn = FRAMEWORK_FNS[op]
        ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in inputs]
        t_grads = torch.autograd.grad(t_fn(*ts).sum(), ts)
        arrays = [jnp.asarray(x, jnp.float64) for x in inputs]
        y, pullback = jax.vjp(j_fn, *arrays)
        j_grads = pullback(jnp.ones_like(y))
        assert cells["torch"] == table._cell([g.numpy() for g in t_grads]), row
        assert cells["jax"] == table._cell([np.asarray(g) for g in j_grads]), row
        assert row.endswith(" | DIFFER |") == (cells["torch"] != cells["jax"]), row
    one, ta, tb = (torch.tensor([v], dtype=torch.float64) for v in (1.0, 1.0, 2.0))
    for fn, want in ((torch.fmax, 2.0), (torch.fmin, 1.0)):  # fmax: b's tangent; fmin: a's
        assert torch.func.jvp(fn, (one, one), (ta, tb))[1].item() == want, fn


def test_the_plain_hinge_expression_as_documented():
    """README: max(0, 1 - x) as an expression; at its kink x = 1 the policies give 0, -1, -1/2, -1,
    PyTorch's clamp(1 - x, min=0) -1 and relu(1 - x) 0 (its autograd), JAX's maximum -1/2 (jax.vjp);
    away from the kink every policy is the derivative, on both sides."""
    x = np.array([1.0, 0.5, 2.0, -3.0])
    got = {}
    for ties in POLICIES:
        module = symgrad.load_expr("Max(0, 1 - x)", ties=ties)
        y, saved = module.forward(x)
        np.testing.assert_array_equal(y, np.maximum(0.0, 1.0 - x))
        (got[ties],) = module.backward(np.ones_like(x), saved)
        np.testing.assert_array_equal(got[ties][1:], [-1.0, 0.0, -1.0])
    assert [got[t][0] for t in POLICIES] == [0.0, -1.0, -0.5, -1.0]
    t = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    (clamp,) = torch.autograd.grad(torch.clamp(1 - t, min=0).sum(), t)
    (relu,) = torch.autograd.grad(F.relu(1 - t).sum(), t)
    _, pullback = jax.vjp(lambda v: jnp.maximum(0.0, 1.0 - v), jnp.asarray([1.0]))
    assert (clamp.item(), relu.item(), float(pullback(jnp.ones(1))[0][0])) == (-1.0, 0.0, -0.5)
    assert got["first"][0] == relu.item() and got["last"][0] == clamp.item()


def _shrink_torch_paths(fn, x, g, lambd):
    """fn's (F.softshrink, F.hardshrink) (output, grad) on x through a contiguous tensor (len(x) a multiple of every
    lane count: all in PyTorch's SIMD lanes) and through a strided view of the same values (its
    scalar path), as arrays of x's dtype."""
    def tensor(a):
        if a.dtype == BF16:
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)

    def array(t):
        t = t.detach().contiguous()
        return t.view(torch.int16).numpy().view(BF16) if t.dtype == torch.bfloat16 else t.numpy()

    paths = []
    for t in (tensor(x).clone(), torch.stack([tensor(x)] * 2, 1)[:, 0]):
        t.requires_grad_()
        y = fn(t, lambd)
        y.backward(tensor(g))
        paths.append((array(y), array(t.grad)))
    return paths


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_softshrink_torch_preset_follows_simd_forward_and_scalar_backward(dtype):
    """PyTorch's softshrink contradicts itself (conventions.py, the preset's note), checked exactly:
    on every float16 and bfloat16 value (a tie-heavy sample in float32/64) the preset equals its
    SIMD lanes' forward (+0 in the zero band) and its scalar path's backward (g at NaN); its scalar
    path's forward is x * 0, -0 exactly where -lambd <= x <= -0, and its lanes' gradient at NaN 0."""
    lambd = 0.5
    if dtype in (np.float16, BF16):
        x = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    else:
        x = np.resize(np.concatenate([SPECIALS, np.random.default_rng(3).uniform(-2, 2, 499)]), 1024)
        x = x.astype(dtype)
    g = np.full(x.shape, 0.75, x.dtype)
    with np.errstate(invalid="ignore"):  # (signaling NaN bit patterns)
        ours = _ours(symgrad.load("softshrink", convention="torch", lambd=lambd), x, g)
        xf = x.astype(np.float64)
    (lane_y, lane_g), (scalar_y, scalar_g) = _shrink_torch_paths(F.softshrink, x, g, lambd)
    nan, band = np.isnan(xf), (xf >= -lambd) & np.signbit(xf)
    assert _same(ours[0], lane_y).all() and _same(ours[1], scalar_g).all()
    differs = ~_same(ours[0], scalar_y)
    assert band.any() and (differs == (band & ~nan)).all()
    assert (np.signbit(scalar_y[band].astype(np.float64)) & (scalar_y[band] == 0)).all()
    assert (~_same(ours[1], lane_g) == nan).all() and (lane_g[nan] == 0).all()


# ----------------------------------------------------------------------------- hardshrink

HARDSHRINK = [{}, {"lambd": 0.3}, {"lambd": 0}]


def _hardshrink_exception(params, dtype, x, want):
    """Where PyTorch's hardshrink (scalar path) may differ from the torch preset: its float16 and
    bfloat16 kernel compares x with lambd rounded to the dtype (the preset, like its float16
    forward, in float32), so at |x| == that rounding of a lambd it does not hold it gives 0."""
    lam = params.get("lambd", 0.5)
    if dtype not in (np.float16, BF16):
        return np.zeros(x.shape, bool)
    rounded = float(np.array(lam).astype(dtype).astype(np.float64))
    return (np.abs(x.astype(np.float64)) == rounded) & (rounded != lam) & (want[0] == 0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("params", HARDSHRINK, ids=lambda p: f"lambd{p.get('lambd', 0.5)}")
def test_hardshrink_presets_equal_the_frameworks_bit_for_bit(params, dtype):
    """torch: F.hardshrink on its scalar path (a strided view); its SIMD lanes (a contiguous
    tensor) differ exactly in the gradient at NaN (0 there, g on the scalar path and in the
    preset). jax: where(abs(x) > lambd, x, 0), as one writes it in JAX."""
    lam = params.get("lambd", 0.5)
    x, g = _inputs(dtype)
    x, g = np.resize(x, 128).astype(dtype), np.resize(g, 128).astype(dtype)  # 128: whole lanes
    ours = _ours(symgrad.load("hardshrink", convention="torch", **params), x, g)
    with np.errstate(invalid="ignore"):
        (lane_y, lane_g), (scalar_y, scalar_g) = _shrink_torch_paths(F.hardshrink, x, g, lam)
    exempt = _hardshrink_exception(params, dtype, x, (scalar_y, scalar_g))
    for what, a, b in (("forward", ours[0], scalar_y), ("grad", ours[1], scalar_g)):
        ok = _same(a, b) | exempt
        assert ok.all(), f"torch {params} {what} at x={x[~ok].tolist()}: {a[~ok].tolist()} {b[~ok].tolist()}"
    nan = np.isnan(x.astype(np.float64))
    assert _same(lane_y, scalar_y).all() and (~_same(lane_g, scalar_g) <= nan).all()
    assert (lane_g[nan] == 0).all() and (scalar_g[nan] == g[nan]).all()
    ours = _ours(symgrad.load("hardshrink", convention="jax", **params), x, g)
    want = _jax(lambda v: jnp.where(jnp.abs(v) > lam, v, 0.0), x, g)
    for what, a, b in zip(("forward", "grad"), ours, want):
        assert _same(a, b).all(), f"jax {params} {what}: {a.tolist()} {b.tolist()}"


def _hardshrink_reference(lam, ties, x):
    """The README's definition one element at a time: max(lambd, x, -x) scanned in order (a NaN
    beats every number, NaNs tie: 'dominate'), the winner's value (0, x, x) and its derivative."""
    y, d = np.empty(x.shape), np.empty(x.shape)
    for i, v in enumerate(map(float, x)):
        pieces, values, slopes = (lam, v, -v), (0.0, v, v), (0.0, 1.0, 1.0)
        best = 0
        for j in (1, 2):
            p, b = pieces[j], pieces[best]
            if np.isnan(b) and not np.isnan(p):
                continue
            if (np.isnan(p) and not np.isnan(b)) or p > b or (p == b or np.isnan(p)) and ties == "last":
                best = j
        y[i], d[i] = values[best], slopes[best]
    return y, d


@pytest.mark.parametrize("ties", ["first", "last"])
@pytest.mark.parametrize("params", HARDSHRINK, ids=lambda p: f"lambd{p.get('lambd', 0.5)}")
def test_hardshrink_every_policy_follows_the_definition(params, ties):
    x = np.array(SPECIALS)
    y, gx = _ours(symgrad.load("hardshrink", ties=ties, **params), x, np.ones_like(x))
    want_y, want_g = _hardshrink_reference(params.get("lambd", 0.5), ties, x)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(gx, want_g, err_msg=f"{params} {ties}")


def test_hardshrink_check_finite_differences_and_errors():
    x = np.array([-1.0, -0.5, 0.0, 0.5, 1.0, 0.25])
    for ties in ("first", "last"):
        assert symgrad.check(symgrad.load("hardshrink", ties=ties), x, modes="both").ok
    wrong = symgrad.load("hardshrink", ties="last")  # 'last''s gradient at the kinks, claimed 'first'
    pair = (lambda v: wrong.forward(v)[0], lambda g, v: wrong.backward(g, wrong.forward(v)[1]))
    report = symgrad.check(pair, np.array([0.5, 2.0]), ties="first", op="hardshrink")
    assert not report.ok and any(f.index == (0,) for f in report.failures), str(report)
    v = np.random.default_rng(5).standard_normal(60)
    (gx,) = _ours(symgrad.load("hardshrink"), v, np.ones_like(v))[1:]
    h = 1e-6
    fd = (F.hardshrink(torch.tensor(v + h)) - F.hardshrink(torch.tensor(v - h))).numpy() / (2 * h)
    np.testing.assert_allclose(gx, fd, atol=1e-6)
    v = np.array([-1.0, -0.5, -0.0, 0.0, 0.25, np.nan])  # lambd < 0: no band (F.hardshrink: x)
    np.testing.assert_array_equal(symgrad.load("hardshrink", lambd=-0.5).forward(v)[0], v)
    with pytest.raises(ValueError, match=r"hardshrink.*split"):
        symgrad.load("hardshrink", ties="split")


@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
def test_hardshrink_cpu_backend_equals_the_numpy_module():
    cpu, ref = (symgrad.load("hardshrink", backend=b, convention="torch") for b in ("cpu", "numpy"))
    for dtype in (np.float64, np.float32, np.float16):
        x, g = _inputs(dtype)
        for what, a, b in zip(("forward", "grad"), _ours(cpu, x, g), _ours(ref, x, g)):
            assert _same(a, b).all(), f"cpu hardshrink {np.dtype(dtype).name} {what}"
