"""Derivation of kthvalue, median and nanmedian (kinds/median.py): one row of the sort's W.

On the representative row x0, x1, x2 ranked ascending (derive_order.rank_weights: the policy's
W of the whole sort, checked there on every weak ordering) the output selects rank r: kthvalue
r = k - 1 (a k beyond the row of 3: its last rank), a median r = (3 - 1) // 2 = 1.  Its W row is
row r of the sort's W; at the tie x = (1, 1, 0) rank 1 lies in the tie block of x0 and x1, so the
policy decides: first [1, 0, 0], last [0, 1, 0], split [1/2, 1/2, 0], all [1, 1, 0].  JAX's
midpoint (an even count) is shown on a row of 4: half of rank 1's row and half of rank 2's.
"""

from __future__ import annotations

import functools

import sympy as sp

from .derivation import Derivation, Step
from .derive_order import ROW, _check_sort, _tie_point, order_symbols, rank_weights
from .kinds.median import midpoint, rank_words
from .ops import Op

_POLICY_WORDS = {
    "first": "first: rank_i = sum_(j<i) [x_j <= x_i] + sum_(j>i) [x_j < x_i] (a stable sort), W[i] = [rank_i = {r}]",
    "last": "last: rank_i = sum_(j<i) [x_j < x_i] + sum_(j>i) [x_j <= x_i], W[i] = [rank_i = {r}]",
    "split": "split: a_i = sum_(j!=i) [x_j < x_i], t_i = 1 + sum_(j!=i) [x_j >= x_i][x_j <= x_i]; "
             "W[i] = [a_i <= {r} < a_i + t_i] / t_i (1/t to each element of the tie block holding rank {r})",
    "all": "all: a_i, t_i as for split; W[i] = [a_i <= {r} < a_i + t_i] (a one at each element of the "
           "tie block holding rank {r}: not a subgradient)"}


def _rank(name: str, k: int | None) -> int:
    return min(k, ROW) - 1 if name == "kthvalue" else (ROW - 1) // 2


def _at(row, point) -> sp.Matrix:
    return sp.Matrix([[sp.simplify(e.xreplace(point)) for e in row]])


@functools.lru_cache(maxsize=32)
def _derive(name: str, ties: str, k: int | None, mid: bool, words: str):
    xs = order_symbols()
    W = rank_weights(xs, ties, False)
    r = _rank(name, k)
    row = list(W.row(r))
    y = sum((w * x for w, x in zip(row, xs)), sp.S.Zero)
    g = sp.Symbol("g", real=True)
    tie = dict(zip(xs, _tie_point(ROW)))
    steps = [
        Step("forward", f"{name}: a representative row x0, x1, x2 ranked ascending (NaN ranks as the "
             f"largest value); the output selects {words}: here rank {r}", (("y", y),)),
        Step("W-form", _POLICY_WORDS[ties].format(r=r), tuple((f"W[{i}]", w) for i, w in enumerate(row))),
        Step("W at a tie", f"x = {tuple(_tie_point(ROW))}: rank {r} lies in a tie block; the row of W "
             "(columns: elements)", (("W", _at(row, tie)),)),
        Step("backward", "W is constant where no two elements tie: dy/dx = W, and grad_x = W^T g "
             "(g the output's gradient)", tuple((f"grad_x{i}", w * g) for i, w in enumerate(row))),
    ]
    if mid:
        steps.append(_midpoint_step(ties))
    checks = _check_sort(xs, W, ties, False)
    checks.append(f"the output is row {r} of that W (rank {r} of the ascending order)")
    partials = {x: sp.Matrix([w]) for x, w in zip(xs, row)}
    return xs, sp.Matrix([y]), partials, steps, checks


def _midpoint_step(ties: str) -> Step:
    """JAX's even count: W = (W[1] + W[2]) / 2 on a row of 4, at the tie (1, 1, 0, 2)."""
    xs4 = sp.symbols("x0:4", real=True)
    W4 = rank_weights(xs4, ties, False)
    row = [(a + b) / 2 for a, b in zip(W4.row(1), W4.row(2))]
    tie = dict(zip(xs4, (1, 1, 0, 2)))
    return Step("midpoint (JAX)", "an even count: jnp.median averages the two middle ranks, y = (y_1 + "
                "y_2) * 0.5 on a row of 4, so W is half of each rank's row; at x = (1, 1, 0, 2), where "
                "ranks 1 and 2 are one tie block", (("W", _at(row, tie)),))


def derive_median(op: Op) -> Derivation:
    """The Derivation of kthvalue, median or nanmedian (no max/min nodes)."""
    xs, y, partials, steps, checks = _derive(op.name, op.ties, op.params.get("k"), midpoint(op),
                                             rank_words(op))
    return Derivation(op, xs, y, [], dict(partials), list(steps), list(checks))
