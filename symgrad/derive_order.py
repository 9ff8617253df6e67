"""Derivation of the order statistics (kinds/order.py): sort, topk, cummax, cummin.

SymPy objects only, like ``derive``; ``derive.derive`` hands the kind over to here.

sort / topk.  On a representative row x0, x1, x2 (the rule is the same for every length) output
r selects the element of rank r: y_r = sum_i W[r, i] x_i.  Ranks are written with comparison
indicators, ``x_j ranks before x_i`` being [x_j > x_i] for a descending order, [x_j < x_i] for an
ascending one (NaN ranks as the largest value; the code compares a total-order key):

* first: rank_i = sum_{j<i} [x_j >= x_i] + sum_{j>i} [x_j > x_i] (the lower index ranks first:
  a stable sort), W[r, i] = [rank_i = r]; last: the strictness swapped;
* split / all: a_i = sum_{j!=i} [x_j > x_i] elements rank before i and t_i = 1 + sum_{j!=i}
  [x_j >= x_i][x_j <= x_i] tie with it; i's tie block is the ranks a_i .. a_i + t_i - 1, and W[r, i] =
  [a_i <= r < a_i + t_i] / t_i (split: the mean of the tied ranks' rows), without / t_i (all).

W is constant where no two elements tie, so dy/dx = W there and backward is W^T g; at a tie W is
the policy's choice.  The checks, on every weak ordering of the row: W x is the sorted row, W's
rows (and, for first/last, its columns) sum to 1 (split: the rows do; all: each tied row sums to
the block's size), first/last's W is a permutation, and at every strict ordering W is the
Jacobian of the sort (finite differences in exact rationals).

cummax / cummin.  Output i is the max (min) of the prefix x[0..i]: row i of W is the tie policy's
W-row of that prefix (``policy.weights``, the W-form of every max in symgrad).  Under the JAX
preset (order_form "tree") a tie's elements share by their places in jax.lax.associative_scan's
tree of binary maxima, each sending 1/2 to two equal operands: the derivation lists that W at an
all-tied row of 5 next to the even split.
"""

from __future__ import annotations

import functools
import itertools
from fractions import Fraction

import sympy as sp

from . import policy as _policy
from .derivation import Derivation, Step
from .indicators import compare
from .kinds.median import selects_one
from .kinds.order import cumulative, descending
from .ops import Op

ROW = 3  # the representative row


def order_symbols():
    return sp.symbols(f"x0:{ROW}", real=True)


def _before(a, b, descending: bool, strict: bool):
    """[a ranks before b]: a > b (>=) for a descending order, a < b (<=) for an ascending one."""
    if descending:
        return compare(sp.Gt if strict else sp.Ge, a, b)
    return compare(sp.Lt if strict else sp.Le, a, b)


def rank_weights(xs, ties: str, descending: bool) -> sp.Matrix:
    """W[r, i] of a full sort of the row xs under a tie policy (the rows of a top-k: its first k)."""
    n = len(xs)
    if _policy.TIES[ties].single:
        strict_before = ties == "last"  # first: an earlier equal element ranks before

        def rank(i):
            return sp.Add(*[_before(xs[j], xs[i], descending, strict_before if j < i else not strict_before)
                            for j in range(n) if j != i])
        return sp.Matrix(n, n, lambda r, i: sp.Piecewise((1, sp.Eq(rank(i), r)), (0, True)))
    ahead = [sp.Add(*[_before(xs[j], xs[i], descending, True) for j in range(n) if j != i]) for i in range(n)]
    tied = [1 + sp.Add(*[compare(sp.Ge, xs[j], xs[i]) * compare(sp.Le, xs[j], xs[i]) for j in range(n) if j != i])
            for i in range(n)]

    def w(r, i):
        inside = sp.Piecewise((1, sp.And(sp.Le(ahead[i], r), sp.Lt(r, ahead[i] + tied[i]))), (0, True))
        return inside / tied[i] if ties == "split" else inside
    return sp.Matrix(n, n, w)


def prefix_weights(xs, ties: str, kind: str) -> sp.Matrix:
    """W[i, j] of a cumulative max/min: row i the policy's W-row of the prefix x[0..i]."""
    n = len(xs)
    rows = [list(_policy.weights(tuple(xs[:i + 1]), ties, kind)) + [sp.S.Zero] * (n - i - 1) for i in range(n)]
    return sp.Matrix(rows)


