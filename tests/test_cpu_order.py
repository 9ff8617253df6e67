"""The cpu backend's order statistics (issue 29: sort, topk, cummax, cummin, kthvalue, median,
nanmedian) against the NumPy backend's module, itself checked against a brute-force W, PyTorch and JAX (tests/test_order.py,
tests/test_median.py): forward's values, indices and every saved array, backward and jvp, bit for
bit (signs of zero and NaN bits included) on tie-heavy inputs with NaN, +-inf and +-0, in
float16, float32 and float64 (bfloat16 through the NumPy module's wrappers).  A representative
case in the default run (a rank, a prefix's tie blocks), every policy, preset (JAX's tree of
cummax/cummin among them), NaN rule and dtype with -m slow."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from order_cases import every_case

POOL = np.array([0.0, -0.0, 1.0, -1.0, 2.0, np.inf, -np.inf, np.nan, 0.5])
GRADS = np.array([0.0, -0.0, 1.0, -2.0, 0.5, 3.0, -0.25, 1e-3, np.inf])
DTYPES = (np.float16, np.float32, np.float64)
# (op, params, input shape): rows short enough for the insertion (k <= 32) and long enough for
# the merge sort, the ranked dim first and last
SHAPES = ((4, 9), (3, 70))


def bits(a) -> tuple:
    """An array as (dtype, shape, its bits): equal only where every bit is."""
    a = np.asarray(a)
    return a.dtype, a.shape, a.view(f"u{a.dtype.itemsize}").tolist() if a.dtype.kind == "f" else a.tolist()


def _as_tuple(y) -> tuple:
    return y if isinstance(y, tuple) else (y,)


def assert_same_module(name: str, params: dict, shapes=SHAPES, dtypes=DTYPES, seed=0) -> None:
    """The cpu module equals the NumPy module bit for bit: forward's outputs and saved arrays,
    backward and jvp, on tie-heavy inputs of each shape and dtype."""
    want_m = symgrad.load(name, backend="numpy", **params)
    got_m = symgrad.load(name, backend="cpu", **params)
    rng = np.random.default_rng(seed)
    for shape in shapes:
        for dtype in dtypes:
            what = f"{name}{params} {shape} {np.dtype(dtype).name}"
            x = rng.choice(POOL, size=shape).astype(dtype)
            want, want_saved = want_m.forward(x)
            got, got_saved = got_m.forward(x)
            assert list(map(bits, _as_tuple(got))) == list(map(bits, _as_tuple(want))), f"{what}: forward"
            for field, a, b in zip(want_saved._fields, got_saved, want_saved):
                assert (bits(a) == bits(b)) if isinstance(b, np.ndarray) else a == b, f"{what}: saved.{field}"
            g = (rng.choice(GRADS, size=_as_tuple(want)[0].shape) * rng.choice([1, -1], size=_as_tuple(want)[0].shape))
            assert bits(got_m.backward(g.astype(dtype), got_saved)[0]) == \
                bits(want_m.backward(g.astype(dtype), want_saved)[0]), f"{what}: backward"
            t = rng.choice(GRADS, size=shape).astype(dtype)
            assert bits(got_m.jvp(t, got_saved)) == bits(want_m.jvp(t, want_saved)), f"{what}: jvp"


# one case of each kernel body and tie order in the default run (each compiles its source once)
# (the whole default run's share: about 4 s on 2 loaded cores, most of it compiling two sources)
FAST = [("topk", {"k": 3, "convention": "torch"}),  # rank, first; insertion and merge sort
        ("cummin", {"dim": 1, "ties": "all", "nan": "zero"})]  # prefix, tie blocks, NaN outputs send nothing


@pytest.mark.parametrize("name,params", FAST, ids=lambda v: v if isinstance(v, str) else "")
def test_cpu_equals_the_numpy_module_bit_for_bit(name, params):
    assert_same_module(name, params)


@pytest.mark.slow
@pytest.mark.parametrize("name,params", list(every_case()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_policy_and_preset_equals_the_numpy_module(name, params):
    shapes = ((70, 3), (45, 2, 2)) if params.get("k") == 40 else SHAPES + ((2, 3, 33), (40, 5))
    if name != "topk" and params.get("dim", 0) in (0, -1):
        shapes += ((),)  # a 0-d input: one row of one element
    assert_same_module(name, params, shapes=shapes, seed=1)


def test_shapes_threads_and_bfloat16():
    """Empty rows; results independent of the thread count; bfloat16 as the NumPy
    module's wrappers compute it."""
    assert_same_module("topk", {"k": 3, "convention": "torch"}, shapes=((0, 5), (2, 3)), dtypes=(np.float32,))
    m = symgrad.load(FAST[1][0], backend="cpu", **FAST[1][1])
    x = np.random.default_rng(3).choice(POOL, size=(64, 50))
    (y1, i1), s1 = m.forward(x, threads=1)
    (y2, i2), s2 = m.forward(x, threads=2)
    assert bits(y1) == bits(y2) and bits(i1) == bits(i2)
    assert bits(m.backward(np.ones_like(y1), s1, threads=1)[0]) == bits(m.backward(np.ones_like(y1), s2, threads=2)[0])
    ml_dtypes = pytest.importorskip("ml_dtypes")
    xb = x.astype(ml_dtypes.bfloat16)
    want_m = symgrad.load(FAST[1][0], backend="numpy", **FAST[1][1])
    (yb, ib), sb = m.forward(xb)
    (yw, iw), sw = want_m.forward(xb)
    assert yb.dtype == yw.dtype and bits(yb.view(np.uint16)) == bits(yw.view(np.uint16)) and bits(ib) == bits(iw)
    g = np.ones(yb.shape, ml_dtypes.bfloat16)
    assert bits(m.backward(g, sb)[0].view(np.uint16)) == bits(want_m.backward(g, sw)[0].view(np.uint16))


