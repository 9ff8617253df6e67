"""max_unpool1d/2d/3d and logsumexp: against PyTorch 2.13 (CPU), independent oracles written here,
finite differences, the t -> 0+ limit, the CUDA kernels on the CPU harness, and bad input.

Oracles:
* unpooling: a Python loop over the indices (write in row-major order, the first or last write
  stays; the gradient of a slot to the writer that stayed, or to each writer under 'all'), and
  F.max_unpool*d with indices from F.max_pool*d(return_indices=True);
* logsumexp: torch.logsumexp (t = 1) and t * torch.logsumexp(x / t), central finite differences,
  and as t -> 0+ the split policy's W computed here ([x_i = max] / #ties).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import symgrad
from symgrad.ops import resolve

torch = pytest.importorskip("torch")
F = torch.nn.functional

ROOT = Path(__file__).resolve().parent.parent
SEEDS = range(int(os.environ.get("SYMGRAD_UNPOOL_EXAMPLES", "3")))
UNPOOL_POLICIES = ("first", "last", "all")

# (d, params, input shape before pooling): batched and unbatched, overlapping windows (duplicate
# indices), output_size
POOLED = [
    (1, {"kernel_size": 2}, (2, 3, 8)),
    (1, {"kernel_size": 3, "stride": 2, "padding": 1}, (3, 9)),
    (2, {"kernel_size": 2}, (2, 2, 6, 6)),
    (2, {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 7, 7)),
    (2, {"kernel_size": (2, 3), "stride": (1, 2)}, (1, 2, 5, 7)),
    (3, {"kernel_size": 2}, (1, 2, 4, 4, 4)),
    (3, {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 5, 5, 5)),
]


def _pool(d, params, x):
    kw = {k: v for k, v in params.items() if k in ("kernel_size", "stride", "padding")}
    return getattr(F, f"max_pool{d}d")(torch.tensor(x), return_indices=True, **kw)


def _torch_unpool(d, params, p, idx, g, output_size=None):
    kw = {k: v for k, v in params.items() if k in ("kernel_size", "stride", "padding")}
    pt = torch.tensor(p, requires_grad=True)
    y = getattr(F, f"max_unpool{d}d")(pt, torch.tensor(idx), output_size=output_size, **kw)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), pt.grad.numpy()


def oracle_unpool(x, idx, out_spatial, ties, g=None):
    """The forward (and backward for g) as loops: planes are the leading dims."""
    d = len(out_spatial)
    lead = x.shape[:-d]
    size = int(np.prod(out_spatial))
    xs = x.reshape(-1, int(np.prod(x.shape[-d:])))
    ids = idx.reshape(xs.shape)
    y = np.zeros((xs.shape[0], size), dtype=x.dtype)
    stays = np.zeros(xs.shape, dtype=bool)
    for p in range(xs.shape[0]):
        owner = {}
        for i in range(xs.shape[1]):
            j = int(ids[p, i])
            if ties != "first" or j not in owner:
                owner[j] = i
        for j, i in owner.items():
            y[p, j] = xs[p, i]
            stays[p, i] = True
    y = y.reshape(lead + tuple(out_spatial))
    if g is None:
        return y
    gp = g.reshape(xs.shape[0], size)
    gx = np.zeros(xs.shape, dtype=x.dtype)
    for p in range(xs.shape[0]):
        for i in range(xs.shape[1]):
            if ties == "all" or stays[p, i]:
                gx[p, i] = gp[p, int(ids[p, i])]
    return y, gx.reshape(x.shape)


# ----------------------------------------------------------------------------- unpool vs PyTorch

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("d,params,shape", POOLED, ids=[f"{d}d-{p}-{s}" for d, p, s in POOLED])
def test_unpool_matches_torch_and_the_oracle(d, params, shape, dtype):
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        for x in (rng.integers(0, 3, size=shape).astype(dtype),  # tie-heavy
                  rng.standard_normal(shape).astype(dtype)):
            p, idx = _pool(d, params, x)
            p, idx = p.numpy(), idx.numpy()
            out_shape = symgrad.load(f"max_unpool{d}d", **params).forward(p, idx)[0].shape
            g = rng.standard_normal(out_shape).astype(dtype)
            y_t, gx_t = _torch_unpool(d, params, p, idx, g)
            planes = idx.reshape(-1, int(np.prod(idx.shape[-d:]))).tolist()
            unique = all(len(set(r)) == len(r) for r in planes)
            for ties in UNPOOL_POLICIES:
                m = symgrad.load(f"max_unpool{d}d", ties=ties, **params)
                y, saved = m.forward(p, idx)
                grad_input, grad_indices = m.backward(g, saved)
                assert grad_indices is None
                assert y.dtype == dtype and grad_input.dtype == dtype
                # duplicates come from one element picked twice: every policy writes its value
                assert np.array_equal(y, y_t), (ties, seed)
                want_y, want_g = oracle_unpool(p, idx, y.shape[-d:], ties, g)
                assert np.array_equal(y, want_y) and np.array_equal(grad_input, want_g), (ties, seed)
                if ties == "all" or unique:
                    assert np.array_equal(grad_input, gx_t), (ties, seed)  # PyTorch's gather


def test_duplicates_occur_and_the_policies_differ_there():
    """The overlapping case really has duplicate indices, and first/last/all differ on them."""
    x = np.array([[0.0, 2.0, 1.0, 0.0, 5.0]])
    p, idx = _pool(1, {"kernel_size": 3, "stride": 2, "padding": 1}, x)
    assert idx.tolist() == [[1, 1, 4]]
    g = np.arange(1.0, 6.0)[None]
    grads = {t: symgrad.load("max_unpool1d", ties=t, kernel_size=3, stride=2, padding=1).backward(
        g, symgrad.load("max_unpool1d", ties=t, kernel_size=3, stride=2, padding=1).forward(
            p.numpy(), idx.numpy())[1])[0].tolist() for t in UNPOOL_POLICIES}
    assert grads == {"first": [[2.0, 0.0, 5.0]], "last": [[0.0, 2.0, 5.0]], "all": [[2.0, 2.0, 5.0]]}


def test_random_indices_with_duplicates_and_distinct_values():
    """Indices that no pooling made: duplicates carry different values. first/last keep their
    writer (the oracle); 'all' keeps the last write, as PyTorch's CPU kernel, and gathers."""
    rng = np.random.default_rng(7)
    for seed in SEEDS:
        x = rng.standard_normal((2, 3, 4, 4))
        idx = rng.integers(0, 64, size=x.shape)  # into an 8x8 plane: many duplicates
        g = rng.standard_normal((2, 3, 8, 8))
        for ties in UNPOOL_POLICIES:
            m = symgrad.load("max_unpool2d", ties=ties, kernel_size=2)
            y, saved = m.forward(x, idx)
            gx, _ = m.backward(g, saved)
            want_y, want_g = oracle_unpool(x, idx, (8, 8), ties, g)
            assert np.array_equal(y, want_y) and np.array_equal(gx, want_g), (ties, seed)
        y_t, gx_t = _torch_unpool(2, {"kernel_size": 2}, x, idx, g)
        y_all, saved = symgrad.load("max_unpool2d", ties="all", kernel_size=2).forward(x, idx)
        assert np.array_equal(y_all, y_t)
        assert np.array_equal(symgrad.load("max_unpool2d", ties="all", kernel_size=2).backward(g, saved)[0], gx_t)


