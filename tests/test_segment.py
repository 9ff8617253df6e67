"""Segment and scatter max/min (issue 33): every policy against a brute-force loop written here
from the README's definition (output j is the extremum of the elements whose index is j, W's row
j the policy's weights over that segment), the torch preset against Tensor.scatter_reduce and
the jax preset against jax.ops.segment_max/min bit for bit (tie-heavy, NaN, +-inf, +-0),
symgrad.check, the CLI."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import symgrad

VALUES = [0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan]
DTYPES = [np.float16, np.float32, np.float64]


def _tie_heavy(rng, shape, dtype, nan=True):
    pool = VALUES if nan else VALUES[:-1]
    return np.array(rng.choice(pool, size=shape), dtype=dtype)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def _same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, want.dtype, got.shape, want.shape)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), (got, want)
    assert np.array_equal(_bits(got)[~nan], _bits(want)[~nan]), (got, want)


# ----------------------------------------------------------------------------- the definition

def _row(vals, ties, ext):
    """W's row over one segment (dominate: a NaN beats every number, NaNs tie)."""
    key = [((1, 0.0) if np.isnan(v) else (0, v if ext == "max" else -v)) for v in vals]
    best = max(key)
    hits = [k == best for k in key]
    n = sum(hits)
    if ties == "first":
        i = hits.index(True)
        return [float(j == i) for j in range(len(vals))]
    if ties == "last":
        i = len(hits) - 1 - hits[::-1].index(True)
        return [float(j == i) for j in range(len(vals))]
    return [(1.0 / n if ties == "split" else 1.0) if h else 0.0 for h in hits]


def _brute_scatter(inp, index, src, ties, ext, include_self, g):
    """1-d scatter along dim 0: output and (grad_input, grad_src) from the definition."""
    out = inp.astype(np.float64).copy()
    gi, gs = np.zeros(inp.shape), np.zeros(src.shape)
    for j in range(inp.size):
        members = [("i", j)] if include_self else []
        members += [("s", e) for e in range(src.size) if index[e] == j]
        if not members:
            members = [("i", j)]
        vals = [inp[e] if w == "i" else src[e] for w, e in members]
        row = _row(vals, ties, ext)
        nan = [np.isnan(v) for v in vals]
        out[j] = np.nan if any(nan) else (max if ext == "max" else min)(vals)
        for (w, e), r in zip(members, row):
            (gi if w == "i" else gs)[e] += r * g[j]
    return out, gi, gs


@pytest.mark.parametrize("ties", ["first", "last", "split", "all"])
@pytest.mark.parametrize("ext", ["max", "min"])
@pytest.mark.parametrize("include_self", [True, False])
def test_every_policy_is_the_definition(ties, ext, include_self):
    rng = np.random.default_rng(5)
    mod = symgrad.load(f"scatter_{ext}", ties=ties, include_self=include_self)
    for _ in range(20):
        inp = _tie_heavy(rng, 5, np.float64)
        src = _tie_heavy(rng, 9, np.float64)
        index = rng.integers(0, 5, 9)
        g = rng.choice([1.0, -2.0, 0.5], 5)
        y, saved = mod.forward(inp, index, src)
        want, gi, gs = _brute_scatter(inp, index, src, ties, ext, include_self, g)
        np.testing.assert_array_equal(y, want)
        grad_input, none, grad_src = mod.backward(g, saved)
        assert none is None
        np.testing.assert_array_equal(grad_input, gi)
        np.testing.assert_array_equal(grad_src, gs)
        # jvp is backward's transpose
        t_i, t_s = rng.normal(size=5), rng.normal(size=9)
        lhs = np.sum(mod.jvp(t_i, None, t_s, saved) * g)
        assert np.isclose(lhs, np.sum(t_i * grad_input) + np.sum(t_s * grad_src))


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_nan_rule_each_gives_every_element_of_a_nan_segment_the_whole_gradient(backend):
    """NaN rule 'each' (README): a window holding NaN gives every element the whole gradient;
    other segments follow the policy (split). The NumPy module's backward raised NameError."""
    rng = np.random.default_rng(11)
    mod = symgrad.load("scatter_max", backend=backend, ties="split", nan="each")
    for _ in range(10):
        inp, src = _tie_heavy(rng, 4, np.float64), _tie_heavy(rng, 9, np.float64)
        index, g = rng.integers(0, 4, 9), rng.choice([1.0, -2.0, 0.5], 4)
        y, saved = mod.forward(inp, index, src)
        want, gi, gs = _brute_scatter(inp, index, src, "split", "max", True, g)
        for j in range(4):  # the NaN segments: every member gets g[j]
            members = [e for e in range(9) if index[e] == j]
            if np.isnan(inp[j]) or np.isnan(src[members]).any():
                gi[j], gs[members] = g[j], g[j]
        np.testing.assert_array_equal(y, want)
        grad_input, _, grad_src = mod.backward(g, saved)
        np.testing.assert_array_equal(grad_input, gi)
        np.testing.assert_array_equal(grad_src, gs)


