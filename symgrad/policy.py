"""Tie policies: the one place that decides who wins a tie, and what NaN does.

In the W-matrix view, max over pieces p_0..p_{n-1} is sum_i w_i * p_i, where each weight w_i is
a product of comparison indicators. A policy decides which comparisons are strict:

    first  w_i = prod_{j<i} [p_i > p_j] * prod_{j>i} [p_i >= p_j]   (one winner: the lowest index)
    last   w_i = prod_{j<i} [p_i >= p_j] * prod_{j>i} [p_i > p_j]   (one winner: the highest index)
    split  w_i = E_i / sum_k E_k,  E_i = prod_{j!=i} [p_i >= p_j]   (tied winners share equally)
    all    w_i = E_i                                                 (each tied winner gets it all)

min is the same with every comparison reversed.  'all' is not a subgradient: at a k-way tie the
weights sum to k.

NaN rule (every policy): NaN dominates.  A NaN beats every number in both max and min, and NaNs tie
with each other, so a window holding a NaN has output NaN and its gradient goes to its NaN
elements under the policy (first NaN, last NaN, split among the NaNs, or each NaN).  This is the
comparison semantics that ``nan_aware`` gives the lowered code.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sympy as sp

from .indicators import Indicator, IsNan, compare, crossing_form

POLICIES = ("first", "last", "split", "all")
DEFAULT_POLICY = "first"


@dataclass(frozen=True)
class PolicyInfo:
    name: str
    rule: str  # one line: who gets the gradient at a tie
    subgradient: bool  # False: the weights of a tie sum to more than 1


INFO = {
    "first": PolicyInfo("first", "a tie goes wholly to the tied element that comes first", True),
    "last": PolicyInfo("last", "a tie goes wholly to the tied element that comes last", True),
    "split": PolicyInfo("split", "a k-way tie gives each tied element 1/k", True),
    "all": PolicyInfo(
        "all",
        "a k-way tie gives each tied element the whole gradient "
        "(NOT a subgradient: the weights of a k-way tie sum to k)",
        False,
    ),
}

def _formula(strict_before: str, strict_after: str):
    def f(kind: str) -> str:
        b, a = (strict_before, strict_after) if kind == "max" else (
            strict_before.replace(">", "<"), strict_after.replace(">", "<"))
        return f"w_k = prod_(j<k) [x_k {b} x_j] * prod_(j>k) [x_k {a} x_j]"
    return f


def _formula_mask(split: bool):
    def f(kind: str) -> str:
        e = f"E_k = prod_(j!=k) [x_k {'>=' if kind == 'max' else '<='} x_j]"
        return f"w_k = E_k / sum_j E_j, {e}" if split else f"w_k = {e}"
    return f


FORMULA = {
    "first": _formula(">", ">="),
    "last": _formula(">=", ">"),
    "split": _formula_mask(True),
    "all": _formula_mask(False),
}

NAN_RULE = (
    "NaN dominates: a NaN wins every comparison in max and min and NaNs tie with each other, "
    "so a window holding NaN outputs NaN and its gradient goes to its NaN element(s) under the policy"
)


def check_policy(ties: object) -> str:
    """Validate a policy name (None means the default)."""
    if ties is None:
        return DEFAULT_POLICY
    if not isinstance(ties, str):
        raise TypeError(f"ties must be one of {', '.join(POLICIES)} (a string), got {ties!r}")
    if ties not in POLICIES:
        raise ValueError(f"unknown tie policy ties={ties!r}; expected one of: {', '.join(POLICIES)}")
    return ties


def _beats(a: sp.Expr, b: sp.Expr, kind: str, strict: bool) -> Indicator:
    """[a beats b] for a max (a > b) or a min (a < b)."""
    if kind == "max":
        return compare(sp.Gt if strict else sp.Ge, a, b)
    return compare(sp.Lt if strict else sp.Le, a, b)


@functools.lru_cache(maxsize=64)
def weights(pieces: tuple[sp.Expr, ...], policy: str, kind: str) -> list[sp.Expr]:
    """The W-matrix row of an extremum: w_i for each piece, as indicator products."""
    n = len(pieces)
    if policy in ("first", "last"):
        strict_before = policy == "first"  # first: must beat earlier pieces strictly
        return [
            sp.Mul(*[_beats(pieces[i], pieces[j], kind, strict_before if j < i else not strict_before)
                     for j in range(n) if j != i])
            for i in range(n)
        ]
    wins = [sp.Mul(*[_beats(pieces[i], pieces[j], kind, False) for j in range(n) if j != i])
            for i in range(n)]
    if policy == "all":
        return wins
    count = sp.Add(*wins)
    return [w / count for w in wins]


# ---------------------------------------------------------------------------------------------
# NaN semantics of a comparison, used when the derivation is lowered to code.

def isnan_of(e: sp.Expr) -> sp.Basic:
    """isnan(e) for the pieces that occur here: numbers, symbols, c*symbol."""
    if e.is_number:
        return sp.false
    coeff, rest = e.as_coeff_Mul()
    if coeff.is_number and coeff.is_finite and coeff != 0 and rest.is_Symbol:
        return IsNan(rest)
    return IsNan(e)


def nan_aware(ind: Indicator) -> sp.Basic:
    """The Boolean that the lowered code evaluates for [rel] under the NaN rule.

    non-strict  [a >= b]  ->  (a >= b) | isnan(a)
    strict      [a > b]   ->  (a > b) | (isnan(a) & ~isnan(b))

    Two linear pieces of one variable are compared through the variable (x >= 0.01*x is
    emitted as x >= 0: equal for real x, and right at +-inf where both pieces overflow), while
    the NaN terms still follow the pieces: x and 0.01*x are NaN together, a tie.
    """
    rel = ind.rel
    nan_a, nan_b = isnan_of(rel.lhs), isnan_of(rel.rhs)
    crossing = crossing_form(ind)
    rel = rel if crossing is None else crossing
    if ind.strict:
        # a and b NaN together (x vs 0.01*x) tie, and a tie is no strict win
        return rel if nan_a == nan_b else sp.Or(rel, sp.And(nan_a, sp.Not(nan_b)))
    return sp.Or(rel, nan_a)


def nan_aware_equal(v: sp.Expr, extremum: sp.Expr) -> sp.Basic:
    """[v is the extremum of its window] given the extremum under the NaN rule: (v == m) | isnan(v)."""
    return sp.Or(sp.Eq(v, extremum, evaluate=False), isnan_of(v))
