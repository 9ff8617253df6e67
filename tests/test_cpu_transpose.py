"""The cpu reductions' layout change (the library's tiled transpose, where the reduced dims are one
block of axes with others after it): forward, backward and jvp equal the NumPy module's bits,
shapes whose sides are and are not multiples of the 8 x 8 tile, every dtype, two presets."""

import numpy as np
import pytest

import symgrad

DIM0 = [((64, 24), 0), ((9, 17), 0), ((13, 8, 3), 0)]  # one library: the default run's
CASES = [((2, 13, 11), 1), ((3, 8, 5, 7), (1, 2)), ((3, 5, 2, 9), (0, 1)), ((4, 1, 3), 1)]


def test_moved_rows_equal_the_numpy_module():
    _check("amax", "torch", DIM0)


@pytest.mark.slow
@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("convention", ["torch", None])
def test_moved_rows_equal_the_numpy_module_every_case(op, convention):
    _check(op, convention, DIM0 + CASES)


def _check(op, convention, cases):
    rng = np.random.default_rng(3)
    for shape, dim in cases:
        cpu = symgrad.load(op, backend="cpu", convention=convention, dim=dim)
        ref = symgrad.load(op, convention=convention, dim=dim)
        for dtype in (np.float16, np.float32, np.float64):
            x = np.round(rng.standard_normal(shape) * 2).astype(dtype)  # ties in most slices
            x.flat[::7] = -0.0
            (y, s), (y0, s0) = cpu.forward(x), ref.forward(x)
            g = rng.standard_normal(y.shape).astype(dtype)
            t = rng.standard_normal(shape).astype(dtype)
            what = (shape, dim, dtype.__name__)
            assert y.tobytes() == y0.tobytes() and y.shape == y0.shape, what
            assert cpu.backward(g, s)[0].tobytes() == ref.backward(g, s0)[0].tobytes(), what
            assert np.asarray(cpu.jvp(t, s)).tobytes() == np.asarray(ref.jvp(t, s0)).tobytes(), what