@pytest.mark.parametrize("ties", UNPOOL_POLICIES)
def test_backward_is_the_adjoint_exactly(ties):
    """<W x, g> = <x, W^T g> on small integers (exact in float64): with unique indices for every
    policy, where forward is W x; with duplicates W x is the forward for first/last, and for
    'all' W x is the scatter-add (np.add.at), whose adjoint the gather is."""
    rng = np.random.default_rng(3)
    m = symgrad.load("max_unpool1d", ties=ties, kernel_size=2)
    for unique in (True, False):
        for _ in range(20):
            x = rng.integers(-9, 10, size=(3, 2, 5)).astype(np.float64)
            if unique:
                idx = np.stack([np.stack([rng.permutation(10)[:5] for _ in range(2)]) for _ in range(3)])
            else:
                idx = rng.integers(0, 10, size=x.shape)
            g = rng.integers(-9, 10, size=(3, 2, 10)).astype(np.float64)
            y, saved = m.forward(x, idx)
            gx, _ = m.backward(g, saved)
            if ties == "all" and not unique:
                wx = np.zeros_like(y)
                for p in np.ndindex(3, 2):
                    np.add.at(wx[p], idx[p], x[p])
            else:
                wx = y
            assert np.sum(wx * g) == np.sum(x * gx)


