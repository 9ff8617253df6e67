"""The cpu reductions' forward plan (cpu/_plan_cache.py.jinja _planned): once a call has checked
a C-contiguous input of a shape and dtype, later calls on such an input skip the checks and the
layout.  Every other input of that shape must still take the full path: a copy of a strided or
Fortran-ordered view, a byte-swapped array computed natively, another dtype its own kernel, a
masked array its TypeError, a bad thread count its ValueError, and backward must read what the
planned forward saved.

Oracle: the max or min of each reduced slice, a Python loop over the slices (distinct values, no
zero and no NaN: the value is the answer whatever the tie and zero rules), and a gradient that is
grad_output at each slice's one winner and zero elsewhere."""

import re

import numpy as np
import pytest

import symgrad
from symgrad import backends
from symgrad.ops import resolve
from symgrad.pipeline import render

# (op, parameters, shape): a row (the dim last) and columns (a block with a dim after it) of the
# module tests/test_cpu_columns.py compiles in the default run; slow: other modules (dims last, amin,
# all, dims moved)
CASES = [("amax", {"dim": 0}, (40,)), ("amax", {"dim": 0}, (6, 7)),
         pytest.param("amax", {"dim": -1}, (5, 40), marks=pytest.mark.slow),
         pytest.param("amin", {"dim": 0}, (6, 7), marks=pytest.mark.slow),
         pytest.param("amax", {}, (4, 9), marks=pytest.mark.slow),
         pytest.param("amax", {"dim": (0, 2)}, (3, 4, 5), marks=pytest.mark.slow)]


