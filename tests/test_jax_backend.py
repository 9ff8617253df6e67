"""The jax backend (symgrad/backends/jax/) and symgrad.jax's native path.

Oracle: the NumPy backend's module of the same op (itself checked against finite differences and
the SymPy derivation): the jax module's forward, backward and jvp equal it bit for bit on the CPU
(float16, bfloat16, float32 and float64; NaN == NaN whatever its payload, every other value by its
bits, so signs of zero count), under jax.jit, at ties (small integers, repeated values), NaN, +-0
and +-inf.  symgrad.jax's native path: no callback in the jaxpr, vmap equals a loop, jit(grad)
equals the NumPy module's backward bit for bit (the presets' equality with JAX's own ops is
tests/test_symgrad_jax.py's).
"""

from __future__ import annotations

import itertools
import random
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install \".[jax]\")")
import jax.numpy as jnp  # noqa: E402

import symgrad  # noqa: E402
from symgrad import backends, policy  # noqa: E402
from symgrad.ops import OPS, ORDERS, resolve  # noqa: E402
from symgrad.pipeline import render  # noqa: E402

ml_dtypes = pytest.importorskip("ml_dtypes")

ELEMENTWISE = ["maximum", "minimum", "relu", "clamp", "hardtanh", "relu6", "leaky_relu", "abs"]
PARAMS = {"clamp": [{"min": -1.0, "max": 1.0}, {"min": 0}, {"max": 2}],
          "hardtanh": [{}, {"min_val": -2, "max_val": 3.5}],
          "leaky_relu": [{}, {"negative_slope": 0.0}, {"negative_slope": 0.2}]}
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
# ties, NaN, +-0, +-inf, values that clamp/hardtanh/relu6 tie with (their bounds)
VALUES = np.array([0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, 3.5, 6.0, np.inf, -np.inf, np.nan])
GRADS = np.array([1.0, -1.0, 0.0, -0.0, 3.0, 0.5, np.inf, np.nan])


def _settings(name):
    """(params, settings) of every variant: the presets and every tie policy x NaN rule x order the
    op allows (those resolve() refuses left out)."""
    spec = OPS[name]
    out = []
    for params in PARAMS.get(name, [{}]):
        combos = [{"convention": "torch"}, {"convention": "jax"}] + [
            {"ties": t, "nan": n, "order": o} for t, n, o in itertools.product(
                spec.policies or policy.TIES, spec.nan_rules or policy.NAN_RULES, ORDERS)]
        for s in combos:
            try:
                resolve(name, s.get("ties"), nan=s.get("nan"), order=s.get("order"),
                        convention=s.get("convention"), **params)
            except (ValueError, TypeError):
                continue
            out.append((name, params, s))
    return out


ALL = [v for name in ELEMENTWISE for v in _settings(name)]


def _representative():
    """Per op: both presets and one tie policy x NaN rule x order variant (a fixed sample) of its
    first parameter set; leaky_relu's slope 0 (a Literal: x * 0) under both presets."""
    chosen = []
    for name in ELEMENTWISE:
        first = PARAMS.get(name, [{}])[0]
        variants = [v for v in ALL if v[0] == name and v[1] == first]
        chosen += [v for v in variants if "convention" in v[2]]
        chosen += random.Random(name).sample([v for v in variants if "convention" not in v[2]], 1)
    chosen += [v for v in ALL if v[0] == "leaky_relu" and v[1] == {"negative_slope": 0.0} and "convention" in v[2]]
    return chosen


REPRESENTATIVE = _representative()
SLOW = [v for v in ALL if v not in REPRESENTATIVE]


def _id(v):
    name, params, s = v
    return "-".join([name] + [f"{k}={p}" for k, p in params.items()] + [str(x) for x in s.values()])


