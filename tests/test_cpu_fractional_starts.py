"""The cpu backend's fractional pooling computes each plane's window starts in C (its starts
kernel): they equal the NumPy module's _windows (floating point in the compute type, float16
samples widened to float32 as the NumPy module runs them) for samples across [0, 1), its ends
included, for the geometries of several input and output sizes."""

import numpy as np
import pytest

import symgrad

# (input sizes, output sizes) along the two spatial axes, windows of 3 (the module's kernel_size):
# windows that overlap (48 -> 20), a step above 2 (100 -> 18), one output (alpha never divides),
# an output per position (9 -> 7: alpha 1), a window as large as the input (3 -> 1)
GEOMETRIES = [((48, 48), (20, 20)), ((100, 37), (98, 18)), ((5, 9), (1, 7)), ((3, 3), (1, 1))]


def _samples(dtype, planes: int, rng) -> np.ndarray:
    """(1, planes, 2) samples in [0, 1): random ones after each corner of the range."""
    one_below = np.nextafter(dtype(1), dtype(0))
    edges = np.array([0, one_below, 0.5, np.finfo(dtype).tiny, np.nextafter(dtype(0), dtype(1)), 0.25, 0.75],
                     dtype=dtype)
    u = np.minimum(rng.random((1, planes, 2)).astype(dtype), one_below)
    u[0, :len(edges), 0], u[0, :len(edges), 1] = edges, edges[::-1]
    return u


@pytest.mark.parametrize("dtype", (np.float16, np.float32, np.float64))
def test_the_starts_kernel_equals_the_numpy_modules_windows(dtype):
    m = symgrad.load("fractional_max_pool2d", backend="cpu", ties="split", kernel_size=3, output_size=(4, 5))
    ref = symgrad.load("fractional_max_pool2d", ties="split", kernel_size=3, output_size=(4, 5))
    rng = np.random.default_rng(5)
    for lengths, outs in GEOMETRIES:
        u = _samples(dtype, 2000, rng)
        got = m._window_starts((u.shape[1], *lengths, *outs), u, 1)
        want = ref._windows((1, u.shape[1], *lengths), (1, u.shape[1], *outs),
                            u.astype(np.float32) if dtype == np.float16 else u)
        for axis, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == np.int64 and np.array_equal(g, w), (lengths, outs, axis, np.argwhere(g != w)[:5])
