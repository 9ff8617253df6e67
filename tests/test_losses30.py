"""The margin losses (issue 30): l1_loss and margin_ranking_loss, elementwise in the W-matrix view,
with PyTorch's reduction around them (symgrad/losses.py).

Oracles: PyTorch 2.13 (F.l1_loss, F.margin_ranking_loss) and JAX on the CPU (the expression a JAX
user writes: jnp.abs(input - target), jnp.maximum(0, margin - target * (input1 - input2)), under
jnp.mean/jnp.sum) under the presets, bit for bit (the sign of a zero included, any NaN equal to
any NaN) in float64/32/16 and bfloat16, forward and backward, on tie-heavy grids (every pair of
-inf, -1, -0.5, +-0, 0.3, 0.5, 1, 2, +inf, NaN: input = target, the margin's kink, y = +-1);
the reductions' sums (at::sum's order, one thread) and the mean's division; a brute-force chain
rule through the max node from the README's policy definitions, under every policy; finite
differences away from the kinks; symgrad.check under every policy.
"""

from __future__ import annotations

import itertools
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
VALUES = [-np.inf, -1.0, -0.5, -0.0, 0.0, 0.3, 0.5, 1.0, 2.0, np.inf, np.nan]
GRADS = [1.0, -0.5, 0.0, -0.0, np.inf]
TARGETS = [1.0, -1.0, 0.5, 0.0, np.nan]  # margin_ranking_loss's y: +-1, and what else it takes


def _margin_fns(margin):
    return (lambda a, b, y: F.margin_ranking_loss(a, b, y, margin=margin, reduction="none"),
            lambda a, b, y: jnp.maximum(0.0, margin - y * (a - b)))


# (op, params, inputs, PyTorch, JAX): the inputs' grids
CASES = [
    ("l1_loss", {}, (VALUES, VALUES), lambda a, b: F.l1_loss(a, b, reduction="none"),
     lambda a, b: jnp.abs(a - b)),
    ("margin_ranking_loss", {}, (VALUES, VALUES, TARGETS)) + _margin_fns(0.0),
    ("margin_ranking_loss", {"margin": 0.3}, (VALUES, VALUES, TARGETS)) + _margin_fns(0.3),
    ("margin_ranking_loss", {"margin": 1.0}, (VALUES, VALUES, TARGETS[:2])) + _margin_fns(1.0),
]
IDS = [f"{c[0]}-{'-'.join(f'{k}{v}' for k, v in c[1].items())}" for c in CASES]


def _same(got, want):
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return np.zeros(got.shape, bool)
    got, want = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(got)
    return (nan == np.isnan(want)) & (nan | ((got == want) & (np.signbit(got) == np.signbit(want))))


def _grid(columns, dtype):
    """Every combination of the columns' values, with every grad_output."""
    rows = np.array(list(itertools.product(*columns, GRADS))).T
    return [r.astype(dtype) for r in rows[:-1]], rows[-1].astype(dtype)


def _torch_dtype(dtype):
    return torch.bfloat16 if dtype == BF16 else getattr(torch, np.dtype(dtype).name)


def _torch(fn, xs, g):
    dt = _torch_dtype(xs[0].dtype)
    ts = [torch.tensor(x.astype(np.float64)).to(dt).requires_grad_() for x in xs]
    y = fn(*ts)
    grads = torch.autograd.grad(y, ts, torch.tensor(np.asarray(g, np.float64)).to(dt))
    back = lambda v: v.detach().to(torch.float64).numpy().astype(xs[0].dtype)  # noqa: E731 (exact)
    return back(y), [back(v) for v in grads]


def _jax(fn, xs, g):
    dt = jnp.bfloat16 if xs[0].dtype == BF16 else xs[0].dtype
    y, pullback = jax.vjp(fn, *[jnp.asarray(x, dt) for x in xs])
    back = lambda v: np.asarray(v).astype(xs[0].dtype)  # noqa: E731
    return back(y), [back(v) for v in pullback(jnp.asarray(g, dt))]


def _ours(module, xs, g):
    y, saved = module.forward(*xs)
    return y, list(module.backward(g, saved))


def _assert_same(got, want, xs, g, what):
    for name, a, b in zip(["forward"] + [f"grad {k}" for k in range(len(xs))],
                          [got[0]] + got[1], [want[0]] + want[1]):
        ok = _same(a, b) if np.ndim(a) else _same([a], [b])
        assert ok.all(), (f"{what} {name}: at {[x[~ok][:4].tolist() for x in xs] if np.ndim(a) else ''} "
                          f"g={np.asarray(g)[~ok][:4].tolist() if np.ndim(a) else g}: got "
                          f"{np.asarray(a)[~ok][:4].tolist()}, want {np.asarray(b)[~ok][:4].tolist()}")


