"""The blocked code paths of the generated modules give the same bits as one block.

Generated modules work on cache-sized blocks (window modules: blocks of planes in phase layout;
overlapping windows are scattered back in steps of SCATTER windows; elementwise modules: flat
chunks).  The test inputs elsewhere are small enough to fit in one block, so here the block sizes
are shrunk (module constants BLOCK and SCATTER) until every path runs: several blocks, a last
block that is only partly full, a plane split over several scatter steps, several planes per step.
The oracle is the same module with its own block sizes, which the other test files check against
finite differences, SymPy and PyTorch.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import symgrad

from conftest import ELEMENTWISE, POLICIES, WINDOWED, case_id

WINDOW_CASES = [c for c in WINDOWED if c[0].startswith(("max_pool", "maxout"))]


def _bits(a: np.ndarray) -> np.ndarray:
    """The array's bits, with every NaN made the same (NaN payloads are not specified)."""
    a = np.where(np.isnan(a), np.nan, a).astype(a.dtype)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.itemsize])


def _tricky(rng, shape, dtype):
    """Tie-heavy values with NaN, -inf and signed zeros sprinkled in."""
    x = rng.integers(-1, 2, size=shape).astype(np.float64)
    x[rng.random(shape) < 0.1] = np.nan
    x[rng.random(shape) < 0.1] = -np.inf
    x[rng.random(shape) < 0.1] = -0.0
    return x.astype(dtype)


