"""logsumexp under convention="torch" / "jax" in float16 and bfloat16 (issue 28): bit for bit with
PyTorch 2.13's CPU torch.logsumexp and JAX's jax.nn.logsumexp (jax.vjp), forward and backward (NaN
equals any NaN), in the NumPy module and the cpu backend's loader alike.  Each framework rounds
each of its ops to the dtype (x - m, exp, the float32 sum, log, + m; backward PyTorch's x - y, exp,
product, JAX's g / sum times exp(x - m)); their exp and log, checked here on every float16 and
bfloat16 value, are the correctly rounded float32 result rounded to the dtype (XLA's with float32
subnormals flushed to zero).  float32 and float64 keep the documented exception (PyTorch's exp and
log are Intel MKL VML's, XLA's its own: docs/guarantees.md, tools/framework_exp_log.py)."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
ml_dtypes = pytest.importorskip("ml_dtypes")
import jax.numpy as jnp  # noqa: E402
HALVES = [(np.dtype(np.float16), torch.float16), (np.dtype(ml_dtypes.bfloat16), torch.bfloat16)]
SPECIAL = [0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 60000.0]
SHAPES = [((1,), 0), ((2,), 0), ((17,), 0), ((33,), -1), ((129,), 0), ((1000,), 0), ((3, 40), 1),
          ((40, 5), 0), ((4, 9, 6), 1), ((2, 3, 40), (0, 2)), ((50, 33), (0, 1)), ((0,), 0), ((3, 0), 1)]


def _bits_equal(got: np.ndarray, want, dtype) -> bool:
    """Bit for bit (signs of zero included), any NaN equal to any NaN, and the same shape (want: a
    tensor or a JAX array)."""
    if isinstance(want, torch.Tensor):
        want = want.detach().contiguous().view(torch.int16).numpy().view(np.uint16)
    else:
        want = np.asarray(want).view(np.uint16)
    got = np.array(got, copy=True, order="C")  # (0-d stays 0-d)
    if got.dtype != dtype or got.shape != want.shape:
        return False
    got_nan, want_nan = np.isnan(got.astype(np.float32)), np.isnan(want.view(dtype).astype(np.float32))
    return np.array_equal(got_nan, want_nan) and np.array_equal(got.view(np.uint16)[~got_nan], want[~want_nan])


def _tensor(x: np.ndarray, tdtype):
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(tdtype)


def _inputs(shape: tuple, dtype, rng) -> list:
    """Smooth values, tie-heavy integers, special values (+-0, +-inf, NaN, a large one), and
    values whose exp is subnormal in float32 (or that are: bfloat16)."""
    return [(rng.standard_normal(shape) * 4).astype(np.float32).astype(dtype),
            rng.integers(-3, 3, shape).astype(dtype),
            rng.choice(SPECIAL, shape).astype(np.float32).astype(dtype),
            rng.choice([0.0, -80.0, -90.0, -100.0, 1e-39, 3.0], shape).astype(np.float32).astype(dtype)]


def _torch_vjp(x: np.ndarray, dim, tdtype, rng) -> tuple:
    t = _tensor(x, tdtype).requires_grad_()
    want = torch.logsumexp(t, tuple(range(x.ndim)) if dim is None else dim)  # (no dim=None in PyTorch)
    g = np.asarray(rng.standard_normal(tuple(want.shape))).astype(np.float32).astype(x.dtype)
    (want_grad,) = torch.autograd.grad(want, t, _tensor(g, tdtype).reshape(want.shape))
    return want, g, want_grad


def _jax_vjp(x: np.ndarray, dim, tdtype, rng) -> tuple:
    want, pullback = jax.vjp(lambda v: jax.nn.logsumexp(v, axis=dim), jnp.asarray(x))
    g = np.asarray(rng.standard_normal(want.shape)).astype(np.float32).astype(x.dtype)
    return want, g, pullback(jnp.asarray(g))[0]


def _torch_jvp(x: np.ndarray, t: np.ndarray, dim, tdtype):
    """backward's transpose in PyTorch's own ops: (t * (x - y).exp()).sum(dims), y its logsumexp
    (torch.func.jvp computes another formula, sum(t * exp(x - m)) / sum(exp(x - m)): the docs' rule
    is the transpose, as every preset's jvp)."""
    xt, tt = _tensor(x, tdtype), _tensor(t, tdtype)
    dims = tuple(range(x.ndim)) if dim is None else dim
    return (tt * (xt - torch.logsumexp(xt, dims, keepdim=True)).exp()).sum(dims)


def _jax_jvp(x: np.ndarray, t: np.ndarray, dim, tdtype):
    """jax.jvp of jax.nn.logsumexp: its linear ops are backward's, transposed."""
    return jax.jvp(lambda v: jax.nn.logsumexp(v, axis=dim), (jnp.asarray(x),), (jnp.asarray(t),))[1]


def _runner(backend: str, module, tdtype):
    """(x, g, t) -> the module's (forward, backward, jvp) as NumPy arrays of x's dtype: the NumPy
    and cpu modules called as they are, the torch module on tensors, the jax module under jit."""
    if backend == "torch":
        def tensor(a):
            return _tensor(np.asarray(a), tdtype).reshape(np.shape(a))

        def run(x, g, t):
            y, saved = module.forward(tensor(x))
            out = (y, module.backward(tensor(g), saved)[0], module.jvp(tensor(t), saved))
            return [a.contiguous().view(torch.int16).numpy().view(x.dtype) for a in out]
        return run
    if backend == "jax":
        @jax.jit
        def results(x, g, t):
            y, saved = module.forward(x)
            return y, module.backward(g, saved)[0], module.jvp(t, saved)
        return lambda x, g, t: [np.asarray(a) for a in results(jnp.asarray(x), jnp.asarray(g), jnp.asarray(t))]

    def run(x, g, t):
        y, saved = module.forward(x)
        return y, module.backward(g, saved)[0], module.jvp(t, saved)
    return run


def _check(backend: str, framework: str, shapes: list, seed: int, inputs=None) -> None:
    """The backend's module under the framework's preset: forward, backward and jvp bit for bit
    with the framework (jvp: backward's transpose in its ops, _torch_jvp, _jax_jvp) and, for the
    torch, jax and cuda backends, with the NumPy module."""
    rng = np.random.default_rng(seed)
    vjp, jvp = {"torch": (_torch_vjp, _torch_jvp), "jax": (_jax_vjp, _jax_jvp)}[framework]
    for (dtype, tdtype) in HALVES:
        for shape, dim in shapes:
            module = symgrad.load("logsumexp", backend=backend, convention=framework, dim=dim)
            run = _runner(backend, module, tdtype)
            numpy_module = symgrad.load("logsumexp", convention=framework, dim=dim)
            for x in (inputs or _inputs)(shape, dtype, rng):
                want, g, want_grad = vjp(x, dim, tdtype, rng)
                t = (rng.standard_normal(shape) * 3).astype(np.float32).astype(dtype)
                y, grad, tangent = run(x, g, t)
                assert _bits_equal(y, want, dtype), (dtype, shape, dim, x, y, want)
                assert _bits_equal(grad, want_grad, dtype), (dtype, shape, dim, x, grad, want_grad)
                assert _bits_equal(tangent, jvp(x, t, dim, tdtype), dtype), (dtype, shape, dim, x, t, tangent)
                if backend in ("torch", "jax", "cuda"):
                    for got, want in zip((y, grad, tangent), _runner("numpy", numpy_module, tdtype)(x, g, t)):
                        assert _bits_equal(got, want, dtype), (dtype, shape, dim, x, got, want)


# JAX compiles each shape and dtype (seconds each): its checks are slow
FRAMEWORKS = ["torch", pytest.param("jax", marks=pytest.mark.slow)]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("dtype,tdtype", HALVES, ids=["float16", "bfloat16"])
def test_exp_and_log_of_every_value(framework, dtype, tdtype):
    """The module's exp and log (_torch_math, _xla_math) equal the framework's on all 65536 values."""
    module = symgrad.load("logsumexp", convention=framework, dim=0)
    ours = module._torch_math if framework == "torch" else module._xla_math
    bits = np.arange(1 << 16, dtype=np.uint16)
    for name, fn in (("exp", np.exp), ("log", np.log)):
        if framework == "torch":
            want = getattr(torch, name)(_tensor(bits, tdtype))
        else:
            want = getattr(jnp, name)(jnp.asarray(bits.view(dtype)))
        assert _bits_equal(ours(fn, bits.view(dtype)), want, dtype), name


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_numpy_module_equals_the_framework(framework):
    _check("numpy", framework, SHAPES, 0)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_cpu_backend_equals_the_framework(framework):
    """The cpu loader places the same host code (compiling its library takes seconds)."""
    _check("cpu", framework, SHAPES + [((4, 5), None)], 1)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_numpy_module_equals_the_framework_many_lengths(framework):
    """Lengths around PyTorch's sum's vectors and cascade blocks and XLA's reduce windows, rows
    and columns, several dims, all dims."""
    lengths = [3, 4, 5, 7, 8, 9, 15, 16, 31, 32, 33, 63, 64, 65, 255, 256, 257, 4095, 4096, 4097]
    _check("numpy", framework, [((n,), 0) for n in lengths] + [((2, n), 1) for n in lengths[:13]]
           + [((n, 17), 0) for n in lengths[:13]] + [((40, 3, 70), (0, 2)), ((5, 6), None)], 2)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_torch_backend_equals_the_framework(framework):
    """The torch backend prints the rule: PyTorch's ops themselves under the torch preset, XLA's
    arithmetic (flushes, reduce order) in torch operations under the jax preset (every other shape
    in the default run: the rest in the slow one)."""
    _check("torch", framework, SHAPES[::2] if framework == "torch" else SHAPES, 3)


@pytest.mark.slow
def test_torch_backend_equals_pytorch_every_shape():
    _check("torch", "torch", SHAPES[1::2], 5)


@pytest.mark.slow  # (each shape and dtype jitted: seconds each)
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_jax_backend_equals_the_framework(framework):
    """The jax backend prints the rule: JAX's own ops under the jax preset (jitted), PyTorch's
    arithmetic (at::sum's order) in jax.numpy under the torch preset, on inputs where no float32
    subnormal is met (XLA's CPU flushes them: docs/conventions.md)."""
    _check("jax", framework, SHAPES, 4, inputs=lambda *a: _inputs(*a)[:3] if framework == "torch" else _inputs(*a))


@pytest.mark.slow  # (JAX's exp and log of every value)
@pytest.mark.parametrize("dtype,tdtype", HALVES, ids=["float16", "bfloat16"])
def test_torch_backends_xla_exp_and_log_of_every_value(dtype, tdtype):
    """The torch module's _xla_math (flushing after PyTorch's rounding) equals jnp.exp/jnp.log on
    all 65536 values."""
    module = symgrad.load("logsumexp", backend="torch", convention="jax", dim=0)
    bits = np.arange(1 << 16, dtype=np.uint16)
    for name in ("exp", "log"):
        got = module._xla_math(getattr(torch, name), _tensor(bits, tdtype))
        want = getattr(jnp, name)(jnp.asarray(bits.view(dtype)))
        assert _bits_equal(got.view(torch.int16).numpy().view(dtype), want, dtype), name


def test_without_a_preset_float16_rounds_once():
    """Without a convention a float16 logsumexp stays computed in float32 and rounded once (no
    framework's arithmetic in the module)."""
    module = symgrad.load("logsumexp", dim=0)
    assert not hasattr(module, "_torch_math") and not hasattr(module, "_xla_math")
    assert module.forward(np.array([0.0, -np.inf], np.float16))[0] == np.float16(0.0)


# ----------------------------------------------------------------------------- the cuda backend

# the shapes the cuda checks take: SHAPES (dims 0, -1, 1, (0, 2), (0, 1), empty slices), all dims,
# and columns whose at::sum order differs from row to row (dim 0 of (n, inner): inner 40 holds
# whole blocks of 32 columns and 8 others; inner 5 blocks of 4 and one other)
CUDA_SHAPES = SHAPES + [((4, 5), None), ((70, 40), 0), ((33, 5), 0), ((3, 4, 50), (0, 2))]


def _cuda_sources_of(convention: str, *dims) -> list:
    """The .cu source of the cuda module under the convention, for each dim."""
    from symgrad import backends
    from symgrad.ops import resolve
    from symgrad.pipeline import render
    return [text for dim in dims
            for name, text in render(resolve("logsumexp", convention=convention, dim=dim), backends.get("cuda")).items()
            if name.endswith(".cu")]


def _cuda_sources(conventions) -> list:
    dims = dict.fromkeys(d for _, d in CUDA_SHAPES + ORDER_SHAPES)
    return [text for c in conventions for text in _cuda_sources_of(c, *dims)]


@pytest.fixture(scope="module")
def fake_cupy(tmp_path_factory):
    """The CUDA loaders' kernels run on the CPU (tests/cuda_harness), every source of the cuda checks
    compiled at once."""
    import os
    import sys
    from pathlib import Path
    import cuda_harness as harness
    if harness.find_cxx() is None:
        pytest.skip("no C++ compiler: the CUDA kernels run on the CPU through one")
    cache = Path(os.environ.get("SYMGRAD_HARNESS_CACHE") or tmp_path_factory.mktemp("lse-half-host"))
    harness.build_many(_cuda_sources(["torch", "jax"]), cache)
    old = sys.modules.get("cupy")
    sys.modules["cupy"] = harness.fake_cupy(cache)
    yield sys.modules["cupy"]
    if old is None:
        sys.modules.pop("cupy", None)
    else:
        sys.modules["cupy"] = old


def test_cuda_backend_equals_pytorch(fake_cupy):
    """The cuda backend's float16/bfloat16 kernels under the torch preset (run on the CPU through
    the harness): forward, backward and jvp bit for bit with PyTorch (torch.logsumexp, its backward,
    the transpose in its ops) and with the NumPy module, at::sum's order included."""
    _check("cuda", "torch", CUDA_SHAPES, 6)


def test_cuda_backend_equals_the_numpy_module_under_jax(fake_cupy):
    """Under the jax preset: bit for bit with the NumPy module (JAX itself: the slow test below)."""
    rng = np.random.default_rng(7)
    for dtype, tdtype in HALVES:
        for shape, dim in CUDA_SHAPES:
            run = _runner("cuda", symgrad.load("logsumexp", backend="cuda", convention="jax", dim=dim), tdtype)
            want = _runner("numpy", symgrad.load("logsumexp", convention="jax", dim=dim), tdtype)
            for x in _inputs(shape, dtype, rng):
                y = np.asarray(symgrad.load("logsumexp", convention="jax", dim=dim).forward(x)[0])
                g = rng.standard_normal(y.shape).astype(np.float32).astype(dtype)
                t = (rng.standard_normal(shape) * 3).astype(np.float32).astype(dtype)
                for got, expected in zip(run(x, g, t), want(x, g, t)):
                    assert _bits_equal(got, np.asarray(expected), dtype), (dtype, shape, dim, x, got, expected)


@pytest.mark.slow  # (JAX compiles each shape)
def test_cuda_backend_equals_jax(fake_cupy):
    _check("cuda", "jax", CUDA_SHAPES, 8)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_double_exp_and_log_round_every_half_to_the_correct_float32(dtype):
    """The cuda kernels compute a half value's exp and log in double and round to float32: CUDA's
    double exp and log are within 1 ulp of the exact value (its programming guide's bound), so that
    float32 is the correctly rounded one wherever the exact value lies farther than 2 double ulps
    from a float32 rounding boundary.  Checked here for every float16 and bfloat16 value (flushed
    as XLA reads it or not), in 80-bit long double; the exact results (exp(0) = 1, log(1) = 0, and
    0, infinities and NaN) are left to IEEE special-case results."""
    if np.finfo(np.longdouble).nmant < 63:
        pytest.skip("needs an 80-bit long double")
    values = np.arange(1 << 16, dtype=np.uint16).view(dtype).astype(np.float32)
    flushed = np.where(np.abs(values) < np.finfo(np.float32).tiny, np.float32(0), values)
    close = []
    with np.errstate(all="ignore"):
        args = np.unique(np.concatenate([values, flushed]).astype(np.longdouble))
        for name, fn in (("exp", np.exp), ("log", np.log)):
            exact = fn(args)
            f = exact.astype(np.float32)
            inexact = np.isfinite(exact) & (exact != 0) & (f.astype(np.longdouble) != exact)
            up = np.nextafter(f, np.float32(np.inf)).astype(np.longdouble)
            down = np.nextafter(f, np.float32(-np.inf)).astype(np.longdouble)
            big = np.isinf(f)  # beyond FLT_MAX's rounding boundary: FLT_MAX + ulp / 2
            fl = np.where(big, np.longdouble(np.finfo(np.float32).max), f.astype(np.longdouble))
            top = np.longdouble(2.0) ** 128
            bounds = [(fl + np.where(big, top, up)) / 2, (fl + np.where(big, fl, down)) / 2]
            margin = np.min([np.abs(exact - b) for b in bounds], axis=0) / np.abs(exact)
            close += [(name, float(a)) for a in args[inexact & (margin <= np.longdouble(2.0) ** -51)]]
    assert not close, close[:10]


# shapes whose rows at::sum and XLA add in orders of their own: long rows (vectors, cascades,
# XLA's windows of 32), columns (dim 0: inner 40 holds whole blocks of 32 columns and 8 others,
# inner 5 blocks of 4 and one other), several dims
ORDER_SHAPES = [((1000,), 0), ((3, 300), 1), ((70, 40), 0), ((33, 5), 0), ((40, 3, 70), (0, 2)), ((5, 6), None)]


def _cancelling(shape: tuple, dim, dtype, rng) -> np.ndarray:
    """Tangents whose sum along each reduced slice cancels: +2^14 at the slice's first element,
    -2^14 at its last, small ones of both signs between, so that what the float32 sum loses of the
    small ones, which the order of the additions decides, reaches the rounded result."""
    dims = tuple(range(len(shape))) if dim is None else tuple(sorted(np.atleast_1d(dim) % len(shape)))
    last = tuple(range(len(shape) - len(dims), len(shape)))
    moved = [s for d, s in enumerate(shape) if d not in dims] + [shape[d] for d in dims]
    rows = rng.choice([-1.0, 1.0], moved) * np.exp2(rng.uniform(-4, 0, moved))
    flat = rows.reshape(tuple(moved[:len(shape) - len(dims)]) + (-1,))  # (a view: rows is new)
    flat[..., 0], flat[..., -1] = 2.0 ** 14, -2.0 ** 14
    return np.moveaxis(rows, last, dims).astype(np.float32).astype(dtype)


# shapes where at::sum of a float16/bfloat16 tensor adds in an order of its own (issue 28): rows of
# every length to 300 (vectors of 16 elements loaded as 8 float32 lanes, element i plus element
# i + 8), batched rows, columns under (inner 5, 12) and over (16, 17, 40) a vector of 16, all of a
# 2-d or 3-d tensor, adjacent dims, and dims apart (summed as float32: sum_out's acc buffer)
JVP_ORDER_SHAPES = ([((n,), 0) for n in range(1, 301)]
                    + [((3, n), 1) for n in (15, 16, 17, 24, 31, 32, 33, 100, 257)]
                    + [((n, inner), 0) for n in (3, 17, 40) for inner in (5, 12, 16, 17, 40)]
                    + [((5, 6), None), ((50, 33), (0, 1)), ((4, 9, 20), (1, 2)), ((4, 9, 6), 1),
                       ((40, 3, 70), (0, 2)), ((2, 1, 40), (0, 2)), ((7, 3, 40, 5), (0, 2)),
                       ((4, 2, 5, 3, 6), (0, 2, 4))])


def _check_jvp_order(backend: str, shapes: list, seed: int) -> None:
    """The module's torch-preset jvp of cancelling tangents on tie-heavy inputs (every term's
    weight alike: the order of the float32 sum decides the rounded result) bit for bit with
    PyTorch's own (t * (x - y).exp()).sum(dims)."""
    rng = np.random.default_rng(seed)
    for dtype, tdtype in HALVES:
        for shape, dim in shapes:
            module = symgrad.load("logsumexp", backend=backend, convention="torch", dim=dim)
            for x in (np.zeros(shape, dtype), rng.integers(-1, 1, shape).astype(dtype)):
                t = _cancelling(shape, dim, dtype, rng)
                got = module.jvp(t, module.forward(x)[1])
                assert _bits_equal(got, _torch_jvp(x, t, dim, tdtype), dtype), (dtype, shape, dim)


def test_numpy_jvp_adds_in_pytorchs_order():
    _check_jvp_order("numpy", JVP_ORDER_SHAPES, 10)


@pytest.mark.slow
def test_cpu_jvp_adds_in_pytorchs_order():
    _check_jvp_order("cpu", JVP_ORDER_SHAPES[::7], 11)


@pytest.mark.slow  # (each shape and dtype jitted)
def test_jax_jvp_adds_in_pytorchs_order():
    """The jax backend's own _torch_sum (jax/_torch_sum.py.jinja) under the torch preset."""
    _check_jvp_order("jax", JVP_ORDER_SHAPES[::13] + JVP_ORDER_SHAPES[-8:], 12)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_cuda_jvp_adds_in_the_frameworks_order(fake_cupy, framework):
    """The kernels' sum programs: jvp of cancelling tangents on tie-heavy inputs (every term's
    weight alike) bit for bit with the NumPy module and, under torch, with PyTorch's own ops (a sum
    from left to right, or the wrong columns' order, differs)."""
    rng = np.random.default_rng(9)
    for dtype, tdtype in HALVES:
        for shape, dim in ORDER_SHAPES:
            module = symgrad.load("logsumexp", backend="cuda", convention=framework, dim=dim)
            numpy_module = symgrad.load("logsumexp", convention=framework, dim=dim)
            for x in (np.zeros(shape, dtype), rng.integers(-1, 1, shape).astype(dtype)):
                t = _cancelling(shape, dim, dtype, rng)
                got = module.jvp(t, module.forward(x)[1])
                assert _bits_equal(got, numpy_module.jvp(t, numpy_module.forward(x)[1]), dtype), (dtype, shape, dim)
                if framework == "torch":
                    assert _bits_equal(got, _torch_jvp(x, t, dim, tdtype), dtype), (dtype, shape, dim)


@pytest.mark.parametrize("framework", ["torch", pytest.param("jax", marks=pytest.mark.slow)])
def test_cuda_half_kernels_compile_with_nvcc(tmp_path, framework):
    """nvcc (the CUDA compiler; CuPy compiles with NVRTC, the same front end) compiles the preset's
    .cu, its float16/bfloat16 kernels included, without a warning; only those compute in double (a
    half value's exp and log, above), the float32 kernels do not."""
    import re
    import shutil
    import subprocess
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    (source,) = _cuda_sources_of(framework, (0, 2))
    cu = tmp_path / "lse.cu"
    cu.write_text(source)
    proc = subprocess.run([nvcc, "--ptx", "-arch=compute_80", "--fmad=false", "-Werror", "all-warnings", str(cu),
                           "-o", str(tmp_path / "lse.ptx")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entries = dict(re.findall(r"\.entry\s+(\w+)\((.*?)(?=\.entry|\Z)", (tmp_path / "lse.ptx").read_text(), re.S))
    halves = [name for name in entries if re.search(r"_(forward|backward|jvp)_half_(f16|bf16)$", name)]
    assert len(halves) == 6 and all(".f64" in entries[name] for name in halves)
    assert all(".f64" not in body for name, body in entries.items() if name.endswith("_f32"))