SLOW = pytest.mark.slow  # the default run keeps a representative set (the suite's time budget)


def _variants(cases, ids, dtypes, default):
    """(case, convention, dtype) params: those default(case id, convention, dtype name) keeps run
    by default, the others with -m slow."""
    for case, i in zip(cases, ids):
        for convention in ("torch", "jax"):
            for dtype in dtypes:
                name = np.dtype(dtype).name
                marks = () if default(i, convention, name) else (SLOW,)
                yield pytest.param(case, convention, dtype, marks=marks, id=f"{i}-{convention}-{name}")


@pytest.mark.parametrize("case,convention,dtype", _variants(
    CASES, IDS, DTYPES, lambda i, c, d: (i, d) in (("l1_loss-", "float32"),
                                                   ("margin_ranking_loss-margin0.3", "float16"))))
def test_presets_equal_the_frameworks_bit_for_bit(case, convention, dtype):
    name, params, columns, torch_fn, jax_fn = case
    module = symgrad.load(name, convention=convention, **params)  # reduction='none'
    xs, g = _grid(columns, dtype)
    want = _torch(torch_fn, xs, g) if convention == "torch" else _jax(jax_fn, xs, g)
    _assert_same(_ours(module, xs, g), want, xs, g, f"{name} {params} {convention} {np.dtype(dtype).name}")


REDUCED = {  # (PyTorch, JAX) of each reduction, the elementwise functions of CASES inside
    "l1_loss": (lambda red: lambda a, b: F.l1_loss(a, b, reduction=red),
                lambda red: lambda a, b: getattr(jnp, red)(jnp.abs(a - b))),
    "margin_ranking_loss": (
        lambda red: lambda a, b, y: F.margin_ranking_loss(a, b, y, margin=0.3, reduction=red),
        lambda red: lambda a, b, y: getattr(jnp, red)(jnp.maximum(0.0, 0.3 - y * (a - b)))),
}


def _reduced_inputs(name, n, dtype):
    rng = np.random.default_rng(n)
    xs = [(rng.standard_normal(n) * 3).round(1) for _ in range(2)]
    if name == "margin_ranking_loss":
        xs.append(rng.choice([1.0, -1.0], n))
    return [x.astype(dtype) for x in xs]


@pytest.mark.parametrize("dtype", [pytest.param(d, marks=() if d == np.float32 else (SLOW,))
                                   for d in DTYPES], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("sizes", [(300,), pytest.param((0, 1, 7, 33, 2000), marks=SLOW)], ids=str)
@pytest.mark.parametrize("reduction", [pytest.param("sum", marks=SLOW), "mean"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "l1_loss" else (SLOW,))
                                  for n in REDUCED])
def test_reductions_equal_the_frameworks(name, reduction, dtype, sizes):
    """PyTorch (one thread): forward (at::sum's order; the mean's division) and backward bit for
    bit. JAX: backward bit for bit (jnp.mean's g / count), forward within XLA's summation order
    (NumPy's pairwise sum here): a few units in the last place of float32's sum of magnitudes."""
    torch_fn, jax_fn = REDUCED[name]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for n in sizes:
            xs = _reduced_inputs(name, n, dtype)
            g = np.asarray(0.7, dtype)
            got = _ours(symgrad.load(name, convention="torch", reduction=reduction,
                                     **({"margin": 0.3} if name != "l1_loss" else {})), xs, g)
            _assert_same(got, _torch(torch_fn(reduction), xs, g), xs, g, f"torch {n}")
            module = symgrad.load(name, convention="jax", reduction=reduction,
                                  **({"margin": 0.3} if name != "l1_loss" else {}))
            y, grads = _ours(module, xs, g)
            want_y, want_grads = _jax(jax_fn(reduction), xs, g)
            _assert_same((y, grads), (y, want_grads), xs, g, f"jax {n}")
            scale = np.sum(np.abs(module.module.forward(*xs)[0].astype(np.float64)))
            eps = float(np.finfo(np.float32 if dtype == BF16 else dtype).eps)
            assert abs(float(y) - float(want_y)) <= 4 * eps * scale / (n if reduction == "mean" and n else 1) \
                + abs(float(want_y)) * float(np.finfo(dtype).eps if dtype != BF16 else 2**-8) \
                or (np.isnan(float(y)) and np.isnan(float(want_y))), (n, y, want_y)
    finally:
        torch.set_num_threads(threads)