def test_output_size_as_pytorch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 5))
    p, idx = _pool(2, {"kernel_size": 2}, x)  # 2x2 out of 5x5: default unpool size 4x4
    m = symgrad.load("max_unpool2d", kernel_size=2, output_size=(5, 5))
    y, saved = m.forward(p.numpy(), idx.numpy())
    g = rng.standard_normal(y.shape)
    y_t, gx_t = _torch_unpool(2, {"kernel_size": 2}, p.numpy(), idx.numpy(), g, output_size=[5, 5])
    assert y.shape == (1, 2, 5, 5) and np.array_equal(y, y_t)
    assert np.array_equal(m.backward(g, saved)[0], gx_t)
    # the whole output shape, (N, C) in front, as PyTorch also takes it
    m4 = symgrad.load("max_unpool2d", kernel_size=2, output_size=(1, 2, 5, 5))
    y4_t, _ = _torch_unpool(2, {"kernel_size": 2}, p.numpy(), idx.numpy(), g, output_size=[1, 2, 5, 5])
    assert np.array_equal(m4.forward(p.numpy(), idx.numpy())[0], y4_t)
    with pytest.raises(ValueError, match="output_size"):
        symgrad.load("max_unpool2d", kernel_size=2, output_size=(2, 5, 5))  # PyTorch: 2 or 4 entries
    with pytest.raises(ValueError, match="output_size"):
        symgrad.load("max_unpool2d", kernel_size=2, output_size=(6, 6)).forward(p.numpy(), idx.numpy())
    with pytest.raises(ValueError, match="between 2 and 6"):
        getattr(F, "max_unpool2d")(p, idx, 2, output_size=[6, 6])  # PyTorch refuses it too


def test_unpool_bad_input():
    m = symgrad.load("max_unpool2d", kernel_size=2)
    x = np.ones((1, 2, 2))
    ok = np.zeros((1, 2, 2), dtype=np.int64)
    m.forward(x, ok)
    with pytest.raises(ValueError, match=r"indices must be in \[0, 16\).*got 16"):
        m.forward(x, ok + 16)
    with pytest.raises(ValueError, match=r"indices must be in \[0, 16\).*got -1"):
        m.forward(x, ok - 1)
    with pytest.raises(TypeError, match="indices must be an integer array"):
        m.forward(x, ok.astype(np.float64))
    with pytest.raises(ValueError, match=r"indices must have the input's shape \(1, 2, 2\)"):
        m.forward(x, ok[..., :1])
    with pytest.raises(ValueError, match="3 \\(unbatched\\) or 4 \\(batched\\) dims"):
        m.forward(np.ones((2, 2)), ok[0])
    with pytest.raises(TypeError, match="input must be an array of float16"):
        m.forward(x.astype(np.int64), ok)
    with pytest.raises(ValueError, match="ties must be 'first' or 'last' or 'all'"):
        symgrad.load("max_unpool2d", kernel_size=2, ties="split")
    with pytest.raises(ValueError, match="nan must be 'dominate'"):
        symgrad.load("max_unpool2d", kernel_size=2, nan="keep")
    with pytest.raises(TypeError, match="missing required parameter 'kernel_size'"):
        symgrad.load("max_unpool1d")
    y, saved = m.forward(x, ok)
    with pytest.raises(ValueError, match="grad_output must have the forward output's shape"):
        m.backward(np.ones((1, 3, 3)), saved)


