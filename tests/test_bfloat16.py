"""bfloat16 in the NumPy backend (ml_dtypes): computed in float32, each result rounded once.

Oracles: PyTorch 2.13 CPU in bfloat16 under convention="torch", bit for bit (NaN as NaN, signs of
zero compared), for the elementwise ops, maximum/minimum, the reductions and max pooling (where
windows overlap, PyTorch and JAX add each window's gradient in bfloat16, each add rounded: so do
the presets); the float32 module on the widened inputs, rounded once (ml_dtypes' cast, to nearest
even), under the default convention for every kind of op.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import symgrad

ml_dtypes = pytest.importorskip("ml_dtypes")
torch = pytest.importorskip("torch")
F = torch.nn.functional
BF16 = np.dtype(ml_dtypes.bfloat16)
SPECIALS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 6.0, 0.5, -2.0, 3.0]


def _bits(a) -> bytes:
    """An array's bytes, every NaN made one NaN (PyTorch's may carry a sign): bit for bit
    otherwise, signs of zero included."""
    a = np.array(a, dtype=np.float32)
    a[np.isnan(a)] = np.nan
    return a.tobytes()


def _tie_heavy(rng, shape):
    """bfloat16 values: small integers (ties), specials (NaN, +-inf, +-0) and values whose
    products and quotients round (leaky_relu's slope, a split's 1/3)."""
    pick = rng.integers(0, 3, size=shape)
    v = np.where(pick == 0, rng.choice(SPECIALS, size=shape),
                 np.where(pick == 1, rng.integers(-2, 3, size=shape), rng.standard_normal(shape) * 3))
    return v.astype(BF16)


def _to_torch(a):
    return torch.tensor(np.asarray(a, dtype=np.float32)).to(torch.bfloat16)


def _torch_run(fn, xs, g):
    ts = [_to_torch(x).requires_grad_() for x in xs]
    y = fn(*ts)
    y.backward(_to_torch(g))
    return y.detach().float().numpy(), [t.grad.float().numpy() for t in ts]


ELEMENTWISE = [
    ("maximum", {}, torch.maximum, 2),
    ("minimum", {}, torch.minimum, 2),
    ("relu", {}, torch.relu, 1),
    ("clamp", {"min": -1.0, "max": 0.5}, lambda t: torch.clamp(t, -1.0, 0.5), 1),
    ("hardtanh", {}, F.hardtanh, 1),
    ("relu6", {}, F.relu6, 1),
    ("leaky_relu", {"negative_slope": 0.1}, lambda t: F.leaky_relu(t, 0.1), 1),
    ("abs", {}, torch.abs, 1),
]
REDUCTIONS = [
    ("amax", {"dim": 1}, lambda t: torch.amax(t, 1)),
    ("amin", {"dim": (0, 2), "keepdim": True}, lambda t: torch.amin(t, (0, 2), keepdim=True)),
    ("amax", {}, torch.amax),
    ("max", {}, torch.max),
    ("min", {}, torch.min),
]
POOLS = [  # windows that do not overlap: each input element gets at most one gradient
    ("max_pool1d", {"kernel_size": 2}, lambda t: F.max_pool1d(t, 2), (2, 3, 8)),
    ("max_pool2d", {"kernel_size": 3, "stride": 3, "padding": 1},
     lambda t: F.max_pool2d(t, 3, 3, 1), (2, 2, 7, 8)),
    ("max_pool3d", {"kernel_size": 2}, lambda t: F.max_pool3d(t, 2), (1, 2, 4, 4, 6)),
    ("adaptive_max_pool2d", {"output_size": (3, 2)}, lambda t: F.adaptive_max_pool2d(t, (3, 2)),
     (2, 2, 6, 6)),
]

# PyTorch's CPU hardtanh/relu6 backward at NaN is 0 in SIMD lanes and g in the scalar tail; the
# preset follows the scalar path (README, Framework conventions)
NAN_BY_LANE = {"hardtanh", "relu6"}


def _same(name, got, want) -> bool:  # bit for bit, the sign of zero included
    got, want = np.asarray(got, dtype=np.float32), np.asarray(want, dtype=np.float32)
    return _bits(got) == _bits(want)


def _check(name, m, fn, xs, g):
    y, saved = m.forward(*xs)
    grads = m.backward(g, saved)
    want_y, want_grads = _torch_run(fn, xs, g)
    assert y.dtype == BF16 and saved.dtype == BF16
    assert _same(name, y, want_y), (name, xs, y, want_y)
    for x, got, want in zip(xs, grads, want_grads):
        assert got.dtype == BF16
        if name in NAN_BY_LANE:  # the documented self-contradiction: compared off NaN only
            got, want = np.where(np.isnan(x), 0, got), np.where(np.isnan(x), 0, want)
        assert _same(name, got, want), (name, xs, g, got, want)


@pytest.mark.parametrize("name,params,fn,arity", ELEMENTWISE, ids=[e[0] for e in ELEMENTWISE])
def test_elementwise_equal_pytorch_bfloat16(name, params, fn, arity):
    m = symgrad.load(name, convention="torch", **params)
    rng = np.random.default_rng(1)
    for shape in [(64,), (5, 7)]:
        xs = [_tie_heavy(rng, shape) for _ in range(arity)]
        if arity == 2:
            xs[1][: shape[0] // 2] = xs[0][: shape[0] // 2]  # a = b: the split ties
        g = (rng.standard_normal(shape) * 3).astype(BF16)
        _check(name, m, fn, xs, g)


@pytest.mark.parametrize("name,params,fn", REDUCTIONS, ids=[f"{r[0]}-{i}" for i, r in enumerate(REDUCTIONS)])
def test_reductions_equal_pytorch_bfloat16(name, params, fn):
    m = symgrad.load(name, convention="torch", **params)
    rng = np.random.default_rng(2)
    for trial in range(6):
        x = rng.integers(0, 3, size=(3, 6, 4)).astype(BF16)  # 3-, 2-way ties: g/3 rounds
        if trial % 2:
            x.flat[rng.choice(x.size, 3)] = np.nan
        y = m.forward(x)[0]
        g = (rng.standard_normal(y.shape) * 3).astype(BF16)
        _check(name, m, fn, [x], g)


@pytest.mark.parametrize("name,params,fn,shape", POOLS, ids=[p[0] for p in POOLS])
def test_max_pooling_equal_pytorch_bfloat16(name, params, fn, shape):
    m = symgrad.load(name, convention="torch", **params)
    rng = np.random.default_rng(3)
    for trial in range(3):
        x = _tie_heavy(rng, shape)
        y = m.forward(x)[0]
        g = (rng.standard_normal(y.shape) * 3).astype(BF16)
        _check(name, m, fn, [x], g)


OVERLAPPING = [  # windows that overlap: an element's windows' gradients are added up
    ("max_pool2d", {"kernel_size": 3, "stride": 1, "padding": 1}, (2, 3, 7, 7)),
    ("max_pool1d", {"kernel_size": 4, "stride": 2, "padding": 2}, (2, 3, 11)),
    ("max_pool3d", {"kernel_size": 2, "stride": 1}, (1, 2, 4, 4, 5)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2}, (2, 2, 9, 8)),
    ("adaptive_max_pool2d", {"output_size": (4, 5)}, (2, 3, 7, 7)),
]


def _torch_pool(name, params):
    if name.startswith("adaptive"):
        return lambda t: getattr(F, name)(t, params["output_size"])
    return lambda t: getattr(F, name)(t, params["kernel_size"], params.get("stride"), params.get("padding", 0),
                                      params.get("dilation", 1))


def _jax_pool(params, spatial):
    _, jnp, lax = _jax()
    k, s, p = (params[n] for n in ("kernel_size", "stride", "padding"))
    return lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (1, 1) + (k,) * spatial, (1, 1) + (s,) * spatial,
                                       [(0, 0)] * 2 + [(p, p)] * spatial)


def _overlapping_inputs(rng, shape, y_shape_of):
    """Tie-heavy bfloat16 input (small integers, with NaN, +-inf and +-0 in every other trial) and
    a gradient whose sums round in bfloat16 (normal values times 3, +-0 among them)."""
    for trial in range(8):
        x = rng.integers(-2, 3, size=shape).astype(np.float32)
        if trial % 2:
            x.flat[rng.choice(x.size, 6)] = rng.choice(SPECIALS, 6)
        x = x.astype(BF16)
        g = (rng.standard_normal(y_shape_of(x)) * 3).astype(np.float32)
        g.flat[rng.choice(g.size, 3)] = [0.0, -0.0, -0.0]
        yield x, g.astype(BF16)


@pytest.mark.parametrize("name,params,shape", OVERLAPPING, ids=[f"{o[0]}-{i}" for i, o in enumerate(OVERLAPPING)])
def test_overlapping_windows_add_in_bfloat16_as_pytorch(name, params, shape):
    """Where windows overlap, PyTorch's CPU kernel adds each window's gradient to its winner's in
    output order in bfloat16 (each add rounded): the torch preset does too, bit for bit (before,
    symgrad added in float32 and rounded once)."""
    m = symgrad.load(name, convention="torch", **params)
    rng = np.random.default_rng(4)
    for x, g in _overlapping_inputs(rng, shape, lambda x: m.forward(x)[0].shape):
        _check(name, m, _torch_pool(name, params), [x], g)


@pytest.mark.parametrize("spatial", [2, 3])
def test_overlapping_fractional_windows_add_in_bfloat16_as_pytorch(spatial):
    """PyTorch's fractional_max_pool2d/3d backward (gradInput[index] += gradOutput in bfloat16)
    adds overlapping windows' gradients in output order, each add rounded: so does the preset.
    The windows' arithmetic is exact here (stride (9 - 3) / (4 - 1) = 2, samples multiples of 1/4):
    PyTorch computes it in bfloat16 for a bfloat16 input, which can move a window elsewhere."""
    name, out = f"fractional_max_pool{spatial}d", (4,) * spatial
    m = symgrad.load(name, convention="torch", kernel_size=3, output_size=out)
    rng = np.random.default_rng(9)
    for x, g in _overlapping_inputs(rng, (2, 2) + (9,) * spatial, lambda x: (2, 2) + out):
        samples = rng.choice([0.0, 0.25, 0.5, 0.75], size=(2, 2, spatial)).astype(BF16)
        fn = lambda t: getattr(F, name)(t, 3, output_size=out, _random_samples=_to_torch(samples))  # noqa: E731
        y, saved = m.forward(x, samples)
        (got, none), (want_y, (want,)) = m.backward(g, saved), _torch_run(fn, [x], g)
        assert none is None and _bits(y) == _bits(want_y) and got.dtype == BF16 and _bits(got) == _bits(want)


@pytest.mark.parametrize("name,params,shape", OVERLAPPING[:3], ids=[o[0] for o in OVERLAPPING[:3]])
def test_overlapping_windows_add_in_bfloat16_as_jax(name, params, shape):
    """XLA's select_and_scatter (JAX's max pooling VJP) adds in bfloat16 in output order too, a
    padding winner's gradient dropped: the jax preset equals it bit for bit."""
    params = {"stride": params["kernel_size"], "padding": 0} | params
    m = symgrad.load(name, convention="jax", **params)
    fn = _jax_pool(params, len(shape) - 2)
    rng = np.random.default_rng(5)
    for x, g in _overlapping_inputs(rng, shape, lambda x: m.forward(x)[0].shape):
        y, saved = m.forward(x)
        (got,) = m.backward(g, saved)
        want_y, (want,) = _jax_run(fn, [x], g)
        assert _bits(y) == _bits(want_y) and got.dtype == BF16 and _bits(got) == _bits(want), (name, x, g)


