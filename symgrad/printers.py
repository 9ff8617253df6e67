"""Printers: one SymPy node in, one string out.  No math is decided here.

``NumpyPrinter`` subclasses SymPy's ``NumPyPrinter`` and adds the nodes of the lowered kernel
description.  A comparison is printed as a comparison (``x >= y``), never through Heaviside or a
subtraction (``inf - inf`` is NaN); Boolean connectives use NumPy's elementwise ``& | ~``; floats
are printed as the shortest literal that reads back as the same double.

``TextPrinter`` prints derivation steps for people: Iverson brackets, DiracDelta, max/min.
"""

from __future__ import annotations

import sympy as sp
from sympy.printing.numpy import NumPyPrinter
from sympy.printing.str import StrPrinter

from .indicators import IsNan
from .lower import Count, Quotient, Select

_INFIX = {"==": "==", ">": ">", ">=": ">=", "<": "<", "<=": "<="}


def _bare(s: str) -> str:
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


class NumpyPrinter(NumPyPrinter):
    """SymPy's NumPy printer, with ``np`` as the module name and the lowered nodes added."""

    _module = "np"

    def __init__(self, settings=None):
        super().__init__({"strict": True, "fully_qualified_modules": True, **(settings or {})})

    def _print_Relational(self, expr):
        op = _INFIX[expr.rel_op]
        return f"({self._print(expr.lhs)} {op} {self._print(expr.rhs)})"

    def _bool_join(self, expr, sep):
        return "(" + f" {sep} ".join(self._print(a) for a in expr.args) + ")"

    def _print_And(self, expr):
        return self._bool_join(expr, "&")

    def _print_Or(self, expr):
        return self._bool_join(expr, "|")

    def _print_Not(self, expr):
        return f"~{self._print(expr.args[0])}"

    def _print_BooleanTrue(self, expr):
        return "True"

    def _print_BooleanFalse(self, expr):
        return "False"

    def _print_IsNan(self, expr):
        return f"np.isnan({self._print(expr.args[0])})"

    def _print_Select(self, expr):
        cond, a, b = expr.args
        if b == 0:  # the generated module's _select: np.where(cond, a, 0) without a branch
            return f"_select({_bare(self._print(cond))}, {self._print(a)})"
        return f"np.where({_bare(self._print(cond))}, {self._print(a)}, {self._print(b)})"

    def _print_Quotient(self, expr):
        return f"({self._print(expr.args[0])}) / ({self._print(expr.args[1])})"

    def _print_Count(self, expr):
        # the number of conditions that hold, added up in the working dtype
        out = f"np.add({self._print(expr.args[0])}, {self._print(expr.args[1])}, dtype=dtype)" \
            if len(expr.args) > 1 else f"np.asarray({self._print(expr.args[0])}, dtype=dtype)"
        for a in expr.args[2:]:
            out = f"np.add({out}, {self._print(a)})"
        return out

    def _print_MaxOf(self, expr):
        return self._fold("np.maximum", expr.args)

    def _print_MinOf(self, expr):
        return self._fold("np.minimum", expr.args)

    def _fold(self, fn, args):
        out = self._print(args[0])
        for a in args[1:]:
            out = f"{fn}({out}, {self._print(a)})"
        return out

    def _print_Float(self, expr):
        return repr(float(expr))


class TextPrinter(StrPrinter):
    """Readable text for derivation steps."""

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_DiracDelta(self, expr):
        return f"delta({self._print(expr.args[0])})"

    def _print_Select(self, expr):
        c, a, b = expr.args
        return f"({self._print(a)} if {self._print(c)} else {self._print(b)})"

    def _print_Count(self, expr):
        return "#{" + ", ".join(self._print(a) for a in expr.args) + "}"

    def _print_Quotient(self, expr):
        return f"({self._print(expr.args[0])}) / ({self._print(expr.args[1])})"


_ARG = {("max", "first"): "np.argmax({a}, axis=-1)",
        ("min", "first"): "np.argmin({a}, axis=-1)",
        ("max", "last"): "{a}.shape[-1] - 1 - np.argmax({a}[..., ::-1], axis=-1)",
        ("min", "last"): "{a}.shape[-1] - 1 - np.argmin({a}[..., ::-1], axis=-1)"}


def numpy_arg_extremum(extremum: str, order: str, array: str) -> str:
    """The NumPy call giving the scan winner along the last axis.

    np.argmax/argmin return the first occurrence of the extremum and treat NaN as winning, which
    is exactly a strict scan under the NaN rule; 'last' runs it on the reversed axis.
    """
    return _ARG[extremum, order].format(a=array)


def numpy_extremum_fold(extremum: str, a: str, b: str) -> str:
    """Elementwise extremum of two arrays; np.maximum/np.minimum propagate NaN (NaN dominates)."""
    return f"np.{'maximum' if extremum == 'max' else 'minimum'}({a}, {b})"


def numpy_extremum_reduce(extremum: str, array: str) -> str:
    return f"np.{'max' if extremum == 'max' else 'min'}({array}, axis=-1)"


def numpy_code(expr: sp.Basic) -> str:
    return NumpyPrinter().doprint(expr)


def text(expr: sp.Basic) -> str:
    return TextPrinter().doprint(expr)


__all__ = ["NumpyPrinter", "TextPrinter", "numpy_code", "text", "IsNan", "Select", "Count", "Quotient"]
