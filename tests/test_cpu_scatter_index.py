"""The cpu max-pool scatter backward (overlapping windows under a scan policy) checks each saved
window-local index as it reads it and reports one outside the window (-1), so the loader leaves the
range to it (BACKWARD_CHECKS_INDEX, no pass over saved.index per call): a forged index, in a window
the kernel checks for padding and in one it does not, is reported by the kernel itself and refused
with the loader's ValueError naming it, float32/float16/bfloat16, NCHW and channels-last."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import symgrad

if not any(shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))):
    pytest.skip("no C compiler: the cpu backend needs one", allow_module_level=True)

PARAMS = {"kernel_size": 3, "stride": 2, "padding": 1}
SHAPE = (2, 3, 7, 6)  # outputs 4 x 3: window (0, 0) reaches padding, (1, 1) is inside the input
FORGED = [((0, 0, 0, 0), 9), ((1, 2, 1, 1), 9), ((1, 2, 3, 2), 255)]


def _dtype(name):
    return np.dtype(pytest.importorskip("ml_dtypes").bfloat16) if name == "bfloat16" else np.dtype(name)


@pytest.mark.parametrize("name", ("float32", pytest.param("float16", marks=pytest.mark.slow)))
def test_the_scatter_kernel_reports_an_index_outside_the_window(name):
    m = symgrad.load("max_pool2d", backend="cpu", convention="torch", **PARAMS)
    assert m.BACKWARD_CHECKS_INDEX
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(name)
    y, saved = m.forward(x, threads=1)
    g = np.ones(y.shape, name)
    sizes = (*SHAPE, *y.shape[2:])
    for where, value in FORGED:
        index = saved.index.copy()
        index[where] = value
        grad = np.full(SHAPE, 7, name)
        assert m._call("backward", np.dtype(name), "nchw", (g, index, grad), sizes, 1) == -1
        assert np.isin(grad, (0, 1, 2, 3, 4)).all()  # every element written, none from the forged window
    assert m._call("backward", np.dtype(name), "nchw", (g, saved.index, np.empty(SHAPE, name)), sizes, 1) == 0


@pytest.mark.parametrize("name,channels_last", [
    ("float16", False), ("bfloat16", True),
    *(pytest.param(n, cl, marks=pytest.mark.slow) for n, cl in (("float32", False), ("float32", True),
                                                                 ("float16", True), ("bfloat16", False)))])
def test_a_forged_index_is_refused_naming_it(name, channels_last):
    m = symgrad.load("max_pool2d", backend="cpu", convention="torch", **PARAMS)
    dtype = _dtype(name)
    x = np.random.default_rng(1).standard_normal(SHAPE).astype(dtype)
    if channels_last:
        x = np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 1, -1)), -1, 1)
    y, saved = m.forward(x)
    g = np.ones(y.shape, dtype)
    want = m.backward(g, saved)[0]
    for where, value in FORGED:
        index = saved.index.copy(order="K")  # in saved's layout
        index[where] = value
        with pytest.raises(ValueError, match=rf"saved.index must hold values in \[0, 9\), got {value}"):
            m.backward(g, saved._replace(index=index))
        assert m.backward(g, saved)[0].tobytes() == want.tobytes()  # the index forward saved is taken
