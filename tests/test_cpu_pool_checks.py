"""The cpu backend's adaptive pooling backward checks each saved winner against its own window in
the kernel (the loader leaves that check to it): a forged index inside the window box but outside
its window is refused with the NumPy module's ValueError, in both layouts, float16 and float32."""

import numpy as np
import pytest

import symgrad


# (op, output_size, input shape, the output whose winner is forged, the box's cell given it): along
# axis 0 the windows of 8 -> 3 are [0, 3), [2, 6), [5, 8), the box 4: the first is a cell short
# (test_cpu_kinds' geometries, their libraries built there)
ADAPTIVE_OUTSIDE = [
    ("adaptive_max_pool1d", 3, (1, 2, 8), (..., 0), 3),
    ("adaptive_max_pool2d", (3, 4), (2, 3, 8, 9), (..., 0, 1), 9),  # box 4 x 3 (9 -> 4: [0, 3) ...), cell (3, 0)
]


@pytest.mark.parametrize("op,size,shape,where,cell", ADAPTIVE_OUTSIDE)
@pytest.mark.parametrize("dtype", (np.float32, np.float16))
@pytest.mark.parametrize("channels_last", (False, True))
def test_an_adaptive_index_outside_its_own_window_is_refused(op, size, shape, where, cell, dtype, channels_last):
    m = symgrad.load(op, backend="cpu", output_size=size, ties="first")
    ref = symgrad.load(op, output_size=size, ties="first")
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    if channels_last:
        x = np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 1, -1)), -1, 1)
    for module in (m, ref):
        y, saved = module.forward(x)
        index = saved.index.copy()
        index[where] = cell
        forged = saved._replace(index=index)
        with pytest.raises(ValueError, match="outside its window"):
            module.backward(np.ones(y.shape, dtype), forged)
        with pytest.raises(ValueError, match="outside its window"):
            module.jvp(np.ones(shape, dtype), forged)
        module.backward(np.ones(y.shape, dtype), saved)  # the index forward saved is taken


# (op, params, input shape, the output plane's size, ties): test_cpu_kinds' unpooling geometries
UNPOOL_OUTSIDE = [("max_unpool2d", {"kernel_size": 2}, (2, 3, 2, 2), 16, "all"),
                  ("max_unpool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 6), 11, "first")]


@pytest.mark.parametrize("op,params,shape,size,ties", UNPOOL_OUTSIDE)
@pytest.mark.parametrize("bad", (-1, "size", 2**40))
def test_unpool_indices_outside_a_plane_are_refused_by_the_kernels_as_numpy_refuses_them(op, params, shape, size, ties, bad):
    """The cpu loader leaves the indices' range to its kernels (forward's, backward's and jvp's
    check each index as they read it, reading slot 0 instead): an index outside, in a later plane,
    gives the NumPy module's ValueError, word for word, and nothing is written outside the output."""
    bad = size if bad == "size" else bad
    m = symgrad.load(op, backend="cpu", ties=ties, **params)
    ref = symgrad.load(op, ties=ties, **params)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    idx = np.random.default_rng(1).integers(0, size, size=shape)
    forged = idx.copy()
    forged.reshape(-1)[-2] = bad  # in the last plane
    errors = []
    for module in (m, ref):
        with pytest.raises(ValueError) as info:
            module.forward(x, forged)
        errors.append(str(info.value))
        y, saved = module.forward(x, idx)
        s = saved._replace(indices=forged.reshape(saved.indices.shape))
        for call in (lambda: module.backward(np.ones(y.shape, np.float32), s),
                     lambda: module.jvp(np.ones(x.shape, np.float32), None, s)):
            with pytest.raises(ValueError) as info:
                call()
            errors.append(str(info.value))
    assert errors[:3] == errors[3:], errors
    assert f"got {bad}" in errors[0] and f"got {bad}" in errors[1]



def _box(spatial: tuple, out) -> int:
    """The window box's cells: per axis the largest PyTorch adaptive window, [floor(i L / o),
    ceil((i + 1) L / o))."""
    out = (out,) * len(spatial) if isinstance(out, int) else out
    cells = 1
    for length, o in zip(spatial, out):
        cells *= max(-(-(i + 1) * length // o) - i * length // o for i in range(o))
    return cells


@pytest.mark.parametrize("op,size,shape,where,cell", ADAPTIVE_OUTSIDE)
def test_an_adaptive_index_beyond_the_box_is_refused_by_the_kernel(op, size, shape, where, cell):
    """backward leaves the index's range to the kernel too (no pass over saved.index in the loader):
    a winner at the box's size, or the index type's largest value, is refused with the NumPy
    module's ValueError."""
    m = symgrad.load(op, backend="cpu", output_size=size, ties="first")
    ref = symgrad.load(op, output_size=size, ties="first")
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    box = _box(shape[2:], size)
    for module in (m, ref):
        y, saved = module.forward(x)
        for value in (box, np.iinfo(saved.index.dtype).max):
            index = saved.index.copy()
            index[where] = value
            with pytest.raises(ValueError, match=f"saved.index must hold indices into the window box below {box}"):
                module.backward(np.ones(y.shape, np.float32), saved._replace(index=index))


@pytest.mark.parametrize("channels_last", (False, True))
def test_adaptive_windows_as_large_as_the_box_scatter_as_numpy(channels_last):
    """Windows that split every axis evenly (6 -> 3, 8 -> 4: each as large as the box, so the
    kernel skips the per-axis window check): backward equals the NumPy module's bit for bit on
    tie-heavy input, and an index beyond the box is still refused."""
    m = symgrad.load("adaptive_max_pool2d", backend="cpu", output_size=(3, 4), ties="first")
    ref = symgrad.load("adaptive_max_pool2d", output_size=(3, 4), ties="first")
    rng = np.random.default_rng(2)
    x = rng.integers(0, 3, size=(2, 3, 6, 8)).astype(np.float32)
    if channels_last:
        x = np.moveaxis(np.ascontiguousarray(np.moveaxis(x, 1, -1)), -1, 1)
    (y, saved), (y_ref, saved_ref) = m.forward(x), ref.forward(x)
    g = rng.standard_normal(y.shape).astype(np.float32)
    assert np.array_equal(saved.index, saved_ref.index)
    (got,), (want,) = m.backward(g, saved), ref.backward(g, saved_ref)
    assert got.tobytes() == want.tobytes()  # the bits, in logical order, signs of zero included
    index = saved.index.copy()
    index[0, 0, 0, 0] = 4  # the box is 2 x 2
    with pytest.raises(ValueError, match="window box below 4"):
        m.backward(g, saved._replace(index=index))