# the cpu backend's b16 backward kernels under both presets: one overlapping geometry under the torch
# preset in the default run (one tests/test_cpu.py compiles), both presets and every overlapping max
# pooling with -m slow
CPU_OVERLAPPING = [pytest.param("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 9, 8), c, id=f"k3s2p1-{c}",
                                marks=[pytest.mark.slow] if c == "jax" else []) for c in ("torch", "jax")] + [
    pytest.param(name, params, shape, c, id=f"{name}-{i}-{c}", marks=pytest.mark.slow)
    for i, (name, params, shape) in enumerate(OVERLAPPING[:4]) for c in ("torch", "jax")]


@pytest.mark.parametrize("name,params,shape,convention", CPU_OVERLAPPING)
def test_cpu_backend_adds_bfloat16_as_the_preset(name, params, shape, convention):
    """Overlapping windows (issue 28, item 11): the cpu backend's b16 kernels add each window's
    gradient in output order, each add rounded to bfloat16, as PyTorch's CPU kernel (torch preset)
    and XLA's select_and_scatter (jax preset): bit for bit with the framework and the NumPy module,
    forward and backward, NCHW and channels-last, 1 and 2 threads (it raised a TypeError before)."""
    if not any(shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))):
        pytest.skip("no C compiler: the cpu backend needs one")
    m = symgrad.load(name, backend="cpu", convention=convention, **params)
    ref = symgrad.load(name, convention=convention, **params)
    fn = (_torch_pool(name, params) if convention == "torch" else
          _jax_pool({"stride": params["kernel_size"], "padding": 0} | params, len(shape) - 2))
    run = _torch_run if convention == "torch" else _jax_run
    rng = np.random.default_rng(8)
    for trial, (x, g) in enumerate(_overlapping_inputs(rng, shape, lambda x: ref.forward(x)[0].shape)):
        if convention == "jax" and name == "max_pool2d" and params.get("dilation", 1) != 1:
            continue  # (_jax_pool has no dilation)
        want_y, (want,) = run(fn, [x], g)
        (numpy_grad,) = ref.backward(g, ref.forward(x)[1])
        assert _bits(numpy_grad) == _bits(want), (name, convention, x, g)
        cl = trial % 2 == 1 and len(shape) == 4  # channels-last every other trial
        lay = (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)) if cl else (lambda a: a)
        y, saved = m.forward(lay(x), threads=1 + trial % 2)
        (got,) = m.backward(lay(g), saved, threads=1 + trial % 2)
        assert got.dtype == BF16 and _bits(np.ascontiguousarray(y)) == _bits(want_y)
        assert _bits(np.ascontiguousarray(got)) == _bits(want), (name, convention, cl, x, g)
    # a float32 gradient of a bfloat16 op (the bfloat16 wrappers, then the b16 kernels): as the NumPy module's
    (wide,) = m.backward(g.astype(np.float32), m.forward(x)[1])
    assert _bits(wide) == _bits(ref.backward(g.astype(np.float32), ref.forward(x)[1])[0])


