"""fractional_max_pool2d/3d: PyTorch's windows and gradients (torch preset, bit for bit), every tie
policy against the W-form evaluated by hand, JAX's jnp.max over the same windows (jax preset),
the jvp as backward's transpose, the framework ops, and the errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import symgrad
from symgrad.policy import POLICIES

torch = pytest.importorskip("torch")
F = torch.nn.functional

FLOATS = (np.float16, np.float32, np.float64)


def _torch_pool(d: int):
    return F.fractional_max_pool2d if d == 2 else F.fractional_max_pool3d


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, the sign of zero included; any NaN equals any NaN."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.all(
        ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))))


def _case(rng, d: int, ratio: bool):
    """(kernel_size, output_size or output_ratio as PyTorch takes it, spatial size)."""
    k = tuple(int(v) for v in rng.integers(1, 4, size=d))
    spatial = tuple(int(v) for v in rng.integers(5, 12, size=d))
    if ratio:
        r = tuple(float(v) for v in rng.uniform(0.3, 0.6, size=d))
        out = tuple(int(n * q) for n, q in zip(spatial, r))
        spatial = tuple(max(n, o + kk) for n, o, kk in zip(spatial, out, k))  # PyTorch's 3-d check is strict
        return k, {"output_ratio": r}, spatial
    # 3-d: PyTorch requires out + k - 1 < in (2-d: <=)
    out = tuple(int(rng.integers(1, n - kk + (2 if d == 2 else 1))) for n, kk in zip(spatial, k))
    return k, {"output_size": out}, spatial


def _tie_heavy(rng, shape, dtype):
    x = rng.integers(0, 3, size=shape).astype(np.float64)
    special = rng.random(shape)
    x[special < 0.06] = np.nan
    x[(special >= 0.06) & (special < 0.09)] = -np.inf
    x[(special >= 0.09) & (special < 0.11)] = np.inf
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda t: t.__name__)
@pytest.mark.parametrize("d", [2, 3])
def test_torch_preset_equals_pytorch_bit_for_bit(d, dtype):
    """Windows (PyTorch's sequence, computed in the input's dtype), the scan (first tie, last NaN)
    and the backward's accumulation of overlapping windows in output order, on tie-heavy inputs
    with NaN and +-inf, batched and unbatched, output_size and output_ratio."""
    rng = np.random.default_rng(d * 10 + FLOATS.index(dtype))
    for trial in range(12):
        k, size, spatial = _case(rng, d, ratio=trial % 3 == 2)
        batched = trial % 4 != 3
        shape = ((2, 3) if batched else (3,)) + spatial
        m = symgrad.load(f"fractional_max_pool{d}d", kernel_size=k, convention="torch", **size)
        x = _tie_heavy(rng, shape, dtype)
        samples = rng.random(((2, 3) if batched else (1, 3)) + (d,)).astype(dtype)
        y, saved = m.forward(x, samples)
        xt = torch.tensor(x, requires_grad=True)
        yt = _torch_pool(d)(xt, k, _random_samples=torch.tensor(samples), **size)
        assert _same(y, yt.detach().numpy()), (trial, k, size, spatial)
        g = rng.integers(-3, 4, size=y.shape).astype(dtype)
        yt.backward(torch.tensor(g))
        grad_x, grad_samples = m.backward(g, saved)
        assert grad_samples is None
        assert _same(grad_x, xt.grad.numpy()), (trial, k, size, spatial)


def _windows(u: np.ndarray, length: int, out: int, k: int) -> list[int]:
    """PyTorch's generate_intervals for one plane's sample u (a NumPy scalar of the input dtype),
    written out element by element: the independent statement of the windows."""
    real = type(u)
    if out == 1:
        return [length - k]
    alpha = real(length - k) / real(out - 1)
    return [int((real(i) + u) * alpha) - int(u * alpha) for i in range(out - 1)] + [length - k]


def _oracle(x: np.ndarray, samples: np.ndarray, k: tuple, out: tuple, ties: str, g: np.ndarray):
    """(output, grad_x) from the W-form by hand, NaN rule 'dominate' (a NaN beats every number, NaNs
    tie): per window, its elements in row-major order; the extremum; the tied winners; their
    weights by the policy; the gradients added in output order."""
    d = len(k)
    order = (1, 0) if d == 2 else (0, 1, 2)  # the sample of each spatial axis (PyTorch's order)
    n, c = x.shape[:2]
    y = np.empty((n, c) + out, dtype=x.dtype)
    grad = np.zeros(x.shape, dtype=np.float64)
    for b in range(n):
        for ch in range(c):
            starts = [_windows(samples[b, ch, order[a]], x.shape[2 + a], out[a], k[a]) for a in range(d)]
            for o in np.ndindex(*out):
                elems = [tuple(starts[a][o[a]] + t[a] for a in range(d)) for t in np.ndindex(*k)]
                vals = np.array([x[(b, ch) + e] for e in elems], dtype=np.float64)
                nan = np.isnan(vals)
                tied = np.flatnonzero(nan) if nan.any() else np.flatnonzero(vals == vals.max())
                y[(b, ch) + o] = vals[tied[0]]
                share = {"first": {tied[0]: 1.0}, "last": {tied[-1]: 1.0},
                         "split": {t: 1.0 / len(tied) for t in tied},
                         "all": {t: 1.0 for t in tied}}[ties]
                for t, w in share.items():
                    grad[(b, ch) + elems[t]] += w * g[(b, ch) + o]
    return y, grad


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("d", [2, 3])
def test_every_policy_equals_the_w_form_by_hand(d, ties):
    rng = np.random.default_rng(len(ties) + d)
    for trial in range(4):
        k, size, spatial = _case(rng, d, ratio=False)
        out = size["output_size"]
        m = symgrad.load(f"fractional_max_pool{d}d", kernel_size=k, output_size=out, ties=ties)
        x = rng.integers(0, 3, size=(2, 2) + spatial).astype(np.float64)
        x[rng.random(x.shape) < 0.05] = np.nan
        samples = rng.random((2, 2, d))
        g = rng.integers(1, 5, size=(2, 2) + out).astype(np.float64)
        y, saved = m.forward(x, samples)
        want_y, want_grad = _oracle(x, samples, k, out, ties, g)
        assert _same(y, want_y)
        np.testing.assert_allclose(m.backward(g, saved)[0], want_grad, rtol=1e-12, atol=0)


def test_jax_preset_equals_jnp_max_over_the_same_windows():
    """JAX has no fractional pooling: its preset is jnp.max over each window (split, NaN for a
    window holding NaN), here differentiated by JAX itself."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    rng = np.random.default_rng(5)
    k, out, spatial = (2, 3), (4, 3), (9, 8)
    x = rng.integers(0, 3, size=(2, 2) + spatial).astype(np.float32)
    x[0, 1, 2, 3] = np.nan
    samples = rng.random((2, 2, 2)).astype(np.float32)
    m = symgrad.load("fractional_max_pool2d", kernel_size=k, output_size=out, convention="jax")
    y, saved = m.forward(x, samples)
    g = rng.integers(1, 4, size=y.shape).astype(np.float32)
    (grad_x, _) = m.backward(g, saved)
    gather = np.zeros((2, 2) + out + (k[0] * k[1],), dtype=np.int64)  # flat positions in a plane
    for b in range(2):
        for ch in range(2):
            rows = _windows(samples[b, ch, 1], spatial[0], out[0], k[0])
            cols = _windows(samples[b, ch, 0], spatial[1], out[1], k[1])
            for i, j in np.ndindex(*out):
                gather[b, ch, i, j] = [(rows[i] + a) * spatial[1] + cols[j] + e for a, e in np.ndindex(*k)]

    def pool(v):
        flat = v.reshape(2, 2, -1)
        windows = jnp.take_along_axis(flat, jnp.asarray(gather.reshape(2, 2, -1)), axis=2)
        return jnp.max(windows.reshape(gather.shape), axis=-1)

    want_y, vjp = jax.vjp(pool, jnp.asarray(x))
    assert _same(y, np.asarray(want_y))
    assert _same(grad_x, np.asarray(vjp(jnp.asarray(g))[0]))


