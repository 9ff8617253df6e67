"""The cpu backend's adaptive and fractional pooling backward (scan form) make what depends on
saved's input shape alone once a shape and compare the rest of saved with it on every call,
leaving the values of the saved index (and fractional pooling's samples) to the kernels: a Saved
forged in any one field, or in one value, is refused with the NumPy module's error on the first
call of a shape and after valid calls of it (the shape's layout then made), and an index of an
ndarray subclass is taken as the NumPy module takes it."""

import numpy as np
import pytest

import symgrad

SHAPE, SIZE = (2, 3, 8, 9), (3, 4)  # overlapping windows of two sizes along both axes: box 4 x 3


def _forged(saved):
    """(name, saved with one field forged) for each field backward checks."""
    index = saved.index
    return [
        ("output_shape", saved._replace(output_shape=saved.output_shape[:-1] + (5,))),
        ("input_shape", saved._replace(input_shape=saved.input_shape[:-1] + (0,))),
        ("index dtype", saved._replace(index=index.astype(np.uint16))),
        ("index shape", saved._replace(index=index[..., :-1])),
        ("index list", saved._replace(index=index.tolist())),
    ]


def _errors(module, x, g, warm: bool) -> list:
    y, saved = module.forward(x)
    if warm:
        module.backward(g, saved)  # the shape's layout made
    errors = []
    for name, forged in _forged(saved):
        with pytest.raises((ValueError, TypeError)) as info:
            module.backward(g, forged)
        errors.append((name, type(info.value).__name__, str(info.value)))
    return errors


@pytest.mark.parametrize("warm", (False, True))
def test_a_forged_saved_is_refused_as_numpy_refuses_it(warm):
    m = symgrad.load("adaptive_max_pool2d", backend="cpu", output_size=SIZE, ties="first")
    ref = symgrad.load("adaptive_max_pool2d", output_size=SIZE, ties="first")
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    g = np.ones((2, 3) + SIZE, np.float32)
    got, want = _errors(m, x, g, warm), _errors(ref, x, g, warm)
    assert [e[:2] for e in got] == [e[:2] for e in want]
    for (name, _, text), (_, _, text_ref) in zip(got, want):
        assert text == text_ref, name


class _Sub(np.ndarray):
    """An ndarray subclass (a saved index handed back through another array type)."""


def test_a_subclass_index_gives_the_plain_index_gradient():
    m = symgrad.load("adaptive_max_pool2d", backend="cpu", output_size=SIZE, ties="first")
    rng = np.random.default_rng(1)
    x = rng.integers(0, 3, size=SHAPE).astype(np.float32)  # ties everywhere
    y, saved = m.forward(x)
    g = rng.standard_normal(y.shape).astype(np.float32)
    (plain,) = m.backward(g, saved)
    (sub,) = m.backward(g, saved._replace(index=saved.index.view(_Sub)))
    assert plain.tobytes() == sub.tobytes()
    ref = symgrad.load("adaptive_max_pool2d", output_size=SIZE, ties="first")
    (numpy,) = ref.backward(g, ref.forward(x)[1])
    assert plain.tobytes() == numpy.tobytes()


FRACTIONAL = dict(kernel_size=3, output_size=(4, 5), convention="torch")  # test_cpu_kinds builds it


def _fractional_errors(module, x, u, warm: bool) -> list:
    y, saved = module.forward(x, u)
    g = np.ones(y.shape, np.float32)
    if warm:
        module.backward(g, saved)
    forged = []
    for value in (np.nan, 1.0, -0.25):  # a sample outside [0, 1), its dtype and shape kept
        samples = saved.samples.copy()
        samples[1, 2, 1] = value
        forged.append(saved._replace(samples=samples))
    for value in (9, 255):  # the window's size, the index type's largest value
        index = saved.index.copy()
        index[1, 2, 3, 4] = value
        forged.append(saved._replace(index=index))
    forged += [saved._replace(samples=saved.samples[:1]), saved._replace(index=saved.index.astype(np.int64))]
    errors = []
    for bad in forged:
        with pytest.raises((ValueError, TypeError)) as info:
            module.backward(g, bad)
        errors.append((type(info.value).__name__, str(info.value)))
    u_bad = u.copy()
    u_bad[0, 1, 0] = 1.0
    with pytest.raises(ValueError) as info:
        module.forward(x, u_bad)
    return errors + [(type(info.value).__name__, str(info.value))]


@pytest.mark.parametrize("warm", (False, True))
def test_a_forged_fractional_saved_is_refused_as_numpy_refuses_it(warm):
    m = symgrad.load("fractional_max_pool2d", backend="cpu", **FRACTIONAL)
    ref = symgrad.load("fractional_max_pool2d", **FRACTIONAL)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    u = rng.random((2, 3, 2)).astype(np.float32)
    assert _fractional_errors(m, x, u, warm) == _fractional_errors(ref, x, u, warm)
