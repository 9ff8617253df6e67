"""adaptive_max_pool1d/2d/3d: PyTorch's adaptive windows (they overlap and differ in size).

* convention="torch" against torch.nn.functional.adaptive_max_pool*d (CPU), forward and backward
  bit for bit (the sign of zero included): random and tie-heavy inputs, with NaN and +-inf, window
  layouts where windows overlap and differ in size (L=10, out=4; L=7, out=5; out > L/2; out == L;
  out > L), float32 and float64, batched and unbatched, gradients whose sums round (so the order of
  accumulation is checked too), and torch's own argmax indices;
* every tie policy against an independent oracle: a per-window Python loop over the windows,
  computed here from their definition, with tests/oracle.py's policy and NaN rules;
* convention="jax" against jnp.max over each window, written in JAX;
* the CUDA kernels run on the CPU through tests/cuda_harness, bit-equal to the NumPy module (the
  catalog's entries are also covered by tests/test_cuda.py), and the parameter, shape and CLI errors;
* the NumPy module's two strategies (one pass per window-box element over all windows, or one
  whole-row call per output window; STRATEGY forces one): each against PyTorch on inputs large
  enough that the module picks the per-window one by itself (global pooling, output (2, 3)), and
  each against a per-window loop for every tie policy and NaN rule, and bit for bit against each
  other (output, saved index, gradient).

SYMGRAD_ADAPTIVE_SEEDS (default 2) sets how many random inputs each layout gets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import symgrad
from oracle import policy_weights, window_winners
from symgrad.ops import resolve
from symgrad.policy import NAN_RULES, POLICIES

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch==2.13.0)")
F = torch.nn.functional

ROOT = Path(__file__).resolve().parent.parent
SEEDS = int(os.environ.get("SYMGRAD_ADAPTIVE_SEEDS", "2"))
SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0])

# (spatial input shape without N, C; output_size): windows overlapping and of different sizes
LAYOUTS = [
    ((10,), 4), ((7,), 5), ((9,), 6), ((5,), 5), ((3,), 7), ((1,), 3), ((12,), 1),
    ((10, 7), (4, 5)), ((6, 9), (4, 4)), ((5, 4), (5, 7)), ((7, 3), (None, 2)),
    ((5, 4, 6), (2, 3, 4)), ((3, 7, 2), (2, 5, 3)), ((4, 4, 3), (4, None, 1)),
]


def layout_id(layout):
    shape, out = layout
    return "L" + "x".join(map(str, shape)) + "-out" + "x".join(map(str, np.atleast_1d(out)))


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal values and signs of zero, any NaN equal to any NaN, same shape and dtype."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    same = ((got == want) & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))
    return bool(same.all())


def inputs(rng, shape, kind: str, dtype) -> np.ndarray:
    if kind == "ties":  # small integers: ties in most windows
        x = rng.integers(0, 3, size=shape).astype(np.float64)
    else:
        x = rng.normal(size=shape)
    if kind == "specials":
        x = rng.integers(0, 3, size=shape).astype(np.float64)
        where = rng.random(shape) < 0.25
        x[where] = rng.choice(SPECIALS, size=int(where.sum()))
    with np.errstate(over="ignore"):  # the largest float64 becomes inf in float16/float32, meant so
        return x.astype(dtype)


def torch_adaptive(d, x, out, g):
    t = torch.tensor(x, requires_grad=True)
    y, index = getattr(F, f"adaptive_max_pool{d}d")(t, out, return_indices=True)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), t.grad.numpy(), index.numpy()


# ----------------------------------------------------------------------------- PyTorch

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout_id(v) for v in LAYOUTS])
def test_torch_convention_is_pytorch_bit_for_bit(layout, dtype):
    spatial, out = layout
    d = len(spatial)
    module = symgrad.load(f"adaptive_max_pool{d}d", convention="torch", output_size=out)
    rng = np.random.default_rng(sum(map(ord, layout_id(layout))) + np.dtype(dtype).itemsize)
    for seed in range(SEEDS):
        for kind in ("ties", "normal", "specials"):
            batched = seed % 2 == 0
            shape = ((2, 3) if batched else (3,)) + spatial
            x = inputs(rng, shape, kind, dtype)
            y, saved = module.forward(x)
            # gradients whose sums round, so overlapping windows must add in PyTorch's order
            g = rng.normal(size=y.shape).astype(dtype)
            (gx,) = module.backward(g, saved)
            ty, tgx, tindex = torch_adaptive(d, x, out, g)
            assert same_bits(y, ty), (kind, x, y, ty)
            assert same_bits(gx, tgx), (kind, x, gx, tgx)
            # the saved window-box index names the element torch's argmax names
            index = saved.index.reshape(tindex.shape)  # kept in the batched shape
            assert same_bits(torch_index(index, spatial, out), tindex.astype(np.int64))


def torch_index(box_index: np.ndarray, spatial: tuple, out) -> np.ndarray:
    """PyTorch's flat spatial index of each winner, from symgrad's saved window-box index."""
    d = len(spatial)
    outs = tuple(L if o is None else o for L, o in zip(spatial, np.broadcast_to(np.array(out, dtype=object), (d,))))
    starts, box = [], []
    for L, o in zip(spatial, outs):
        i = np.arange(o)
        starts.append((i * L) // o)
        box.append(int((-((-(i + 1) * L) // o) - (i * L) // o).max()))
    local = np.unravel_index(box_index.astype(np.int64), box)
    coords = []
    for a in range(d):
        shape_a = [1] * d
        shape_a[a] = -1
        coords.append(local[a] + starts[a].reshape(shape_a))
    return np.ravel_multi_index(tuple(coords), spatial).astype(np.int64)


def test_all_minus_inf_windows_keep_their_first_element():
    """PyTorch's scan starts from -inf with the window's first element: an all -inf window routes
    its gradient to that first element (and overlapping windows add up there)."""
    x = np.full((1, 2, 5, 5), -np.inf)
    module = symgrad.load("adaptive_max_pool2d", convention="torch", output_size=3)
    y, saved = module.forward(x)
    g = np.arange(1.0, 1 + y.size).reshape(y.shape)
    ty, tgx, _ = torch_adaptive(2, x, 3, g)
    assert same_bits(y, ty) and same_bits(module.backward(g, saved)[0], tgx)


# ----------------------------------------------------------------------------- every policy

def oracle(x: np.ndarray, out, ties: str, g: np.ndarray):
    """(output, grad_x): a Python loop over every (batch, channel, window), with the window bounds
    of PyTorch's documentation and the tie/NaN rules of tests/oracle.py."""
    spatial = x.shape[2:]
    outs = [L if o is None else o for L, o in zip(spatial, out)]
    bounds = [[((i * L) // o, -(-((i + 1) * L) // o)) for i in range(o)] for L, o in zip(spatial, outs)]
    y = np.zeros(x.shape[:2] + tuple(outs))
    gx = np.zeros(x.shape)
    for b, c in np.ndindex(*x.shape[:2]):
        for opos in np.ndindex(*outs):  # output order: the gradient sums add in this order
            ranges = [range(*bounds[a][p]) for a, p in enumerate(opos)]
            elems = list(np.ndindex(*[len(r) for r in ranges]))
            coords = [tuple(r[k] for r, k in zip(ranges, e)) for e in elems]
            values = [float(x[(b, c) + cc]) for cc in coords]
            winners = window_winners(values, "max")
            y[(b, c) + opos] = values[winners[0]]
            for k, w in policy_weights(winners, ties).items():
                gx[(b, c) + coords[k]] += w * g[(b, c) + opos]
    return y, gx


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("layout", LAYOUTS[::2], ids=[layout_id(v) for v in LAYOUTS[::2]])
def test_every_policy_matches_a_per_window_loop(layout, ties):
    spatial, out = layout
    d = len(spatial)
    out_t = tuple(np.broadcast_to(np.array(out, dtype=object), (d,)))
    module = symgrad.load(f"adaptive_max_pool{d}d", ties=ties, output_size=out)
    rng = np.random.default_rng(len(spatial) * 100 + POLICIES.index(ties))
    for kind in ("ties", "specials"):
        x = inputs(rng, (2, 2) + spatial, kind, np.float64)
        y, saved = module.forward(x)
        g = rng.integers(1, 5, size=y.shape).astype(np.float64)
        (gx,) = module.backward(g, saved)
        wy, wgx = oracle(x, out_t, ties, g)
        np.testing.assert_array_equal(y, wy)  # -0.0 == 0.0: the winner's value (last: the last -0.0/0.0)
        if ties == "split":  # g/k against g*(1/k): equal up to rounding
            np.testing.assert_allclose(gx, wgx, rtol=1e-14, atol=0)
        else:
            assert np.array_equal(gx, wgx), (x, gx, wgx)


def test_unbatched_equals_batched_and_zero_batch_is_empty():
    module = symgrad.load("adaptive_max_pool2d", ties="split", output_size=(3, 2))
    x = np.random.default_rng(3).integers(0, 3, size=(2, 5, 4)).astype(np.float32)
    y, saved = module.forward(x)
    yb, savedb = module.forward(x[None])
    g = np.ones(y.shape, np.float32)
    assert same_bits(y, yb[0]) and same_bits(module.backward(g, saved)[0], module.backward(g[None], savedb)[0][0])
    y0, saved0 = module.forward(np.zeros((0, 2, 5, 4)))
    assert y0.shape == (0, 2, 3, 2) and module.backward(np.zeros(y0.shape), saved0)[0].shape == (0, 2, 5, 4)


def test_saved_index_is_the_smallest_unsigned_type():
    first = symgrad.load("adaptive_max_pool1d", output_size=2)
    assert first.forward(np.zeros((1, 10)))[1].index.dtype == np.uint8  # windows of 5
    assert first.forward(np.zeros((1, 600)))[1].index.dtype == np.uint16  # windows of 300
    assert set(first.Saved._fields) == {"index", "input_shape", "output_shape", "dtype"}


# ----------------------------------------------------------------------------- JAX

def test_jax_convention_is_jnp_max_per_window():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    shape, out = (7, 5), (3, 4)
    bounds = [[((i * L) // o, -(-((i + 1) * L) // o)) for i in range(o)] for L, o in zip(shape, out)]

    def pool(x):
        rows = [jnp.stack([jnp.max(x[..., h0:h1, w0:w1], axis=(-2, -1)) for w0, w1 in bounds[1]], -1)
                for h0, h1 in bounds[0]]
        return jnp.stack(rows, -2)

    module = symgrad.load("adaptive_max_pool2d", convention="jax", output_size=out)
    rng = np.random.default_rng(7)
    for kind in ("ties", "specials"):
        x = inputs(rng, (2, 2) + shape, kind, np.float64)
        y, saved = module.forward(x)
        g = rng.integers(-3, 4, size=y.shape).astype(np.float64)
        (gx,) = module.backward(g, saved)
        jy, pullback = jax.vjp(pool, jnp.asarray(x))
        (jgx,) = pullback(jnp.asarray(g))
        assert same_bits(y, np.asarray(jy))
        np.testing.assert_allclose(gx, np.asarray(jgx), rtol=1e-14, atol=0)  # NaN where JAX has NaN


# ----------------------------------------------------------------------------- CUDA (on the CPU)

CUDA_CASES = [("adaptive_max_pool1d", {"output_size": 7}, [(2, 3, 3)]),  # out > L
              ("adaptive_max_pool2d", {"output_size": (None, 3)}, [(3, 4, 7)]),  # unbatched, None
              ("adaptive_max_pool3d", {"output_size": (3, 2, 3)}, [(1, 2, 5, 3, 7)])]


@pytest.fixture(scope="module")
def fake_cupy_adaptive(tmp_path_factory):
    import cuda_harness as harness
    from symgrad import backends
    from symgrad.pipeline import render
    if harness.find_cxx() is None:
        pytest.skip("no C++ compiler: the CPU execution harness needs one")
    cache = Path(os.environ.get("SYMGRAD_HARNESS_CACHE") or tmp_path_factory.mktemp("cuda-adaptive"))
    sources = [next(s for n, s in render(resolve(op, ties, **params), backends.get("cuda")).items() if n.endswith(".cu"))
               for op, params, _ in CUDA_CASES for ties in ("first", "split")]
    harness.build_many(sources, cache)
    return harness.fake_cupy(cache)


@pytest.mark.parametrize("ties", ["first", "split"])
@pytest.mark.parametrize("op,params,shapes", CUDA_CASES, ids=[c[0][-2:] for c in CUDA_CASES])
def test_cuda_kernels_equal_numpy_bit_for_bit(fake_cupy_adaptive, monkeypatch, op, params, shapes, ties):
    from cuda_harness.check import every_comparison
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy_adaptive)
    problems = every_comparison(fake_cupy_adaptive, op, params, shapes, ties, monkeypatch.setattr)
    assert not problems, "\n".join(problems[:10])


def test_cuda_harness_sees_a_wrong_window(fake_cupy_adaptive, monkeypatch, tmp_path):
    """The comparison can fail: a kernel whose windows end one element early differs."""
    from cuda_harness.check import compare
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy_adaptive)
    params = {"output_size": 7}
    module = symgrad.load("adaptive_max_pool1d", backend="cuda", ties="first", **params)
    src = module.SOURCE.read_text()
    edited = src.replace("return ((i + 1) * length + out - 1) / out;", "return ((i + 1) * length - 1) / out;")
    assert edited != src
    (tmp_path / module.SOURCE.name).write_text(edited)
    monkeypatch.setattr(module, "SOURCE", tmp_path / module.SOURCE.name)
    monkeypatch.setattr(module, "_modules", {})
    x = np.arange(10.0).reshape(1, 1, 10)
    assert compare(fake_cupy_adaptive, "adaptive_max_pool1d", params, "first", [x], np.float64, module=module)


# ----------------------------------------------------------------------------- errors and CLI

@pytest.mark.parametrize("value,error", [
    (-1, ValueError), ((2, -1), ValueError), ((1, 2, 3), ValueError), (2.5, TypeError),
    ("7", TypeError), ((2, 1.0), TypeError), (None, TypeError), (2**31, ValueError)])
def test_bad_output_size_is_refused_naming_it(value, error):
    with pytest.raises(error, match="output_size"):
        resolve("adaptive_max_pool2d", output_size=value)


def test_bad_inputs_are_refused_in_one_line():
    module = symgrad.load("adaptive_max_pool2d", output_size=2)
    with pytest.raises(ValueError, match=r"x must have 3 dims \(C, \*spatial\) or 4 dims"):
        module.forward(np.ones((2, 2)))
    with pytest.raises(ValueError, match="non-zero channel and spatial sizes"):
        module.forward(np.ones((1, 2, 0, 3)))
    with pytest.raises(TypeError, match="float16, float32 or float64"):
        module.forward(np.ones((1, 3, 3), dtype=np.int64))
    y, saved = module.forward(np.ones((1, 3, 3)))
    with pytest.raises(ValueError, match="grad_output must have the forward output's shape"):
        module.backward(np.ones((1, 3, 3)), saved)


def _cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "symgrad", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=cwd or ROOT, timeout=120)


def test_cli_generates_derives_and_refuses(tmp_path):
    r = _cli("generate", "adaptive_max_pool2d", "--output-size", "none", "3", "--backend", "all",
             "--out", tmp_path)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["adaptive_max_pool2d_outnonex3_first.c", "adaptive_max_pool2d_outnonex3_first.cu",
                     "adaptive_max_pool2d_outnonex3_first.py", "adaptive_max_pool2d_outnonex3_first_cpu.py",
                     "adaptive_max_pool2d_outnonex3_first_cuda.py",
                     "adaptive_max_pool2d_outnonex3_first_jax.py", "adaptive_max_pool2d_outnonex3_first_torch.py"]
    header = (tmp_path / names[2]).read_text().splitlines()[1]
    assert "--output-size None 3" in header  # the header's command regenerates it
    r = _cli("derive", "adaptive_max_pool1d", "--output-size", "3", "--ties", "split")
    assert r.returncode == 0 and "representative window of 4 elements" in r.stdout
    for bad in (["--output-size", "-1"], ["--output-size", "x"], []):  # (0: an empty output)
        r = _cli("generate", "adaptive_max_pool1d", *bad, "--out", tmp_path / "bad")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "output" in r.stderr and r.stdout == ""
    assert not (tmp_path / "bad").exists()


# ----------------------------------------------------------------------------- the two strategies

STRATEGIES = ("box", "window")
# inputs large enough that the module's forward picks the per-window strategy itself (backward
# picks by its own estimate: with few planes its single gather pass costs about the same)
LARGE = [((2, 3, 48, 40), 1), ((2, 3, 48, 40), (2, 3)), ((2, 3, 600), 1), ((1, 2, 12, 10, 14), (2, 1, 1))]


def large_id(case):
    shape, out = case
    return "x".join(map(str, shape)) + "-out" + "x".join(map(str, np.atleast_1d(out)))


def picks(module, monkeypatch) -> list:
    """Records, per forward/backward call, whether it went window by window (it calls _windows)."""
    calls = []
    windows = module._windows

    def spy(axes):
        calls.append("window")
        return windows(axes)
    monkeypatch.setattr(module, "_windows", spy)
    return calls


@pytest.mark.parametrize("case", LARGE, ids=[large_id(c) for c in LARGE])
def test_large_windows_pick_the_per_window_strategy_and_are_pytorch_bit_for_bit(case, monkeypatch):
    shape, out = case
    d = len(shape) - 2
    module = symgrad.load(f"adaptive_max_pool{d}d", convention="torch", output_size=out)
    rng = np.random.default_rng(sum(shape))
    for dtype, kind in ((np.float32, "specials"), (np.float64, "ties"), (np.float32, "normal")):
        x = inputs(rng, shape, kind, dtype)
        g = None
        results = {}
        for strategy in (None,) + STRATEGIES:
            monkeypatch.setattr(module, "STRATEGY", strategy)
            calls = picks(module, monkeypatch)
            y, saved = module.forward(x)
            assert calls == ([] if strategy == "box" else ["window"]), calls  # None: picked by itself
            g = rng.normal(size=y.shape).astype(dtype) if g is None else g
            (gx,) = module.backward(g, saved)
            if strategy is not None:
                assert calls == ([] if strategy == "box" else ["window"] * 2), calls
            results[strategy] = y, saved.index, gx
        ty, tgx, tindex = torch_adaptive(d, x, out, g)
        for strategy, (y, index, gx) in results.items():
            assert same_bits(y, ty), (strategy, kind)
            assert same_bits(gx, tgx), (strategy, kind)
            assert same_bits(torch_index(index.reshape(tindex.shape), shape[2:], out), tindex.astype(np.int64))
        # and the per-window loop over the policy's definition
        wy, wgx = oracle(x.astype(np.float64), np.broadcast_to(np.array(out, dtype=object), (d,)), "first", g.astype(np.float64))
        nan_window = np.isnan(wy)  # PyTorch: the last NaN wins (the loop: the first); same value
        np.testing.assert_array_equal(results["window"][0], wy.astype(dtype))
        if not nan_window.any():
            np.testing.assert_array_equal(results["window"][2], wgx.astype(dtype))


def test_small_windows_pick_the_box_strategy(monkeypatch):
    module = symgrad.load("adaptive_max_pool2d", convention="torch", output_size=16)
    calls = picks(module, monkeypatch)
    y, saved = module.forward(np.zeros((2, 8, 32, 32)))
    module.backward(np.ones(y.shape), saved)
    assert calls == []


def scan_reference(values: list, ties: str, nan: str):
    """(output, {index: weight}) of one max window under a tie policy and NaN rule, as the rules
    read in symgrad/policy.py: first/last a running scan (a later element takes over on the
    rule's comparison), split/all the elements equal to the extremum (IEEE, or NaN dominating)."""
    n = len(values)
    isnan = [np.isnan(v) for v in values]
    if nan == "dominate":
        winners = window_winners(values, "max")
        return values[winners[0]], policy_weights(winners, ties)
    folded = np.nan if any(isnan) else max(values)  # the forward output of a window holding NaN
    if ties in ("first", "last"):
        def takes(v, best):
            strict = ties == "first"
            gt = (v > best) if strict else (v >= best)
            if nan == "keep":  # comparisons with NaN are false
                return gt
            if nan == "replace":  # unless the running winner beats it
                return not ((best >= v) if strict else (best > v))
            if nan == "last_nan":
                return gt or np.isnan(v)
            raise ValueError(nan)
        w = 0
        for k in range(1, n):
            if takes(values[k], values[w]):
                w = k
        return (values[w] if nan == "last_nan" else folded), {w: 1.0}
    hits = [k for k in range(n) if values[k] == folded]  # IEEE: a NaN equals nothing
    if any(isnan) and nan == "each":
        return folded, {k: 1.0 for k in range(n)}
    if any(isnan) and nan == "nan":
        return folded, {k: np.nan for k in range(n)}
    return folded, (policy_weights(hits, ties) if hits else {})


def reference(x: np.ndarray, out, ties: str, nan: str, g: np.ndarray):
    """(output, grad_x) by a Python loop over every (batch, channel, window) in output order."""
    spatial = x.shape[2:]
    outs = [L if o is None else o for L, o in zip(spatial, out)]
    bounds = [[((i * L) // o, -(-((i + 1) * L) // o)) for i in range(o)] for L, o in zip(spatial, outs)]
    y = np.zeros(x.shape[:2] + tuple(outs))
    gx = np.zeros(x.shape)
    for b, c in np.ndindex(*x.shape[:2]):
        for opos in np.ndindex(*outs):
            ranges = [range(*bounds[a][p]) for a, p in enumerate(opos)]
            coords = [tuple(r[k] for r, k in zip(ranges, e)) for e in np.ndindex(*[len(r) for r in ranges])]
            value, weights = scan_reference([float(x[(b, c) + cc]) for cc in coords], ties, nan)
            y[(b, c) + opos] = value
            for k, w in weights.items():
                gx[(b, c) + coords[k]] += w * g[(b, c) + opos]
    return y, gx


RULES = [(ties, nan) for nan, rule in NAN_RULES.items() for ties in rule.policies]
SMALL = [((2, 3, 11), 3), ((2, 2, 6, 7), (2, 3)), ((1, 2, 5, 4, 6), (2, 1, 4)), ((2, 2, 3), 5)]


@pytest.mark.parametrize("ties,nan", RULES, ids=[f"{t}-{n}" for t, n in RULES])
def test_strategies_agree_bit_for_bit_and_with_a_loop_for_every_rule(ties, nan, monkeypatch):
    rng = np.random.default_rng(RULES.index((ties, nan)))
    values = np.array([np.nan, -np.inf, -1.0, -0.0, 0.0, 1.0, np.inf])
    for shape, out in SMALL:
        d = len(shape) - 2
        out_t = tuple(np.broadcast_to(np.array(out, dtype=object), (d,)))
        module = symgrad.load(f"adaptive_max_pool{d}d", ties=ties, nan=nan, output_size=out)
        for dtype in (np.float64, np.float32, np.float16):
            x = rng.choice(values, size=shape).astype(dtype)
            g = rng.integers(1, 5, size=x.shape[:2] + tuple(L if o is None else o for L, o in zip(shape[2:], out_t)))
            g = g.astype(dtype)
            got = {}
            for strategy in STRATEGIES:
                monkeypatch.setattr(module, "STRATEGY", strategy)
                y, saved = module.forward(x)
                got[strategy] = y, saved, module.backward(g, saved)[0]
            (y, saved, gx), (y2, saved2, gx2) = got["box"], got["window"]
            assert same_bits(y, y2) and same_bits(gx, gx2), (shape, dtype, x)
            if "index" in saved._fields:
                assert saved.index.dtype == saved2.index.dtype and np.array_equal(saved.index, saved2.index)
            wy, wgx = reference(x.astype(np.float64), out_t, ties, nan, g.astype(np.float64))
            if dtype == np.float16:  # and an empty batch
                y0, saved0 = module.forward(x[:0])
                (gx0,) = module.backward(g[:0], saved0)
                assert y0.shape == (0,) + y.shape[1:] and gx0.shape == (0,) + shape[1:]
            np.testing.assert_array_equal(y2, wy.astype(dtype))  # -0.0 == 0.0
            if ties == "split":  # g/k against g*(1/k)
                np.testing.assert_allclose(gx2, wgx.astype(dtype), rtol=2e-3 if dtype == np.float16 else 1e-6)
            else:
                np.testing.assert_array_equal(gx2, wgx.astype(dtype))
