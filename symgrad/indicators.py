"""The symbolic vocabulary of the W-matrix view.

* ``Indicator(rel)`` is the Iverson bracket [rel] of a comparison: 1 where it holds, 0 elsewhere.
  Its derivative is a DiracDelta on the comparison's boundary.  Unlike SymPy's
  ``Heaviside(a - b)`` it never takes the value 1/2 and it remembers whether the comparison was
  strict, which is exactly what a tie policy decides.
* ``MaxOf(*args)`` / ``MinOf(*args)`` are max and min that keep their arguments in the order given
  (SymPy's ``Max`` sorts them); argument order is what a tie policy is applied to.
* ``IsNan(e)`` is the predicate "e is NaN", used once the comparisons are lowered to code.
* ``Literal(name, value)`` is a parameter's value kept as a symbol, printed as the value: where a
  framework computes ``x * 0`` SymPy would fold ``0*x`` to ``0``.
"""

from __future__ import annotations

import math

import sympy as sp
from sympy.core.relational import Relational
from sympy.logic.boolalg import BooleanFunction

_UPPER = (sp.StrictGreaterThan, sp.GreaterThan)
_LOWER = (sp.StrictLessThan, sp.LessThan)
_STRICT = (sp.StrictGreaterThan, sp.StrictLessThan)


def canonical_delta(arg: sp.Expr) -> tuple[sp.Expr, int]:
    """DiracDelta(arg) written as sign * DiracDelta(d) with d in one canonical orientation.

    DiracDelta is even, so delta(a - b) and delta(b - a) are the same distribution; SymPy does
    not identify them, and cancellation needs it to.  Returns (DiracDelta(d), 1).
    """
    if arg.could_extract_minus_sign():
        arg = -arg
    return sp.DiracDelta(arg), 1


class Indicator(sp.Function):
    """Iverson bracket of a comparison: ``Indicator(x > y)`` is 1 where x > y and 0 elsewhere."""

    nargs = 1
    is_real = True
    is_nonnegative = True

    @classmethod
    def eval(cls, rel):
        if rel is sp.true:
            return sp.S.One
        if rel is sp.false:
            return sp.S.Zero
        if not isinstance(rel, Relational) or not isinstance(rel, _UPPER + _LOWER):
            raise TypeError(f"Indicator takes a comparison (>, >=, <, <=), got {rel!r}")
        return None

    @property
    def rel(self) -> Relational:
        return self.args[0]

    @property
    def strict(self) -> bool:
        return isinstance(self.rel, _STRICT)

    @property
    def gap(self) -> sp.Expr:
        """The expression that the comparison tests against 0: [gap > 0] or [gap >= 0]."""
        lhs, rhs = self.rel.lhs, self.rel.rhs
        return lhs - rhs if isinstance(self.rel, _UPPER) else rhs - lhs

    def non_strict(self) -> "Indicator":
        """The same comparison with equality admitted (they differ only on the boundary)."""
        if not self.strict:
            return self
        lhs, rhs = self.rel.lhs, self.rel.rhs
        return compare(sp.Ge if isinstance(self.rel, _UPPER) else sp.Le, lhs, rhs)

    def _eval_derivative(self, s):
        # d/ds [g > 0] = delta(g) * dg/ds, for strict and non-strict alike.
        gap = self.gap
        dgap = sp.diff(gap, s)
        if dgap == 0:
            return sp.S.Zero
        delta, sign = canonical_delta(gap if gap.is_Add and len(gap.args) == 2 else sp.expand(gap))
        return sign * delta * dgap

    def _latex(self, printer):
        return r"\left[%s\right]" % printer._print(self.rel)

    def _sympystr(self, printer):
        return "[%s]" % printer._print(self.rel)


class _Extremum(sp.Function):
    """Common base of MaxOf/MinOf: an unevaluated, order-keeping max or min."""

    is_real = True
    kind = ""

    @classmethod
    def eval(cls, *args):
        if len(args) < 1:
            raise TypeError(f"{cls.__name__} needs at least one argument")
        return None

    def _latex(self, printer):
        return r"\%s\left(%s\right)" % (self.kind, ", ".join(printer._print(a) for a in self.args))

    def _sympystr(self, printer):
        return "%s(%s)" % (self.kind, ", ".join(printer._print(a) for a in self.args))


class MaxOf(_Extremum):
    """max(a, b, ...) with its arguments kept in the given order."""

    kind = "max"


class MinOf(_Extremum):
    """min(a, b, ...) with its arguments kept in the given order."""

    kind = "min"


class IsNan(BooleanFunction):
    """The predicate 'e is NaN' (a Boolean-valued function for lowered comparisons)."""

    nargs = 1

    @classmethod
    def eval(cls, e):
        if e.is_number:
            return sp.false if e.is_finite or e.is_infinite else None
        return None

    def _sympystr(self, printer):
        return "isnan(%s)" % printer._print(self.args[0])


class SignBit(BooleanFunction):
    """The predicate 'e has its sign bit set' for a number e (-0 and every negative number; false
    for NaN): it tells -0 from +0, which compare equal."""

    nargs = 1

    @classmethod
    def eval(cls, e):
        if e.is_number and e.is_extended_real:  # a constant is never -0 (SymPy has one zero)
            return sp.true if e.is_extended_negative else sp.false
        return None

    def _sympystr(self, printer):
        return "signbit(%s)" % printer._print(self.args[0])