@pytest.mark.parametrize("ties", ["first", "split"])
def test_segment_max_rows_and_empty_segments(ties):
    """2-d data (rows segmented along dim 0); an empty segment is -inf with no gradient."""
    rng = np.random.default_rng(1)
    mod = symgrad.load("segment_max", ties=ties, num_segments=4)
    data = _tie_heavy(rng, (7, 3), np.float64)
    ids = np.array([0, 2, 0, 2, 2, 0, 3])
    g = rng.choice([1.0, -3.0], (4, 3))
    y, saved = mod.forward(data, ids)
    grad, none = mod.backward(g, saved)
    assert none is None
    for c in range(3):
        want, gi, gs = _brute_scatter(np.full(4, -np.inf), ids, data[:, c], ties, "max", False, g[:, c])
        want[1] = -np.inf  # the empty segment: the identity, and its gradient goes nowhere
        np.testing.assert_array_equal(y[:, c], want)
        np.testing.assert_array_equal(grad[:, c], gs)


def test_scatter_along_dim_1():
    rng = np.random.default_rng(2)
    mod = symgrad.load("scatter_max", ties="last", dim=1)
    inp = _tie_heavy(rng, (2, 3), np.float64)
    src = _tie_heavy(rng, (2, 6), np.float64)
    index = rng.integers(0, 3, (2, 6))
    g = rng.normal(size=(2, 3))
    y, saved = mod.forward(inp, index, src)
    gi, _, gs = mod.backward(g, saved)
    for r in range(2):
        want, wi, ws = _brute_scatter(inp[r], index[r], src[r], "last", "max", True, g[r])
        np.testing.assert_array_equal(y[r], want)
        np.testing.assert_array_equal(gi[r], wi)
        np.testing.assert_array_equal(gs[r], ws)


