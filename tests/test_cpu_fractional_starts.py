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


@pytest.mark.parametrize("outs", [(0, 5), (4, 0), (0, 0)])
def test_the_starts_kernel_writes_nothing_outside_its_arrays_for_no_output(outs):
    """An axis of no output (the loader refuses one; a direct call of the kernel need not): the
    starts kernel wrote starts[o - 1], one int64 before each plane's row of that axis.  Each
    starts array here is a view into a canary buffer; nothing outside the view may change."""
    m = symgrad.load("fractional_max_pool2d", backend="cpu", ties="split", kernel_size=3, output_size=(4, 5))
    ref = symgrad.load("fractional_max_pool2d", ties="split", kernel_size=3, output_size=(4, 5))
    planes, lengths, canary = 8, (9, 11), -7
    u = _samples(np.float32, planes, np.random.default_rng(1))
    buffers = [np.full(planes * o + 8, canary, dtype=np.int64) for o in outs]
    # views 4 int64 into their buffers (an empty slice or reshape would point at the buffer's start)
    starts = [np.ndarray((planes, o), np.int64, buffer=b, offset=32) for b, o in zip(buffers, outs)]
    assert all(s.ctypes.data == b.ctypes.data + 32 for b, s in zip(buffers, starts))
    assert m._call("starts", u.dtype, None, (u, *starts), (planes, *lengths, *outs), 1) == 0
    # the axes with outputs: the NumPy module's windows (each axis's own, whatever the other's size)
    want = ref._windows((1, planes, *lengths), (1, planes, *(o or 1 for o in outs)), u)
    for b, s, w, o in zip(buffers, starts, want, outs):
        assert np.all(b[:4] == canary) and np.all(b[4 + planes * o:] == canary), b
        assert o == 0 or np.array_equal(s, w)


def test_the_loader_refuses_an_output_size_of_zero():
    """The loader's own check (the NumPy module's _output_size) stops an input whose output_ratio
    gives no output before any kernel runs."""
    m = symgrad.load("fractional_max_pool2d", backend="cpu", kernel_size=1, output_ratio=0.5)
    x = np.ones((1, 2, 1, 6), np.float32)
    with pytest.raises(ValueError, match="cannot give 0 outputs"):
        m.forward(x, np.full((1, 2, 2), 0.5, np.float32))