def _same(got, want) -> str | None:
    """None where got equals want bit for bit (NaN == NaN whatever its bits), else what differs."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{got.dtype}{got.shape} != {want.dtype}{want.shape}"
    nan_got, nan_want = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
    bits = np.dtype(f"u{got.dtype.itemsize}")
    equal = (got.view(bits) == want.view(bits)) | (nan_got & nan_want)
    if equal.all():
        return None
    return f"{(~equal).sum()} differ, e.g. {got[~equal][:4]} != {want[~equal][:4]}"


def _check_variant(variant, rng):
    name, params, s = variant
    kw = dict(ties=s.get("ties"), nan=s.get("nan"), order=s.get("order"), convention=s.get("convention"), **params)
    numpy_module = symgrad.load(name, **kw)
    jax_module = symgrad.load(name, backend="jax", **kw)

    @jax.jit
    def results(xs, g, ts):  # one compilation per signature: forward, backward and jvp
        y, saved = jax_module.forward(*xs)
        return [y, *jax_module.backward(g, saved), jax_module.jvp(*ts, saved)]
    two = len(numpy_module.INPUTS) == 2
    bad = []
    for dtype in DTYPES:
        a = rng.choice(VALUES, (6, 8))
        # shapes that broadcast, and the second input equal to the first where it can be (ties)
        cases = [[a.reshape(-1)]] if not two else [
            [a, np.where(rng.random(a.shape) < 0.5, a, rng.choice(VALUES, a.shape))],
            [a[:, :1], a[0]]]
        for xs in cases:
            xs = [x.astype(dtype) for x in xs]
            with np.errstate(all="ignore"):
                y, saved = numpy_module.forward(*xs)
                g = rng.choice(GRADS, y.shape).astype(dtype)
                ts = [rng.choice(GRADS[:-1], x.shape).astype(dtype) for x in xs]
                want = [y, *numpy_module.backward(g, saved), numpy_module.jvp(*ts, saved)]
            got = results(xs, g, ts)
            for label, u, w in zip(["forward", *(f"backward[{k}]" for k in range(len(xs))), "jvp"], got, want):
                why = _same(u, w)
                if why:
                    bad.append(f"{np.dtype(dtype).name} {[x.shape for x in xs]} {label}: {why}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("variant", REPRESENTATIVE, ids=[_id(v) for v in REPRESENTATIVE])
def test_jax_module_equals_the_numpy_module_bit_for_bit(variant):
    with jax.enable_x64(True):
        _check_variant(variant, np.random.default_rng(0))


@pytest.mark.slow
@pytest.mark.parametrize("variant", SLOW, ids=[_id(v) for v in SLOW])
def test_jax_module_equals_the_numpy_module_bit_for_bit_every_variant(variant, request):
    """The rest of the product (op x parameters x policy x NaN rule x order x preset): about 340
    variants, minutes; run with -m slow."""
    with jax.enable_x64(True):
        _check_variant(variant, np.random.default_rng(1))


def test_float32_without_x64():
    """JAX's default (no x64): float32 arrays stay float32, the same bits."""
    with jax.enable_x64(False):
        m, n = symgrad.load("maximum", backend="jax", ties="split"), symgrad.load("maximum", ties="split")
        a = np.array([1.0, 2.0, -0.0, np.nan], np.float32)
        b = np.array([1.0, 3.0, 0.0, 1.0], np.float32)
        y, s = jax.jit(m.forward)(a, b)
        want, saved = n.forward(a, b)
        assert y.dtype == jnp.float32 and _same(y, want) is None
        for u, w in zip(jax.jit(m.backward)(np.ones(4, np.float32), s), n.backward(np.ones(4, np.float32), saved)):
            assert _same(u, w) is None


EXPRESSIONS = [("Max(x*y, x + y, 0)", ["x", "y"], None), ("abs(x) + Min(x, 1)", ["x"], None),
               ("Max(x, 2*y) - Min(x, y)", ["x", "y"], ["x"])]


@pytest.mark.parametrize("text,inputs,wrt", EXPRESSIONS)
@pytest.mark.parametrize("ties", ["split", "first"])
def test_piecewise_linear_expressions_equal_the_numpy_module(text, inputs, wrt, ties):
    """Expressions of max/min, +, * (no exp or log, whose XLA and NumPy roundings differ): the same
    bits, gradients of the inputs outside wrt None, as the NumPy module."""
    rng = np.random.default_rng(2)
    n = symgrad.load_expr(text, inputs=inputs, wrt=wrt, ties=ties)
    m = symgrad.load_expr(text, inputs=inputs, wrt=wrt, ties=ties, backend="jax")
    with jax.enable_x64(True):
        for dtype in (np.float32, np.float64):
            xs = [rng.choice(VALUES, (5, 4)).astype(dtype) for _ in inputs]
            if len(xs) == 2:
                xs[1] = np.where(rng.random(xs[0].shape) < 0.5, xs[0], xs[1])
            with np.errstate(all="ignore"):
                y, saved = n.forward(*xs)
                g = rng.choice(GRADS, y.shape).astype(dtype)
                ts = [rng.choice(GRADS[:-1], x.shape).astype(dtype) if (wrt is None or name in wrt) else None
                      for name, x in zip(inputs, xs)]
                want = [y, *n.backward(g, saved), n.jvp(*ts, saved)]
            y_j, saved_j = jax.jit(m.forward)(*xs)
            got = [y_j, *jax.jit(m.backward)(g, saved_j), m.jvp(*ts, saved_j)]
            for u, w in zip(got, want):
                assert (u is None) == (w is None)
                if w is not None:
                    assert _same(u, w) is None, (dtype, _same(u, w))