# ----------------------------------------------------------------------------- PyTorch

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ext", ["max", "min"])
@pytest.mark.parametrize("include_self", [True, False])
def test_torch_preset_is_scatter_reduce_bit_for_bit(dtype, ext, include_self):
    """Forward and autograd gradients of input.scatter_reduce(0, index, src, 'amax'/'amin'),
    PyTorch 2.13 CPU, including the include_self=False tie bug."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    mod = symgrad.load(f"scatter_{ext}", convention="torch", include_self=include_self)
    tdt = {np.float16: torch.float16, np.float32: torch.float32, np.float64: torch.float64}[dtype]
    for _ in range(30):
        inp = _tie_heavy(rng, (6, 2), dtype)
        src = _tie_heavy(rng, (11, 2), dtype)
        index = rng.integers(0, 6, (11, 2))
        g = np.array(rng.choice([1.0, -3.0, 0.0, -0.0, 7.0], (6, 2)), dtype=dtype)
        ti = torch.tensor(inp, dtype=tdt, requires_grad=True)
        ts = torch.tensor(src, dtype=tdt, requires_grad=True)
        ty = ti.scatter_reduce(0, torch.tensor(index), ts, "a" + ext, include_self=include_self)
        ty.backward(torch.tensor(g, dtype=tdt))
        y, saved = mod.forward(inp, index, src)
        gi, _, gs = mod.backward(g, saved)
        _same_bits(y, ty.detach().numpy())
        _same_bits(gi, ti.grad.numpy())
        _same_bits(gs, ts.grad.numpy())


def test_torch_include_self_false_tie_bug():
    """The issue's case: the excluded self (3) equals the result and is still counted: 0.5."""
    torch = pytest.importorskip("torch")
    s, src = torch.tensor([3.0, 5.0], requires_grad=True), torch.tensor([3.0, 1.0], requires_grad=True)
    s.scatter_reduce(0, torch.tensor([0, 0]), src, "amax", include_self=False).sum().backward()
    assert src.grad.tolist() == [0.5, 0.0]
    mod = symgrad.load("scatter_max", convention="torch", include_self=False)
    _, saved = mod.forward(np.array([3.0, 5.0]), np.array([0, 0]), np.array([3.0, 1.0]))
    assert mod.backward(np.ones(2), saved)[2].tolist() == [0.5, 0.0]
    split = symgrad.load("scatter_max", ties="split", include_self=False)
    _, saved = split.forward(np.array([3.0, 5.0]), np.array([0, 0]), np.array([3.0, 1.0]))
    assert split.backward(np.ones(2), saved)[2].tolist() == [1.0, 0.0]  # symgrad's split


