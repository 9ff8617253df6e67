"""The cpu backend's adaptive pooling forward folds a window whose rows (along the last axis) are
contiguous and at least a vector long in SIMD lanes first, keeping that only where the fold's
order cannot matter (no NaN in the window, a nonzero extremum), the winner then the first (or,
where a tie goes to the later element, the last) element equal to it; and walks its outputs in
runs, the last axis's windows advanced without a division.  Windows of 4 to 12 elements a row
(one vector, two, and a scalar tail), tie-heavy values with and without NaN/+-inf/-0, every policy
x NaN rule the op admits and both presets: forward, the saved index, backward and jvp bit for bit
the NumPy module's (test_cpu_kinds' comparisons; its own windows are narrower than a vector)."""

import pytest

import symgrad
from conftest import case_id
from test_cpu_kinds import _admitted, _compare_all

# (op, params, input shape): rows of 9 and 10 (1d: 9 to 10 elements), a channels-last plane of
# one channel (its rows contiguous too), 3d rows of 6
WIDE = [("adaptive_max_pool1d", {"output_size": 4}, (2, 3, 37)),
        ("adaptive_max_pool2d", {"output_size": (2, 3)}, (2, 2, 5, 26)),
        ("adaptive_max_pool2d", {"output_size": (3, 2)}, (1, 1, 7, 24)),
        ("adaptive_max_pool3d", {"output_size": (2, 1, 2)}, (1, 2, 4, 3, 12))]
CASES = [(op, params, shape, s) for op, params, shape in WIDE for s in _admitted(op, params)]
# the default run: test_cpu_kinds' 2-d geometry (its library built there) on wider rows, under
# the torch preset and a policy whose ties go to the later element
QUICK = [("adaptive_max_pool2d", {"output_size": (3, 4)}, (2, 2, 7, 30), s)
         for s in ({"convention": "torch"}, {"ties": "last", "nan": "dominate"})]


def _check(op, params, shape, settings):
    module = symgrad.load(op, backend="cpu", **settings, **params)
    problems = _compare_all(module, op, params, [shape], settings, ("contiguous", "channels_last"))
    assert not problems, "\n".join(problems[:10])


@pytest.mark.parametrize("op,params,shape,settings", QUICK, ids=[f"{case_id(c[0], c[1])}-{c[3]}" for c in QUICK])
def test_wide_adaptive_windows_equal_numpy_bit_for_bit(op, params, shape, settings):
    _check(op, params, shape, settings)


@pytest.mark.slow
@pytest.mark.parametrize("op,params,shape,settings", CASES, ids=[f"{case_id(c[0], c[1])}-{c[2]}-{c[3]}" for c in CASES])
def test_wide_adaptive_windows_equal_numpy_bit_for_bit_every_setting(op, params, shape, settings):
    _check(op, params, shape, settings)