def distinct(shape, dtype, seed=0):
    """A permutation of 1..size (no ties, no zero), negated at random positions."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    return (rng.permutation(n) + 1.0).reshape(shape) * rng.choice([-1.0, 1.0], shape)


def brute(op: str, x: np.ndarray, dims: tuple) -> tuple:
    """(output, gradient for grad_output 1 + slice number) by a loop over the reduced slices."""
    kept = [i for i in range(x.ndim) if i not in dims]
    moved = np.moveaxis(np.asarray(x, dtype=np.float64), kept, list(range(len(kept))))
    out = np.empty(moved.shape[:len(kept)])
    grad = np.zeros_like(moved)
    for t, index in enumerate(np.ndindex(out.shape)):
        values = moved[index].ravel()
        best = max(range(len(values)), key=lambda k: values[k] if op == "amax" else -values[k])
        out[index] = values[best]
        g = grad[index].reshape(-1)
        g[best] = 1 + t
        grad[index] = g.reshape(grad[index].shape)
    return out, np.moveaxis(grad, list(range(len(kept))), kept)


@pytest.mark.parametrize("op,params,shape", CASES)
def test_planned_forward_takes_the_full_path_for_other_inputs(op, params, shape):
    m = symgrad.load(op, backend="cpu", convention="torch", **params)
    dims = tuple(d % len(shape) for d in np.atleast_1d(params.get("dim", range(len(shape)))))
    base = distinct(shape, np.float32).astype(np.float32)
    m.forward(base, threads=1)  # plans this shape and dtype
    wide = distinct(shape[:-1] + (2 * shape[-1],), np.float32, seed=1).astype(np.float32)
    inputs = [distinct(shape, np.float32, seed=2).astype(np.float32),  # planned
              np.asfortranarray(distinct(shape, np.float32, seed=3).astype(np.float32)),
              wide[..., ::2],  # strided
              distinct(shape, np.float32, seed=4).astype(">f4"),  # byte-swapped
              distinct(shape, np.float64, seed=5)]  # another dtype
    for x in inputs:
        y, saved = m.forward(x, threads=1)
        out, grad = brute(op, x, dims)
        assert y.dtype == x.dtype.newbyteorder("=") and np.array_equal(y, out.astype(y.dtype))
        (gx,) = m.backward((1 + np.arange(out.size)).reshape(out.shape).astype(y.dtype), saved, threads=1)
        assert np.array_equal(gx, grad.astype(y.dtype))
    with pytest.raises(TypeError, match="masked array"):
        m.forward(np.ma.masked_array(base, mask=np.zeros(shape, bool)))
    with pytest.raises(ValueError, match="threads must be a positive int"):
        m.forward(base, threads=0)


def test_planned_maxout_takes_the_full_path_for_other_inputs():
    """maxout's plan (_loader_maxout.py.jinja): a channels-last or strided input of a planned shape
    takes its own layout, another dtype its own kernel."""
    m = symgrad.load("maxout", backend="cpu", convention="torch", pieces=2)
    shape = (2, 6, 3, 5)
    m.forward(distinct(shape, np.float32).astype(np.float32), threads=1)  # plans this shape
    wide = distinct(shape[:-1] + (10,), np.float32, seed=1).astype(np.float32)
    channels_last = np.ascontiguousarray(distinct(shape, np.float32, seed=3).astype(np.float32)
                                         .transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    for x in [distinct(shape, np.float32, seed=2).astype(np.float32), channels_last, wide[..., ::2],
              distinct(shape, np.float64, seed=5)]:
        y, saved = m.forward(x, threads=1)
        windows = x.reshape(2, 3, 2, 3, 5)  # (N, groups, pieces, H, W)
        out = np.empty((2, 3, 3, 5), x.dtype)
        grad = np.zeros(x.shape, x.dtype)
        for b, g, i, j in np.ndindex(out.shape):
            k = max(range(2), key=lambda p: windows[b, g, p, i, j])
            out[b, g, i, j] = windows[b, g, k, i, j]
            grad[b, 2 * g + k, i, j] = 1 + b
        assert np.array_equal(y, out)
        g_out = np.broadcast_to((1 + np.arange(2, dtype=x.dtype)).reshape(2, 1, 1, 1), out.shape)
        (gx,) = m.backward(np.ascontiguousarray(g_out), saved, threads=1)
        assert np.array_equal(gx, grad)


@pytest.mark.parametrize("op,params", [("amax", {"dim": 0}), ("maxout", {"pieces": 2})])
def test_plan_cache_is_bounded_and_drops_its_plans_when_full(op, params):
    """Both loaders keep their plans in the loaders' one bounded cache (cpu/_plan_cache.py.jinja
    _PLANS, a cpu/_bounded.py.jinja _Bounded): at most 64 shapes; the 65th drops the others, whose inputs then take the full
    path again, and every call still gives the brute-force answer."""
    m = symgrad.load(op, backend="cpu", convention="torch", **params)
    m._PLANS.clear()
    shapes = [(2, 2 * k, 3) for k in range(1, 66)]
    for k, shape in enumerate(shapes):
        m.forward(distinct(shape, np.float32, seed=k).astype(np.float32), threads=1)
        assert len(m._PLANS) == k % 64 + 1 and m._planned(np.zeros(shape, np.float32)) is not None
    assert m._planned(np.zeros(shapes[0], np.float32)) is None  # dropped with the others
    for shape in shapes[:2] + shapes[-1:]:  # dropped and kept plans: the same answers
        x = distinct(shape, np.float32, seed=7).astype(np.float32)
        for _ in range(2):
            y, saved = m.forward(x, threads=1)
            if op == "amax":
                want, grad = brute(op, x, (0,))
            else:
                pairs = x.reshape(2, shape[1] // 2, 2, 3)
                want = pairs.max(axis=2)
                grad = (pairs == want[:, :, None]).astype(np.float32).reshape(shape)
            assert np.array_equal(y, want.astype(np.float32))
            if op == "amax":
                (gx,) = m.backward((1 + np.arange(want.size)).reshape(want.shape).astype(np.float32),
                                   saved, threads=1)
            else:
                (gx,) = m.backward(np.ones(want.shape, np.float32), saved, threads=1)
            assert np.array_equal(gx, grad.astype(np.float32))


LOADERS = [("amax", {"dim": 0}, True), ("maxout", {"pieces": 2}, True), ("max_pool2d", {"kernel_size": 2}, False),
           ("adaptive_max_pool2d", {"output_size": 3}, False),
           ("fractional_max_pool2d", {"kernel_size": 2, "output_size": 3}, False)]


@pytest.mark.parametrize("op,params,plans", LOADERS, ids=[c[0] for c in LOADERS])
def test_only_the_planned_loaders_define_the_plan_cache(op, params, plans):
    """The reductions' and maxout's loaders define forward's plan cache and call it; the other
    select loaders (adaptive, fractional), which never call it, hold none of it (they printed
    _plan_cache from the select skeleton).  The bounded cache is defined once where it is used
    (pooling's backward keeps its checked calls in it)."""
    (text,) = [v for k, v in render(resolve(op, **params), backends.get("cpu")).items() if k.endswith(".py")]
    assert "_plan_cache" not in text
    assert ("_PLANS" in text) == ("_planned(" in text) == ("_plan(" in text) == plans
    defined = re.findall(r"^class _Bounded\b", text, re.M)
    used = re.findall(r"_Bounded\(\d+\)", text)
    assert len(defined) == (1 if used else 0) and bool(used) == (plans or op == "max_pool2d")