# ----------------------------------------------------------------------------- JAX

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ext", ["max", "min"])
def test_jax_preset_is_segment_max_bit_for_bit(dtype, ext):
    """Value and grad of jax.ops.segment_max/min (CPU): 1 / count, the -inf fill counted, a
    segment holding NaN gets no gradient."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    rng = np.random.default_rng(4)
    mod = symgrad.load(f"segment_{ext}", convention="jax", num_segments=5)
    fn = getattr(jax.ops, f"segment_{ext}")
    for _ in range(30):
        data = _tie_heavy(rng, (12, 2), dtype)
        ids = rng.integers(0, 5, 12)
        g = np.array(rng.choice([1.0, -3.0, 0.0, -0.0, 7.0], (5, 2)), dtype=dtype)
        want = np.asarray(fn(jnp.asarray(data), jnp.asarray(ids), 5))
        _, vjp = jax.vjp(lambda d: fn(d, jnp.asarray(ids), 5), jnp.asarray(data))
        (want_grad,) = vjp(jnp.asarray(g))
        y, saved = mod.forward(data, ids)
        _same_bits(y, want)
        _same_bits(mod.backward(g, saved)[0], np.asarray(want_grad))


# ----------------------------------------------------------------------------- check, CLI, errors

@pytest.mark.parametrize("ties", ["first", "last", "split", "all"])
def test_symgrad_check_decides_segments(ties):
    mod = symgrad.load("scatter_max", ties=ties)
    inp = np.array([1.0, 0.5, 2.0])
    src = np.array([1.0, 3.0, 1.0, 2.0, 0.25])
    index = np.array([0, 1, 0, 2, 1])
    report = symgrad.check(mod, inp, index, src)
    assert report and report.tied_windows >= 2, str(report)
    seg = symgrad.load("segment_min", ties=ties, num_segments=2)
    report = symgrad.check(seg, np.array([1.0, 1.0, 0.5, 0.5, 2.0]), np.array([0, 0, 1, 1, 1]))
    assert report and report.tied_windows == 2, str(report)


def test_a_wrong_policy_fails_the_check():
    mod = symgrad.load("scatter_max", ties="last")
    report = symgrad.check(mod, np.array([1.0]), np.array([0, 0]), np.array([1.0, 0.5]), ties="first")
    assert not report


def test_bad_input_is_one_line():
    mod = symgrad.load("scatter_max")
    with pytest.raises(ValueError, match="index must be in"):
        mod.forward(np.zeros(2), np.array([0, 2]), np.zeros(2))
    with pytest.raises(TypeError, match="integers"):
        mod.forward(np.zeros(2), np.array([0.0, 1.0]), np.zeros(2))
    seg = symgrad.load("segment_max", indices_are_sorted=True)
    with pytest.raises(ValueError, match="not sorted"):
        seg.forward(np.zeros(2), np.array([1, 0]))


def test_cli_generate_and_derive(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "symgrad", *a], capture_output=True, text=True)  # noqa: E731
    r = run("generate", "scatter_max", "--backend", "numpy", "--no-include-self", "--dim", "1",
            "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "scatter_max_dim1_self0_first.py").exists()
    r = run("derive", "segment_max", "--ties", "split", "--num-segments", "3")
    assert r.returncode == 0 and "segment" in r.stdout, r.stderr
    r = run("generate", "scatter_max", "--backend", "all", "--out", str(tmp_path / "all"))
    assert r.returncode == 0, r.stderr
    # the backends that build segments: numpy, cpu (its .c source and loader), cuda (its .cu
    # source and CuPy loader), torch and jax
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == [
        "scatter_max_first.c", "scatter_max_first.cu", "scatter_max_first.py", "scatter_max_first_cpu.py",
        "scatter_max_first_cuda.py", "scatter_max_first_jax.py", "scatter_max_first_torch.py"]


# ----------------------------------------------------------------------------- framework ops

def test_symgrad_torch_op_is_scatter_reduce():
    """symgrad.torch.op("scatter_max", convention="torch") through autograd equals PyTorch's own
    scatter_reduce bit for bit; the index gets no gradient."""
    torch = pytest.importorskip("torch")
    import symgrad.torch as st
    rng = np.random.default_rng(6)
    f = st.op("scatter_max", convention="torch", include_self=False, dim=1)
    inp, src = _tie_heavy(rng, (3, 4), np.float32), _tie_heavy(rng, (3, 9), np.float32)
    index = torch.tensor(rng.integers(0, 4, (3, 9)))
    g = torch.tensor(rng.choice([1.0, -2.0, 0.0], (3, 4)), dtype=torch.float32)
    got, want = [], []
    for fn, out in ((lambda a, b: f(a, index, b), got),
                    (lambda a, b: a.scatter_reduce(1, index, b, "amax", include_self=False), want)):
        a, b = torch.tensor(inp, requires_grad=True), torch.tensor(src, requires_grad=True)
        y = fn(a, b)
        y.backward(g)
        out += [y.detach().numpy(), a.grad.numpy(), b.grad.numpy()]
    for x, w in zip(got, want):
        _same_bits(x, w)


def test_symgrad_jax_op_is_segment_max():
    """symgrad.jax.op("segment_max", convention="jax"): value and jit(grad) equal jax.ops.segment_max's."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    import symgrad.jax as sj
    rng = np.random.default_rng(7)
    f = sj.op("segment_max", convention="jax", num_segments=4)
    data = jnp.asarray(_tie_heavy(rng, (10, 3), np.float64))
    ids = jnp.asarray(rng.integers(0, 4, 10))
    w = jnp.asarray(rng.choice([1.0, -2.0], (4, 3)))
    mine = jax.jit(jax.grad(lambda d: jnp.sum(f(d, ids) * w)))(data)
    theirs = jax.grad(lambda d: jnp.sum(jax.ops.segment_max(d, ids, 4) * w))(data)
    _same_bits(np.asarray(f(data, ids)), np.asarray(jax.ops.segment_max(data, ids, 4)))
    _same_bits(np.asarray(mine), np.asarray(theirs))