def test_smooth_expression_is_close_to_the_numpy_module():
    """exp and log round differently in XLA and NumPy: close, not bit for bit."""
    text = "max(x, 0) * exp(y) - min(x, y)"
    n, m = symgrad.load_expr(text), symgrad.load_expr(text, backend="jax")
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((2, 7))
    want_y, saved = n.forward(x, y)
    got_y, saved_j = jax.jit(m.forward)(x, y)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-6)
    for u, w in zip(m.backward(np.ones(7, np.float32), saved_j), n.backward(np.ones(7), saved)):
        np.testing.assert_allclose(u, w, rtol=1e-6)
    assert not m.PIECEWISE_LINEAR


# ----------------------------------------------------------------------------- symgrad.jax, natively

def test_the_jitted_grad_holds_no_callback():
    """jit(grad) of relu + max_pool2d + amax: the jax backend's code, no callback (each op's
    tangent a linear_call), under tie policies and the jax preset."""
    import symgrad.jax as sj
    for settings in ({"ties": "split"}, {"ties": "first"}, {"convention": "jax"}):
        relu, amax = sj.op("relu", **settings), sj.op("amax", dim=(-2, -1), **settings)
        pool = sj.op("max_pool2d", kernel_size=3, stride=2, padding=1, **settings)
        text = str(jax.make_jaxpr(jax.jit(jax.grad(lambda x: amax(pool(relu(x))).sum())))(jnp.ones((2, 3, 8, 8))))
        assert "callback" not in text and "linear_call" in text, settings
    # logsumexp too (issue 32: the jax backend builds it)
    lse = sj.op("logsumexp", dim=-1)
    assert "callback" not in str(jax.make_jaxpr(jax.grad(lambda x: lse(x).sum()))(jnp.ones((1, 1, 4))))


def test_expressions_take_the_native_path():
    import symgrad.jax as sj
    e = sj.expr("Max(x, 2*y)", inputs=["x", "y"])
    text = str(jax.make_jaxpr(jax.grad(lambda x, y: e(x, y).sum(), argnums=(0, 1)))(jnp.ones(3), jnp.ones(3)))
    assert "callback" not in text


@pytest.mark.parametrize("name,settings", [("relu", {"ties": "split"}), ("maximum", {"ties": "first"}),
                                           ("clamp", {"convention": "torch", "min": -1.0, "max": 1.0}),
                                           ("leaky_relu", {"convention": "jax"})])
def test_jit_grad_equals_the_numpy_modules_backward(name, settings):
    """jit(grad) and jvp through symgrad.jax: the NumPy module's backward and jvp, bit for bit."""
    import symgrad.jax as sj
    f = sj.op(name, **settings)
    n = symgrad.load(name, **settings)
    rng = np.random.default_rng(4)
    with jax.enable_x64(True):
        for dtype in (np.float32, np.float64):
            xs = [rng.choice(VALUES, 40).astype(dtype) for _ in n.INPUTS]
            if len(xs) == 2:
                xs[1] = np.where(rng.random(40) < 0.5, xs[0], xs[1])
            g = rng.choice(GRADS[:-2], 40).astype(dtype)
            with np.errstate(all="ignore"):
                y, saved = n.forward(*xs)
                want = n.backward(g, saved)
                want_t = n.jvp(*xs, saved)
            got = jax.jit(jax.grad(lambda *v: (f(*v) * g).sum(), argnums=tuple(range(len(xs)))))(*xs)
            for u, w in zip(got, want):
                assert _same(u, w) is None
            assert _same(jax.jit(f)(*xs), y) is None
            assert _same(jax.jit(lambda *v: jax.jvp(f, v, tuple(xs))[1])(*xs), want_t) is None


