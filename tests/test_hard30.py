"""hardsigmoid (issue 30): (min(3, max(-3, x)) + 3) / 6, the output an affine map of a max/min.

Oracles: PyTorch 2.13 (F.hardsigmoid) and JAX (jax.nn.hard_sigmoid) on the CPU under the presets,
bit for bit (signs of zero included, any NaN equal to any NaN), forward and backward, in float64
and float32 on the kinks +-3, their neighbours, +-0, +-inf and NaN, and on every float16 and
bfloat16 value; the one documented exception (JAX's bfloat16 forward multiplies by 1/6 in float32)
recomputed here and exempted exactly there.  A brute-force chain rule through the two max/min
nodes from the README's policies, every policy; symgrad.check under every policy and a planted
wrong kink value; finite differences; double backward of symgrad.torch's op against PyTorch's;
the cpu backend against the NumPy module; the conventions table's rows against the frameworks.
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
from test_activations30 import _jax, _node, _ours, _same, _torch  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
GRADS = [-1.0, 0.5, -0.0, 0.0, 3.0, 0.1, 2.0, 1e-3]
# float32 and bfloat16 in the default run, float64 and float16 (every value) with -m slow
DTYPES = [pytest.param(np.float64, marks=pytest.mark.slow), np.float32,
          pytest.param(np.float16, marks=pytest.mark.slow), BF16]


def _inputs(dtype):
    """Every float16/bfloat16 value; in float32/64 the kinks, their neighbours and the specials,
    and random values."""
    if dtype in (np.float16, BF16):
        x = np.arange(2**16, dtype=np.uint16).view(dtype)
    else:
        kinks = [-3.0, 3.0, -0.0, 0.0, np.inf, -np.inf, np.nan, 1e-300, -7.0, 0.5]
        near = [np.nextafter(k, d) for k in (-3.0, 3.0) for d in (-np.inf, np.inf)]
        rng = np.random.default_rng(3)
        x = np.concatenate([np.array(kinks + near).astype(dtype), rng.normal(0, 4, 500).astype(dtype),
                            np.nextafter(np.array(near).astype(dtype), dtype(0))])
    g = np.resize(np.array(GRADS), x.shape).astype(dtype)
    return x, g


def _jax_bf16(x, sixth):
    """relu6(x + 3) in bfloat16, times sixth in float32, rounded to bfloat16 once."""
    u = np.clip((x.astype(np.float32) + np.float32(3)).astype(BF16), 0, 6).astype(np.float32)
    return (u * np.float32(sixth)).astype(BF16)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("convention", ["torch", "jax"])
def test_presets_equal_the_frameworks_bit_for_bit(convention, dtype):
    module = symgrad.load("hardsigmoid", convention=convention)
    x, g = _inputs(dtype)
    got = _ours(module, x, g)
    want = _torch(F.hardsigmoid, x, g) if convention == "torch" else _jax(jax.nn.hard_sigmoid, x, g)
    for what, a, b in zip(("forward", "grad"), got, want):
        ok = _same(a, b)
        if convention == "jax" and dtype == BF16 and what == "forward":
            # the documented exception: JAX multiplies by 1/6 in float32, the preset by 1/6
            # rounded to bfloat16 (as it rounds every constant in bfloat16)
            assert _same(b, _jax_bf16(x, np.float32(1 / 6))).all()
            ok |= _same(a, _jax_bf16(x, np.float32(BF16.type(1 / 6))))
        assert ok.all(), (f"{convention} {np.dtype(dtype).name} {what}: at x={x[~ok][:8].tolist()}: "
                          f"got {a[~ok][:8].tolist()}, want {b[~ok][:8].tolist()}")


def test_the_presets_differ_just_below_3():
    """PyTorch compares x < 3, JAX x + 3 < 6: at the float below 3, where x + 3 rounds to 6, the
    output is 1 in both and the gradient 1/6 in PyTorch, 0 in JAX (as the presets give)."""
    x = np.array([np.nextafter(np.float32(3), np.float32(0))])
    g = np.ones_like(x)
    t, j = _torch(F.hardsigmoid, x, g), _jax(jax.nn.hard_sigmoid, x, g)
    assert t[0][0] == j[0][0] == 1 and t[1][0] == np.float32(1 / 6) and j[1][0] == 0
    for convention, want in (("torch", t), ("jax", j)):
        got = _ours(symgrad.load("hardsigmoid", convention=convention), x, g)
        assert all(_same(a, b).all() for a, b in zip(got, want)), convention


def _reference(ties, x):
    """(min(3, max(-3, x)) + 3) / 6 and its derivative, one element at a time."""
    y, d = np.empty(x.shape), np.empty(x.shape)
    for i, v in enumerate(map(float, x)):
        u, du = _node("max", -3.0, v, 0.0, 1.0, ties)
        u, du = _node("min", 3.0, u, 0.0, du, ties)
        y[i], d[i] = (u + 3) / 6, du / 6
    return y, d


@pytest.mark.parametrize("ties", POLICIES)
def test_every_policy_follows_the_definition(ties):
    module = symgrad.load("hardsigmoid", ties=ties)
    x = np.array([-np.inf, -4.0, -3.0, -1.0, -0.0, 0.0, 2.5, 3.0, 7.0, np.inf, np.nan])
    y, gx = _ours(module, x, np.ones_like(x))
    want_y, want_g = _reference(ties, x)
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(gx, want_g, err_msg=f"{ties} at {x.tolist()}")


@pytest.mark.parametrize("ties", POLICIES)
def test_check_passes_every_policy(ties):
    module = symgrad.load("hardsigmoid", ties=ties)
    report = symgrad.check(module, np.array([-3.0, 3.0, 0.5, -4.0, 4.0]), modes="both")
    assert report.ok, str(report)


@pytest.mark.parametrize("kink", [-3.0, 3.0])
def test_check_catches_a_wrong_kink_value(kink):
    """A backward that gives a kink the other policy's value while claiming 'first' fails."""
    ours = symgrad.load("hardsigmoid", ties="last")

    def vjp(g, x):
        return ours.backward(g, ours.forward(x)[1])

    pair = (lambda x: ours.forward(x)[0], vjp)
    x = np.array([kink, 0.5])
    report = symgrad.check(pair, x, ties="first", op="hardsigmoid")
    assert not report.ok
    assert any(f.index == (0,) and f.kind in ("tie", "kink") for f in report.failures), str(report)
    assert symgrad.check(pair, x, ties="last", op="hardsigmoid").ok