def test_jax_preset_scatter_max_src_gradient_is_at_max():
    """Under the jax preset scatter_max's output and src gradient are input.at[index].max(src)'s
    (its gradient to input is not JAX's, as the README says)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    rng = np.random.default_rng(8)
    mod = symgrad.load("scatter_max", convention="jax")
    for _ in range(40):
        inp, src = _tie_heavy(rng, 5, np.float64), _tie_heavy(rng, 9, np.float64)
        index = rng.integers(0, 5, 9)
        g = rng.choice([1.0, -2.0, 0.0], 5)
        y, vjp = jax.vjp(lambda a, b: a.at[index].max(b), jnp.asarray(inp), jnp.asarray(src))
        got, saved = mod.forward(inp, index, src)
        _same_bits(got, np.asarray(y))
        _same_bits(mod.backward(g, saved)[2], np.asarray(vjp(jnp.asarray(g))[1]))


@pytest.mark.parametrize("ties", ["torch", "first", "last", "split", "all"])
def test_an_index_expanded_along_the_features_segments_whole_rows(ties):
    """index.unsqueeze(-1).expand(E, F) (graph pooling's form) takes the row path (one key per
    row): compared with PyTorch under the torch preset, with the definition otherwise."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    settings = {"convention": "torch"} if ties == "torch" else {"ties": ties}
    mod = symgrad.load("scatter_max", **settings)
    inp, src = _tie_heavy(rng, (4, 3), np.float64), _tie_heavy(rng, (10, 3), np.float64)
    ids = rng.integers(0, 4, 10)
    index = np.broadcast_to(ids[:, None], (10, 3))
    g = rng.choice([1.0, -2.0, 0.0], (4, 3))
    y, saved = mod.forward(inp, index, src)
    gi, _, gs = mod.backward(g, saved)
    assert saved.key.shape == (10,)  # one key per row
    if ties == "torch":
        ti, ts = torch.tensor(inp, requires_grad=True), torch.tensor(src, requires_grad=True)
        ty = ti.scatter_reduce(0, torch.tensor(index), ts, "amax")
        ty.backward(torch.tensor(g))
        want = (ty.detach().numpy(), ti.grad.numpy(), ts.grad.numpy())
    else:
        cols = [_brute_scatter(inp[:, c], ids, src[:, c], ties, "max", True, g[:, c]) for c in range(3)]
        want = tuple(np.stack([c[k] for c in cols], axis=1) for k in range(3))
    for got, w in zip((y, gi, gs), want):
        _same_bits(got, w)
    if ties != "torch":  # (the torch preset's NaN segments give NaN in both)
        t_i, t_s = rng.normal(size=(4, 3)), rng.normal(size=(10, 3))
        assert np.isclose(np.sum(mod.jvp(t_i, None, t_s, saved) * g), np.sum(t_i * gi) + np.sum(t_s * gs))


def test_torch_preset_bfloat16_is_scatter_reduce():
    """bfloat16 (ml_dtypes) under the torch preset: computed in float32 and rounded once, which is
    how PyTorch's CPU computes g / N in bfloat16: the same bits."""
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    rng = np.random.default_rng(10)
    for include_self in (True, False):
        mod = symgrad.load("scatter_max", convention="torch", include_self=include_self)
        for _ in range(20):
            inp, src = _tie_heavy(rng, (5, 2), np.float32), _tie_heavy(rng, (9, 2), np.float32)
            inp[0, 0], src[:3, 0] = 1.0, 1.0  # a 3- or 4-way tie: g / 3 rounds in bfloat16
            index = rng.integers(0, 5, (9, 2))
            index[:3, 0] = 0
            g = np.array(rng.choice([1.0, -3.0, 0.0, 7.0], (5, 2)), dtype=np.float32)
            ti = torch.tensor(inp, dtype=torch.bfloat16, requires_grad=True)
            ts = torch.tensor(src, dtype=torch.bfloat16, requires_grad=True)
            ty = ti.scatter_reduce(0, torch.tensor(index), ts, "amax", include_self=include_self)
            ty.backward(torch.tensor(g, dtype=torch.bfloat16))
            y, saved = mod.forward(inp.astype(bf16), index, src.astype(bf16))
            gi, _, gs = mod.backward(g.astype(bf16), saved)
            for got, want in ((y, ty), (gi, ti.grad), (gs, ts.grad)):
                assert got.dtype == bf16
                _same_bits(got.astype(np.float32), want.detach().float().numpy())  # exact widening
