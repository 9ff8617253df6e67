"""The cpu backend's bag kernels (embedding_bag_max, roi_max_pool; issue 33) against the NumPy
module (itself checked against the definition, PyTorch's EmbeddingBag and torchvision's roi_pool in
test_bag.py and test_roi.py), bit for bit: outputs, Saved field for field, backward and jvp, on
tie-heavy tables with NaN, +-inf and +-0, padding_idx, include_last_offset, 2-d input and empty
bags or bins, every policy and preset; the backward's bits independent of the thread count."""

from __future__ import annotations

import numpy as np
import pytest

import symgrad
from test_segment_cpu import _same as _same_float  # (skips the module without a C compiler)

VALUES = [0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan]
FLT_MAX = float(np.finfo(np.float32).max)


def _same(got, want, what):
    """test_segment_cpu's bit comparison; bfloat16 (a kind-'V' dtype there) widened to float32
    first, exactly."""
    if getattr(np.asarray(want).dtype, "name", "") == "bfloat16":
        assert np.asarray(got).dtype == np.asarray(want).dtype, what
        got, want = np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32)
    _same_float(got, want, what)


def _compare(numpy_mod, cpu_mod, inputs, floating, rng, what):
    """forward, Saved, backward and jvp of the cpu module equal the NumPy module's; backward with
    1 and 3 threads the same bits."""
    want, want_saved = numpy_mod.forward(*inputs)
    got, got_saved = cpu_mod.forward(*inputs, threads=2)
    _same(got, want, f"{what}: output")
    assert got_saved._fields == want_saved._fields
    for field, a, b in zip(want_saved._fields, got_saved, want_saved):
        if isinstance(b, np.ndarray):
            _same(a, b, f"{what}: saved.{field}")
        else:
            assert a == b, (what, field)
    dtype = want.dtype
    g = np.array(rng.choice([1.0, -3.0, 0.0, -0.0, 7.0, 0.5, np.inf], want.shape), dtype=dtype)
    wants = numpy_mod.backward(g, want_saved)
    for threads in (1, 3):
        for a, b in zip(cpu_mod.backward(g, got_saved, threads=threads), wants):
            assert (a is None) == (b is None)
            if b is not None:
                _same(a, b, f"{what}: backward, {threads} threads")
    tangents = [np.array(rng.choice([1.0, -2.0, 0.25, -0.0], x.shape), dtype=dtype) if i == floating else None
                for i, x in enumerate(inputs)]
    _same(cpu_mod.jvp(*tangents, got_saved), numpy_mod.jvp(*tangents, want_saved), f"{what}: jvp")


def _bag_inputs(rng, dtype, params):
    """(rows, weight, offsets): a tie-heavy table, repeated rows, offsets with empty bags (a 2-d
    input every other call where the parameters allow it)."""
    weight = np.array(rng.choice(VALUES, size=(6, 3)), dtype=dtype)
    rows = rng.integers(0, 6, size=12)
    if not params.get("include_last_offset") and rng.integers(2):
        return rows.reshape(4, 3), weight, None
    offsets = np.sort(np.concatenate([[0], rng.integers(0, 13, size=4)]))
    if params.get("include_last_offset"):
        offsets = np.append(offsets, 12)
    return rows, weight, offsets


def _bags(settings, params, dtypes, cases=4):
    numpy_mod = symgrad.load("embedding_bag_max", backend="numpy", **settings, **params)
    cpu_mod = symgrad.load("embedding_bag_max", backend="cpu", **settings, **params)
    rng = np.random.default_rng(13)
    for dtype in dtypes:
        for case in range(cases):
            _compare(numpy_mod, cpu_mod, _bag_inputs(rng, dtype, params), 1, rng,
                     f"{settings} {params} {np.dtype(dtype).name} case {case}")


def test_embedding_bag_torch_preset_is_the_numpy_module():
    """PyTorch's rule (NaN 'keep', first of ties): float16/32/64, padding_idx, 2-d input."""
    _bags({"convention": "torch"}, {"padding_idx": 2}, (np.float16, np.float32, np.float64), cases=3)


SETTINGS = [{"ties": "first"}, {"ties": "last"}, {"ties": "split"}, {"ties": "all"},
            {"ties": "first", "nan": "keep"}, {"ties": "last", "nan": "keep"}, {"ties": "split", "nan": "zero"},
            {"ties": "split", "nan": "nan"}, {"ties": "split", "nan": "each"}, {"ties": "all", "nan": "zero"},
            {"convention": "jax"}]


@pytest.mark.slow
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(s.values()))
def test_embedding_bag_every_policy_is_the_numpy_module(settings):
    dtypes = (np.float32, np.float64) if settings.get("convention") == "jax" else (np.float16, np.float32, np.float64)
    _bags(settings, {}, dtypes)
    _bags(settings, {"include_last_offset": True, "padding_idx": -1}, (np.float32,))


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{"convention": "torch"}, {"ties": "first"}, {"ties": "split"},
                                      {"ties": "last", "nan": "keep"}, {"ties": "all", "nan": "zero"}],
                         ids=lambda s: "-".join(s.values()))
def test_roi_max_pool_is_the_numpy_module(settings):
    """Overlapping bins, boxes partly outside the input (empty bins), -FLT_MAX (torchvision's start)."""
    params = {"output_size": (2, 3), "spatial_scale": 0.5}
    numpy_mod = symgrad.load("roi_max_pool", backend="numpy", **settings, **params)
    cpu_mod = symgrad.load("roi_max_pool", backend="cpu", **settings, **params)
    rng = np.random.default_rng(17)
    for dtype in (np.float16, np.float32, np.float64):
        for case in range(4):
            x = np.array(rng.choice(VALUES + [-FLT_MAX], size=(2, 2, 5, 6)), dtype=dtype)
            corners = rng.choice(np.arange(-3.0, 14.0, 0.5), size=(4, 4))
            boxes = np.concatenate([rng.integers(0, 2, size=(4, 1)).astype(float), corners], axis=1).astype(dtype)
            _compare(numpy_mod, cpu_mod, (x, boxes), 0, rng, f"{settings} {np.dtype(dtype).name} case {case}")


@pytest.mark.slow
@pytest.mark.parametrize("settings", [{"convention": "torch"}, {"ties": "split"}], ids=lambda s: "-".join(s.values()))
def test_bfloat16_is_the_numpy_module(settings):
    """bfloat16 through the float32 kernels (the loader's wrappers), as the NumPy module computes it."""
    bfloat16 = pytest.importorskip("ml_dtypes").bfloat16
    _bags(settings, {"padding_idx": 0}, (bfloat16,))


@pytest.mark.slow
def test_a_saved_that_does_not_match_is_refused():
    cpu_mod = symgrad.load("embedding_bag_max", backend="cpu", ties="first")
    y, saved = cpu_mod.forward(np.array([0, 1]), np.ones((2, 3)), np.array([0]))
    with pytest.raises(ValueError, match="saved must be"):
        cpu_mod.backward(np.ones(y.shape), saved._replace(rows=np.array([0, 5])))
    with pytest.raises(ValueError, match="saved must be"):
        cpu_mod.jvp(None, np.ones((2, 3)), None, saved._replace(winner=np.full(y.shape, 10**9)))