def test_a_saved_index_that_forward_did_not_save_is_one_clear_error():
    m = symgrad.load(FAST[0][0], backend="cpu", **FAST[0][1])
    (y, _), saved = m.forward(np.arange(12.0).reshape(3, 4))
    for bad in (-1, 4, 10**12):
        forged = saved._replace(indices=np.full_like(saved.indices, bad))
        with pytest.raises(ValueError, match="saved must be the Saved value that this module's forward returned"):
            m.backward(np.ones_like(y), forged)
        with pytest.raises(ValueError, match="saved must be the Saved value"):
            m.jvp(np.ones((3, 4)), forged)
    with pytest.raises(ValueError, match="saved.indices must be forward's int64 array"):
        m.backward(np.ones_like(y), saved._replace(indices=saved.indices.astype(np.int32)))


def test_check_decides_the_cpu_modules():
    """symgrad.check (its probes read only forward) accepts the cpu modules' backward and jvp."""
    x = np.array([[1.0, 0.5, 1.0, 0.0, 1.0, 0.5], [2.0, 2.0, 2.0, 2.0, -1.0, 0.0]])
    for name, params in FAST:
        report = symgrad.check(symgrad.load(name, backend="cpu", **params), x, modes="both")
        assert report.ok and report.tied_windows > 0, str(report)


@pytest.mark.slow
@pytest.mark.parametrize("name,params", [("median", {"dim": 1, "ties": "last"}), ("kthvalue", {"k": 40, "dim": 1}),
                                         ("topk", {"k": 40, "dim": 1})], ids=lambda v: v if isinstance(v, str) else "")
def test_long_rows_of_distinct_sorted_and_tied_values(name, params):
    """The quickselect of one rank and the merge sort of topk on rows of 1000: distinct values,
    rows sorted ascending and descending (the middle-of-three pivot's easy and hard orders), and
    rows of one value."""
    want_m = symgrad.load(name, backend="numpy", **params)
    got_m = symgrad.load(name, backend="cpu", **params)
    rng = np.random.default_rng(5)
    normal = rng.standard_normal((4, 1000))
    for x in (normal, np.sort(normal), -np.sort(normal), np.ones((4, 1000)), np.round(normal * 3)):
        want, _ = want_m.forward(x.astype(np.float32))
        got, _ = got_m.forward(x.astype(np.float32))
        assert list(map(bits, got)) == list(map(bits, want))
