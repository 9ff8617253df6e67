"""Special values give the documented result, for every op, tie policy and float dtype.

* NaN, +-inf, -0.0 (it ties with 0.0), subnormals, the largest finite values and all-equal windows,
  against tests/oracle.py: README's max/min forms with the tie policies and the NaN rule (NaN
  dominates max and min; NaNs tie with each other; padding never wins);
* index and count types: the emitted code holds every index and count in a type that cannot
  overflow (checked in the source and on the type-choosing helpers for lengths past 2**31 and
  2**32, where allocating such inputs is out of reach), and a float16 count past 65504 ties.

BACKENDS lists what runs the generated code.  Today that is NumPy; CUDA's CPU-execution harness
joins the list as one more entry (a loader and a pair of array conversions) when the CUDA backend
lands, and every test here then runs on it too.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pytest

import symgrad
from oracle import reference
from symgrad.policy import POLICIES

ROOT = Path(__file__).resolve().parents[1]


class Backend(NamedTuple):
    name: str
    load: Callable  # (op, ties, **params) -> module with forward(*inputs), backward(g, saved)
    to_backend: Callable  # NumPy array -> the backend's array
    to_numpy: Callable  # the backend's array -> NumPy array


BACKENDS = [
    pytest.param(Backend("numpy", lambda op, ties, **p: symgrad.load(op, backend="numpy", ties=ties, **p),
                         np.asarray, np.asarray), id="numpy"),
    # CUDA joins here when its backend lands: Backend("cuda", <load with backend="cuda">,
    # <NumPy -> harness array>, <harness array -> NumPy>), run through the CPU execution harness.
]

DTYPES = [np.float16, np.float32, np.float64]


def specials(dtype) -> np.ndarray:
    """NaN, +-inf, +-0, +-the smallest subnormal, the smallest normal, +-the largest finite value,
    and the ops' kinks and bounds (-1, 0.5, 1, 6)."""
    fi = np.finfo(dtype)
    return np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, fi.smallest_subnormal, -fi.smallest_subnormal,
                     fi.smallest_normal, fi.max, -fi.max, 1.0, -1.0, 0.5, 6.0], dtype=dtype)


def pairs(s: np.ndarray) -> np.ndarray:
    """Every ordered pair of values, one per row: with the diagonal, all-equal pairs."""
    return np.array(list(itertools.product(s, repeat=2)), dtype=s.dtype)