def test_vmap_of_grad_equals_a_loop_natively():
    """vmap of grad, of grad-of-grad and of jvp equal a loop over the examples; the batched jaxpr
    has no sequential map (the linear_call's batching rule batches natively)."""
    import symgrad.jax as sj
    rng = np.random.default_rng(5)
    f, m = sj.op("relu", ties="split"), sj.op("maximum", ties="split")
    xs = jnp.asarray(rng.integers(-2, 3, (5, 7)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal(7).astype(np.float32))

    def loss(x):
        return (f(x) ** 2 * w).sum()
    gg = jax.grad(lambda x: (jax.grad(loss)(x) * w).sum())
    for fn in (jax.grad(loss), gg, lambda x: jax.jvp(f, (x,), (w,))[1]):
        np.testing.assert_array_equal(jax.jit(jax.vmap(fn))(xs), np.stack([fn(x) for x in xs]))
    text = str(jax.make_jaxpr(jax.vmap(jax.grad(loss)))(xs))
    assert "while" not in text and "scan" not in text and "callback" not in text
    # one input batched, the other not
    b = xs[0]
    grads = jax.vmap(jax.grad(lambda u, v: (m(u, v) * w).sum(), argnums=(0, 1)), in_axes=(0, None))(xs, b)
    loop = [jax.grad(lambda u, v: (m(u, v) * w).sum(), argnums=(0, 1))(u, b) for u in xs]
    for k in range(2):
        np.testing.assert_array_equal(grads[k], np.stack([gr[k] for gr in loop]))


def test_grad_of_grad_is_the_tie_policys():
    """The second derivative of relu(x)**2 is 2 W**2 with the split weight (1/2 at 0), not the
    derivative of the forward's jax.numpy code (which would give 1 at 0)."""
    import symgrad.jax as sj
    f = sj.op("relu", ties="split")
    x = jnp.asarray([-1.0, 0.0, 2.0])
    np.testing.assert_array_equal(jax.grad(lambda u: jax.grad(lambda v: (f(v) ** 2).sum())(u).sum())(x),
                                  [0.0, 0.5, 2.0])


def test_symgrad_jax_gets_the_jax_library():
    """The backend package backends/jax/ shadows nothing: symgrad.jax imports the JAX library."""
    import symgrad.backends.jax as backend
    import symgrad.jax as sj
    assert sj.jax is jax and sj.jnp is jnp
    assert backend.__name__ == "symgrad.backends.jax" and backends.get("jax").package is backend


# ----------------------------------------------------------------------------- files, CLI, errors

def test_generate_and_load(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "symgrad", "generate", "relu", "--ties", "split", "--backend",
                        "jax", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (path,) = out.iterdir()
    text = path.read_text()
    assert "--backend jax" in text.splitlines()[1] and "import jax.numpy as jnp" in text
    assert "pure_callback" not in text and "io_callback" not in text and ".numpy()" not in text
    m = symgrad.load("relu", backend="jax", ties="split")
    assert m.BACKEND == "jax" and m.TIES == "split"
    np.testing.assert_array_equal(m.backward(jnp.ones(3), m.forward(jnp.asarray([-1.0, 0.0, 1.0]))[1])[0],
                                  [0.0, 0.5, 1.0])


def test_rendering_is_deterministic():
    op = resolve("clamp", "split", min=-1.0, max=1.0)
    assert render(op, backends.get("jax")) == render(op, backends.get("jax"))


def test_a_variant_it_refuses_is_refused_in_one_line():
    """Every kernel form is built (RoI pooling and logsumexp since issues 32 and 33); segment_max
    without num_segments is refused (jax.ops.segment_max needs it under jit)."""
    with pytest.raises(ValueError, match=r"^segment_max: the jax backend builds segments with num_segments given "
                                         r"only .* use backend='numpy'") as err:
        symgrad.load("segment_max", backend="jax")
    assert "\n" not in str(err.value)


def test_backend_all_leaves_out_the_variants_it_refuses(tmp_path):
    """segment_max without num_segments: --backend all writes the other backends' files, not the
    jax module; max pooling's jax module is written."""
    for args, jax_file in ((["segment_max"], False),
                           (["max_pool2d", "--kernel-size", "2"], True)):
        out = tmp_path / args[0]
        r = subprocess.run([sys.executable, "-m", "symgrad", "generate", *args, "--backend", "all", "--out", str(out)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        names = [p.name for p in out.iterdir()]
        assert any(n.endswith("_jax.py") for n in names) == jax_file and len(names) > 1, names


def test_a_missing_jax_is_explained_by_the_generated_module(tmp_path):
    files = render(resolve("relu", "split"), backends.get("jax"))
    (name, text), = files.items()
    (tmp_path / name).write_text(text)
    code = (f"import sys; sys.modules['jax'] = None; sys.path.insert(0, {str(tmp_path)!r})\n"
            f"try:\n    import {name[:-3]}\nexcept ModuleNotFoundError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.count("\n") == 1 and 'pip install ".[jax]"' in out.stdout, out.stdout


def test_errors():
    m = symgrad.load("maximum", backend="jax", ties="split")
    with pytest.raises(TypeError, match="maximum: a must be an array of float16, bfloat16, float32 or float64, "
                                        "got dtype int32"):
        m.forward(jnp.ones(3, jnp.int32), jnp.ones(3))
    with pytest.raises(ValueError, match=r"maximum: inputs a and b must broadcast together"):
        m.forward(jnp.ones(3), jnp.ones(4))
    _, saved = m.forward(jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match=r"grad_output must have the forward output's shape \(3,\)"):
        m.backward(jnp.ones(4), saved)
    with pytest.raises(TypeError, match="saved must be the Saved value"):
        m.backward(jnp.ones(3), (1, 2))
    e = symgrad.load_expr("Max(x, 2*y)", inputs=["x", "y"], wrt=["x"], backend="jax")
    _, saved = e.forward(jnp.ones(2), jnp.ones(2))
    with pytest.raises(ValueError, match="tangent_y must be None"):
        e.jvp(None, jnp.ones(2), saved)
    assert e.backward(jnp.ones(2), saved)[1] is None


def test_templates_place_finished_strings():
    from pathlib import Path

    from test_render import _template_decisions
    found = _template_decisions([Path(backends.get("jax").templates)])
    assert found == [], "\n".join(found)


def test_a_broadcast_gradient_of_inexact_sums_is_close():
    """A broadcast input's gradient is summed in XLA's order, not NumPy's (nor at::sum_to's under
    the torch preset): the same bits where the sums are exact (the tests above), within rounding
    elsewhere (documented in the module's docstring)."""
    rng = np.random.default_rng(6)
    for settings in ({"ties": "split"}, {"convention": "torch"}):
        n = symgrad.load("maximum", **settings)
        m = symgrad.load("maximum", backend="jax", **settings)
        a = rng.standard_normal((300, 8)).astype(np.float32)
        b = (rng.standard_normal(8) - 3).astype(np.float32)
        g = rng.standard_normal((300, 8)).astype(np.float32)
        want = n.backward(g, n.forward(a, b)[1])
        got = jax.jit(m.backward)(g, m.forward(a, b)[1])
        assert _same(got[0], want[0]) is None  # not summed: the same bits
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- window kernels

# max pooling's parameter sets: overlapping and disjoint windows, padding, dilation, ceil_mode
POOLS = [("max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1}),
         ("max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2, "ceil_mode": True}),
         ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}),
         ("max_pool2d", {"kernel_size": 2}),
         ("max_pool2d", {"kernel_size": (2, 3), "stride": 1, "padding": (1, 0), "dilation": (2, 1)}),
         ("max_pool3d", {"kernel_size": 2, "stride": 1, "padding": 1})]
# an input per spatial rank: odd sizes, so that ceil_mode and padding leave partial windows
POOL_SHAPES = {1: (2, 3, 11), 2: (2, 3, 7, 6), 3: (1, 2, 4, 5, 5)}


def _window_settings(name, params):
    """Every preset, tie policy and NaN rule the op takes (those resolve() refuses left out)."""
    combos = [{"convention": "torch"}, {"convention": "jax"}] + [
        {"ties": t, "nan": n} for t, n in itertools.product(policy.TIES, policy.NAN_RULES)]
    out = []
    for s in combos:
        try:
            resolve(name, s.get("ties"), nan=s.get("nan"), convention=s.get("convention"), **params)
        except (ValueError, TypeError):
            continue
        out.append((name, params, s))
    return out


# the reductions' parameter sets: one dim, several with keepdim, all (max and min take none)
REDUCTIONS = [("amax", {"dim": -1}), ("amin", {"dim": (0, 2), "keepdim": True}), ("amax", {}),
              ("max", {}), ("min", {})]
REDUCTION_SHAPE = (3, 4, 5)
MAXOUT_SHAPE = (3, 6, 2, 3)  # pieces 2 and 3 divide 6
MAXOUTS = [("maxout", {"pieces": 3}), ("maxout", {"pieces": 2})]
MAXOUT_ALL = [v for name, params in MAXOUTS for v in _window_settings(name, params)]
WINDOW_ALL = [v for name, params in POOLS for v in _window_settings(name, params)]
# (amax and amin under the torch preset too: jvp in PyTorch's at::sum order, as the NumPy module)
REDUCTION_ALL = [v for name, params in REDUCTIONS for v in _window_settings(name, params)]


def _window_representative():
    """Per parameter set one tie policy under the default NaN rule (in turn); both presets on the
    sets they differ most on (padding that takes part, dilation, ceil_mode); on max_pool2d's first
    set a NaN rule that keeps the fold apart from the winner (keep) and one that splits NaN
    arithmetically (nan)."""
    chosen = []
    for k, (name, params) in enumerate(POOLS):
        variants = [v for v in WINDOW_ALL if v[0] == name and v[1] == params]
        chosen += [v for v in variants if v[2].get("ties") == list(policy.TIES)[k % 4] and v[2]["nan"] == "dominate"]
        if k in (1, 2):
            chosen += [v for v in variants if "convention" in v[2]]
        if k == 2:
            chosen += [v for v in variants if v[2].get("nan") in ("keep", "nan") and v[2]["ties"] == "first"]
    return chosen


# the reductions: amax over one dim under the jax preset and each tie policy (NaN dominates);
# min over everything under the torch preset (NaN rule 'nan', the zeros rule 'ordered') and split
# as arithmetic
WINDOW_REPRESENTATIVE = _window_representative() + [
    v for v in REDUCTION_ALL
    if (v[0], v[1]) == REDUCTIONS[0] and (v[2].get("nan") == "dominate" or "convention" in v[2])
    or v[0] == "min" and (v[2].get("convention") == "torch" or v[2].get("nan") == "nan")] + [
    v for v in MAXOUT_ALL if v[1] == MAXOUTS[0][1] and ("convention" in v[2] or v[2] == {"ties": "split", "nan": "dominate"})]
WINDOW_SLOW = [v for v in WINDOW_ALL + REDUCTION_ALL + MAXOUT_ALL if v not in WINDOW_REPRESENTATIVE]


def _window_inputs(shape, rng):
    """Inputs with ties, NaN, +-0 and +-inf; with small integers (many ties); and random normals."""
    return [rng.choice(VALUES, shape), rng.integers(-1, 2, shape).astype(np.float64) * rng.choice([1.0, -0.0], shape),
            rng.standard_normal(shape)]


def _check_window_variant(variant, rng):
    name, params, s = variant
    kw = dict(ties=s.get("ties"), nan=s.get("nan"), convention=s.get("convention"), **params)
    numpy_module = symgrad.load(name, **kw)
    jax_module = symgrad.load(name, backend="jax", **kw)
    assert jax_module.BACKEND == "jax" and "pure_callback" not in open(jax_module.__file__).read()

    @jax.jit
    def results(x, g, t):  # one compilation per signature: forward, backward and jvp
        y, saved = jax_module.forward(x)
        return [y, *jax_module.backward(g, saved), jax_module.jvp(t, saved), saved]
    bad = []
    windows = OPS[name].strategy.windows
    rows = windows == "rows"
    shape = {"rows": REDUCTION_SHAPE, "blocks": MAXOUT_SHAPE}.get(windows) or POOL_SHAPES[OPS[name].spatial]
    for dtype in DTYPES:
        for x in _window_inputs(shape, rng):
            x = x.astype(dtype)
            with np.errstate(all="ignore"):
                y, saved = numpy_module.forward(x)
                g = rng.choice(GRADS, y.shape).astype(dtype)
                t = rng.choice(GRADS[:-1], x.shape).astype(dtype)
                want = [y, *numpy_module.backward(g, saved), numpy_module.jvp(t, saved)]
            *got, saved_j = results(x, g, t)
            # the same Saved contents: the uint8 window-local index (scan), the input and output (mask)
            fields = [f for f in ("index", "x", "output") if f in saved._fields]
            want += [getattr(saved, f) for f in fields]
            got += [getattr(saved_j, f) for f in fields]
            for label, u, w in zip(["forward", "backward", "jvp"] + [f"saved.{f}" for f in fields], got, want):
                if rows and "index" not in fields and label in ("forward", "saved.output"):
                    # a split/all reduction's output is np.max's, whose sign of a zero where a row
                    # holds +0 and -0 follows its SIMD lanes (the module's docstring): zeros as +0
                    u, w = (np.where(np.asarray(a) == 0, np.zeros((), np.asarray(a).dtype), a) for a in (u, w))
                why = _same(u, w)
                if why:
                    bad.append(f"{np.dtype(dtype).name} {label}: {why}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("variant", WINDOW_REPRESENTATIVE, ids=[_id(v) for v in WINDOW_REPRESENTATIVE])
def test_jax_window_module_equals_the_numpy_module_bit_for_bit(variant):
    with jax.enable_x64(True):
        _check_window_variant(variant, np.random.default_rng(7))


@pytest.mark.slow
@pytest.mark.parametrize("variant", WINDOW_SLOW, ids=[_id(v) for v in WINDOW_SLOW])
def test_jax_window_module_equals_the_numpy_module_bit_for_bit_every_variant(variant):
    with jax.enable_x64(True):
        _check_window_variant(variant, np.random.default_rng(8))


@pytest.mark.parametrize("settings", [{"ties": "first"}, {"convention": "jax"}, {"convention": "torch"}])
def test_max_pooling_indices_are_the_numpy_modules(settings):
    """return_indices=True: PyTorch's flat positions, as the NumPy module computes them."""
    kw = dict(kernel_size=3, stride=2, padding=1, return_indices=True, **settings)
    n, m = symgrad.load("max_pool2d", **kw), symgrad.load("max_pool2d", backend="jax", **kw)
    x = np.random.default_rng(9).integers(-1, 2, (2, 2, 5, 6)).astype(np.float32)
    (y, i), _ = n.forward(x)
    with jax.enable_x64(True):
        (y_j, i_j), _ = jax.jit(m.forward)(x)
    assert _same(y_j, y) is None and np.asarray(i_j).dtype == np.int64
    np.testing.assert_array_equal(i_j, i)


def test_window_module_errors():
    m = symgrad.load("max_pool2d", backend="jax", kernel_size=3)
    with pytest.raises(ValueError, match=r"^max_pool2d: x must have 3 dims \(C, \*spatial\) or 4 dims"):
        m.forward(jnp.ones((2, 2, 2, 2, 2)))
    with pytest.raises(ValueError, match=r"^max_pool2d: x of spatial size \(2, 2\) is too small"):
        m.forward(jnp.ones((1, 1, 2, 2)))
    with pytest.raises(TypeError, match=r"^max_pool2d: x must be an array of float16, bfloat16, float32 or "
                                        r"float64, got dtype int32"):
        m.forward(jnp.ones((1, 1, 6, 6), jnp.int32))
    y, saved = m.forward(jnp.ones((1, 1, 6, 6)))
    with pytest.raises(ValueError, match=r"grad_output must have the forward output's shape \(1, 1, 2, 2\)"):
        m.backward(jnp.ones((1, 1, 3, 3)), saved)
    with pytest.raises(TypeError, match="saved must be the Saved value"):
        m.backward(y, (1, 2))
    with pytest.raises(ValueError, match=r"tangent_x must have its input's shape \(1, 1, 6, 6\)"):
        m.jvp(jnp.ones((1, 1, 4)), saved)


# ----------------------------------------------------------------------------- symgrad.jax, window ops natively

def test_vmap_of_grad_of_max_pooling_equals_a_loop():
    """vmap of grad (and of grad-of-grad) through relu, max pooling and amax equals a loop over the
    examples, batched natively (no sequential map, no callback); and equals the NumPy module's
    backward per example."""
    import symgrad.jax as sj
    pool = sj.op("max_pool2d", kernel_size=3, stride=2, padding=1, ties="split")
    first = sj.op("max_pool2d", kernel_size=2, ties="first")
    relu, amax = sj.op("relu", ties="split"), sj.op("amax", dim=-1, ties="split")
    rng = np.random.default_rng(10)
    xs = jnp.asarray(rng.integers(-2, 3, (4, 2, 3, 7, 6)).astype(np.float32))  # 4 examples of (2, 3, 7, 6)
    w = jnp.asarray(rng.standard_normal((2, 3, 4, 3)).astype(np.float32))

    def loss(x):
        return (pool(relu(x)) ** 2 * w).sum() + first(x).sum() + (amax(x) ** 2).sum()
    gg = jax.grad(lambda x: (jax.grad(loss)(x) * x).sum())
    for fn in (jax.grad(loss), gg):
        one = jax.jit(fn)  # (compiled once for the loop)
        np.testing.assert_array_equal(jax.jit(jax.vmap(fn))(xs), np.stack([one(x) for x in xs]))
    text = str(jax.make_jaxpr(jax.vmap(jax.grad(loss)))(xs))
    assert "while" not in text and "scan" not in text and "callback" not in text
    n = symgrad.load("max_pool2d", kernel_size=3, stride=2, padding=1, ties="split")
    grads = jax.jit(jax.vmap(jax.grad(lambda x: (pool(x) * w).sum())))(xs)
    for x, g in zip(np.asarray(xs), grads):
        assert _same(g, n.backward(np.asarray(w), n.forward(x)[1])[0]) is None


_SHARDED_STEP = r'''
import os
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import symgrad.jax as sj

jax.config.update("jax_enable_x64", True)
assert len(jax.devices()) == 2, jax.devices()
relu, pool = sj.op("relu", ties="split"), sj.op("max_pool2d", kernel_size=2, ties="split")
pool_jax = sj.op("max_pool2d", kernel_size=3, stride=2, padding=1, convention="jax")
rng = np.random.default_rng(0)
# small integers: every sum is exact in float64, so any order of the batch's sums gives the same bits
params = {"conv": jnp.asarray(rng.integers(-2, 3, (4, 1, 3, 3)), jnp.float64),
          "dense": jnp.asarray(rng.integers(-2, 3, (4 * 2 * 2, 3)), jnp.float64)}
x = jnp.asarray(rng.integers(-3, 4, (8, 1, 10, 10)), jnp.float64)
y = jnp.asarray(rng.integers(-2, 3, (8, 3)), jnp.float64)

def loss(params, x, y):
    h = jax.lax.conv_general_dilated(x, params["conv"], (1, 1), "VALID")  # (8, 4, 8, 8)
    h = pool_jax(pool(relu(h)))  # (8, 4, 2, 2)
    return (((h.reshape(h.shape[0], -1) @ params["dense"]) - y) ** 2).sum()

step = jax.jit(jax.grad(loss, argnums=(0, 1)))
single = step(params, x, y)
mesh = Mesh(np.array(jax.devices()), ("batch",))
batch = NamedSharding(mesh, P("batch"))
xs, ys = jax.device_put(x, batch), jax.device_put(y, batch)
params_r = jax.device_put(params, NamedSharding(mesh, P()))
text = step.lower(params_r, xs, ys).as_text()
assert "callback" not in text
sharded = step(params_r, xs, ys)
assert sharded[1].sharding.spec == P("batch") or len(sharded[1].sharding.device_set) == 2, sharded[1].sharding
for a, b in zip(jax.tree_util.tree_leaves(single), jax.tree_util.tree_leaves(sharded)):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and np.array_equal(a.view(np.uint64), b.view(np.uint64)), (a, b)
assert np.abs(np.asarray(single[0]["conv"])).sum() > 0
print("OK")
'''


def test_a_training_step_sharded_over_two_devices_gives_the_single_device_gradients():
    """A small CNN of symgrad.jax ops (conv, relu, max pooling under ties='split' and the jax
    preset, dense) on 2 host devices: the batch sharded with a NamedSharding, the parameters
    replicated; jit(grad)'s gradients (parameters and input) equal the single-device ones bit for
    bit (small integers: every sum exact), with no callback in the compiled step."""
    import os
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", _SHARDED_STEP], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stdout + r.stderr


# the torch preset's jvp of amax/amin in at::sum's order: inexact tangents along rows long enough for
# its vector lanes and cascades (a strided column; contiguous rows, adjacent and non-adjacent dims
# and every dim under -m slow)
AT_SUM_DTYPES = ("float16", "bfloat16", "float32", "float64")
AT_SUM_CASES = [pytest.param(*c, marks=[pytest.mark.slow] if slow else [], id=f"{c[0]}-{c[1]}-{len(c[3])}")
                for c, slow in [
    (("amin", {"dim": 0}, (70, 9), ("float32",)), False), (("amin", {"dim": 0}, (70, 9), AT_SUM_DTYPES), True),
    (("amax", {"dim": -1}, (3, 100), AT_SUM_DTYPES), True), (("amax", {"dim": (1, 2)}, (2, 9, 40), AT_SUM_DTYPES), True),
    (("amax", {}, (6, 50), AT_SUM_DTYPES), True),
    (("amin", {"dim": (0, 2), "keepdim": True}, (5, 3, 7), AT_SUM_DTYPES), True)]]


@pytest.mark.parametrize("name,kw,shape,dtypes", AT_SUM_CASES)
def test_torch_preset_reduction_jvp_adds_in_at_sum_order(name, kw, shape, dtypes):
    """The jax module's jvp under the torch preset, under jit, equals the NumPy module's (which
    reproduces PyTorch's CPU at::sum order, checked against PyTorch in the NumPy backend's tests
    and test_torch_backend) bit for bit in float16/32/64 and bfloat16, tie-heavy inputs, inexact
    tangents (+inf and -0 among them)."""
    import ml_dtypes
    np_mod = symgrad.load(name, convention="torch", **kw)
    mod = symgrad.load(name, backend="jax", convention="torch", **kw)
    forward, jvp = jax.jit(mod.forward), jax.jit(mod.jvp)
    rng = np.random.default_rng(8)
    with jax.enable_x64(True):
        for dtype in [ml_dtypes.bfloat16 if d == "bfloat16" else np.dtype(d) for d in dtypes]:
            x = rng.choice([0.0, -0.0, 1.0, 2.0, 2.0, np.inf, -np.inf], shape).astype(dtype)
            t = (rng.standard_normal(shape) * 3).astype(dtype)
            t.ravel()[:2] = [np.inf, -0.0]
            with np.errstate(all="ignore"):
                want = np_mod.jvp(t, np_mod.forward(x)[1])
            differ = _same(jvp(t, forward(x)[1]), want)
            assert differ is None, (name, kw, np.dtype(dtype).name, differ)