def test_finite_differences_away_from_the_kinks():
    x = np.random.default_rng(5).normal(0, 3, 60)
    x = x[np.abs(np.abs(x) - 3) > 1e-3]
    h = 1e-6
    want = (F.hardsigmoid(torch.tensor(x + h)) - F.hardsigmoid(torch.tensor(x - h))).numpy() / (2 * h)
    for ties in POLICIES:
        module = symgrad.load("hardsigmoid", ties=ties)
        (gx,) = module.backward(np.ones_like(x), module.forward(x)[1])
        np.testing.assert_allclose(gx, want, atol=1e-6)


def test_symgrad_torch_double_backward():
    """PyTorch 2.13 has no double backward for hardsigmoid (hardsigmoid_backward's derivative is
    not implemented: a RuntimeError).  symgrad's op is piecewise linear: the gradient's derivative
    in grad_output is the gradient's weight (PyTorch's first-order gradient of v), in x it is 0."""
    st = pytest.importorskip("symgrad.torch")
    x0 = np.array([-np.inf, -4.0, -3.0, -1.0, -0.0, 0.0, 2.5, 3.0, 7.0, np.inf])
    rng = np.random.default_rng(7)
    g0, v0 = (rng.integers(-3, 4, size=x0.shape).astype(np.float64) for _ in range(2))
    x, go = torch.tensor(x0, requires_grad=True), torch.tensor(g0, requires_grad=True)
    (gx,) = torch.autograd.grad(F.hardsigmoid(x), x, go, create_graph=True)
    with pytest.raises(RuntimeError, match="hardsigmoid_backward is not implemented"):
        torch.autograd.grad((gx * torch.tensor(v0)).sum(), (go, x))
    (want,) = torch.autograd.grad(F.hardsigmoid(x), x, torch.tensor(v0))
    (gx,) = torch.autograd.grad(st.op("hardsigmoid", convention="torch")(x), x, go, create_graph=True)
    d_go, d_x = torch.autograd.grad((gx * torch.tensor(v0)).sum(), (go, x), allow_unused=True)
    assert _same(d_go.detach().numpy(), want.numpy()).all()
    assert d_x is None or not d_x.detach().numpy().any()