def test_cli_refuses_a_bad_policy_with_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "symgrad", "generate", "max_unpool2d", "--kernel-size", "2",
                        "--ties", "split", "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "ties must be" in r.stderr
    assert not (tmp_path / "o").exists()
    r = subprocess.run([sys.executable, "-m", "symgrad", "generate", "logsumexp", "--temperature", "0",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "temperature must be a real number > 0" in r.stderr
    for t in (-1.0, 5e-324, 1e300):
        with pytest.raises(ValueError, match="temperature must be a real number > 0"):
            symgrad.load("logsumexp", temperature=t)
    with pytest.raises(TypeError, match="temperature must be a real number"):
        symgrad.load("logsumexp", temperature="0.1")


# ----------------------------------------------------------------------------- logsumexp

LSE_CASES = [((3, 7), -1, False), ((2, 3, 4), (0, 2), True), ((4, 5), None, False), ((6,), 0, True)]


def _torch_lse(x, g, dim, keepdim, t):
    xt = torch.tensor(x, requires_grad=True)
    dims = tuple(range(x.ndim)) if dim is None else dim
    y = torch.logsumexp(xt, dims, keepdim) if t == 1 else t * torch.logsumexp(xt / t, dims, keepdim)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), xt.grad.numpy()


@pytest.mark.parametrize("t", [1.0, 0.1, 2.5])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_logsumexp_matches_torch(t, dtype):
    rtol = {np.float64: 1e-12, np.float32: 2e-5}[dtype] / min(t, 1)
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        for shape, dim, keepdim in LSE_CASES:
            m = symgrad.load("logsumexp", dim=dim, keepdim=keepdim, temperature=t)
            for x in (rng.standard_normal(shape) * 3, rng.integers(0, 3, size=shape).astype(np.float64)):
                x = x.astype(dtype)
                y, saved = m.forward(x)
                g = rng.standard_normal(y.shape).astype(dtype)
                (gx,) = m.backward(g, saved)
                y_t, gx_t = _torch_lse(x, g, dim, keepdim, t)
                assert y.shape == y_t.shape and y.dtype == dtype and gx.dtype == dtype
                np.testing.assert_allclose(y, y_t, rtol=rtol, atol=rtol)
                np.testing.assert_allclose(gx, gx_t, rtol=rtol, atol=rtol)


def test_logsumexp_special_values_as_torch():
    """All -inf, +inf, NaN and mixes: the same outputs and the same NaN/0 pattern of gradients
    as torch.logsumexp."""
    inf, nan = np.inf, np.nan
    x = np.array([[-inf, -inf, -inf], [1.0, inf, 0.0], [nan, 1.0, 2.0], [inf, -inf, inf],
                  [-inf, 3.0, -inf], [1e308, 1e308, -1e308]])
    m = symgrad.load("logsumexp", dim=-1)
    y, saved = m.forward(x)
    (gx,) = m.backward(np.ones(6), saved)
    y_t, gx_t = _torch_lse(x, np.ones(6), -1, False, 1.0)
    np.testing.assert_array_equal(y, y_t)  # NaN equals NaN here
    np.testing.assert_allclose(gx, gx_t, rtol=1e-15, atol=0)


def test_logsumexp_finite_differences():
    rng = np.random.default_rng(11)
    h = 1e-6
    for t in (1.0, 0.3):
        m = symgrad.load("logsumexp", dim=1, temperature=t)
        x = rng.standard_normal((2, 5, 3))
        y, saved = m.forward(x)
        g = rng.standard_normal(y.shape)
        (gx,) = m.backward(g, saved)
        fd = np.zeros_like(x)
        for i in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[i] = h
            fd[i] = np.sum(g * (m.forward(x + e)[0] - m.forward(x - e)[0])) / (2 * h)
        np.testing.assert_allclose(gx, fd, rtol=1e-6, atol=1e-8)


def _split_w(x):
    """The split policy's W along the last axis, computed here: [x_i = max] / #ties."""
    hit = x == x.max(axis=-1, keepdims=True)
    return hit / hit.sum(axis=-1, keepdims=True)


def test_small_temperature_tends_to_the_split_policy():
    """At small t the gradient is the split W to within exp(-gap/t) (gap 1: below 1e-40 at t =
    0.01), on tie-heavy integer windows; at larger t it is visibly not."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 4, size=(200, 6)).astype(np.float64)
    want = _split_w(x)
    assert (want.max(axis=-1) < 1).any()  # some windows really tie
    for t, close in ((0.01, True), (0.001, True), (1.0, False)):
        m = symgrad.load("logsumexp", dim=-1, temperature=t)
        y, saved = m.forward(x)
        (gx,) = m.backward(np.ones(200), saved)
        assert np.allclose(gx, want, rtol=0, atol=1e-12) == close, t
        np.testing.assert_allclose(y, x.max(axis=-1), atol=t * np.log(6) + 1e-12)
    # and symgrad's amax split backward, the policy this limit names, agrees on these windows
    amax = symgrad.load("amax", ties="split", dim=-1)
    ya, sa = amax.forward(x)
    (ga,) = amax.backward(np.ones(200), sa)
    m = symgrad.load("logsumexp", dim=-1, temperature=0.001)
    (gl,) = m.backward(np.ones(200), m.forward(x)[1])
    np.testing.assert_allclose(gl, ga, rtol=0, atol=1e-12)


def test_the_derivation_shows_the_limit():
    d = symgrad.derive("logsumexp")
    step = next(s for s in d.steps if s.title == "limit t -> 0+")
    lims = [float(e) for label, e in step.items if label.startswith("lim dy")]
    np.testing.assert_array_equal(lims, _split_w(np.array([1.0, 1.0, 0.0])))
    assert any("split" in c for c in d.checks)


def test_unpool_derivation_is_w_transpose():
    """The derivation's backward items equal W^T g for W built here from the indices."""
    import sympy as sp
    for ties in UNPOOL_POLICIES:
        d = symgrad.derive("max_unpool1d", kernel_size=2, ties=ties)
        back = dict(next(s for s in d.steps if s.title == "backward").items)
        i0, i1 = sp.symbols("i0 i1", integer=True, nonnegative=True)
        g = sp.symbols("g0:3", real=True)
        for a in range(3):
            for b in range(3):
                got = [sp.simplify(back[f"grad_x{k}"].xreplace({i0: a, i1: b})) for k in range(2)]
                want = [g[a] if (ties != "last" or a != b) else 0,
                        g[b] if (ties != "first" or a != b) else 0]
                assert got == want, (ties, a, b)


# ----------------------------------------------------------------------------- CUDA on the CPU

@pytest.fixture(scope="module")
def fake_cupy(tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cuda_harness import fake_cupy as make, find_cxx
    if find_cxx() is None:
        pytest.skip("no C++ compiler: the CUDA kernels run on the CPU through one")
    cache = Path(os.environ.get("SYMGRAD_HARNESS_CACHE") or tmp_path_factory.mktemp("unpool-host"))
    cp = make(cache)
    old = sys.modules.get("cupy")
    sys.modules["cupy"] = cp
    yield cp
    if old is None:
        sys.modules.pop("cupy", None)
    else:
        sys.modules["cupy"] = old


def _same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        a.view(np.uint8 if a.itemsize == 1 else f"u{a.itemsize}"),
        b.view(np.uint8 if b.itemsize == 1 else f"u{b.itemsize}"))


CUDA_UNPOOL = [("max_unpool2d", {"kernel_size": 2}, "first", (2, 3, 3, 3), 36),
               ("max_unpool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, "all", (3, 5), 9),
               ("max_unpool3d", {"kernel_size": 2}, "last", (1, 2, 2, 2, 2), 64)]


@pytest.mark.parametrize("op,params,ties,shape,size", CUDA_UNPOOL, ids=[c[0] + "-" + c[2] for c in CUDA_UNPOOL])
def test_cuda_unpool_equals_numpy_bit_for_bit(fake_cupy, op, params, ties, shape, size):
    rng = np.random.default_rng(2)
    mn = symgrad.load(op, ties=ties, **params)
    mc = symgrad.load(op, backend="cuda", ties=ties, **params)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324, 1.0, 2.0])
    for dtype in (np.float64, np.float32, np.float16):
        x = rng.choice(specials, size=shape).astype(dtype)
        idx = rng.integers(0, size, size=shape)  # duplicates with different values
        y1, s1 = mn.forward(x, idx)
        y2, s2 = mc.forward(x, idx)
        assert _same_bits(y1, y2), (dtype, ties)
        g = rng.choice(specials, size=y1.shape).astype(dtype)
        g1, n1 = mn.backward(g, s1)
        g2, n2 = mc.backward(g, s2)
        assert n1 is None and n2 is None and _same_bits(g1, g2), (dtype, ties)
        t = rng.choice(specials, size=shape).astype(dtype)
        assert _same_bits(mn.jvp(t, None, s1), mc.jvp(t, None, s2)), (dtype, ties)
    with pytest.raises(ValueError, match="indices must be in"):
        mc.forward(x, idx + size)
    with pytest.raises(TypeError, match="indices must be an integer array"):
        mc.forward(x, idx.astype(np.float32))


