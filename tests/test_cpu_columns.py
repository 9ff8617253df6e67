"""The cpu reductions' column kernels (the mask form on a block of reduced dims with others after it,
folded as it lies: select.c.jinja's _select_reduction) and the forward's fold of a row in SIMD lanes
(a NaN flagged on the side): forward and backward equal the NumPy module's bits on columns and
rows whose extremum is a zero of either sign, a NaN, or a tie, in every dtype; the exhaustive
variant under every mask policy x NaN rule and both presets, amax and amin."""

import numpy as np
import pytest

import symgrad
from symgrad.ops import resolve
from symgrad.policy import NAN_RULES

# (shape, dim): columns of 2-d arrays, a block with kept dims before and after it
CASES = [((9, 2), 0), ((6, 5), 0), ((3, 7, 4), 0), ((2, 5, 3, 4), (1, 2))]
# rows of 16 elements or more (the fold in lanes: 32 float or 16 double lanes a step), a NaN in the
# lanes' loop, the first step or the tail
ROWS = [((70,), 0), ((16,), 0), ((3, 70), -1), ((2, 3, 50), (1, 2)), ((5, 16), 1)]
# more rows (rows of 33 or 100 differed where the NumPy module took np.max's zero, whose sign
# depends on NumPy's lanes: now every setting has a zeros rule, the plain op the first zero)
LANE_ROWS = [((33,), 0), ((4, 100), -1)]
# mask-form settings (the column kernels' form): every NaN rule of 'split' and 'all', both presets
SETTINGS = ([{"ties": t, "nan": n} for n, rule in NAN_RULES.items() for t in ("split", "all")
             if t in rule.policies] + [{"convention": "torch"}, {"convention": "jax"}])


def test_columns_equal_the_numpy_module():
    _check("amax", {"convention": "torch"}, [(s, 0) for s, d in CASES if d == 0])


def test_rows_folded_in_lanes_equal_the_numpy_module():
    _check("amax", {"convention": "torch"}, ROWS[:2] + LANE_ROWS[:1], None)  # the library of the test above


@pytest.mark.slow
@pytest.mark.parametrize("op", ["amax", "amin"])
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(s.values()))
def test_columns_equal_the_numpy_module_every_setting(op, settings):
    _check(op, settings, CASES)
    _check(op, settings, ROWS + LANE_ROWS, None)


def _inputs(rng, shape, dtype):
    """Ties everywhere: zeros of both signs and +-1 (columns whose extremum is a zero among them),
    and a NaN in some columns.  float16 without zeros: there the rows' kernels already differ from
    the NumPy module under the torch preset (a column of +-0 gives -0 against NumPy's +0)."""
    values = [-1.0, 1.0] if dtype == np.float16 else [-1.0, -0.0, 0.0, 1.0]
    x = rng.choice(np.array(values), size=shape)
    nan = x.copy()
    nan.flat[::5] = np.nan
    ties = np.round(rng.standard_normal(shape) * 2)  # an extremum the lanes' fold keeps
    one_nan = ties.reshape(-1, shape[-1]).copy()  # a NaN a row: at the last (the tail), 20, 40 (the lanes' loop) or 3
    rows = np.arange(len(one_nan))
    one_nan[rows, np.array([-1, 20, 3, 40])[rows % 4] % shape[-1]] = np.nan
    arrays = [x, nan, ties, one_nan.reshape(shape)]
    if dtype != np.float16:
        zeros = rng.choice(np.array([-1.0, -0.0, 0.0]), size=shape)
        arrays += [zeros, -zeros]
    return [a.astype(dtype) for a in arrays]


def _check(op, settings, cases, layout="columns"):
    rng = np.random.default_rng(5)
    for shape, dim in cases:
        try:
            resolve(op, dim=dim, **settings)
        except ValueError:  # a setting the op does not admit
            continue
        cpu = symgrad.load(op, backend="cpu", dim=dim, **settings)
        ref = symgrad.load(op, dim=dim, **settings)
        assert _kernel_layout(cpu, shape) == layout, (shape, dim)  # the kernels under test
        for dtype in (np.float16, np.float32, np.float64):
            for k, x in enumerate(_inputs(rng, shape, dtype)):
                (y, s), (y0, s0) = cpu.forward(x), ref.forward(x)
                g = rng.standard_normal(y.shape).astype(dtype)
                what = (op, settings, shape, dim, dtype.__name__, k)
                assert y.tobytes() == y0.tobytes() and y.shape == y0.shape, what
                assert cpu.backward(g, s)[0].tobytes() == ref.backward(g, s0)[0].tobytes(), what


def _kernel_layout(module, shape) -> str | None:
    """The layout the loader passes the forward kernel an input of this shape in."""
    loader = module.forward.__globals__
    dims, kept, n, _ = loader["_layout"](shape)
    return loader["_kernel_input"](np.zeros(shape, np.float32), dims, kept, n)[0]