def tree_weights(values, kind: str) -> list[list[Fraction]]:
    """W of jax.lax.associative_scan's cumulative max/min of numbers (no NaN), as JAX's jvp
    computes it: each binary max/min sends 1/2 to each of two equal operands (_balanced_eq).
    Rows: outputs; each entry is an exact Fraction."""
    better = max if kind == "max" else min

    def comb(a, b):  # a, b: (value, weights)
        z = better(a[0], b[0])
        wa = Fraction(1, 2) if a[0] == z and b[0] == z else Fraction(int(a[0] == z))
        wb = Fraction(1, 2) if a[0] == z and b[0] == z else Fraction(int(b[0] == z))
        return z, [wa * p + wb * q for p, q in zip(a[1], b[1])]

    def scan(elems):
        if len(elems) < 2:
            return elems
        reduced = [comb(elems[k], elems[k + 1]) for k in range(0, len(elems) - 1, 2)]
        odd = scan(reduced)
        evens = [comb(odd[k], elems[2 * k + 2]) for k in range(len(elems[2::2]))]
        even = [elems[0]] + evens
        out = []
        for k in range(len(elems)):
            out.append(even[k // 2] if k % 2 == 0 else odd[k // 2])
        return out

    n = len(values)
    unit = [(v, [Fraction(int(i == j)) for j in range(n)]) for i, v in enumerate(values)]
    return [w for _, w in scan(unit)]


def _weak_orderings(n: int):
    """Every weak ordering of n elements, as values in 0..n-1 (ties included)."""
    seen = set()
    for vals in itertools.product(range(n), repeat=n):
        ranks = tuple(sorted(set(vals)).index(v) for v in vals)
        if ranks not in seen:
            seen.add(ranks)
            yield ranks


def _check_sort(xs, W, ties: str, descending: bool) -> list[str]:
    n = len(xs)
    orderings = list(_weak_orderings(n))
    strict = 0
    for vals in orderings:
        env = dict(zip(xs, vals))
        Wv = W.xreplace(env).applyfunc(lambda e: sp.simplify(e))
        y = list(Wv * sp.Matrix(vals))
        want = sorted(vals, reverse=descending)
        if ties in ("first", "last", "split") and y != want:
            raise AssertionError(f"sort {ties}: W x = {y} at {vals}, not the sorted row {want}")
        for r in range(n):
            tie = sum(1 for v in vals if v == want[r])
            if sum(Wv.row(r)) != (tie if ties == "all" else 1):
                raise AssertionError(f"sort {ties}: row {r} of W sums to {sum(Wv.row(r))} at {vals}")
        if ties in ("first", "last") and any(sum(Wv.col(i)) != 1 for i in range(n)):
            raise AssertionError(f"sort {ties}: W is not a permutation at {vals}")
        if ties in ("first", "last"):
            order = sorted(range(n), key=lambda i: (-vals[i] if descending else vals[i], i if ties == "first" else -i))
            if [list(Wv.row(r)).index(1) for r in range(n)] != order:
                raise AssertionError(f"sort {ties}: W's ranks {Wv} at {vals} are not the {ties} order {order}")
        if len(set(vals)) == n:  # strict: W is the Jacobian of the sort (exact differences)
            strict += 1
            h = Fraction(1, 4)
            for i in range(n):
                moved = [Fraction(v) + (h if j == i else 0) for j, v in enumerate(vals)]
                diff = [(a - b) / h for a, b in zip(sorted(moved, reverse=descending), want)]
                if diff != list(Wv.col(i)):
                    raise AssertionError(f"sort: the difference quotient {diff} != W's column {i} at {vals}")
    return [f"all {len(orderings)} weak orderings of a row of {n}: "
            + ("W x is the sorted row, " if ties != "all" else "")
            + ("each row of W sums to 1" if ties != "all" else "row r of W sums to the size of rank r's tie")
            + ("; W is a permutation, the policy's order of equal elements" if ties in ("first", "last") else ""),
            f"the {strict} strict orderings: W is the Jacobian of the sort (difference quotients in exact "
            f"rationals), so backward W^T g is the exact adjoint there"]


def _tie_point(n: int):
    return [1] * (n - 1) + [0]  # two (n - 1)-way tied maxima above a smaller element


@functools.lru_cache(maxsize=64)
def _derive_sort(name: str, ties: str, descending: bool, k: int | None):
    xs = order_symbols()
    W = rank_weights(xs, ties, descending)
    rows = ROW if k is None else max(1, min(k, ROW))  # (k = 0 selects nothing: rank 0's rule shown)
    Wk = W[:rows, :]
    gs = sp.symbols(f"g0:{rows}", real=True)
    at = dict(zip(xs, _tie_point(ROW)))
    order = "descending" if descending else "ascending"
    policy_words = {
        "first": "first: rank_i = sum_(j<i) [x_j {ge} x_i] + sum_(j>i) [x_j {gt} x_i] (a stable sort), "
                 "W[r,i] = [rank_i = r]",
        "last": "last: rank_i = sum_(j<i) [x_j {gt} x_i] + sum_(j>i) [x_j {ge} x_i], W[r,i] = [rank_i = r]",
        "split": "split: a_i = sum_(j!=i) [x_j {gt} x_i], t_i = 1 + sum_(j!=i) [x_j >= x_i][x_j <= x_i]; "
                 "W[r,i] = [a_i <= r < a_i + t_i] / t_i (the mean of the tied ranks' rows)",
        "all": "all: a_i, t_i as for split; W[r,i] = [a_i <= r < a_i + t_i] (every tied rank's row "
               "whole: not a subgradient)"}[ties]
    ge, gt = (">=", ">") if descending else ("<=", "<")
    steps = [
        Step("forward", f"{name}: a representative row x0, x1, x2 ranked {order} (NaN ranks as the "
             f"largest value; the rule is the same for every length)"
             + (f"; the first k = {k} ranks" if k is not None else "")
             + (" (none: the rule of rank 0 is shown)" if k == 0 else ""),
             tuple((f"y_{r}", (Wk * sp.Matrix(xs))[r]) for r in range(rows))),
        Step("W-form", policy_words.format(ge=ge, gt=gt),
             tuple((f"W[{r},{i}]", Wk[r, i]) for r in range(rows) for i in range(ROW))),
        Step("W at a tie", f"x = {tuple(_tie_point(ROW))}: rows are ranks, columns elements",
             tuple((f"W[{r},:]", sp.Matrix([[sp.simplify(Wk[r, i].xreplace(at)) for i in range(ROW)]]))
                   for r in range(rows))),
        Step("backward", "W is constant where no two elements tie: dy/dx = W, and grad_x = W^T g",
             tuple((f"grad_x{i}", (Wk.T * sp.Matrix(gs))[i]) for i in range(ROW))),
    ]
    checks = _check_sort(xs, W, ties, descending)
    partials = {x: sp.Matrix(Wk[:, i]) for i, x in enumerate(xs)}
    return xs, Wk * sp.Matrix(xs), partials, steps, checks


@functools.lru_cache(maxsize=32)
def _derive_cumulative(name: str, kind: str, ties: str, order_form: str):
    xs = order_symbols()
    W = prefix_weights(xs, ties, kind)
    gs = sp.symbols(f"g0:{ROW}", real=True)
    steps = [
        Step("forward", f"{name}: output i = {kind}(x[0..i]) on a representative row x0, x1, x2",
             tuple((f"y_{i}", (W * sp.Matrix(xs))[i]) for i in range(ROW))),
        Step("W-form", f"row i: the policy's W-row of the prefix x[0..i] ({_policy.TIES[ties].formula(kind)})",
             tuple((f"W[{i},{j}]", W[i, j]) for i in range(ROW) for j in range(i + 1))),
        Step("backward", "W is constant off ties: dy/dx = W, grad_x = W^T g (each element gathers the "
             "outputs it holds)", tuple((f"grad_x{j}", (W.T * sp.Matrix(gs))[j]) for j in range(ROW))),
    ]
    checks = []
    for vals in _weak_orderings(ROW):
        Wv = W.xreplace(dict(zip(xs, vals))).applyfunc(sp.simplify)
        pick = max if kind == "max" else min
        y = list(Wv * sp.Matrix(vals))
        if ties != "all" and y != [pick(vals[:i + 1]) for i in range(ROW)]:
            raise AssertionError(f"{name} {ties}: W x = {y} at {vals}")
    checks.append(f"all {len(list(_weak_orderings(ROW)))} weak orderings of a row of {ROW}: "
                  + ("W x is the running extremum" if ties != "all" else "each prefix's tied elements get 1"))
    if order_form == "tree":
        tied = [0] * 5
        tree = tree_weights(tied, kind)
        steps.append(Step(
            "tree split (JAX)", "lax.cummax/cummin's gradient is that of jax.lax.associative_scan's tree "
            "of binary max/min, each sending 1/2 to two equal operands: W of an all-tied row of 5",
            tuple((f"W[{i},:]", sp.Matrix([[sp.Rational(w.numerator, w.denominator) for w in tree[i]]]))
                  for i in range(5))))
        sums = [sum(row) for row in tree]
        if sums != [1] * 5:
            raise AssertionError(f"{name}: the tree's rows sum to {sums}")
        issue = [sum(c) for c in zip(*tree_weights([1, 0, 0, 2, 0], "min"))]
        if issue != [1, Fraction(9, 4), Fraction(5, 4), 0, Fraction(1, 2)]:
            raise AssertionError(f"{name}: the tree's W^T 1 at cummin([1, 0, 0, 2, 0]) is {issue}")
        checks.append("the tree's rows sum to 1 (a subgradient); at cummin([1, 0, 0, 2, 0]) W^T 1 = "
                      "[1, 9/4, 5/4, 0, 1/2], JAX's gradient")
    partials = {x: sp.Matrix(W[:, i]) for i, x in enumerate(xs)}
    return xs, W * sp.Matrix(xs), partials, steps, checks


def derive_order(op: Op, display: bool = False) -> Derivation:
    """The Derivation of an order statistic (no max/min nodes: ``nodes`` is empty)."""
    if selects_one(op.name):  # kthvalue, median, nanmedian: one rank (derive_median.py)
        from .derive_median import derive_median
        return derive_median(op)
    if cumulative(op.name):
        xs, y, partials, steps, checks = _derive_cumulative(op.name, op.spec.extremum, op.ties, op.order_form)
    else:
        k = op.params["k"] if op.name == "topk" else None
        xs, y, partials, steps, checks = _derive_sort(op.name, op.ties, descending(op), k)
    return Derivation(op, xs, y, [], dict(partials), list(steps), list(checks))