def _node_max(p, q, dp, dq, ties):
    """max(p, q) of two pieces with derivatives dp, dq, as the README defines the policies: the
    winner's derivative; at a tie first/last/split/all."""
    if p > q:
        return p, dp
    if q > p:
        return q, dq
    wp, wq = {"first": (1, 0), "last": (0, 1), "split": (0.5, 0.5), "all": (1, 1)}[ties]
    return p, [wp * a + wq * b for a, b in zip(dp, dq)]


def _reference(name, params, ties, xs):
    """Output and each input's derivative, one element at a time, through the max node."""
    ys, grads = [], []
    for row in zip(*map(lambda x: x.tolist(), xs)):
        if name == "l1_loss":
            a, b = row
            y, d = _node_max(a - b, b - a, [1.0, -1.0], [-1.0, 1.0], ties)
        else:
            a, b, t = row
            m = params.get("margin", 0.0)
            y, d = _node_max(0.0, m - t * (a - b), [0.0, 0.0, 0.0], [-t, t, -(a - b)], ties)
        ys.append(y)
        grads.append(d)
    return np.array(ys), [np.array(c) for c in zip(*grads)]


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("case", CASES[:2] + [pytest.param(CASES[2], marks=SLOW)], ids=IDS[:3])
def test_every_policy_follows_the_definition(case, ties):
    name, params, columns = case[:3]
    finite = [[v for v in c if np.isfinite(v)] for c in columns]
    xs, _ = _grid(finite, np.float64)
    module = symgrad.load(name, ties=ties, **params)
    y, grads = _ours(module, xs, np.ones_like(xs[0]))
    want_y, want_grads = _reference(name, params, ties, xs)
    np.testing.assert_array_equal(y, want_y)
    for k, (a, b) in enumerate(zip(grads, want_grads)):
        np.testing.assert_array_equal(a, b, err_msg=f"{name} {params} {ties} grad {k}")


@pytest.mark.parametrize("case", CASES[:3], ids=IDS[:3])
def test_finite_differences_away_from_the_kinks(case):
    name, params, _, torch_fn = case[:4]
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(40) for _ in range(len(case[2]))]
    h = 1e-6
    for ties in POLICIES:
        module = symgrad.load(name, ties=ties, **params)
        grads = module.backward(np.ones(40), module.forward(*xs)[1])
        for k in range(len(xs)):
            up, down = list(xs), list(xs)
            up[k], down[k] = xs[k] + h, xs[k] - h
            f = lambda v: torch_fn(*map(torch.tensor, v)).numpy()  # noqa: E731 (the value only)
            np.testing.assert_allclose(grads[k], (f(up) - f(down)) / (2 * h), atol=1e-6)


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("name,params", [("l1_loss", {}),
                                         pytest.param("margin_ranking_loss", {"margin": 0.5}, marks=SLOW)])
def test_check_passes_every_policy(name, params, ties):
    module = symgrad.load(name, ties=ties, **params)
    v = np.array([-1.0, -0.5, 0.0, 0.5, 1.0, 0.25])
    xs = (v, v[::-1].copy()) if name == "l1_loss" else (v, v[::-1].copy(), np.array([1.0, -1] * 3))
    report = symgrad.check(module, *xs, modes="both")
    assert report.ok, str(report)


def test_reduction_errors_are_one_line():
    with pytest.raises(ValueError, match=r"^l1_loss: reduction must be one of 'none', 'mean', "
                                         r"'sum', got 'avg'$"):
        symgrad.load("l1_loss", reduction="avg")
    with pytest.raises(TypeError, match=r"^margin_ranking_loss: reduction must be one of"):
        symgrad.load("margin_ranking_loss", reduction=None)
    module = symgrad.load("l1_loss", reduction="mean")
    _, saved = module.forward(np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match=r"^l1_loss: grad_output must be a 0-d float array"):
        module.backward(np.ones(3), saved)
    with pytest.raises(TypeError, match=r"^relu: unexpected parameter 'reduction'"):
        symgrad.load("relu", reduction="mean")


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_half_jvp_adds_in_pytorchs_order(reduction):
    """float16/bfloat16 under the torch preset: the reduced jvp of cancelling tangents (+-2^14 at
    the ends, small ones of both signs between, whose float32 sum the order of the additions
    decides) bit for bit with torch.func.jvp of F.l1_loss on rows to 300 elements: sum, at::sum of
    the float16/bfloat16 tensor (vectors of 16 elements loaded as 8 float32 lanes); mean, at::sum
    of its float32 copy (vectors of 8), divided and rounded once."""
    module = symgrad.load("l1_loss", convention="torch", reduction=reduction)
    rng = np.random.default_rng(28)
    for dtype, tdtype in ((np.dtype(np.float16), torch.float16), (BF16, torch.bfloat16)):
        def tensor(a):
            return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(tdtype)
        for n in list(range(1, 40)) + list(range(40, 301, 13)):
            t = rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(-4, 0, n))
            t[0], t[-1] = 2.0 ** 14, -(2.0 ** 14)
            t = t.astype(np.float32).astype(dtype)
            a, b = rng.uniform(1, 2, n).astype(np.float32).astype(dtype), np.zeros(n, dtype)  # (a > b)
            got = module.jvp(t, np.zeros(n, dtype), module.forward(a, b)[1])
            want = torch.func.jvp(lambda x: F.l1_loss(x, tensor(b), reduction=reduction),
                                  (tensor(a),), (tensor(t),))[1]
            assert got.dtype == dtype and got.shape == ()
            assert got.view(np.int16) == want.view(torch.int16).item(), (dtype, n, got, want)