@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
@pytest.mark.parametrize("settings", [{"convention": "torch"},
                                      pytest.param({"convention": "jax"}, marks=pytest.mark.slow),
                                      pytest.param({"ties": "split"}, marks=pytest.mark.slow)],
                         ids=lambda v: "-".join(map(str, v.values())))
def test_cpu_backend_equals_the_numpy_module(settings):
    cpu, ref = symgrad.load("hardsigmoid", backend="cpu", **settings), symgrad.load("hardsigmoid", **settings)
    for dtype in (np.float64, np.float32, np.float16):
        x, g = _inputs(dtype)
        for what, a, b in zip(("forward", "grad"), _ours(cpu, x, g), _ours(ref, x, g)):
            assert _same(a, b).all(), f"cpu {settings} {np.dtype(dtype).name} {what}"


@pytest.mark.slow
def test_conventions_table_rows_are_the_frameworks_gradients():
    """The rows of `symgrad conventions` for hardsigmoid: the torch and jax cells are PyTorch's
    autograd and jax.vjp at those points; docs/conventions.md holds them as measured."""
    from pathlib import Path

    from symgrad import table
    doc = (Path(__file__).resolve().parent.parent / "docs" / "conventions.md").read_text()
    fns = {"hardsigmoid": (F.hardsigmoid, jax.nn.hard_sigmoid),
           "threshold": (lambda t: F.threshold(t, 1.0, 5.0), lambda v: jnp.where(v > 1.0, v, 5.0))}
    rows = [s for s in table.SITUATIONS if s[0] in fns]
    assert len(rows) == 4
    for op, params, situation, (x,) in rows:
        t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        (tg,) = torch.autograd.grad(fns[op][0](t).sum(), t)
        y, pullback = jax.vjp(fns[op][1], jnp.asarray(x, jnp.float64))
        (jg,) = pullback(jnp.ones_like(y))
        cells = [table.measure(c, op, params, (x,)) for c in table.COLUMNS]
        assert cells[table.COLUMNS.index("torch")] == table._cell([tg.numpy()]), situation
        assert cells[table.COLUMNS.index("jax")] == table._cell([np.asarray(jg)]), situation
        flag = "DIFFER" if table._cell([tg.numpy()]) != table._cell([np.asarray(jg)]) else "same"
        label = op + (f"({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")
        assert f"| `{label}` | {situation} | " + " | ".join(cells) + f" | {flag} |" in doc


# ----------------------------------------------------------------------------- threshold
#
# F.threshold(x, threshold, value): x where x > threshold, else value: W of max(threshold, x)
# times (value, x).  JAX has none: its preset is the where() one writes.

THRESHOLDS = [(1.0, 5.0), pytest.param(0.3, -2.5, marks=pytest.mark.slow),
              pytest.param(-3.0, 0.0, marks=pytest.mark.slow)]


def _threshold_inputs(dtype, th):
    x, g = _inputs(dtype)
    if dtype not in (np.float16, BF16):  # the threshold as the dtype holds it, and its neighbours
        t = np.array(th).astype(dtype)
        x = np.concatenate([x, [t, np.nextafter(t, dtype(-np.inf)), np.nextafter(t, dtype(np.inf))]])
        g = np.resize(np.array(GRADS), x.shape).astype(dtype)
    return x, g


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("convention", ["torch", "jax"])
@pytest.mark.parametrize("th,value", THRESHOLDS)
def test_threshold_presets_equal_the_frameworks_bit_for_bit(th, value, convention, dtype):
    module = symgrad.load("threshold", convention=convention, threshold=th, value=value)
    x, g = _threshold_inputs(dtype, th)
    got = _ours(module, x, g)
    want = (_torch(lambda t: F.threshold(t, th, value), x, g) if convention == "torch"
            else _jax(lambda v: jnp.where(v > th, v, value), x, g))
    for what, a, b in zip(("forward", "grad"), got, want):
        ok = _same(a, b)
        assert ok.all(), (f"{convention} {np.dtype(dtype).name} {what}: at x={x[~ok][:8].tolist()}: "
                          f"got {a[~ok][:8].tolist()}, want {b[~ok][:8].tolist()}")