@pytest.mark.parametrize("t", [1.0, 0.1])
def test_cuda_logsumexp_equals_numpy_to_a_few_ulps(fake_cupy, t):
    """exp and log of the host/device libraries and NumPy's differ in the last bits, and NumPy
    sums pairwise: equal to 64 ulps of the dtype divided by t (the gradient's exponent carries
    the output's rounding times 1/t); NaN where NumPy has NaN."""
    rng = np.random.default_rng(4)
    mn = symgrad.load("logsumexp", dim=(0, 2), temperature=t)
    mc = symgrad.load("logsumexp", backend="cuda", dim=(0, 2), temperature=t)
    for dtype in (np.float64, np.float32, np.float16):
        x = rng.standard_normal((3, 4, 50)).astype(dtype)
        x[0, 1, :] = -np.inf
        x[1, 2, 3] = np.nan
        x[2, 3, 7] = np.inf
        tol = 64 * np.finfo(dtype).eps / t
        y1, s1 = mn.forward(x)
        y2, s2 = mc.forward(x)
        np.testing.assert_allclose(y2, y1, rtol=tol, atol=tol)
        g = rng.standard_normal(y1.shape).astype(dtype)
        (g1,) = mn.backward(g, s1)
        (g2,) = mc.backward(g, s2)
        np.testing.assert_allclose(g2.astype(np.float64), g1.astype(np.float64), rtol=tol, atol=tol)
        tangent = rng.standard_normal(x.shape).astype(dtype)
        np.testing.assert_allclose(mc.jvp(tangent, s2).astype(np.float64), mn.jvp(tangent, s1).astype(np.float64),
                                   rtol=tol, atol=tol * np.abs(tangent).sum(axis=(0, 2)).max())
