"""logsumexp in the torch and jax backends (issue 32): plain framework code, against the NumPy
backend's module (itself checked against finite differences and torch.logsumexp in
test_logsumexp*.py / test_special*.py).  The modules compute as the NumPy module computes (in at
least float32, the max shifted out, the terms added in NumPy's pairwise order, rounded once), so
what differs is each library's exp and log: measured on this machine (PyTorch 2.13, JAX 0.10.2,
NumPy, CPU), float32/float64 forward within 1 ulp of max(|y|, 1), backward (on the same saved
output) within 3 ulps of the gradient, jvp within 2 ulps of the sum of its terms' magnitudes;
float16 and bfloat16 (computed in float32, rounded once) within 1 ulp of the result, but the
backward under a preset, whose NumPy module rounds each op as the framework does (within 5 + 2|a|
ulps, a the argument of exp).  JAX's
backward is further off where exp's argument a = (x - y) / t is large: XLA does not divide by t as
NumPy does (an ulp of a becomes |a| ulps of exp(a)), and flushes results below the dtype's smallest
normal number to zero: measured within 3 + 2|a| ulps, or 0 where NumPy's result is subnormal.  Where the
arithmetic is exact the bits are equal: NaN and +-inf slices, empty slices (-inf), rows of one
element (y = x, gradient g, jvp t).  Then symgrad.torch.op and symgrad.jax.op: torch.compile
(fullgraph, from the first call), jit, grad, vmap; every preset (the kernel is the same: only
'split' and the NaN rule 'nan' exist).
"""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from conftest import same_values

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16), BF16)
PARAMS = [{"dim": -1}, {"dim": -1, "temperature": 0.1}, {"dim": (0, 2), "keepdim": True, "temperature": 0.5},
          {"dim": None}]
SETTINGS = [{}, {"convention": "torch"}, {"convention": "jax"}]
# the bounds above: (forward, backward, jvp) in ulps, by dtype
ULPS = {"float64": (1, 3, 2), "float32": (1, 3, 2), "float16": (1, 1, 1), "bfloat16": (1, 1, 1)}


def _inputs(params: dict, dtype, rng) -> list:
    """Smooth rows (|x| up to ~15), and the exact cases: a slice holding NaN, +inf, only -inf."""
    shape = (3, 5, 4) if params.get("dim") != -1 else (6, 37)
    x = rng.standard_normal(shape) * 5
    special = x.copy()
    special.reshape(-1)[[0, 9]] = [np.nan, np.inf]
    if params.get("dim") == -1:
        special[2] = -np.inf
    return [x.astype(dtype), special.astype(dtype)]


def _within(got, want, scale, dtype, ulps, flushed=False) -> bool:
    """|got - want| within ulps (a number, or one per element) of the dtype's spacing at scale
    where want is finite (flushed: or got 0 where want is subnormal), got exactly want where
    want is NaN or infinite."""
    got, want = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    finite = np.isfinite(want)
    if not same_values(got[~finite], want[~finite], zeros=False):
        return False
    wide = np.float32 if dtype == BF16 else dtype
    scale = np.abs(np.asarray(scale, np.float64)).astype(dtype).astype(wide)
    spacing = np.spacing(scale).astype(np.float64) * (2.0 ** 16 if dtype == BF16 else 1.0)  # (bfloat16: 7 bits)
    ok = np.abs(got - want) <= np.asarray(ulps) * spacing
    if flushed:
        ok |= (got == 0) & (np.abs(want) < np.finfo(wide).tiny)
    return bool((ok | ~finite).all())


def _compare(run, params, settings, dtype, xla=False):
    """run(x, g, t, saved_of_numpy) -> (y, grad, jvp) of the framework module, checked against
    the NumPy module within ULPS (xla: backward within 3 + 2|a| ulps, or flushed; float16/bfloat16
    under a preset: 5 + 2|a|), and bit for bit
    on rows of one element and empty rows."""
    rng = np.random.default_rng(5)
    numpy_module = symgrad.load("logsumexp", **settings, **params)
    fwd, bwd, tan = ULPS[dtype.name]
    # float16/bfloat16 under a preset: the NumPy module rounds each op to the dtype, as the framework
    # (x - y rounded: an ulp of a is |a| ulps of exp(a); JAX's g / sum and product rounded too:
    # within 5 + 2|a| ulps)
    each_op = bool(settings.get("convention")) and dtype.itemsize == 2
    for x in _inputs(params, dtype, rng):
        y, saved = numpy_module.forward(x)
        g = rng.standard_normal(y.shape).astype(dtype)
        t = rng.standard_normal(x.shape).astype(dtype)
        got_y, got_grad, got_jvp = run(x, g, t, saved)
        assert _within(got_y, y, np.maximum(np.abs(y.astype(np.float64)), 1), dtype, fwd), "forward"
        grad = numpy_module.backward(g, saved)[0]
        if xla or each_op:  # |a| = -log(exp(a)), exp(a) the NumPy module's weight (its backward of ones)
            with np.errstate(divide="ignore", invalid="ignore"):
                a = np.abs(np.log(numpy_module.backward(np.ones_like(y), saved)[0].astype(np.float64)))
            base = 3 if xla and not each_op else 5  # (each op rounded: 4 ulps seen at |a| = 0.4, bfloat16)
            bwd = np.where(np.isfinite(a), base + 2 * a, base)
        assert _within(got_grad, grad, grad, dtype, bwd, flushed=xla), "backward"
        scale = numpy_module.jvp(np.abs(t), saved)  # (the terms' magnitudes: the weights are >= 0)
        assert _within(got_jvp, numpy_module.jvp(t, saved), scale, dtype, tan), "jvp"
    if params.get("dim") == -1:  # rows of one element and empty rows: exact
        for shape in ((4, 1), (3, 0)):
            x = rng.standard_normal(shape).astype(dtype)
            y, saved = numpy_module.forward(x)
            want = (y, numpy_module.backward(y, saved)[0], numpy_module.jvp(x, saved))
            for a, b in zip(run(x, y, x, saved), want):
                assert same_values(a, b)