@pytest.mark.parametrize("ties", ["first", "last"])
def test_threshold_every_policy_follows_the_definition(ties):
    """W of max(1, x) (the README's policies, _node) times (5, x), and its a.e. derivative."""
    module = symgrad.load("threshold", ties=ties, threshold=1, value=5)
    x = np.array([-np.inf, -4.0, 0.0, 1.0, 2.5, np.inf, np.nan])
    y, gx = _ours(module, x, np.ones_like(x))
    for i, v in enumerate(map(float, x)):
        _, w = _node("max", 1.0, v, 0.0, 1.0, ties)  # x's weight
        want = v if w else 5.0
        assert _same(y[i], want) and gx[i] == w, (ties, v, y[i], gx[i])


def test_threshold_refuses_split_all_and_bad_parameters():
    for ties in ("split", "all"):
        with pytest.raises(ValueError, match=r"^threshold: ties must be 'first' or 'last' \(the output"):
            symgrad.load("threshold", ties=ties, threshold=1, value=5)
    with pytest.raises(TypeError, match=r"^threshold: missing required parameter 'value'$"):
        symgrad.load("threshold", threshold=1)


@pytest.mark.parametrize("ties", ["first", "last"])
def test_threshold_check_passes_and_catches_a_wrong_value(ties):
    module = symgrad.load("threshold", ties=ties, threshold=1, value=5)
    x = np.array([1.0, 0.5, 2.0])
    assert symgrad.check(module, x, modes="both").ok
    other = symgrad.load("threshold", ties="last" if ties != "last" else "first", threshold=1, value=5)

    def vjp(g, v):
        return other.backward(g, other.forward(v)[1])

    report = symgrad.check((lambda v: module.forward(v)[0], vjp), x, ties=ties, op="threshold",
                           params={"threshold": 1, "value": 5})
    assert not report.ok and any(f.index == (0,) for f in report.failures), str(report)


def test_threshold_finite_differences_and_double_backward():
    x0 = np.random.default_rng(5).normal(0, 3, 60)
    x0 = x0[np.abs(x0 - 1) > 1e-3]
    h = 1e-6
    f = lambda v: F.threshold(torch.tensor(v), 1.0, 5.0).numpy()  # noqa: E731
    module = symgrad.load("threshold", threshold=1, value=5)
    (gx,) = module.backward(np.ones_like(x0), module.forward(x0)[1])
    np.testing.assert_allclose(gx, (f(x0 + h) - f(x0 - h)) / (2 * h), atol=1e-6)
    st = pytest.importorskip("symgrad.torch")
    x1 = np.array([-np.inf, -4.0, 0.0, 1.0, 2.5, np.inf])
    g0, v0 = np.arange(6.0) - 2, np.arange(6.0)[::-1].copy()
    results = []
    for fn in (st.op("threshold", convention="torch", threshold=1, value=5),
               lambda t: F.threshold(t, 1.0, 5.0)):
        x, go = torch.tensor(x1, requires_grad=True), torch.tensor(g0, requires_grad=True)
        (gx,) = torch.autograd.grad(fn(x), x, go, create_graph=True)
        second = torch.autograd.grad((gx * torch.tensor(v0)).sum(), (go, x), allow_unused=True)
        results.append([gx.detach().numpy()] + [np.zeros(x1.shape) if s is None else s.detach().numpy()
                                                 for s in second])
    for a, b in zip(*results):
        assert _same(a, b).all(), (a.tolist(), b.tolist())


@pytest.mark.slow
@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
def test_threshold_cpu_backend_equals_the_numpy_module():
    kw = dict(convention="torch", threshold=0.3, value=-2.5)
    cpu, ref = symgrad.load("threshold", backend="cpu", **kw), symgrad.load("threshold", **kw)
    for dtype in (np.float64, np.float32, np.float16):
        x, g = _threshold_inputs(dtype, 0.3)
        for what, a, b in zip(("forward", "grad"), _ours(cpu, x, g), _ours(ref, x, g)):
            assert _same(a, b).all(), f"cpu threshold {np.dtype(dtype).name} {what}"