def test_cpu_b16_scatter_every_bfloat16_gradient_as_the_numpy_module():
    """The cpu backend's b16 scatter (overlapping windows, torch preset) adds on the bits, a NaN sum
    taken on a branch (sg_add_b16), with no NaN test where no gradient a band adds is a NaN
    (sg_add_fast_b16): every bfloat16 as grad_output (every NaN, +-inf, +-0 and subnormal among
    them; sums that overflow, cancel and round at each add), then every one but the NaNs, gets the
    NumPy module's bits off NaN, and a NaN where it gives one, as the quiet NaN of its sign."""
    if not any(shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))):
        pytest.skip("no C compiler: the cpu backend needs one")
    params = {"kernel_size": 3, "stride": 2, "padding": 1}
    m = symgrad.load("max_pool2d", backend="cpu", convention="torch", **params)
    ref = symgrad.load("max_pool2d", convention="torch", **params)
    x = np.random.default_rng(1).integers(0, 3, size=(2, 8, 128, 130)).astype(BF16)  # ties
    x[0, 0, :2, :4] = np.nan
    y, saved = m.forward(x, threads=1)
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(BF16)
    assert y.size >= every.size
    finite = every[~np.isnan(every.astype(np.float32))]  # no NaN: sg_add_fast_b16 (inf - inf among the sums)
    finite = np.resize(finite, y.shape)
    finite[1, 0, :, 0::2], finite[1, 0, :, 1::2] = np.inf, -np.inf  # winners shared by +inf and -inf windows
    for g, where in ((np.resize(every, y.shape), ...), (finite, (1, 0))):  # where: a NaN sum is
        (got,) = m.backward(g, saved, threads=1)
        with np.errstate(over="ignore", invalid="ignore"):
            (want,) = ref.backward(g, ref.forward(x)[1])
        got_bits, want_bits = got.view(np.uint16), want.view(np.uint16)
        nan = np.isnan(want.astype(np.float32))
        assert nan[where].any() and np.array_equal(got_bits[~nan], want_bits[~nan])
        assert np.array_equal(got_bits[nan], (want_bits[nan] & 0x8000) | 0x7fc0)


