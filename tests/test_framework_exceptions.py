"""What the OpInfo audit (tools/opinfo.py) once counted as documented exceptions, each now either
reproduced under its framework's preset or shown to be the framework contradicting itself.

Oracles: PyTorch 2.13 CPU (one thread) on the same values, compared bit for bit."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import symgrad

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)


def _need_compiler(backend):
    if backend == "cpu" and not any(shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))):
        pytest.skip("no C compiler: the cpu backend is not available")


def _torch_bf16(a):
    return torch.from_numpy(np.array(a, order="C").view(np.int16)).view(torch.bfloat16)


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cpu", marks=pytest.mark.slow)])
@pytest.mark.parametrize("op", ["fmax", "fmin"])
def test_torch_preset_bfloat16_fmax_fmin_of_zeros_return_the_second(op, backend):
    """PyTorch's bfloat16 fmax/fmin return the second of +0 and -0 (its other dtypes the first) at
    every position, length and broadcast; the torch preset does too, and its gradients are
    unchanged: bit for bit with PyTorch on tie-heavy values with +-0, +-inf and NaN (failed before:
    the first, as in the other dtypes)."""
    _need_compiler(backend)
    m = symgrad.load(op, backend=backend, convention="torch")
    rng = np.random.default_rng(3)
    levels = np.array([-0.0, 0.0, 1.0, -1.0, np.inf, -np.inf, np.nan])
    for shape_a, shape_b in [((37,), (37,)), ((4, 9), (9,)), ((1,), (5, 1)), ((), ())]:
        a = rng.choice(levels, size=shape_a).astype(BF16)
        b = rng.choice(levels, size=shape_b).astype(BF16)
        ta, tb = _torch_bf16(a).requires_grad_(), _torch_bf16(b).requires_grad_()
        want = getattr(torch, op)(ta, tb)
        g = rng.standard_normal(want.shape).astype(BF16)
        want.backward(_torch_bf16(g))
        y, saved = m.forward(a, b)
        grads = m.backward(g, saved)
        assert y.dtype == BF16 and y.tobytes() == want.detach().view(torch.int16).numpy().tobytes(), (a, b, y)
        for got, t in zip(grads, (ta, tb)):
            assert got.tobytes() == t.grad.view(torch.int16).numpy().tobytes(), (a, b, got)
