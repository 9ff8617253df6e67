"""What the backends' code printers share: one SymPy node in, one string out, no math decided.

Each backend's printer (``backends/<name>/printer.py``) subclasses a SymPy code printer and adds the
nodes of the lowered kernel description (lower.py).  A comparison is printed as a comparison, never
through Heaviside or a subtraction (``inf - inf`` is NaN)."""

from __future__ import annotations

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
