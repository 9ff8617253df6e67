"""Printers for people: derivation steps as text (Iverson brackets, DiracDelta, max/min) and as
LaTeX for the documentation pages.  The backends' code printers live in their packages
(``backends/<name>/printer.py``)."""

from __future__ import annotations

import sympy as sp
from sympy.printing.latex import LatexPrinter as SympyLatexPrinter
from sympy.printing.str import StrPrinter


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

    def _print_Equality(self, expr):
        return f"({self._print(expr.lhs)} == {self._print(expr.rhs)})"

    def _print_Quotient(self, expr):
        return f"({self._print(expr.args[0])}) / ({self._print(expr.args[1])})"

    def _print_Product(self, expr):
        return f"({self._print(expr.args[0])}) * ({self._print(expr.args[1])})"


class LatexPrinter(SympyLatexPrinter):
    """LaTeX for the documentation pages: Iverson brackets, DiracDelta, max/min (their ``_latex``
    hooks), floats as the shortest literal that reads back as the same double (as in the code)."""

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_expm1(self, expr):
        """e^x - 1 as a reader writes it (SymPy's ``\\operatorname{expm}_{1}`` reads as a subscript)."""
        return rf"\left(e^{{{self._print(expr.args[0])}}} - 1\right)"


def text(expr: sp.Basic) -> str:
    return TextPrinter().doprint(expr)


def latex(expr: sp.Basic) -> str:
    return LatexPrinter().doprint(expr)