@pytest.mark.parametrize("name,params,fn,shape", POOLS[:3], ids=[p[0] for p in POOLS[:3]])
def test_windows_that_cannot_overlap_add_nothing_in_bfloat16(name, params, fn, shape):
    """Where no two windows can hold one element (each window within its stride), an element gets
    at most one term: the preset's bfloat16 adds are moot, so the lowering keeps the float32
    backward (no per-add rounding pass: issue 28's 22x), and the cpu backend computes it too, equal
    to PyTorch bit for bit (the NumPy module as well, test_max_pooling_equal_pytorch_bfloat16)."""
    from symgrad import pipeline
    from symgrad.ops import resolve
    assert pipeline.build(resolve(name, convention="torch", **params)).kernel.bfloat16_adds == "float32"
    if not any(shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))):
        pytest.skip("no C compiler: the cpu backend needs one")
    m = symgrad.load(name, backend="cpu", convention="torch", **params)
    rng = np.random.default_rng(7)
    for trial in range(3):
        x = _tie_heavy(rng, shape)
        g = (rng.standard_normal(m.forward(x)[0].shape) * 3).astype(BF16)
        _check(name, m, fn, [x], g)


DEFAULT_OPS = [  # every kind of op under the default convention: (name, params, inputs)
    ("maximum", {"ties": "split"}, lambda r: [_tie_heavy(r, (4, 5)), _tie_heavy(r, (5,))]),
    ("leaky_relu", {"negative_slope": 0.3}, lambda r: [_tie_heavy(r, (40,))]),
    ("amax", {"dim": 1, "ties": "split"}, lambda r: [r.integers(0, 3, (3, 6, 2)).astype(BF16)]),
    ("max_pool2d", {"kernel_size": 3, "stride": 1, "padding": 1, "ties": "split"},
     lambda r: [_tie_heavy(r, (2, 5, 6))]),
    ("max_pool1d", {"kernel_size": 3, "stride": 1}, lambda r: [_tie_heavy(r, (2, 2, 9))]),
    ("maxout", {"pieces": 3, "ties": "split"}, lambda r: [r.integers(0, 3, (2, 6, 4)).astype(BF16)]),
    ("adaptive_max_pool1d", {"output_size": 4, "ties": "split"},
     lambda r: [r.integers(0, 3, (2, 3, 7)).astype(BF16)]),
    ("fractional_max_pool2d", {"kernel_size": 2, "output_size": (3, 3)},
     lambda r: [_tie_heavy(r, (2, 2, 7, 7)), r.random((2, 2, 2)).astype(BF16)]),
    ("logsumexp", {"dim": -1, "temperature": 0.7}, lambda r: [(r.standard_normal((3, 5))).astype(BF16)]),
    ("max_unpool1d", {"kernel_size": 2, "ties": "all"},
     lambda r: [r.standard_normal((2, 3, 4)).astype(BF16), r.integers(0, 8, (2, 3, 4))]),
]


@pytest.mark.parametrize("name,params,make", DEFAULT_OPS, ids=[o[0] for o in DEFAULT_OPS])
def test_every_kind_is_its_float32_result_rounded_once(name, params, make):
    m = symgrad.load(name, **params)
    rng = np.random.default_rng(5)
    xs = make(rng)
    wide = [x.astype(np.float32) if x.dtype == BF16 else x for x in xs]
    y, saved = m.forward(*xs)
    y32, saved32 = m.forward(*wide)
    assert y.dtype == BF16 and _bits(y) == _bits(y32.astype(BF16))
    g = (rng.standard_normal(y.shape) * 2).astype(BF16)
    if name == "logsumexp":  # backward reads the output: the rounded one, as the forward returned it
        saved32 = saved32._replace(output=y.astype(np.float32))
    for got, want in zip(m.backward(g, saved), m.backward(g.astype(np.float32), saved32)):
        if want is None:
            assert got is None
            continue
        assert got.dtype == BF16 and _bits(got) == _bits(want.astype(BF16)), (got, want)
    tangents = [(rng.standard_normal(x.shape)).astype(BF16) if x.dtype == BF16 and k == 0 else None
                for k, x in enumerate(xs)]
    if name == "maximum":
        tangents[1] = rng.standard_normal(xs[1].shape).astype(BF16)
    got = m.jvp(*tangents, saved)
    want = m.jvp(*[None if t is None else t.astype(np.float32) for t in tangents], saved32)
    assert got.dtype == BF16 and _bits(got) == _bits(want.astype(BF16))


