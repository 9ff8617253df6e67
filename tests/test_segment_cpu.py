"""The cpu backend's segment kernels (scatter_max/min, segment_max/min; issue 33) against the
NumPy module (itself checked against the definition and the frameworks in test_segment.py), bit
for bit: outputs, Saved field for field, backward and jvp, on tie-heavy inputs with NaN, +-inf and
+-0, every policy and both presets.  Skipped when no C compiler is found, except under CI=true."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import symgrad

COMPILER = next((shutil.which(c) for c in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang"))
                 if shutil.which(c)), None)
if COMPILER is None and os.environ.get("CI") != "true":
    pytest.skip("no C compiler (cc, gcc, clang or $CC) on this machine: the cpu backend needs one "
                "(required when CI=true)", allow_module_level=True)

VALUES = [0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan]
POLICIES = [{"ties": t} for t in ("first", "last", "split", "all")] + [
    {"convention": "torch"}, {"convention": "jax"}]
OPS = ["scatter_max", "scatter_min", "segment_max", "segment_min"]


def _same(got, want, what):
    """Equal bits (every NaN taken as NaN), or equal values for what is not a float array."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    if want.dtype.kind == "f":
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), what
        bits = f"u{want.dtype.itemsize}"
        assert np.array_equal(got[~nan].view(bits), want[~nan].view(bits)), (what, got, want)
    else:
        assert np.array_equal(got, want), (what, got, want)


def _inputs(op, rng, dtype, rows=0):
    """The forward inputs and the shapes of the output and of src (data)."""
    def tie_heavy(shape):
        return np.array(rng.choice(VALUES, size=shape), dtype=dtype)
    if op.startswith("segment"):
        data = tie_heavy((13, 3))
        return (data, rng.integers(0, 5, 13)), (5, 3), data.shape
    src = tie_heavy((4, 9))
    index = rng.integers(0, 3, (4, 9))
    if rows:  # one index per row, the same along the features (whole rows segmented)
        index = np.broadcast_to(rng.integers(0, 3, (4, 1)), (4, 9)).copy()
    return (tie_heavy((3, 9)), index, src), (3, 9), src.shape


def _modules(op, policy, include_self):
    params = ({"num_segments": 5} if op.startswith("segment") else {"dim": 0, "include_self": include_self})
    return (symgrad.load(op, backend="numpy", **policy, **params),
            symgrad.load(op, backend="cpu", **policy, **params))


def _compare(numpy_mod, cpu_mod, op, dtype, rng, rows=0):
    inputs, out_shape, _ = _inputs(op, rng, dtype, rows)
    _compare_on(numpy_mod, cpu_mod, inputs, out_shape, dtype, rng)


def _compare_on(numpy_mod, cpu_mod, inputs, out_shape, dtype, rng):
    """Forward, Saved, backward and jvp of the cpu module on these inputs equal the NumPy module's."""
    want, want_saved = numpy_mod.forward(*inputs)
    got, got_saved = cpu_mod.forward(*inputs)
    _same(got, want, "output")
    assert got_saved._fields == want_saved._fields
    for field, a, b in zip(want_saved._fields, got_saved, want_saved):
        if isinstance(b, np.ndarray):
            _same(a, b, f"saved.{field}")
        else:
            assert a == b, field
    g = np.array(rng.choice([1.0, -3.0, 0.0, -0.0, 7.0, 0.5], out_shape), dtype=dtype)
    for a, b in zip(cpu_mod.backward(g, got_saved), numpy_mod.backward(g, want_saved)):
        assert (a is None) == (b is None)
        if b is not None:
            _same(a, b, "backward")
    tangents = [None if i.dtype.kind in "iu" else np.array(rng.choice([1.0, -2.0, 0.25, -0.0], i.shape), dtype=dtype)
                for i in inputs]
    _same(cpu_mod.jvp(*tangents, got_saved), numpy_mod.jvp(*tangents, want_saved), "jvp")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: next(iter(p.values())))
# max in the default run, min (the same kernels with the other extremum) with -m slow
@pytest.mark.parametrize("op, include_self", [
    pytest.param(op, s, marks=[pytest.mark.slow] if op.endswith("min") else [])
    for op in OPS for s in ((True, False) if op.startswith("scatter") else (False,))])
def test_cpu_is_the_numpy_module_bit_for_bit(op, include_self, policy, dtype):
    """Forward, Saved, backward and jvp equal the NumPy module's on tie-heavy inputs with NaN, +-inf
    and +-0, include_self both ways (segment_max has none)."""
    numpy_mod, cpu_mod = _modules(op, policy, include_self)
    rng = np.random.default_rng(7)
    for _ in range(6):
        _compare(numpy_mod, cpu_mod, op, dtype, rng)
    if op.startswith("scatter"):
        _compare(numpy_mod, cpu_mod, op, dtype, rng, rows=1)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: next(iter(p.values())))