def _run(m, x, g):
    y, saved = m.forward(x)
    (gx,) = m.backward(g, saved)
    return y, saved, gx


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shape", WINDOW_CASES, ids=[case_id(*c) for c in WINDOW_CASES])
def test_window_blocks_agree_with_one_block(op, params, shape, ties, dtype, monkeypatch):
    rng = np.random.default_rng(11)
    m = symgrad.load(op, ties=ties, **params)
    # three more planes (samples or channels), so that blocks of two planes leave a last block of one
    x = _tricky(rng, (shape[0] + 3,) + tuple(shape[1:]), dtype)
    g = rng.integers(-3, 4, size=m.forward(x)[0].shape).astype(dtype)
    g[rng.random(g.shape) < 0.1] = -0.0
    y0, s0, gx0 = _run(m, x, g)
    plan = m._layout(x.shape)
    assert plan.planes >= 3
    # blocks of 1 and 2 planes (forward, backward), scatter steps of one window, of part of a
    # plane, and of two planes with a last step of one,
    # and every backward path whatever the window size: disjoint windows written directly or
    # scattered, overlapping ones accumulated per element or scattered
    window_count = math.prod(plan.out_plane)
    for block, scatter, threshold in itertools.product(
            (1, 2 * math.prod(plan.wide), 2 * window_count),
            (1, max(2, window_count // 2 + 1), 2 * window_count), (0, m.WINDOW)):
        monkeypatch.setattr(m, "BLOCK", block)
        if hasattr(m, "SCATTER"):
            monkeypatch.setattr(m, "SCATTER", scatter)
            monkeypatch.setattr(m, "ACCUMULATE_UP_TO", threshold)
            monkeypatch.setattr(m, "WRITE_UP_TO", threshold)
            monkeypatch.setattr(m, "WRITE_SMALL_UP_TO", threshold)
        y, saved, gx = _run(m, x, g)
        np.testing.assert_array_equal(_bits(y), _bits(y0))
        np.testing.assert_array_equal(_bits(gx), _bits(gx0))
        if "index" in saved._fields:
            np.testing.assert_array_equal(saved.index, s0.index)


@pytest.mark.parametrize("convention", [None, "jax"])  # jax: padding takes part and can win
def test_scatter_finds_window_positions_once_per_call(convention, monkeypatch):
    """Backward's scatter path in steps of whole planes: every step's windows sit where the first
    step's do, a plane further on, so their positions in a plane are computed once per call.
    Computed per step (a division of every window number per step) they made backward 4.5x as
    slow (issue 28 item 10); several steps still give the bits of one."""
    m = symgrad.load("max_pool2d", kernel_size=3, stride=2, padding=1,
                     **({"convention": convention} if convention else {"ties": "first"}))
    rng = np.random.default_rng(13)
    x = _tricky(rng, (4, 3, 9, 9), np.float32)
    x[::2, :, :2, :2] = -np.inf  # a corner window of -inf only: under jax its padding wins
    y, saved = m.forward(x)
    g = rng.integers(-3, 4, size=y.shape).astype(np.float32)
    (gx0,) = m.backward(g, saved)
    plan = m._layout(x.shape)
    count = math.prod(plan.out_plane)
    computed = []
    origins = m._origins
    monkeypatch.setattr(m, "_origins", lambda plan, windows: computed.append(len(windows)) or origins(plan, windows))
    monkeypatch.setattr(m, "SCATTER", 2 * count)  # two planes a step: six steps
    assert m._path(plan, x.nbytes) == "scatter" and plan.padded == (convention == "jax")
    (gx,) = m.backward(g, saved)
    assert computed == [count]  # one plane's windows, once
    np.testing.assert_array_equal(_bits(gx), _bits(gx0))


def test_window_plan_cache_is_bounded_and_stays_correct():
    m = symgrad.load("max_pool1d", kernel_size=3, stride=2, padding=1)
    rng = np.random.default_rng(12)
    first = rng.normal(size=(2, 3, 9))
    y0, s0 = m.forward(first)
    for length in range(3, 80):  # more shapes than the cache holds
        m.forward(rng.normal(size=(1, 2, length)))
    assert sum(size for _, size in m._PLANS.values()) <= m.PLAN_CACHE_BYTES
    y, s = m.forward(first)
    np.testing.assert_array_equal(y, y0)
    np.testing.assert_array_equal(m.backward(np.ones_like(y), s)[0], m.backward(np.ones_like(y0), s0)[0])


ELEMENTWISE_SAME_SHAPE = [c for c in ELEMENTWISE if len(set(c[2])) == 1]


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shapes", ELEMENTWISE_SAME_SHAPE,
                         ids=[case_id(*c) for c in ELEMENTWISE_SAME_SHAPE])
def test_elementwise_chunks_agree_with_one_chunk(op, params, shapes, ties, monkeypatch):
    rng = np.random.default_rng(13)
    m = symgrad.load(op, ties=ties, **params)
    inputs = [_tricky(rng, (7, 11), np.float32) * 3 for _ in shapes]
    y0, s0 = m.forward(*inputs)
    g = rng.normal(size=y0.shape).astype(np.float32)
    g[rng.random(g.shape) < 0.1] = -0.0
    g0 = m.backward(g, s0)
    for block in (1, 10, 76):  # chunks of one element, several chunks with a short last one
        monkeypatch.setattr(m, "BLOCK", block)
        y, s = m.forward(*inputs)
        got = m.backward(g, s)
        np.testing.assert_array_equal(_bits(y), _bits(y0))
        for a, b in zip(got, g0):
            assert a.dtype == b.dtype and a.shape == b.shape
            np.testing.assert_array_equal(_bits(a), _bits(b))


@pytest.mark.parametrize("ties", ["first", "split"])
@pytest.mark.parametrize("op,params,shape", [
    ("maxout", {"pieces": 2}, (0, 2, 0)), ("maxout", {"pieces": 2}, (2, 4, 0, 3)), ("maxout", {"pieces": 2}, (0, 4)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, (0, 2, 5, 5)),
    ("max_pool2d", {"kernel_size": 2}, (0, 1, 4, 4)),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else None)
def test_empty_inputs_on_every_path(op, params, shape, ties, monkeypatch):
    """No planes, or planes of no elements: every block size and backward path returns an empty
    gradient of the input's shape (no division by an empty plane's size)."""
    m = symgrad.load(op, ties=ties, **params)
    x = np.zeros(shape, dtype=np.float16)
    for threshold in (0, m.WINDOW):
        for name in ("WRITE_UP_TO", "WRITE_SMALL_UP_TO", "ACCUMULATE_UP_TO"):
            if hasattr(m, name):
                monkeypatch.setattr(m, name, threshold)
        y, saved = m.forward(x)
        assert y.size == 0
        (gx,) = m.backward(np.zeros_like(y), saved)
        assert gx.shape == x.shape and gx.dtype == x.dtype