def test_bfloat16_with_float32_is_float32_and_each_gradient_keeps_its_inputs_dtype():
    m = symgrad.load("maximum", convention="torch")
    a = np.array([1.0, 2.0, 3.0, np.nan], BF16)
    b = np.array([2.0, 2.0, 1.0, 0.0], np.float32)
    y, saved = m.forward(a, b)
    ga, gb = m.backward(np.full(4, 3.0, np.float32), saved)
    ta, tb = torch.tensor(a.astype(np.float32)).bfloat16().requires_grad_(), torch.tensor(b, requires_grad=True)
    ty = torch.maximum(ta, tb)
    ty.backward(torch.full((4,), 3.0))
    assert y.dtype == np.float32 and ty.dtype == torch.float32
    np.testing.assert_array_equal(y, ty.detach().numpy())
    assert ga.dtype == BF16 and gb.dtype == np.float32
    np.testing.assert_array_equal(ga.astype(np.float32), ta.grad.float().numpy())
    np.testing.assert_array_equal(gb, tb.grad.numpy())


def test_neither_symgrad_nor_a_generated_module_imports_ml_dtypes_and_a_missing_one_is_named():
    code = (
        "import sys, numpy as np, symgrad\n"
        "m = symgrad.load('relu')\n"
        "y, s = m.forward(np.ones(3, np.float32)); m.backward(np.ones(3, np.float32), s)\n"
        "assert 'ml_dtypes' not in sys.modules, 'imported ml_dtypes'\n"
        "import ml_dtypes\n"
        "x = np.ones(3, ml_dtypes.bfloat16)\n"
        "sys.modules['ml_dtypes'] = None  # as if it were not installed\n"
        "try:\n"
        "    m.forward(x)\n"
        "except TypeError as e:\n"
        "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "needs the ml_dtypes package" in out.stdout and "pip install ml_dtypes" in out.stdout, out


# ----------------------------------------------------------------------------- the jax preset

def _jax():
    jax = pytest.importorskip("jax")
    return jax, jax.numpy, jax.lax


def _jax_run(fn, xs, g):
    jax, jnp, _ = _jax()
    y, pullback = jax.vjp(fn, *[jnp.asarray(x) for x in xs])
    return np.asarray(y), [np.asarray(t) for t in pullback(jnp.asarray(g))]


def _jax_cases():
    jax, jnp, lax = _jax()
    pool = lambda k, s: lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (1, 1, k), (1, 1, s),  # noqa: E731
                                                    [(0, 0)] * 3)
    return [  # (op, params, JAX function, input shapes, exact gradients: sums that do not round)
        ("relu", {}, jax.nn.relu, [(24,)], False),
        ("clamp", {"min": -1.0, "max": 2.0}, lambda x: jnp.clip(x, -1.0, 2.0), [(24,)], False),
        ("hardtanh", {}, jax.nn.hard_tanh, [(24,)], False),
        ("relu6", {}, jax.nn.relu6, [(24,)], False),
        ("leaky_relu", {"negative_slope": 0.5}, lambda x: jax.nn.leaky_relu(x, 0.5), [(24,)], False),
        ("leaky_relu", {"negative_slope": 0.0}, lambda x: jax.nn.leaky_relu(x, 0.0), [(24,)], False),
        ("abs", {}, jnp.abs, [(24,)], False),
        ("maximum", {}, jnp.maximum, [(4, 6), (6,)], True),
        ("minimum", {}, jnp.minimum, [(24,), (24,)], False),
        ("amax", {"dim": 1}, lambda v: jnp.max(v, axis=1), [(3, 6, 2)], True),
        ("amin", {"dim": (0, 2), "keepdim": True}, lambda v: jnp.min(v, axis=(0, 2), keepdims=True),
         [(3, 6, 2)], True),
        ("max", {}, jnp.max, [(3, 5)], True),
        ("min", {}, jnp.min, [(3, 5)], True),
        ("maxout", {"pieces": 3}, lambda v: jnp.max(v.reshape(2, 2, 3, 4), axis=2), [(2, 6, 4)], True),
        ("max_pool1d", {"kernel_size": 2}, pool(2, 2), [(2, 3, 8)], False),
        ("max_pool1d", {"kernel_size": 3, "stride": 1}, pool(3, 1), [(2, 3, 8)], True),
    ]




@pytest.mark.parametrize("index", range(16))
def test_jax_preset_equals_jax_bfloat16(index):
    """Every op under convention="jax" against JAX 0.10 in bfloat16 (CPU), bit for bit with signs
    of zero, on tie-heavy inputs with NaN, +-inf and +-0; gradients with +-0, and exactly
    representable ones where a gradient is a sum (XLA's order of adding is its own)."""
    name, params, fn, shapes, exact = _jax_cases()[index]
    m = symgrad.load(name, convention="jax", **params)
    rng = np.random.default_rng(10 + index)
    for trial in range(8):
        xs = [_tie_heavy(rng, s) for s in shapes]
        y = m.forward(*xs)[0]
        pick = rng.choice([-2.0, -1.0, -0.0, 0.0, 0.5, 3.0] if exact else [-1.7, -0.0, 0.0, 0.3, 2.5],
                          size=y.shape)
        g = np.asarray(pick).astype(BF16)
        (want_y, want_grads), grads = _jax_run(fn, xs, g), m.backward(g, m.forward(*xs)[1])
        assert y.dtype == BF16 and _bits(y) == _bits(want_y), (name, xs, y, want_y)
        for got, want in zip(grads, want_grads):
            assert got.dtype == BF16 and _bits(got) == _bits(want), (name, xs, g, got, want)


EVERY = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(BF16)  # every bfloat16 value
TINY = 2.0**-126  # bfloat16's (and float32's) smallest normal