def test_rows_wider_than_a_block_are_the_numpy_module(policy):
    """Rows of 70 features (forward tests the hits 64 columns at a time: a block's edge and the
    tail past it) segmented whole by an expanded index (stride 0, as PyTorch's index.expand)."""
    numpy_mod, cpu_mod = _modules("scatter_max", policy, False)
    rng = np.random.default_rng(11)
    index = np.broadcast_to(rng.integers(0, 3, (6, 1)), (6, 70))
    inputs = (rng.choice(VALUES, (3, 70)), index, rng.choice(VALUES, (6, 70)))
    _compare_on(numpy_mod, cpu_mod, inputs, (3, 70), np.float64, rng)


@pytest.mark.parametrize("policy", [{"ties": "split"}, {"convention": "torch"}, {"ties": "first"}],
                         ids=lambda p: next(iter(p.values())))
def test_float16_is_the_numpy_module_bit_for_bit(policy):
    numpy_mod, cpu_mod = _modules("scatter_max", policy, False)
    rng = np.random.default_rng(3)
    for _ in range(4):
        _compare(numpy_mod, cpu_mod, "scatter_max", np.float16, rng)


def test_a_saved_that_does_not_match_is_refused():
    numpy_mod, cpu_mod = _modules("scatter_max", {"ties": "first"}, True)
    y, saved = cpu_mod.forward(np.zeros(3), np.array([0, 2]), np.ones(2))
    with pytest.raises(ValueError, match="saved must be"):
        cpu_mod.backward(np.ones(3), saved._replace(key=np.array([0, 5])))
    with pytest.raises(ValueError, match="saved must be"):  # a winner past src's rows: not read
        cpu_mod.jvp(np.ones(3), None, np.ones(2), saved._replace(winner=np.array([[0], [10**9], [-1]])))


EDGES = [("scatter_max", {"dim": 0, "include_self": False},
          (np.ones((3, 2), np.float32), np.zeros((0, 2), np.int64), np.zeros((0, 2), np.float32))),
         ("scatter_min", {"dim": 1, "include_self": True},
          (np.ones((2, 3)), np.array([[0, 2], [1, 1]]), np.array([[5.0, -0.0], [0.0, -0.0]]))),
         ("segment_max", {"num_segments": 3}, (np.zeros((0, 2), np.float32), np.zeros(0, np.int64))),
         ("segment_min", {"num_segments": 0}, (np.zeros((0,), np.float32), np.zeros(0, np.int64))),
         ("segment_max", {}, (np.array([1.0, 2.0, -0.0]), np.array([0, 3, 3])))]


@pytest.mark.parametrize("policy", [{"ties": "last"}, {"ties": "split"}, {"convention": "torch"}],
                         ids=lambda p: next(iter(p.values())))
def test_empty_segments_and_another_dim_are_the_numpy_module(policy):
    """No src rows, no segments, empty segments between used ones, dim 1: forward, Saved, backward
    and jvp as the NumPy module's."""
    for op, params, inputs in EDGES:
        numpy_mod = symgrad.load(op, backend="numpy", **policy, **params)
        cpu_mod = symgrad.load(op, backend="cpu", **policy, **params)
        (want, want_saved), (got, got_saved) = numpy_mod.forward(*inputs), cpu_mod.forward(*inputs)
        _same(got, want, op)
        for a, b in zip(got_saved, want_saved):
            assert np.array_equal(a, b) if isinstance(b, np.ndarray) else a == b, op
        g = np.full(want.shape, 3.0, want.dtype)
        for a, b in zip(cpu_mod.backward(g, got_saved), numpy_mod.backward(g, want_saved)):
            assert (a is None) == (b is None) and (b is None or np.array_equal(a, b)), op
        tangents = [None if i.dtype.kind in "iu" else np.full(i.shape, -2.0, i.dtype) for i in inputs]
        _same(cpu_mod.jvp(*tangents, got_saved), numpy_mod.jvp(*tangents, want_saved), op)


def test_float16_under_jax_reciprocal_is_refused_naming_the_numpy_backend():
    """JAX's weight g * (1 / count): NumPy rounds 1 / count to float16 first, the kernels compute
    float16 in float, so float16 is refused (float32 is the NumPy module's, above)."""
    _, cpu_mod = _modules("segment_max", {"convention": "jax"}, False)
    with pytest.raises(TypeError, match="backend='numpy'"):
        cpu_mod.forward(np.ones(3, np.float16), np.array([0, 0, 1]))
    _, split = _modules("segment_max", {"ties": "split"}, False)  # g / count: float16 built
    assert split.forward(np.ones(3, np.float16), np.array([0, 0, 1]))[0].dtype == np.float16
