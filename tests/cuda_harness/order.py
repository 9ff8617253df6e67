"""The order statistics' comparison of a cuda module with the NumPy module (tests/test_cuda_order.py
on the CPU harness, tests/test_cuda_gpu.py on a GPU): forward's outputs and every saved array,
backward and jvp, bit for bit (any NaN equal to any NaN) on tie-heavy inputs with NaN, +-inf and
+-0; and the cases, every policy, preset and NaN rule of each kernel body."""

from __future__ import annotations

import numpy as np

import symgrad

POOL = np.array([0.0, -0.0, 1.0, -1.0, 2.0, np.inf, -np.inf, np.nan, 0.5])
GRADS = np.array([0.0, -0.0, 1.0, -2.0, 0.5, 3.0, -0.25, 1e-3, np.inf])
DTYPES = (np.float16, np.float32, np.float64)
# rows short enough for topk's insertion (k <= 32) and long enough for the merge sort and the
# quickselect's partitions, the ranked dim first and last
SHAPES = ((4, 9), (3, 70))


def bits(a) -> tuple:
    """An array as (dtype, shape, its bits, NaNs as one pattern): equal only where every bit of a
    number is."""
    a = np.asarray(a)
    if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
        return a.dtype, a.shape, a.tolist()
    u = a.view(f"u{a.dtype.itemsize}").copy()
    u[np.isnan(a.astype(np.float64))] = 0
    return a.dtype, a.shape, u.tolist()


def _as_tuple(y) -> tuple:
    return y if isinstance(y, tuple) else (y,)


def _identity(a):
    return a


def assert_same_module(name: str, params: dict, shapes=SHAPES, dtypes=DTYPES, seed=0, device=_identity,
                       host=_identity, reference: dict | None = None) -> None:
    """The cuda module equals the NumPy module bit for bit: forward's outputs and saved arrays,
    backward and jvp, on tie-heavy inputs of each shape and dtype.  device, host: an array to the
    cuda module's arrays and back (CuPy's on a GPU; the CPU stand-in's are NumPy's); reference:
    the NumPy module's parameters where they are not params (a test that the comparison fails)."""
    want_m = symgrad.load(name, backend="numpy", **(params if reference is None else reference))
    got_m = symgrad.load(name, backend="cuda", **params)
    rng = np.random.default_rng(seed)
    for shape in shapes:
        for dtype in dtypes:
            what = f"{name}{params} {shape} {np.dtype(dtype).name}"
            x = rng.choice(POOL, size=shape).astype(dtype)
            want, want_saved = want_m.forward(x)
            got, got_saved = got_m.forward(device(x))
            assert [bits(host(a)) for a in _as_tuple(got)] == list(map(bits, _as_tuple(want))), f"{what}: forward"
            assert got_saved._fields == want_saved._fields
            for field, a, b in zip(want_saved._fields, got_saved, want_saved):
                assert (bits(host(a)) == bits(b)) if isinstance(b, np.ndarray) else a == b, f"{what}: saved.{field}"
            shape_out = _as_tuple(want)[0].shape
            g = np.asarray(rng.choice(GRADS, size=shape_out) * rng.choice([1, -1], size=shape_out)).astype(dtype)
            assert bits(host(got_m.backward(device(g), got_saved)[0])) == bits(want_m.backward(g, want_saved)[0]), \
                f"{what}: backward"
            t = np.asarray(rng.choice(GRADS, size=shape)).astype(dtype)
            assert bits(host(got_m.jvp(device(t), got_saved))) == bits(want_m.jvp(t, want_saved)), f"{what}: jvp"


def shapes_of(name: str, params: dict) -> tuple:
    """The input shapes of a case: rows short and long, the ranked dim first and last, a 0-d input
    where the op takes one."""
    shapes = ((70, 3), (45, 2, 2)) if params.get("k") == 40 else SHAPES + ((2, 3, 33), (40, 5))
    if name != "topk" and params.get("dim", 0) in (0, -1, None):
        shapes += ((),)  # a 0-d input: one row of one element
    return shapes
