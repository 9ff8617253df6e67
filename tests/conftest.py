"""Shared fixtures and the op table the tests are parametrized over."""

from __future__ import annotations

import os

import numpy as np
import pytest
import sympy as sp

from symgrad.indicators import MaxOf, MinOf
from symgrad.policy import POLICIES


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Every test generates into one private cache, and keys derivations with a secret of its
    own, never the user's."""
    old = {v: os.environ.get(v) for v in ("SYMGRAD_CACHE_DIR", "SYMGRAD_KEY_FILE")}
    os.environ["SYMGRAD_CACHE_DIR"] = str(tmp_path_factory.mktemp("symgrad-cache"))
    os.environ["SYMGRAD_KEY_FILE"] = str(tmp_path_factory.mktemp("symgrad-config") / "key")
    yield
    for var, value in old.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value


# Elementwise ops with parameters: (op, params, input shapes)
ELEMENTWISE = [
    ("maximum", {}, [(3, 4), (3, 4)]),
    ("maximum", {}, [(3, 1), (4,)]),  # broadcasting
    ("minimum", {}, [(2, 5), (2, 5)]),
    ("relu", {}, [(4, 5)]),
    ("clamp", {"min": 0}, [(4, 5)]),
    ("clamp", {"max": 0.5}, [(4, 5)]),
    ("clamp", {"min": -1.0, "max": 1.0}, [(4, 5)]),
    ("clamp", {"min": 1.0, "max": -1.0}, [(4, 5)]),  # min > max: the output is max
    ("hardtanh", {}, [(4, 5)]),
    ("hardtanh", {"min_val": -2.0, "max_val": 3.0}, [(4, 5)]),
    ("relu6", {}, [(4, 5)]),
    ("leaky_relu", {}, [(4, 5)]),
    ("leaky_relu", {"negative_slope": 0.2}, [(4, 5)]),
    ("leaky_relu", {"negative_slope": -0.5}, [(4, 5)]),
    ("leaky_relu", {"negative_slope": 2.0}, [(4, 5)]),  # slope > 1: the envelope is a min
    ("leaky_relu", {"negative_slope": 0.0}, [(4, 5)]),  # presets: x * 0 (indicators.Literal)
    ("abs", {}, [(4, 5)]),
]

# Window ops: (op, params, input shape)
WINDOWED = [
    ("max_pool1d", {"kernel_size": 2}, (2, 3, 8)),
    ("max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 9)),
    ("max_pool1d", {"kernel_size": 3, "stride": 1, "dilation": 2}, (3, 10)),  # unbatched
    ("max_pool1d", {"kernel_size": 2, "stride": 3, "padding": 1, "ceil_mode": True}, (2, 2, 8)),
    ("max_pool2d", {"kernel_size": 2}, (2, 3, 6, 6)),
    ("max_pool2d", {"kernel_size": 2, "stride": 1}, (2, 2, 5, 5)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 2, 7, 7)),
    ("max_pool2d", {"kernel_size": (3, 2), "stride": (2, 1), "padding": (1, 0), "dilation": (1, 2)}, (2, 7, 8)),
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "ceil_mode": True}, (1, 2, 8, 8)),
    ("max_pool3d", {"kernel_size": 2}, (1, 2, 4, 4, 4)),
    ("max_pool3d", {"kernel_size": 2, "stride": 1, "padding": 1}, (2, 3, 3, 3)),  # unbatched
    ("maxout", {"pieces": 2}, (2, 6, 3)),
    ("maxout", {"pieces": 3}, (2, 6)),
    ("amax", {}, (3, 4)),
    ("amax", {"dim": 1}, (3, 4, 2)),
    ("amax", {"dim": (0, 2), "keepdim": True}, (3, 4, 2)),
    ("amin", {"dim": -1}, (3, 5)),
    ("amin", {"dim": (1,), "keepdim": True}, (2, 3, 4)),
]


def case_id(op, params, *_):
    return op + "".join(f"-{k}{v}" for k, v in params.items()).replace(" ", "")


def sympy_value(expr, env):
    """Evaluate a derivation expression exactly with SymPy (max/min with SymPy's Max/Min)."""
    expr = expr.replace(lambda e: isinstance(e, MaxOf), lambda e: sp.Max(*e.args))
    expr = expr.replace(lambda e: isinstance(e, MinOf), lambda e: sp.Min(*e.args))
    return expr.xreplace(env)


def tie_heavy(rng, shape, levels=3):
    """Values drawn from a few small integers, so ties are common (exact in every float type)."""
    return rng.integers(0, levels, size=shape).astype(np.float64)


def tie_free(rng, shape, gap=0.05):
    """Distinct values at least `gap` apart, in random order."""
    n = int(np.prod(shape))
    return (rng.permutation(n) * gap - n * gap / 2 + 0.013).reshape(shape)


__all__ = ["ELEMENTWISE", "WINDOWED", "POLICIES", "case_id", "sympy_value", "tie_heavy", "tie_free"]


# The files whose session fixtures compile for minutes (nvcc and the CUDA harness; the cpu
# backend's libraries) and the longest CLI file are collected first: the tests run a file per
# worker (pytest-xdist --dist loadfile), handed out in collection order, so these start at once
# instead of being the last file left on one worker while the other idles.
_FIRST = ("test_cuda.py", "test_cpu_kinds.py", "test_cpu.py", "test_cli.py")


def same_values(got, want, zeros=True) -> bool:
    """Same dtype, shape and values, NaN where NaN and (with zeros) the same signs of zero."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    got, want = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(got)
    ok = (nan == np.isnan(want)) & (nan | (got == want))
    if zeros:
        ok &= nan | (np.signbit(got) == np.signbit(want))
    return bool(ok.all())


def assert_same_values(got, want, what, zeros=True):
    assert same_values(got, want, zeros), \
        f"{what}: got {np.asarray(got).tolist()}, want {np.asarray(want).tolist()}"


def pytest_configure(config):
    # `-m slow` also sets SYMGRAD_SLOW=1, so that module-level sizes (hypothesis example counts)
    # can read it before any fixture runs (xdist workers inherit it)
    if slow_run(config):
        os.environ["SYMGRAD_SLOW"] = "1"


def examples(default: int, slow: int) -> int:
    """A hypothesis example count: $SYMGRAD_CONVENTION_EXAMPLES, else `slow` in a slow run, else
    `default`."""
    if os.environ.get("SYMGRAD_CONVENTION_EXAMPLES"):
        return int(os.environ["SYMGRAD_CONVENTION_EXAMPLES"])
    return slow if os.environ.get("SYMGRAD_SLOW") == "1" else default


def slow_run(config) -> bool:
    """Whether this run includes the exhaustive variants (`-m slow` or SYMGRAD_SLOW=1)."""
    return "slow" in (config.getoption("markexpr") or "") or os.environ.get("SYMGRAD_SLOW") == "1"


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: _FIRST.index(item.path.name) if item.path.name in _FIRST else len(_FIRST))
    # exhaustive variants (@pytest.mark.slow) run with `-m slow` or SYMGRAD_SLOW=1; the default run
    # keeps their representative set
    if slow_run(config):
        return
    skip = pytest.mark.skip(reason="exhaustive variant: run with -m slow (or SYMGRAD_SLOW=1)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def first_entry_of_each_op(entries):
    """Catalog entries as test parameters: the first of each op in the default run, the others
    with -m slow (the suite must stay under 15 minutes on 2 cores)."""
    seen = set()
    for e in entries:
        yield e if e.name not in seen else pytest.param(e, marks=pytest.mark.slow)
        seen.add(e.name)