def _jax_every_value_cases():
    jax, jnp, _ = _jax()
    return {  # id: (op, params, JAX function)
        "leaky_relu-0.3": ("leaky_relu", {"negative_slope": 0.3}, lambda v: jax.nn.leaky_relu(v, 0.3)),
        "leaky_relu": ("leaky_relu", {}, jax.nn.leaky_relu),
        "leaky_relu-neg": ("leaky_relu", {"negative_slope": -0.7}, lambda v: jax.nn.leaky_relu(v, -0.7)),
        "leaky_relu-0": ("leaky_relu", {"negative_slope": 0.0}, lambda v: jax.nn.leaky_relu(v, 0.0)),
        "clamp": ("clamp", {"min": -0.1, "max": 0.2}, lambda v: jnp.clip(v, -0.1, 0.2)),
        "clamp-min": ("clamp", {"min": -0.1}, lambda v: jnp.clip(v, -0.1)),
        "hardtanh": ("hardtanh", {}, jax.nn.hard_tanh),
        "relu6": ("relu6", {}, jax.nn.relu6),
        "relu": ("relu", {}, jax.nn.relu),
        "abs": ("abs", {}, jnp.abs),
        "maximum": ("maximum", {}, jnp.maximum),
        "minimum": ("minimum", {}, jnp.minimum),
    }


def _flushed(*arrays) -> np.ndarray:
    """Where XLA's CPU flush of subnormals (to zero, inputs and results: FTZ/DAZ) can show: an
    input that is subnormal, or a result at most the smallest normal (a product that was subnormal
    in float32 before its rounding to bfloat16)."""
    out = np.zeros(np.shape(arrays[0]), dtype=bool)
    for a in arrays:
        a = np.abs(np.asarray(a, dtype=np.float32))
        out |= (a > 0) & (a <= TINY)
    return out


@pytest.mark.parametrize("case", ["leaky_relu-0.3", "leaky_relu", "leaky_relu-neg", "leaky_relu-0",
                                  "clamp", "clamp-min", "hardtanh", "relu6", "relu", "abs",
                                  "maximum", "minimum"])
def test_jax_preset_bfloat16_every_value_as_jax(case):
    """Every bfloat16 value (and every one as a gradient and a tangent) under convention="jax"
    equals JAX's bfloat16 bit for bit, signs of zero included: constants rounded to bfloat16 first
    (leaky_relu's 0.3 is 0.30078125, clamp's -0.1 is -0.10009765625, in comparisons too), each
    product and sum rounded to bfloat16.  Off the flushed values (XLA's CPU flushes subnormals to
    zero: _flushed, a few hundred values; README) and, for jvp, compared with +0 == -0 (JAX's
    forward mode selects a tangent where the module's jvp adds backward's pieces)."""
    jax, jnp, _ = _jax()
    name, params, fn = _jax_every_value_cases()[case]
    m = symgrad.load(name, convention="jax", **params)
    xs = [EVERY, np.roll(EVERY, 12345)][: 2 if name in ("maximum", "minimum") else 1]
    g = np.roll(EVERY, 7)
    tangents = [np.roll(EVERY, 3 * k + 1) for k in range(len(xs))]
    with np.errstate(all="ignore"):
        y, saved = m.forward(*xs)
        grads = m.backward(g, saved)
        t = m.jvp(*tangents, saved)
    want_y, want_grads = _jax_run(fn, xs, g)
    want_t = np.asarray(jax.jvp(fn, tuple(map(jnp.asarray, xs)), tuple(map(jnp.asarray, tangents)))[1])
    shown = ~_flushed(*xs, g, *tangents, y, want_y, *grads, *want_grads, t, want_t)
    assert shown.sum() > 60000
    assert y.dtype == BF16 and _bits(y[shown]) == _bits(want_y[shown]), case
    for got, want in zip(grads, want_grads):
        assert got.dtype == BF16 and _bits(got[shown]) == _bits(want[shown]), case
    zero = np.float32(0)
    assert t.dtype == BF16 and _bits(t[shown] + zero) == _bits(want_t[shown] + zero), case


def test_jax_preset_bfloat16_constants_are_bfloat16():
    """leaky_relu(x, 0.3) rounds 0.3 to bfloat16 (0.30078125) and the product to bfloat16, as JAX:
    on these values a float32 slope with one rounding differs (the code before computed that)."""
    jax, jnp, _ = _jax()
    m = symgrad.load("leaky_relu", negative_slope=0.3, convention="jax")
    x = -np.arange(1, 200, dtype=np.float32).astype(BF16) / BF16.type(7)
    g = np.ones(x.shape, BF16)
    y = m.forward(x)[0]
    want_y, (want_g,) = _jax_run(lambda v: jax.nn.leaky_relu(v, 0.3), [x], g)
    assert _bits(y) == _bits(want_y)
    assert _bits(m.backward(g, m.forward(x)[1])[0]) == _bits(want_g)
    once = (x.astype(np.float32) * np.float32(0.3)).astype(BF16)
    assert _bits(y) != _bits(once)  # float32 constant, one rounding: not JAX's


def test_xla_flushes_subnormals_on_the_cpu():
    """The documented exception is JAX's: on the CPU XLA treats a subnormal input as zero and
    flushes a subnormal result to zero, in float32 as in bfloat16, where the presets (and NumPy,
    PyTorch) compute with subnormals."""
    jax, jnp, _ = _jax()
    for dtype in (np.float32, BF16):
        x = np.array([1e-40, -1e-40, -1.5e-38], dtype)
        assert np.all(np.asarray(jax.nn.relu(jnp.asarray(x))) == 0)  # 1e-40 > 0 is false
        assert np.asarray(jax.nn.leaky_relu(jnp.asarray(x), 0.5))[2] == 0  # -7.5e-39 flushed
        y = symgrad.load("relu", convention="jax").forward(x)[0]
        assert y[0] > 0