@pytest.mark.parametrize("ties", ["first", "split"])
def test_jvp_is_the_transpose_of_backward(ties):
    m = symgrad.load("fractional_max_pool3d", kernel_size=(2, 1, 3), output_size=(3, 4, 2), ties=ties)
    rng = np.random.default_rng(1)
    x = rng.integers(0, 3, size=(2, 3, 6, 7, 6)).astype(np.float64)
    y, saved = m.forward(x, rng.random((2, 3, 3)))
    t = rng.integers(-4, 5, size=x.shape).astype(np.float64)
    g = rng.integers(-4, 5, size=y.shape).astype(np.float64)
    assert np.isclose(np.sum(m.jvp(t, None, saved) * g), np.sum(t * m.backward(g, saved)[0]), rtol=1e-12)
    with pytest.raises(ValueError, match="tangent_random_samples must be None"):
        m.jvp(t, np.zeros((2, 3, 3)), saved)


def test_framework_ops_reach_pytorchs_gradient():
    jax = pytest.importorskip("jax")
    import symgrad.jax
    import symgrad.torch
    rng = np.random.default_rng(2)
    x = rng.integers(0, 3, size=(2, 3, 10, 9)).astype(np.float64)
    s = rng.random((2, 3, 2))
    xt = torch.tensor(x, requires_grad=True)
    F.fractional_max_pool2d(xt, 3, output_ratio=(0.5, 0.5), _random_samples=torch.tensor(s)).sum().backward()
    op = symgrad.torch.op("fractional_max_pool2d", kernel_size=3, output_ratio=0.5, convention="torch")
    mine = torch.tensor(x, requires_grad=True)
    op(mine, torch.tensor(s)).sum().backward()
    assert torch.equal(mine.grad, xt.grad)
    fn = symgrad.jax.op("fractional_max_pool2d", kernel_size=3, output_ratio=0.5, convention="torch")
    jax.config.update("jax_enable_x64", True)  # as the other JAX tests: float64 stays float64
    grad = jax.grad(lambda v: fn(v, jax.numpy.asarray(s)).sum())(jax.numpy.asarray(x))
    assert _same(np.asarray(grad), xt.grad.numpy())


