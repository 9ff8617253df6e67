"""The running-scan lowering equals the indicator products it replaces.

For first/last the W-form has O(n^2) comparisons per window; the generated code runs one scan
that replaces the running winner when a later element beats it with the comparison the W-form uses
against earlier elements.  Here the scan (the generated module's saved index) is compared with
the winner read off the indicator products, on every weak ordering of up to 4 elements and on
random tie-heavy windows of 9 and 27 elements, for max and min.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

import symgrad
from symgrad.derive import _make_node, derive, evaluate, weak_orderings, window_symbols
from symgrad.indicators import Indicator, MaxOf
from symgrad.lower import lower, selection, smallest_index_dtype
from symgrad.ops import resolve
from symgrad.policy import weights


def _product_winner(windows: np.ndarray, ties: str, kind: str) -> np.ndarray:
    """Index of the element whose indicator-product weight is 1, per window (rows)."""
    n = windows.shape[1]
    xs = window_symbols(n)
    ws = weights(xs, ties, kind)
    env = {x: windows[:, i] for i, x in enumerate(xs)}
    w = np.stack([np.broadcast_to(np.asarray(evaluate(wi, env), dtype=np.float64), len(windows))
                  for wi in ws], axis=1)
    assert (w.sum(axis=1) == 1).all()  # exactly one winner
    return w.argmax(axis=1)


def _scan_winner(windows: np.ndarray, ties: str, kind: str) -> np.ndarray:
    n = windows.shape[1]
    if kind == "max":
        m = symgrad.load("max_pool1d", kernel_size=n, ties=ties)
        _, saved = m.forward(windows.reshape(1, -1))  # stride n: one window per row
    else:
        m = symgrad.load("amin", dim=-1, ties=ties)
        _, saved = m.forward(windows)
    return saved.index.reshape(-1).astype(np.int64)


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("ties", ["first", "last"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_scan_equals_products_on_every_weak_ordering(n, ties, kind):
    windows = np.array(list(weak_orderings(n)), dtype=np.float64)
    assert len(windows) == {1: 1, 2: 3, 3: 13, 4: 75}[n]  # ordered Bell numbers
    np.testing.assert_array_equal(_scan_winner(windows, ties, kind), _product_winner(windows, ties, kind))


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("ties", ["first", "last"])
@pytest.mark.parametrize("n", [9, 27])
def test_scan_equals_products_on_random_ties(n, ties, kind):
    rng = np.random.default_rng(n)
    windows = rng.integers(0, 3, size=(500, n)).astype(np.float64)
    windows[:5] = 1.0  # all-equal windows
    np.testing.assert_array_equal(_scan_winner(windows, ties, kind), _product_winner(windows, ties, kind))


@pytest.mark.parametrize("ties,form", [("first", "scan"), ("last", "scan"), ("split", "mask"), ("all", "mask")])
def test_lowering_reads_the_form_off_the_derivation(ties, form):
    k = lower(derive(resolve("max_pool2d", kernel_size=3, ties=ties)))
    assert k.selection.form == form
    if form == "scan":
        assert k.saved == ("index",) and k.index_dtype == "uint8"
        # first must beat the running winner strictly, last only needs to equal it
        assert (">" in str(k.selection.take)) and ((">=" in str(k.selection.take)) == (ties == "last"))
    else:
        assert k.selection.counts == (ties == "split")


def test_a_w_form_that_is_no_scan_is_not_lowered_to_one():
    """Every comparison strict: no winner at a tie, and the lowering must refuse it."""
    xs = window_symbols(3)
    node = _make_node(sp.Symbol("y"), MaxOf(*xs), "first")
    node.weights = [sp.Mul(*[Indicator(sp.Gt(xs[i], xs[j])) for j in range(3) if j != i])
                    for i in range(3)]
    with pytest.raises(AssertionError, match="unrecognized"):
        selection(node, xs)


@pytest.mark.parametrize("n,dtype", [(1, "uint8"), (256, "uint8"), (257, "uint16"), (65536, "uint16"),
                                     (65537, "uint32")])
def test_smallest_index_dtype(n, dtype):
    assert smallest_index_dtype(n) == dtype
