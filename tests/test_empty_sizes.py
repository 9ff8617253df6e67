"""Zero sizes that PyTorch accepts: logsumexp over a zero-size dim (-inf, as torch.logsumexp) and
adaptive max pooling to an output size 0 (an empty output, as F.adaptive_max_pool*d), in the NumPy
module and in the CUDA module run on the CPU (tests/cuda_harness).

Oracles: PyTorch 2.13 CPU forward (and backward where PyTorch has one: its adaptive pooling
backward refuses an empty grad_output; symgrad returns the zero gradient of the input's shape);
the jvp of an empty slice is the empty sum, 0 (the transpose of a backward whose gradient has no
element)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import cuda_harness as harness
import symgrad

torch = pytest.importorskip("torch")
F = torch.nn.functional

LSE = [((3, 0, 2), 1, False), ((3, 0), (0, 1), False), ((4, 0), 1, True), ((0, 4), 1, False),
       ((2, 0, 3), (1, 2), True)]
ADAPTIVE = [(1, (2, 3, 5), 0), (2, (2, 3, 5, 4), (0, 3)), (2, (3, 5, 4), (2, 0)),
            (3, (1, 2, 4, 3, 5), (0, 0, 0))]


def _torch_lse(x, dim, keepdim, g):
    t = torch.tensor(x, requires_grad=True)
    y = torch.logsumexp(t, dim, keepdim=keepdim)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), t.grad.numpy()


def _run(m, x, g, t):
    y, saved = m.forward(x)
    (grad,) = m.backward(g, saved)
    return y, grad, m.jvp(t, saved)


def _lse_case(shape, dim, keepdim):
    x = np.zeros(shape, np.float32)
    out = torch.logsumexp(torch.tensor(x), dim, keepdim=keepdim).shape
    return x, np.ones(tuple(out), np.float32)


@pytest.mark.parametrize("shape,dim,keepdim", LSE)
def test_logsumexp_over_an_empty_dim_is_minus_inf_as_torch(shape, dim, keepdim):
    x, g = _lse_case(shape, dim, keepdim)
    want_y, want_grad = _torch_lse(x, dim, keepdim, g)
    y, grad, jvp = _run(symgrad.load("logsumexp", dim=dim, keepdim=keepdim), x, g, x)
    np.testing.assert_array_equal(y, want_y)
    assert grad.shape == want_grad.shape == shape and grad.dtype == np.float32
    np.testing.assert_array_equal(jvp, np.zeros_like(y))  # the empty sum (PyTorch's jvp: NaN)


def test_amax_over_an_empty_dim_is_still_refused_as_torch():
    with pytest.raises(ValueError, match="non-zero size along the reduced dims"):
        symgrad.load("amax", dim=1).forward(np.zeros((3, 0), np.float32))


@pytest.mark.parametrize("d,shape,out", ADAPTIVE)
@pytest.mark.parametrize("ties", ["first", "split"])
def test_adaptive_output_size_0_is_empty_as_torch(d, shape, out, ties):
    rng = np.random.default_rng(d)
    x = rng.standard_normal(shape).astype(np.float32)
    m = symgrad.load(f"adaptive_max_pool{d}d", output_size=out, ties=ties)
    want = getattr(F, f"adaptive_max_pool{d}d")(torch.tensor(x), out)
    g = np.ones(tuple(want.shape), np.float32)
    y, grad, jvp = _run(m, x, g, x)
    assert y.shape == tuple(want.shape) and y.size == 0 and y.dtype == np.float32
    np.testing.assert_array_equal(grad, np.zeros_like(x))  # PyTorch's backward refuses
    assert jvp.shape == y.shape
    if ties == "first":
        (y2, indices), _ = symgrad.load(f"adaptive_max_pool{d}d", output_size=out,
                                        return_indices=True).forward(x)
        _, want_i = getattr(F, f"adaptive_max_pool{d}d")(torch.tensor(x), out, return_indices=True)
        assert indices.shape == tuple(want_i.shape) and indices.dtype == np.int64


@pytest.fixture
def fake_cupy(tmp_path_factory, monkeypatch):
    if harness.find_cxx() is None:
        pytest.skip("no host C++ compiler for the CUDA harness")
    fake = harness.fake_cupy(tmp_path_factory.mktemp("cuda-host-empty"))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    return fake


def test_cuda_modules_on_the_cpu_equal_numpy_at_zero_sizes(fake_cupy):
    for shape, dim, keepdim in LSE[:3]:
        x, g = _lse_case(shape, dim, keepdim)
        want = _run(symgrad.load("logsumexp", dim=dim, keepdim=keepdim), x, g, x)
        got = _run(symgrad.load("logsumexp", backend="cuda", dim=dim, keepdim=keepdim), x, g, x)
        for a, b in zip(got, want):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
    for d, shape, out in ADAPTIVE[:2]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        m = symgrad.load(f"adaptive_max_pool{d}d", output_size=out)
        y, saved = m.forward(x)
        g = np.ones(y.shape, np.float32)
        want = _run(m, x, g, x)
        got = _run(symgrad.load(f"adaptive_max_pool{d}d", backend="cuda", output_size=out), x, g, x)
        for a, b in zip(got, want):
            assert a.shape == b.shape
            np.testing.assert_array_equal(a, b)