def test_reduction_none_is_the_generated_module_and_jvp_reduces():
    plain = symgrad.load("l1_loss", convention="torch")
    assert symgrad.load("l1_loss", convention="torch", reduction="none") is plain
    mean = symgrad.load("l1_loss", convention="torch", reduction="mean")
    a, b = np.array([1.0, 2.0, -3.0, 0.5]), np.array([0.5, 2.0, 1.0, 0.5])
    _, saved = mean.forward(a, b)
    ta, tb = np.array([1.0, 1.0, 2.0, 4.0]), np.array([0.0, 3.0, 1.0, 2.0])
    # <jvp(t), g> == <t, vjp(g)> with the 0-d g = 1
    grads = mean.backward(np.asarray(1.0), saved)
    assert mean.jvp(ta, tb, saved) == pytest.approx(float(grads[0] @ ta + grads[1] @ tb))


@pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
@pytest.mark.parametrize("name,settings", [
    pytest.param("l1_loss", {"convention": "torch"}, marks=SLOW),
    pytest.param("l1_loss", {"convention": "jax"}, marks=SLOW),
    pytest.param("margin_ranking_loss", {"convention": "torch", "margin": 0.3}, marks=SLOW),
    pytest.param("margin_ranking_loss", {"convention": "jax", "margin": 0.3}, marks=SLOW),
], ids=lambda v: v if isinstance(v, str) else "-".join(map(str, v.values())))
def test_cpu_backend_equals_the_numpy_module(name, settings):
    cpu, ref = symgrad.load(name, backend="cpu", **settings), symgrad.load(name, **settings)
    columns = next(c[2] for c in CASES if c[0] == name)
    for dtype in (np.float64, np.float32, np.float16):
        xs, g = _grid(columns, dtype)
        got, want = _ours(cpu, xs, g), _ours(ref, xs, g)
        _assert_same(got, want, xs, g, f"cpu {name} {settings} {np.dtype(dtype).name}")


TABLE_FNS = {  # the functions the conventions-table rows stand for (reduction='none'), per framework
    ("l1_loss", 0.0): CASES[0][3:],
    ("margin_ranking_loss", 0.0): _margin_fns(0.0),
    ("margin_ranking_loss", 0.5): _margin_fns(0.5),
}


@SLOW  # (JAX compiles each row's function: 3 s)
def test_conventions_table_rows_are_the_frameworks_gradients():
    """The rows `symgrad conventions` shows for the losses (docs/conventions.md, as committed): the
    torch and jax cells are PyTorch's autograd and jax.vjp at those points, and the last column
    says DIFFER exactly where they differ."""
    from pathlib import Path

    from symgrad import table
    page = (Path(__file__).resolve().parent.parent / "docs" / "conventions.md").read_text().splitlines()
    rows = [s for s in table.SITUATIONS if s[0] in ("l1_loss", "margin_ranking_loss")]
    assert len(rows) == 5
    for op, params, situation, inputs in rows:
        label = op + (f"({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")
        row = next(ln for ln in page if ln.startswith(f"| `{label}` | {situation} |"))
        cells = dict(zip(["torch", "jax"], row.split(" | ")[2:4]))
        torch_fn, jax_fn = TABLE_FNS[(op, params.get("margin", 0.0))]
        xs = [np.array(x) for x in inputs]
        g = np.ones_like(xs[0])
        assert cells["torch"] == table._cell(_torch(torch_fn, xs, g)[1]), row
        assert cells["jax"] == table._cell(_jax(jax_fn, xs, g)[1]), row
        for column in ("torch", "jax"):
            assert cells[column] == table.measure(column, op, params, inputs), row
        assert row.endswith(" | DIFFER |") == (cells["torch"] != cells["jax"]), row
