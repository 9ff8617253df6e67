"""What the backends' code printers share: one SymPy node in, one string out, no math decided.

Each backend's printer (``backends/<name>/printer.py``) subclasses a SymPy code printer and adds the
nodes of the lowered kernel description (lower.py).  A comparison is printed as a comparison, never
through Heaviside or a subtraction (``inf - inf`` is NaN)."""

from __future__ import annotations

import sympy as sp

from ..lower import Shared

INFIX = {"==": "==", ">": ">", ">=": ">=", "<": "<", "<=": "<="}


def float_value(expr) -> float:
    """A SymPy number as the double nearest to it (one rounding), +-inf where it overflows, as
    NumPy reads a literal beyond the range of double (float() of a large int raises instead)."""
    import math
    from fractions import Fraction

    import sympy as sp
    expr = sp.sympify(expr)
    if expr.is_Rational:
        try:
            return float(Fraction(int(expr.p), int(expr.q)))
        except OverflowError:
            return math.inf if expr > 0 else -math.inf
    return float(expr)  # a Float: mpmath rounds to the nearest double, inf beyond the range


class ConditionPrinter:
    """Comparisons and Boolean connectives in a backend's operators (AND, OR, NOT, TRUE, FALSE,
    set by each printer): a comparison is printed as a comparison, in parentheses; a connective
    joins its printed operands.  Listed first among a printer's bases, so these methods win."""

    AND = OR = NOT = TRUE = FALSE = ""

    def _print_Relational(self, expr):
        return f"({self._print(expr.lhs)} {INFIX[expr.rel_op]} {self._print(expr.rhs)})"

    def _bool_join(self, expr, sep):
        return "(" + f" {sep} ".join(self._print(a) for a in expr.args) + ")"

    def _print_And(self, expr):
        return self._bool_join(expr, self.AND)

    def _print_Or(self, expr):
        return self._bool_join(expr, self.OR)

    def _print_Not(self, expr):
        return f"{self.NOT}{self._print(expr.args[0])}"

    def _print_BooleanTrue(self, expr):
        return self.TRUE

    def _print_BooleanFalse(self, expr):
        return self.FALSE


def bare(s: str) -> str:
    """Drop one pair of parentheses that wraps the whole string."""
    if not (s.startswith("(") and s.endswith(")")):
        return s
    depth = 0
    for i, ch in enumerate(s):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(s) - 1:
            return s
    return s[1:-1]


def operand(printer, e, clean=lambda s: s) -> str:
    """An operand of a division: a shared temporary's name as it is, anything else in
    parentheses."""
    return printer._print(e) if isinstance(e, Shared) else f"({clean(printer._print(e))})"


def integer_code(e: sp.Expr, floor_div, ceil_div) -> str:
    """An integer expression of ``symgrad.geometry`` (sums and products of integers, floor and
    ceiling of a quotient of nonnegative integers) as code: ``floor_div(p, q)`` and
    ``ceil_div(p, q)`` print floor(p / q) and ceiling(p / q) from the printed p and q."""

    def code(e, inner=False) -> str:
        if e.is_Symbol or e.is_Integer:
            return str(e)
        if isinstance(e, (sp.floor, sp.ceiling)):
            p, q = sp.fraction(sp.together(e.args[0]))
            return (floor_div if isinstance(e, sp.floor) else ceil_div)(code(p), code(q, True))
        if e.is_Add:
            s = " + ".join(code(t) for t in sorted(e.args, key=lambda t: (t.is_number, sp.default_sort_key(t))))
            return f"({s})" if inner else s
        if e.is_Mul:
            factors = sorted(e.args, key=lambda f: (not f.is_Add, sp.default_sort_key(f)))
            s = " * ".join(code(f, True) for f in factors)
            return f"({s})" if inner else s
        raise ValueError(f"not an integer expression of the window geometry: {e}")

    return code(e)


def python_integer_code(expr: sp.Expr) -> str:
    """An integer expression of the window geometry in Python's integer arithmetic (ints and NumPy
    integer arrays, in the NumPy modules and the CUDA loaders): floor division ``//``, and
    ceiling(p / q) as -(-p // q)."""
    return integer_code(expr, lambda p, q: f"({p}) // {q}", lambda p, q: f"-(-({p}) // {q})")
