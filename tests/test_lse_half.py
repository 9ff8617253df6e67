"""logsumexp under convention="torch" in float16 and bfloat16 (issue 28): bit for bit with PyTorch
2.13's CPU torch.logsumexp, forward and backward (NaN equals any NaN), in the NumPy module and the
cpu backend's loader alike.  PyTorch rounds each of its ops to the dtype (x - m, exp, the float32
sum, log, + m; backward's x - y, exp, the product); its exp and log, checked here on every float16
and bfloat16 value, are the correctly rounded float32 result rounded to the dtype.  float32 and
float64 keep the documented exception (their exp and log are Intel MKL VML's: docs/guarantees.md,
tools/framework_exp_log.py)."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
HALVES = [(np.dtype(np.float16), torch.float16), (np.dtype(ml_dtypes.bfloat16), torch.bfloat16)]
SPECIAL = [0.0, -0.0, 1.0, -1.5, np.inf, -np.inf, np.nan, 60000.0]
SHAPES = [((1,), 0), ((2,), 0), ((17,), 0), ((33,), -1), ((129,), 0), ((1000,), 0), ((3, 40), 1),
          ((40, 5), 0), ((4, 9, 6), 1), ((2, 3, 40), (0, 2)), ((50, 33), (0, 1)), ((0,), 0), ((3, 0), 1)]


def _bits_equal(got: np.ndarray, want, dtype) -> bool:
    """Bit for bit (signs of zero included), any NaN equal to any NaN, and the same shape."""
    want = want.detach().contiguous().view(torch.int16).numpy().view(np.uint16)
    got = np.array(got, copy=True, order="C")  # (0-d stays 0-d)
    if got.dtype != dtype or got.shape != want.shape:
        return False
    got_nan, want_nan = np.isnan(got.astype(np.float32)), np.isnan(want.view(dtype).astype(np.float32))
    return np.array_equal(got_nan, want_nan) and np.array_equal(got.view(np.uint16)[~got_nan], want[~want_nan])


def _tensor(x: np.ndarray, tdtype):
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(tdtype)


def _inputs(shape: tuple, dtype, rng) -> list:
    """Smooth values, tie-heavy integers, and special values (+-0, +-inf, NaN, a large one)."""
    return [(rng.standard_normal(shape) * 4).astype(np.float32).astype(dtype),
            rng.integers(-3, 3, shape).astype(dtype),
            rng.choice(SPECIAL, shape).astype(np.float32).astype(dtype)]


def _check(backend: str, shapes: list, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for (dtype, tdtype) in HALVES:
        for shape, dim in shapes:
            module = symgrad.load("logsumexp", backend=backend, convention="torch", dim=dim)
            for x in _inputs(shape, dtype, rng):
                t = _tensor(x, tdtype).requires_grad_()
                want = torch.logsumexp(t, dim)
                g = np.asarray(rng.standard_normal(tuple(want.shape))).astype(np.float32).astype(dtype)
                (want_grad,) = torch.autograd.grad(want, t, _tensor(g, tdtype).reshape(want.shape))
                y, saved = module.forward(x)
                (grad,) = module.backward(g, saved)
                assert _bits_equal(y, want, dtype), (dtype, shape, dim, x, y, want)
                assert _bits_equal(grad, want_grad, dtype), (dtype, shape, dim, x, grad, want_grad)


@pytest.mark.parametrize("dtype,tdtype", HALVES, ids=["float16", "bfloat16"])
def test_exp_and_log_of_every_value(dtype, tdtype):
    """The module's exp and log (_torch_math) equal torch.exp and torch.log on all 65536 values."""
    module = symgrad.load("logsumexp", convention="torch", dim=0)
    bits = np.arange(1 << 16, dtype=np.uint16)
    for name, fn in (("exp", np.exp), ("log", np.log)):
        want = getattr(torch, name)(_tensor(bits, tdtype))
        assert _bits_equal(module._torch_math(fn, bits.view(dtype)), want, dtype), name


def test_numpy_module_equals_torch():
    _check("numpy", SHAPES, 0)


@pytest.mark.slow
def test_cpu_backend_equals_torch():
    """The cpu loader places the same host code (compiling its library takes seconds)."""
    _check("cpu", SHAPES, 1)


@pytest.mark.slow
def test_numpy_module_equals_torch_many_lengths():
    """Lengths around PyTorch's sum's vectors and cascade blocks, rows and columns."""
    lengths = [3, 4, 5, 7, 8, 9, 15, 16, 31, 32, 63, 64, 65, 255, 256, 257, 4095, 4096, 4097]
    _check("numpy", [((n,), 0) for n in lengths] + [((2, n), 1) for n in lengths[:12]]
           + [((n, 17), 0) for n in lengths[:12]], 2)


def test_only_the_torch_preset_rounds_each_op():
    """Without a convention and under jax a float16 logsumexp stays computed in float32 and
    rounded once (no _torch_math in the module)."""
    x = np.array([0.0, -np.inf], np.float16)
    for convention in (None, "jax"):
        module = symgrad.load("logsumexp", convention=convention, dim=0)
        assert not hasattr(module, "_torch_math")
        assert module.forward(x)[0] == np.float16(0.0)