class Literal(sp.Symbol):
    """A parameter's value (a float) kept as a symbol through the derivation and the lowering,
    printed as the value.

    SymPy folds ``0*x`` to ``0``, so leaky_relu(x, 0) = max(x, 0*x) would be derived as relu;
    PyTorch and JAX compute ``x * 0`` (NaN at x = +-inf, -0 for x < 0; the gradient ``g * 0``).
    Under their presets the slope 0 enters as a Literal: a real symbol SymPy cannot fold, whose
    value the printers write where it stands (``0.0*x``).  It sorts before the inputs, as a number
    does (its class key), so products read as they would with the number.
    """

    def __new__(cls, name: str, value: float):
        obj = sp.Symbol.__xnew__(cls, name, real=True)
        obj.value = float(value)
        return obj

    def __reduce_ex__(self, protocol):
        return (Literal, (self.name, self.value))

    def _hashable_content(self):
        # -0.0 == 0.0 in Python; the sign of the value is part of what it is
        return super()._hashable_content() + (self.value, math.copysign(1.0, self.value))

    def _sympystr(self, printer):
        return repr(self.value)

    def _latex(self, printer):
        return repr(self.value)


def literal_values(e: sp.Expr) -> sp.Expr:
    """e with every Literal replaced by its value (SymPy then folds what it can)."""
    lits = {a: sp.Float(a.value) for a in e.atoms(Literal)}
    return e.xreplace(lits) if lits else e


_FLIP = {sp.StrictGreaterThan: sp.StrictLessThan, sp.GreaterThan: sp.LessThan,
         sp.StrictLessThan: sp.StrictGreaterThan, sp.LessThan: sp.GreaterThan}


def crossing_form(ind: "Indicator") -> Relational | None:
    """[a ? b] for two linear pieces of one variable s, as s ? (their crossing point), or None.

    E.g. [x >= 0.01*x] is x >= 0 and [-x > x] is x < 0.  The two agree on every real x, and
    only the second is right at x = +-inf, where both pieces overflow to the same value.
    """
    cls, a, b = type(ind.rel), ind.rel.lhs, ind.rel.rhs
    if (a.is_Symbol and b.is_Symbol) or (a.is_number or b.is_number):
        return None  # already a comparison of the variables themselves
    gap = sp.expand(a - b) if cls in (sp.StrictGreaterThan, sp.GreaterThan) else sp.expand(b - a)
    # a Literal coefficient (a slope of 0) decides the crossing by its value
    gap = sp.expand(literal_values(gap))
    syms = gap.free_symbols
    if len(syms) != 1:
        return None
    (s,) = syms
    c = gap.coeff(s)
    k = sp.expand(gap - c * s)
    if not (c.is_number and k.is_number) or c == 0:
        return None
    up = cls if cls in (sp.StrictGreaterThan, sp.GreaterThan) else _FLIP[cls]
    point = -k / c
    if isinstance(point, sp.Float) and point == int(point):
        point = sp.Integer(int(point)) if point != 0 else sp.S.Zero
    # c*s + k > 0  <=>  s > -k/c for c > 0, s < -k/c for c < 0
    return (up if c > 0 else _FLIP[up])(s, point)


def compare(cls, a: sp.Expr, b: sp.Expr) -> Indicator | sp.Integer:
    """Indicator(cls(a, b)), evaluated to 0/1 only where it is decided (numbers, or a == b).

    Relationals are built without SymPy's sign inference, which dominates the cost of large
    windows; the result is the same object ``Indicator(cls(a, b))`` would give.
    """
    if a == b or (a.is_number and b.is_number):
        return Indicator(cls(a, b))
    # the same objects Indicator(cls(a, b, evaluate=False)) builds, without the dispatch
    return sp.Basic.__new__(Indicator, sp.Basic.__new__(cls, a, b))


def _replace(e: sp.Expr, old: sp.Symbol, new: sp.Expr) -> sp.Expr:
    if e.is_Symbol:
        return new if e == old else e
    return e.xreplace({old: new})


def substitute(ind: Indicator, old: sp.Symbol, new: sp.Expr) -> sp.Expr:
    """ind with old replaced by new in its comparison (0/1 where that decides it)."""
    rel = ind.rel
    return compare(type(rel), _replace(rel.lhs, old, new), _replace(rel.rhs, old, new))


class IeeeNot(BooleanFunction):
    """not(b), kept as written: under IEEE comparisons not(a <= b) is true when a or b is NaN,
    so it must not be rewritten to a > b (SymPy's Not would)."""

    nargs = 1

    @classmethod
    def eval(cls, b):
        if b is sp.true:
            return sp.false
        if b is sp.false:
            return sp.true
        return None

    def _sympystr(self, printer):
        return "not(%s)" % printer._print(self.args[0])


def indicators_in(expr: sp.Expr) -> list[Indicator]:
    """All Indicator factors of a product (in order)."""
    return [f for f in sp.Mul.make_args(expr) if isinstance(f, Indicator)]
