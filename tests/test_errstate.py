"""Issue 15: the NumPy modules' errstate blocks are there where an operation can raise a NumPy
floating-point warning, and say which; nowhere else (a module under the default NaN rule said "a
count may be 0 under IEEE NaN rules" around a division by a count that cannot be 0).

The oracle is NumPy itself: every mask-form module (split, all) of the window kinds, under every
NaN rule it takes, runs forward, backward and jvp on inputs full of ties, NaN, +-inf and +-0 with
every warning an error.  A block missing where it is needed fails here; one left where nothing
can warn fails the second test."""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import symgrad
from symgrad.policy import NAN_RULES

CASES = [
    ("max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 3, 9)),  # overlapping windows
    ("max_pool2d", {"kernel_size": 2}, (2, 3, 6, 6)),  # disjoint windows
    ("max_pool2d", {"kernel_size": 3, "stride": 1}, (1, 2, 5, 5)),
    ("maxout", {"pieces": 3}, (2, 6, 2)),
    ("amax", {"dim": 1}, (3, 5, 2)),
    ("amin", {}, (4, 3)),
    ("adaptive_max_pool2d", {"output_size": (3, 2)}, (2, 2, 7, 5)),
]
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 1.0, -1.0, 2.0])


def _inputs(rng, shape, dtype):
    x = rng.choice(SPECIAL, size=shape).astype(dtype)
    x.reshape(-1)[: x.size // 2] = np.nan  # whole windows of NaN, where a count may be 0
    return x


def _modules():
    for op, params, shape in CASES:
        for ties in ("split", "all"):
            for nan in sorted(NAN_RULES):
                if ties not in NAN_RULES[nan].policies:
                    continue
                yield pytest.param(op, params, shape, ties, nan, id=f"{op}-{ties}-{nan}-{len(shape)}")


@pytest.mark.parametrize("op, params, shape, ties, nan", list(_modules()))
def test_no_numpy_warning_on_special_values(op, params, shape, ties, nan):
    module = symgrad.load(op, ties=ties, nan=nan, **params)
    rng = np.random.default_rng(15)
    for dtype in (np.float32, np.float64):
        for _ in range(4):
            x = _inputs(rng, shape, dtype)
            g_seed = _inputs(rng, shape, dtype)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                y, saved = module.forward(x)
                g = rng.choice(SPECIAL, size=np.shape(y)).astype(dtype)
                module.backward(g, saved)
                module.jvp(g_seed, saved)


def _errstate_blocks(source: str):
    """(reason comment, errstate line) of every errstate block of a module."""
    found = re.findall(r"^\s*# NaN, silently: (.*(?:\n\s*#   .*)*)\n\s*with np\.errstate\((.*)\):$",
                       source, re.M)
    return [(re.sub(r"\s*\n\s*#   ", " ", reason), flags) for reason, flags in found]


@pytest.mark.parametrize("op, params, shape, ties, nan", list(_modules()))
def test_each_errstate_says_why_and_none_is_dead(op, params, shape, ties, nan):
    module = symgrad.load(op, ties=ties, nan=nan, **params)
    source = Path(module.__file__).read_text(encoding="utf-8")
    assert "a count may be 0 under IEEE NaN rules" not in source
    blocks = _errstate_blocks(source)
    for reason, flags in blocks:
        assert ("/ 0" in reason) == ("divide" in flags), (reason, flags)
    # what can warn, independently of the generator: split divides by a count, which is 0 where a
    # window has no hit (under an IEEE NaN rule, or from a forged saved state); terms adding inside
    # a block need overlapping windows (backward) or a window of several elements (jvp) and are
    # not in the gathered kinds' blocks
    split, ieee = ties == "split", NAN_RULES[nan].ieee
    assert any("0 / 0 where a window has no hit" in r for r, _ in blocks) == (split and ieee)
    assert any("saved was not made by forward" in r for r, _ in blocks) == (split and not ieee)
    if op in ("amax", "amin") and not split:
        assert blocks == [], blocks


@pytest.mark.parametrize("op, params, shape, ties, nan", [c for c in _modules() if c.values[3] == "split"])
def test_no_numpy_warning_from_a_forged_saved_state(op, params, shape, ties, nan):
    """A saved output that is no window's extremum: no window has a hit, every count is 0."""
    module = symgrad.load(op, ties=ties, nan=nan, **params)
    rng = np.random.default_rng(16)
    x = rng.choice(SPECIAL, size=shape)
    y, saved = module.forward(x)
    forged = saved._replace(output=np.full_like(saved.output, 7.0))
    g = rng.choice(SPECIAL, size=np.shape(y))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.backward(g, forged)
        module.jvp(x, forged)


def test_the_default_rule_reduction_does_not_say_a_count_may_be_0_of_forwards_windows():
    """The case the issue names: amax under split with the default NaN rule, where a NaN is a hit,
    so every window of forward's has one: its block says the count is 0 only for a saved state that
    forward did not make."""
    source = Path(symgrad.load("amax", ties="split", dim=1).__file__).read_text(encoding="utf-8")
    reasons = [r for r, _ in _errstate_blocks(source)]
    assert len(reasons) == 2 and all("saved was not made by forward" in r for r in reasons), reasons
    assert not any("0 / 0" in r or "IEEE" in r for r in reasons), reasons