@pytest.mark.parametrize("params,error,match", [
    ({"kernel_size": 2}, ValueError, "exactly one of output_size and output_ratio"),
    ({"kernel_size": 2, "output_size": 3, "output_ratio": 0.5}, ValueError, "exactly one"),
    ({"kernel_size": 2, "output_ratio": 1.0}, ValueError, r"output_ratio must be a number in \(0, 1\)"),
    ({"kernel_size": 2, "output_ratio": (0.5, 0.5, 0.5)}, ValueError, "output_ratio"),
    ({"kernel_size": 2, "output_ratio": "half"}, TypeError, "output_ratio"),
    ({"kernel_size": 0, "output_size": 3}, ValueError, "kernel_size"),
])
def test_parameters_are_checked(params, error, match):
    with pytest.raises(error, match=match):
        symgrad.load("fractional_max_pool2d", **params)


def test_inputs_are_checked():
    m = symgrad.load("fractional_max_pool2d", kernel_size=3, output_size=(4, 4))
    x = np.zeros((2, 3, 6, 6))
    with pytest.raises(ValueError, match=r"random_samples must have shape \(2, 3, 2\)"):
        m.forward(x, np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"random_samples must lie in \[0, 1\)"):
        m.forward(x, np.ones((2, 3, 2)))
    with pytest.raises(TypeError, match="random_samples must be an array of float"):
        m.forward(x, np.zeros((2, 3, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="cannot give 4 outputs of windows of 3"):
        m.forward(np.zeros((2, 3, 5, 6)), np.zeros((2, 3, 2)))
    with pytest.raises(ValueError, match=r"random_samples must have shape \(1, 3, 2\)"):
        m.forward(np.zeros((3, 6, 6)), np.zeros((3, 2)))  # unbatched: N = 1, as PyTorch


def test_cli_derives_and_generates(tmp_path):
    run = [sys.executable, "-m", "symgrad"]
    r = subprocess.run(run + ["derive", "fractional_max_pool2d", "--kernel-size", "2",
                              "--output-ratio", "0.5"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "int((i + u) * alpha) - int(u * alpha)" in r.stdout
    r = subprocess.run(run + ["generate", "fractional_max_pool3d", "--kernel-size", "2",
                              "--output-size", "2", "--convention", "torch", "--backend", "all",
                              "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    # numpy, cpu (.c and its loader), cuda (.cu and its loader), torch and jax
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".c", ".cu", ".py", ".py", ".py", ".py", ".py"]
    assert {p.name.rsplit("_", 1)[-1] for p in tmp_path.glob("*.py")} >= {"torch.py", "jax.py"}