def mixed(s: np.ndarray, rng, shape, block) -> np.ndarray:
    """Half the leading entries drawn from s at random, half all-equal blocks of `block` shape
    (so every window lying in a block is all-equal)."""
    x = rng.choice(s, size=shape)
    coarse = rng.choice(s, size=shape[:-len(block)] + tuple(n // b for n, b in zip(shape[-len(block):], block)))
    for axis, b in zip(range(-len(block), 0), block):
        coarse = np.repeat(coarse, b, axis=axis)
    x[: shape[0] // 2] = coarse[: shape[0] // 2]
    return x.astype(s.dtype)


# (op, params, inputs(specials, rng) -> list of arrays)
ELEMENTWISE = [
    ("maximum", {}, lambda s, r: [s[:, None], s[None, :]]),
    ("minimum", {}, lambda s, r: [s[:, None], s[None, :]]),
    ("relu", {}, lambda s, r: [s]),
    ("clamp", {"min": -1.0, "max": 1.0}, lambda s, r: [s]),
    ("clamp", {"min": 0}, lambda s, r: [s]),
    ("clamp", {"max": 0.5}, lambda s, r: [s]),
    ("clamp", {"min": 1.0, "max": -1.0}, lambda s, r: [s]),
    ("hardtanh", {}, lambda s, r: [s]),
    ("hardtanh", {"min_val": 0.5, "max_val": 6.0}, lambda s, r: [s]),
    ("relu6", {}, lambda s, r: [s]),
    ("leaky_relu", {}, lambda s, r: [s]),
    ("leaky_relu", {"negative_slope": 0.0}, lambda s, r: [s]),
    ("leaky_relu", {"negative_slope": -0.5}, lambda s, r: [s]),
    ("leaky_relu", {"negative_slope": 2.0}, lambda s, r: [s]),
    ("abs", {}, lambda s, r: [s]),
]

WINDOWED = [
    ("max_pool1d", {"kernel_size": 2}, lambda s, r: [pairs(s).reshape(1, -1)]),
    ("max_pool1d", {"kernel_size": 3, "stride": 1, "padding": 1},
     lambda s, r: [np.stack([np.repeat(s, 3), r.permutation(np.repeat(s, 3))])]),
    ("max_pool1d", {"kernel_size": 2, "stride": 3, "padding": 1, "ceil_mode": True},
     lambda s, r: [r.choice(s, size=(2, 3, 11))]),
    ("max_pool2d", {"kernel_size": 2}, lambda s, r: [mixed(s, r, (4, 6, 8), (2, 2))]),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1},
     lambda s, r: [mixed(s, r, (2, 2, 9, 9), (3, 3))]),
    ("max_pool3d", {"kernel_size": 2}, lambda s, r: [mixed(s, r, (2, 2, 4, 4, 4), (2, 2, 2))]),
    ("max_pool3d", {"kernel_size": 2, "stride": 1, "padding": 1}, lambda s, r: [r.choice(s, size=(2, 3, 3, 3))]),
    ("maxout", {"pieces": 2}, lambda s, r: [pairs(s)]),
    ("maxout", {"pieces": 3}, lambda s, r: [mixed(s, r, (8, 6, 2), (3, 1))]),
    ("amax", {}, lambda s, r: [s]),  # one window holding every special value, NaN included
    ("amax", {"dim": 0}, lambda s, r: [s[1:, None]]),  # ... and without NaN: +inf wins
    ("amax", {"dim": -1}, lambda s, r: [pairs(s)]),
    ("amin", {"dim": -1}, lambda s, r: [pairs(s)]),
    ("amax", {"dim": (0, 2), "keepdim": True}, lambda s, r: [r.choice(s, size=(3, 4, 5))]),
    ("amin", {"dim": 1}, lambda s, r: [np.repeat(s[:, None], 4, axis=1)]),  # all-equal rows
]

CASES = ELEMENTWISE + WINDOWED


def case_id(c) -> str:
    return c[0] + "".join(f"-{k}{v}" for k, v in c[1].items()).replace(" ", "")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,make", CASES, ids=[case_id(c) for c in CASES])
@pytest.mark.parametrize("backend", BACKENDS)
def test_special_values_give_the_documented_result(backend, op, params, make, ties, dtype):
    rng = np.random.default_rng(8)
    inputs = [np.asarray(x, dtype=dtype) for x in make(specials(dtype), rng)]
    m = backend.load(op, ties, **params)
    with np.errstate(over="ignore"):  # 2.0 * the largest finite value: inf, as documented
        y, saved = m.forward(*[backend.to_backend(x) for x in inputs])
    y = backend.to_numpy(y)
    g = (1 + np.arange(y.size) % 3).reshape(y.shape).astype(dtype)  # 1, 2, 3: exact everywhere
    grads = [backend.to_numpy(gx) for gx in m.backward(backend.to_backend(g), saved)]
    want_y, want_grads = reference(op, params, ties, inputs, g)

    eps, tiny = float(np.finfo(dtype).eps), float(np.finfo(dtype).smallest_subnormal)
    assert y.dtype == dtype and y.shape == want_y.shape
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want_y), err_msg="NaN positions")
    # outputs are selections, except pieces such as 0.01*x, rounded in the input's type
    with np.errstate(over="ignore"):
        want_y = want_y.astype(dtype)  # what the largest finite value times 2 becomes: inf
    np.testing.assert_allclose(y.astype(np.float64), want_y.astype(np.float64),
                               rtol=2 * eps, atol=2 * tiny, err_msg="output")
    assert len(grads) == len(inputs)
    for k, (gx, want, x) in enumerate(zip(grads, want_grads, inputs)):
        assert gx.shape == x.shape and gx.dtype == dtype
        assert not np.isnan(gx).any(), f"gradient {k} holds NaN"
        # ties move whole units of g (or g/k for split): a tolerance of a few ulps hides none
        np.testing.assert_allclose(gx.astype(np.float64), want, rtol=8 * eps, atol=8 * eps,
                                   err_msg=f"gradient of input {k}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op", ["max_pool1d", "max_pool2d"])
def test_padding_never_wins_against_nan_or_minus_inf(backend, op, ties):
    """Windows at the border whose inside is all -inf, or NaN: the padding still never wins."""
    spatial = int(op[8])
    m = backend.load(op, ties, kernel_size=3, stride=1, padding=1)
    for fill in (-np.inf, np.nan):
        x = np.full((1,) + (4,) * spatial, fill)
        y, saved = m.forward(backend.to_backend(x))
        g = np.ones(backend.to_numpy(y).shape)
        (gx,) = m.backward(backend.to_backend(g), saved)
        want_y, (want_g,) = reference(op, {"kernel_size": 3, "stride": 1, "padding": 1}, ties, [x], g)
        np.testing.assert_array_equal(backend.to_numpy(y), want_y)
        np.testing.assert_allclose(backend.to_numpy(gx), want_g, rtol=1e-15)
        # every window's gradient reached the input: its mass is 1, or its number of winners
        if ties != "all":
            assert backend.to_numpy(gx).sum() == pytest.approx(g.sum())


# ----------------------------------------------------------------------------- index types

INT_DTYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "intp",
              "uintp", "int_", "intc", "uintc", "short", "ushort", "long", "ulong", "longlong",
              "ulonglong", "byte", "ubyte"}
WIDE = {"int64", "uint64", "intp"}