TORCH_EVERY = {  # id: (op, params, PyTorch function)
    "leaky_relu-0.3": ("leaky_relu", {"negative_slope": 0.3}, lambda t: F.leaky_relu(t, 0.3)),
    "leaky_relu": ("leaky_relu", {}, F.leaky_relu),
    "leaky_relu-neg": ("leaky_relu", {"negative_slope": -0.7}, lambda t: F.leaky_relu(t, -0.7)),
    "leaky_relu-0": ("leaky_relu", {"negative_slope": 0.0}, lambda t: F.leaky_relu(t, 0.0)),
    "clamp": ("clamp", {"min": -0.1, "max": 0.2}, lambda t: torch.clamp(t, -0.1, 0.2)),
    "clamp-min": ("clamp", {"min": -0.1}, lambda t: torch.clamp(t, -0.1)),
    "hardtanh": ("hardtanh", {"min_val": -0.1, "max_val": 0.3}, lambda t: F.hardtanh(t, -0.1, 0.3)),
    "relu6": ("relu6", {}, F.relu6),
    "relu": ("relu", {}, torch.relu),
    "abs": ("abs", {}, torch.abs),
    "maximum": ("maximum", {}, torch.maximum),
    "minimum": ("minimum", {}, torch.minimum),
}


@pytest.mark.parametrize("case", list(TORCH_EVERY))
def test_torch_preset_bfloat16_every_value_as_pytorch(case):
    """Every bfloat16 value (and every one as a gradient) under convention="torch" equals
    PyTorch 2.13's CPU bfloat16 bit for bit, signs of zero included: PyTorch computes these ops'
    bfloat16 in float32 with float32 constants (clamp's -0.1 too) and rounds once, as the module
    does (hardtanh/relu6's backward at NaN: compared off NaN, their SIMD lanes contradict)."""
    name, params, fn = TORCH_EVERY[case]
    m = symgrad.load(name, convention="torch", **params)
    xs = [EVERY, np.roll(EVERY, 12345)][: 2 if name in ("maximum", "minimum") else 1]
    g = np.roll(EVERY, 7)
    with np.errstate(all="ignore"):
        y, saved = m.forward(*xs)
        grads = m.backward(g, saved)
    want_y, want_grads = _torch_run(fn, xs, g)
    assert y.dtype == BF16 and _bits(y) == _bits(want_y), case
    for x, got, want in zip(xs, grads, want_grads):
        if name in NAN_BY_LANE:
            with np.errstate(invalid="ignore"):  # np.isnan of a signaling NaN
                got, want = np.where(np.isnan(x), 0, got), np.where(np.isnan(x), 0, want)
        assert _bits(got) == _bits(want), case


# ----------------------------------------------------------------------------- the bridges

BRIDGED = [  # (op, params, torch function, jax function, input shape)
    ("relu", {}, torch.relu, "relu", (5, 7)),
    ("leaky_relu", {"negative_slope": 0.25}, lambda t: F.leaky_relu(t, 0.25),
     lambda jax, jnp: lambda v: jax.nn.leaky_relu(v, 0.25), (40,)),
    ("amax", {"dim": 1}, lambda t: torch.amax(t, 1), lambda jax, jnp: lambda v: jnp.max(v, 1), (3, 6)),
    ("max_pool2d", {"kernel_size": 2}, lambda t: F.max_pool2d(t, 2), None, (2, 3, 6, 4)),
]


@pytest.mark.parametrize("name,params,tfn,jfn,shape", BRIDGED, ids=[b[0] for b in BRIDGED])
def test_bfloat16_tensors_through_symgrad_torch(name, params, tfn, jfn, shape):
    """A bfloat16 tensor through symgrad.torch's op: a bfloat16 output and gradient equal to
    PyTorch's own bfloat16 ones bit for bit (torch preset)."""
    import symgrad.torch as st
    op = st.op(name, convention="torch", **params)
    rng = np.random.default_rng(6)
    x = _tie_heavy(rng, shape)
    ours_t = _to_torch(x).requires_grad_()
    y = op(ours_t)
    g = _to_torch((rng.standard_normal(tuple(y.shape)) * 3).astype(BF16))
    (grad,) = torch.autograd.grad(y, ours_t, g)
    want_y, (want_g,) = _torch_run(tfn, [x], g.float().numpy())
    assert y.dtype == grad.dtype == torch.bfloat16
    if name in NAN_BY_LANE:
        grad = grad.float().masked_fill(torch.isnan(ours_t.detach()), 0)
    assert _bits(y.detach().float().numpy()) == _bits(want_y)
    assert _bits(grad.float().numpy()) == _bits(want_g)


@pytest.mark.parametrize("name,params,tfn,jfn,shape", [b for b in BRIDGED if b[3] is not None],
                         ids=[b[0] for b in BRIDGED if b[3] is not None])