def _torch_run(params, settings, dtype):
    torch = pytest.importorskip("torch")
    module = symgrad.load("logsumexp", backend="torch", **settings, **params)

    def tensor(a):
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16) if a.dtype == BF16 else torch.from_numpy(a)

    def array(t):
        return t.float().numpy().astype(BF16) if t.dtype == torch.bfloat16 else t.numpy()

    def run(x, g, t, saved):
        y, _ = module.forward(tensor(x))
        same = module.Saved(tensor(saved.x), tensor(saved.output), saved.input_shape, saved.output_shape,
                            tensor(saved.x).dtype)  # (the NumPy module's saved output: backward alone)
        return array(y), array(module.backward(tensor(g), same)[0]), array(module.jvp(tensor(t), same))
    return run


def _jax_run(params, settings, dtype):
    jax = pytest.importorskip("jax")
    module = symgrad.load("logsumexp", backend="jax", **settings, **params)

    def run(x, g, t, saved):
        with jax.enable_x64(True):
            y, _ = module.forward(x)
            same = module.Saved(jax.numpy.asarray(saved.x), jax.numpy.asarray(saved.output), saved.input_shape,
                                saved.output_shape, np.dtype(saved.x.dtype))
            return (np.asarray(y), np.asarray(module.backward(g, same)[0]), np.asarray(module.jvp(t, same)))
    return run


def _variants(default: set):
    out = []
    for backend in ("torch", "jax"):
        for p, params in enumerate(PARAMS):
            for s, settings in enumerate(SETTINGS):
                for dtype in DTYPES:
                    key = (backend, p, s, dtype.name)
                    out.append(pytest.param(backend, params, settings, dtype, marks=() if key in default else pytest.mark.slow,
                                            id=f"{backend}-{p}-{'-'.join(settings.values()) or 'split'}-{dtype.name}"))
    return out


@pytest.mark.parametrize("backend,params,settings,dtype", _variants({("torch", 1, 0, "float32")}))
def test_backend_module_within_the_ulps_of_the_numpy_module(backend, params, settings, dtype):
    _compare({"torch": _torch_run, "jax": _jax_run}[backend](params, settings, dtype), params, settings, dtype,
             xla=backend == "jax")


@pytest.mark.slow  # (Dynamo and Inductor compile: seconds)
def test_symgrad_torch_op_compiles_fullgraph_from_the_first_call():
    """In a fresh op, torch.compile(fullgraph=True) before any eager call: the values and gradient
    of the eager call (which runs the NumPy or cpu module), within the ulps above."""
    torch = pytest.importorskip("torch")
    import symgrad.torch as st
    fn = st.op("logsumexp", dim=(0, 2), temperature=0.5, keepdim=True)
    x = torch.randn(3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 4
    compiled = torch.compile(lambda a: fn(a).square().sum(), fullgraph=True)
    xc = x.clone().requires_grad_()
    got = compiled(xc)
    got.backward()
    xe = x.clone().requires_grad_()
    want = fn(xe).square().sum()
    want.backward()
    assert abs(got.item() - want.item()) <= 8 * np.spacing(abs(want.item()))
    assert torch.allclose(xc.grad, xe.grad, rtol=1e-13, atol=0)


@pytest.mark.slow  # (each jitted shape compiles)
def test_symgrad_jax_op_is_native_jit_grad_vmap():
    """symgrad.jax.op('logsumexp') runs the jax backend's module: no callback in the jaxpr of its
    jitted grad; grad equals the module's backward; vmap of grad equals a loop over examples."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import symgrad.jax as sj
    fn = sj.op("logsumexp", dim=-1, temperature=0.1)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((4, 9)).astype(np.float32))
    grad = jax.jit(jax.grad(lambda a: fn(a).sum()))
    assert "callback" not in str(jax.make_jaxpr(grad)(x))
    module = symgrad.load("logsumexp", backend="jax", dim=-1, temperature=0.1)
    y, saved = module.forward(x)
    assert same_values(np.asarray(grad(x)), np.asarray(module.backward(jnp.ones_like(y), saved)[0]))
    per_example = jax.vmap(jax.grad(lambda row: fn(row[None])[0]))(x)
    loop = jnp.stack([jax.grad(lambda row: fn(row[None])[0])(row) for row in x])
    assert same_values(np.asarray(per_example), np.asarray(loop))