def _fresh_sources() -> dict[str, str]:
    """Sources of one module of every template and selection form (scan and mask)."""
    from symgrad.ops import resolve
    from symgrad import backends
    from symgrad.pipeline import render
    ops = [("maximum", "split", {}), ("clamp", "first", {"min": 0, "max": 6}), ("max_pool2d", "first", {"kernel_size": 3}),
           ("max_pool2d", "split", {"kernel_size": 2}), ("max_pool3d", "all", {"kernel_size": 2}),
           ("maxout", "last", {"pieces": 3}), ("maxout", "split", {"pieces": 3}),
           ("amax", "first", {}), ("amin", "split", {"dim": 1}), ("amax", "all", {"dim": (0, 1)})]
    out = {}
    for op, ties, params in ops:
        ((name, src),) = render(resolve(op, ties, **params), backends.get("numpy")).items()
        out[name] = src
    return out


def _sources() -> dict[str, str]:
    src = {p.name: p.read_text(encoding="utf-8") for p in sorted((ROOT / "generated" / "numpy").glob("*.py"))}
    src.update(_fresh_sources())
    return src


def test_emitted_code_holds_indices_and_counts_in_types_that_cannot_overflow():
    """Every integer type the emitted code names is 64-bit, except the saved window-local index:
    INDEX_DTYPE (static windows, checked to hold WINDOW - 1 below) and the type that
    _index_dtype(n) picks for a reduction of n elements (checked past 2**31 and 2**32 below).
    Python's int and the builtin `int` dtype (32-bit on some platforms) are never used as a dtype."""
    for name, src in _sources().items():
        tree = ast.parse(src)
        allowed_narrow = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "INDEX_DTYPE" for t in node.targets):
                allowed_narrow |= {id(n) for n in ast.walk(node)}
            if isinstance(node, ast.FunctionDef) and node.name == "_index_dtype":
                allowed_narrow |= {id(n) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in INT_DTYPES and getattr(node.value, "id", "") == "np":
                assert node.attr in WIDE or id(node) in allowed_narrow, \
                    f"{name}:{node.lineno}: np.{node.attr} can overflow an index or a count"
            if isinstance(node, ast.keyword) and node.arg == "dtype":
                assert not (isinstance(node.value, ast.Name) and node.value.id in ("int", "long")), \
                    f"{name}:{node.lineno}: dtype=int is 32-bit on some platforms"
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not any(node.value == t for t in INT_DTYPES - WIDE), \
                    f"{name}:{node.lineno}: narrow integer type {node.value!r}"


@pytest.mark.parametrize("pieces", [1, 2, 257])
def test_static_window_index_type_holds_every_window_position(pieces):
    from symgrad.lower import smallest_index_dtype
    from symgrad.ops import MAX_WINDOW
    m = symgrad.load("maxout", ties="first", pieces=pieces)  # the same modules as test_generated_numpy
    assert m.WINDOW == pieces
    assert np.iinfo(m.INDEX_DTYPE).max >= pieces - 1
    assert np.iinfo(smallest_index_dtype(MAX_WINDOW)).max >= MAX_WINDOW - 1  # the largest window


@pytest.mark.parametrize("n", [1, 256, 257, 2**16, 2**16 + 1, 2**31 - 1, 2**31, 2**31 + 5, 2**32,
                               2**32 + 1, 2**40])
def test_reduction_index_type_holds_every_position(n):
    """The saved index of a reduction over n elements (lengths past 2**31 and 2**32 included,
    where the inputs themselves would not fit here) holds n - 1."""
    m = symgrad.load("amax", ties="first")
    t = m._index_dtype(n)
    assert np.iinfo(t).max >= n - 1
    assert np.dtype(t).itemsize <= 8


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("ties", ["first", "last", "split", "all"])
def test_reduction_past_the_float16_range_of_a_count(ties, dtype):
    """70000 tied elements (more than float16's largest finite value, 65504) and a winner past
    index 65535 (more than uint16 holds)."""
    n = 70_000
    x = np.zeros(n, dtype=dtype)
    m = symgrad.load("amax", ties=ties)
    y, saved = m.forward(x)
    (gx,) = m.backward(np.ones((), dtype=dtype), saved)
    mass = gx.astype(np.float64).sum()
    if ties == "all":
        assert (gx == 1).all()
    elif ties == "split":
        # each share 1/70000 rounds in its own type (in float16 a subnormal: within 0.25 %)
        assert mass == pytest.approx(1.0, rel={np.float16: 5e-3, np.float32: 1e-5, np.float64: 1e-12}[dtype])
        assert (gx > 0).all()
    else:
        assert mass == 1.0 and gx[0 if ties == "first" else -1] == 1.0
    x[n - 3] = 1.0  # a single winner far past 65535
    y, saved = m.forward(x)
    (gx,) = m.backward(np.ones((), dtype=dtype), saved)
    assert y == 1.0 and gx[n - 3] == 1.0 and gx.astype(np.float64).sum() == 1.0