def test_bfloat16_arrays_through_symgrad_jax(name, params, tfn, jfn, shape):
    """A bfloat16 array through symgrad.jax's op (jit, grad): bfloat16 results equal JAX's own
    bfloat16 ones bit for bit (jax preset)."""
    jax, jnp, _ = _jax()
    import symgrad.jax as sj
    fn = sj.op(name, convention="jax", **params)
    want_fn = jax.nn.relu if jfn == "relu" else jfn(jax, jnp)
    rng = np.random.default_rng(7)
    x = jnp.asarray(_tie_heavy(rng, shape))
    y, pullback = jax.vjp(jax.jit(fn), x)
    g = jnp.asarray((rng.standard_normal(y.shape) * 3).astype(BF16))
    want_y, want_pullback = jax.vjp(want_fn, x)
    assert y.dtype == pullback(g)[0].dtype == jnp.bfloat16
    assert _bits(y) == _bits(want_y)
    assert _bits(pullback(g)[0]) == _bits(want_pullback(g)[0])


def test_jax_preset_bfloat16_unpool_and_adaptive():
    """max_unpool1d (zeros.at[indices].set, duplicates: the last write stays and alone gets its
    slot's gradient) and adaptive_max_pool1d (jnp.max over each of PyTorch's windows, which
    overlap) under convention="jax" against JAX in bfloat16, bit for bit with signs of zero."""
    jax, jnp, _ = _jax()
    rng = np.random.default_rng(12)
    unpool = symgrad.load("max_unpool1d", convention="jax", kernel_size=2)
    adaptive = symgrad.load("adaptive_max_pool1d", convention="jax", output_size=3)
    windows = [(0, 3), (2, 5), (4, 7)]  # 7 -> 3: [floor(i*7/3), ceil((i+1)*7/3))
    for trial in range(6):
        x = _tie_heavy(rng, (6, 4))
        idx = rng.integers(0, 8, size=(6, 4))
        g = _tie_heavy(rng, (6, 8))
        g[np.isnan(g.astype(np.float32))] = 0  # (a NaN gradient is NaN everywhere it lands)
        fn = lambda v: jnp.zeros((6, 8), v.dtype).at[jnp.arange(6)[:, None], jnp.asarray(idx)].set(v)  # noqa: E731
        y, saved = unpool.forward(x, idx)
        (got, _) = unpool.backward(g, saved)
        _, (want,) = _jax_run(fn, [x], g)
        assert _bits(y) == _bits(fn(jnp.asarray(x))) and _bits(got) == _bits(want), (x, idx, g)
        x = _tie_heavy(rng, (2, 3, 7))
        g = np.asarray(rng.choice([-2.0, -1.0, -0.0, 0.0, 0.5, 3.0], size=(2, 3, 3))).astype(BF16)
        fn = lambda v: jnp.stack([jnp.max(v[..., s:e], axis=-1) for s, e in windows], -1)  # noqa: E731
        y, saved = adaptive.forward(x)
        want_y, (want,) = _jax_run(fn, [x], g)
        assert _bits(y) == _bits(want_y) and _bits(adaptive.backward(g, saved)[0]) == _bits(want)


def test_generator_rounds_numbers_to_bfloat16_as_ml_dtypes():
    """The generator's pure-Python rounding of a constant (symgrad imports no ml_dtypes) equals
    ml_dtypes' cast from float64: to nearest, ties to even, subnormals, overflow to inf."""
    from symgrad.backends.printing import bfloat16_value
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(2000) * 10.0 ** rng.integers(-45, 40, 2000),
                             [0.3, -0.1, 0.01, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 3.3961e38, 3.4e38, 1e39,
                              2.0**-133, 2.0**-134, 1.5 * 2.0**-134, 2.0**-126 * 0.99, -0.0, 0.0,
                              np.inf, -np.inf, 1 / 3]])
    for v in values:
        with np.errstate(over="ignore"):  # 1e39: inf, as bfloat16_value
            want = float(np.float64(v).astype(BF16).astype(np.float64))
        got = bfloat16_value(float(v))
        assert np.float64(got).tobytes() == np.float64(want).tobytes(), (v, got, want)


@pytest.mark.parametrize("name,params,convention", [("leaky_relu", {"negative_slope": 0.3}, "jax"),
                                                    ("clamp", {"min": -0.1, "max": 0.3}, "torch")])
def test_cpu_backend_refuses_what_the_numpy_module_computes_in_bfloat16(name, params, convention):
    """The compiled kernels compute float32 and round once; where the NumPy module computes a
    bfloat16 op in bfloat16 (constants and products rounded), the cpu backend refuses bfloat16 with
    one TypeError instead of silently differing; elsewhere it equals the NumPy module."""
    import shutil
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler: the cpu backend needs one")
    x = np.array([-1.0, -0.1, 0.0, 2.0], BF16)
    m = symgrad.load(name, backend="cpu", convention=convention, **params)
    with pytest.raises(TypeError, match=r"bfloat16 .* NumPy backend only.*backend='numpy'"):
        m.forward(x)
    y, saved = m.forward(x.astype(np.float32))  # float32 stays the compiled kernels'
    assert y.dtype == np.float32
    same = symgrad.load(name, backend="cpu", convention="torch" if convention == "jax" else "jax",
                        **({"negative_slope": 0.25} if name == "leaky_relu" else {"min": -1.0, "max": 0.5}))
    ref = symgrad.load(name, convention="torch" if convention == "jax" else "jax",
                       **({"negative_slope": 0.25} if name == "leaky_relu" else {"min": -1.0, "max": 0.5}))
    assert _bits(same.forward(x)[0]) == _bits(ref.forward(x)[0])
