"""The cpu logsumexp's forward and backward a block of rows at a time (the kernels' shift and
arguments of exp, then NumPy's exp and sum or product over those rows) and each row's max in SIMD
lanes: forward and backward equal the NumPy module's bytes on rows that span several blocks (the
last one shorter), with a NaN inside the lanes' loop, +-inf, a max of +-0 and ties, float32 and
float64, 1 and 2 threads."""

import numpy as np

import symgrad


def test_blocks_of_rows_equal_the_numpy_module():
    module = symgrad.load("logsumexp", backend="cpu", dim=-1)  # the library test_cpu_kinds builds
    reference = symgrad.load("logsumexp", dim=-1)
    shape = (70, 5000)
    assert 1 < shape[0] * shape[1] // module.forward.__globals__["BLOCK"] < shape[0]  # several blocks of rows
    rng = np.random.default_rng(8)
    for dtype in (np.float32, np.float64):
        x = np.round(rng.standard_normal(shape) * 8).astype(dtype)  # ties
        x[1, 40] = np.nan  # in the lanes' loop
        x[2, 3], x[3, -1], x[4, 100] = np.inf, np.nan, -np.inf
        x[5] = -300.0  # a max of -0 before +0 (exp of the others is 0)
        x[5, 20], x[5, 30] = -0.0, 0.0
        x[6] = -np.inf
        for threads in (1, 2):
            with np.errstate(all="ignore"):
                (y, saved), (y0, saved0) = module.forward(x, threads=threads), reference.forward(x)
                g = rng.standard_normal(y.shape).astype(dtype)
                (gx,), (gx0,) = module.backward(g, saved, threads=threads), reference.backward(g, saved0)
            what = (dtype.__name__, threads)
            assert y.tobytes() == y0.tobytes() and y.shape == y0.shape, what
            assert gx.tobytes() == gx0.tobytes(), what
