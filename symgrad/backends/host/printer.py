"""The host language's printer (NumPy): ``NumpyPrinter`` subclasses SymPy's ``NumPyPrinter`` and
adds the nodes of the lowered kernel description.  It prints the Python that every backend emits:
the NumPy backend's modules (that backend keeps no printer.py of its own) and the NumPy parts of
the cpu and CUDA loaders.  Comparisons are printed as comparisons, Boolean
connectives as NumPy's elementwise ``& | ~``; floats as the shortest literal that reads back as the
same double.  The ``numpy_*`` functions print the whole-row calls of the window templates (a scan's
winner in closed form, folds and reductions)."""

from __future__ import annotations

import math

import sympy as sp
from sympy.printing.numpy import NumPyPrinter

from ..printing import ConditionPrinter, fold_calls
from ..printing import bfloat16_value, float_value
from ..printing import bare as _bare
from ..printing import python_integer_code as numpy_integer_code  # noqa: F401 (the backend's name)
from ..printing import operand as _operand
from . import winners


_EXACT = 2 ** 53  # integers up to this size are doubles exactly
_EXACT_BF16 = 2 ** 8  # and bfloat16 values


def _float_literal(value: float) -> str:
    if value != value:
        return "np.nan"
    if value in (float("inf"), float("-inf")):
        return "np.inf" if value > 0 else "(-np.inf)"
    return repr(value)


class NumpyPrinter(ConditionPrinter, NumPyPrinter):
    """SymPy's NumPy printer, with ``np`` as the module name and the lowered nodes added."""

    _module = "np"
    AND, OR, NOT, TRUE, FALSE = "&", "|", "~", "True", "False"  # NumPy's elementwise operators
    # select: Select(c, a, 0) prints as _select(c, a), the module's branch-free np.where(c, a, 0)
    # (for templates that include host/_select.py.jinja)
    # bfloat16: the code of a bfloat16 op computed in bfloat16 on float32 arrays (a preset whose
    # half is "half": as JAX and PyTorch's clamp compute bfloat16, NumPy float16): every number
    # rounded to bfloat16 first (printed as the double it is) and every product, sum and quotient rounded to
    # bfloat16 by the module's _bf16 (to bfloat16 and back, exact in float32)
    _default_settings = {**NumPyPrinter._default_settings, "select": False, "bfloat16": False}

    def __init__(self, settings=None):
        super().__init__({"strict": True, "fully_qualified_modules": True, **(settings or {})})

    def _print_IeeeNot(self, expr):
        return f"~{self._print(expr.args[0])}"

    def _print_IsNan(self, expr):
        return f"np.isnan({self._print(expr.args[0])})"

    def _print_SignBit(self, expr):
        return f"np.signbit({_bare(self._print(expr.args[0]))})"

    def _print_exp(self, expr):
        return f"np.exp({self._print(expr.args[0])})"  # as SymPy prints it, with np

    def _print_expm1(self, expr):
        return f"np.expm1({self._print(expr.args[0])})"

    def _print_log(self, expr):
        return f"np.log({self._print(expr.args[0])})"

    def _print_IsFinite(self, expr):
        return f"np.isfinite({_bare(self._print(expr.args[0]))})"

    def _print_Select(self, expr):
        cond, a, b = expr.args
        # the module's _select: np.where(c, a, 0), no branch (a number: typed, below)
        if b == 0 and self._settings["select"] and not a.is_number:
            return f"_select({_bare(self._print(cond))}, {self._print(a)})"
        if a.is_number and b.is_number:  # two numbers: typed, so the array has the working dtype
            return (f"np.where({_bare(self._print(cond))}, dtype.type({self._print(a)}), "
                    f"dtype.type({self._print(b)}))")
        return f"np.where({_bare(self._print(cond))}, {self._print(a)}, {self._print(b)})"

    def _print_sigmoid(self, expr):
        return f"(1 / (1 + np.exp(-{self.parenthesize(expr.args[0], 60, strict=True)})))"

    def _module_format(self, fqn, register=True):
        if fqn.startswith("numpy."):  # the generated modules import numpy as np
            fqn = "np." + fqn[len("numpy."):]
        return super()._module_format(fqn, register)

    def _print_Quotient(self, expr):
        return self._rounded(f"{_operand(self, expr.args[0])} / {_operand(self, expr.args[1])}")

    def _print_Product(self, expr):
        return self._rounded(f"{_operand(self, expr.args[0])} * {_operand(self, expr.args[1])}")

    def _rounded(self, text: str) -> str:
        return f"_bf16({_bare(text)})" if self._settings["bfloat16"] else text

    def _print_Mul(self, expr, *args, **kwargs):
        return self._rounded(super()._print_Mul(expr, *args, **kwargs))

    def _print_Add(self, expr, *args, **kwargs):
        return self._rounded(super()._print_Add(expr, *args, **kwargs))

    def _number(self, value: float) -> float:
        return bfloat16_value(value) if self._settings["bfloat16"] else value

    def _print_Count(self, expr):
        # the number of conditions that hold, added up in the working dtype
        out = f"np.add({self._print(expr.args[0])}, {self._print(expr.args[1])}, dtype=dtype)" \
            if len(expr.args) > 1 else f"np.asarray({self._print(expr.args[0])}, dtype=dtype)"
        for a in expr.args[2:]:
            out = f"np.add({out}, {self._print(a)})"
        return out

    def _print_MaxOf(self, expr):
        return fold_calls(self, "np.maximum", expr.args)

    def _print_MinOf(self, expr):
        return fold_calls(self, "np.minimum", expr.args)

    # numbers: Python floats (weak scalars: NumPy computes with them in the working dtype); an
    # integer or fraction that a double holds exactly is printed as written (3, 1/3 is 3 and 1/3
    # rounded once), a larger one as the double it rounds to, inf where it overflows, never as a
    # Python int that NumPy would refuse or overflow on
    def _print_Float(self, expr):
        return _float_literal(self._number(float_value(expr)))

    def _print_Literal(self, expr):
        # a parameter kept as a symbol (indicators.Literal): its value, a negative one in
        # parentheses, as it stands in a product
        text = _float_literal(self._number(expr.value))
        return f"({text})" if text.startswith("-") else text

    def _print_Integer(self, expr):
        if abs(int(expr)) <= (_EXACT_BF16 if self._settings["bfloat16"] else _EXACT):
            return super()._print_Integer(expr)
        return _float_literal(self._number(float_value(expr)))

    def _print_Rational(self, expr):
        if self._settings["bfloat16"]:  # 1/3 rounded to bfloat16 once, as a number JAX is given
            return _float_literal(self._number(float_value(expr)))
        if abs(int(expr.p)) <= _EXACT and int(expr.q) <= _EXACT:
            return super()._print_Rational(expr)
        return _float_literal(float_value(expr))


def numpy_arg_extremum(extremum: str, order: str, array: str) -> str:
    """The NumPy call giving the scan winner along the last axis.

    np.argmax/argmin return the first occurrence of the extremum and treat NaN as winning, which
    is exactly a strict scan under the NaN rule; 'last' runs it on the reversed axis.
    """
    return winners.NUMPY.arg_extremum(extremum, order, array)


def numpy_scan_winner(extremum: str, order: str, nan, name: str = "_winner") -> str:
    """A function `name(rows)`: the index, along the last axis, that the running scan of the
    lowered `take` ends on (winners.scan_winner in NumPy)."""
    return winners.function(name, winners.SCAN_DOC, winners.scan_winner(winners.NUMPY, extremum, order, nan))


def numpy_fold_winner(extremum: str, name: str = "_fold_winner", zeros: str | None = None) -> str:
    """A function `name(rows)`: the index, along the last axis, of the element that folding the
    row with ``numpy_extremum_step`` returns (winners.fold_winner in NumPy)."""
    m = "max" if extremum == "max" else "min"
    return winners.function(name, winners.fold_doc(m), winners.fold_winner(winners.NUMPY, m, zeros))


def numpy_extremum_fold(extremum: str, a: str, b: str) -> str:
    """Elementwise extremum of two arrays; np.maximum/np.minimum propagate NaN (NaN dominates)."""
    return f"np.{'maximum' if extremum == 'max' else 'minimum'}({a}, {b})"


def numpy_extremum_step(extremum: str, a: str, b: str) -> str:
    """One step of a max/min fold with the rule stated for every dtype: a when a is NaN or beats b
    strictly, else b (NaN propagates; of two equal values, +0 and -0 included, the second).  As
    the CUDA fold (``CudaPrinter._fold``); np.maximum itself returns the first at +0/-0 for
    float16 and the second for float32/float64."""
    return winners.NUMPY.extremum_step(extremum, a, b)


def numpy_extremum_reduce(extremum: str, array: str, zeros: str | None = None,
                          skip_nan: bool = False) -> str:
    """The extremum along the last axis (NaN propagating).  Under the zeros rule 'ordered' (-0 below
    +0) a zero extremum is the sum of the row's zeros from -0, negated for a min (-0 + -0 is -0, and
    any +0 makes it +0), where np.max's sign of zero depends on its SIMD lanes.  ``skip_nan``
    (nanmax/nanmin): the extremum of the row with each NaN read as -inf (+inf for a min), NaN where
    the row holds only NaN."""
    m = "max" if extremum == "max" else "min"
    if skip_nan:
        filled = f"np.where(np.isnan({array}), {'-' if m == 'max' else ''}np.inf, {array})"
        # the filled rows named where first read (the reduction reads them first)
        reduce = numpy_extremum_reduce(extremum, "filled", zeros).replace("filled", f"(filled := {filled})", 1)
        return f"np.where(np.isnan({array}).all(axis=-1), np.nan, {reduce})"
    if zeros is None:
        return f"np.{m}({array}, axis=-1)"
    if zeros in ("first", "second"):  # a zero extremum is the row's first (last) zero: a fold
        # keeping the first (second) of equals
        at = (winners.NUMPY.first_true if zeros == "first" else winners.NUMPY.last_true)(f"({array} == 0)")
        zero = f"np.take_along_axis({array}, ({at})[..., None], axis=-1)[..., 0]"
        return f"np.where((extremum := np.{m}({array}, axis=-1)) == 0, {zero}, extremum)"
    if zeros != "ordered":
        raise ValueError(f"no reduction for the zeros rule {zeros!r}")
    zeros_of = f"np.where({array} == 0, {array}, -0.0)" if m == "max" else \
        f"np.where({array} == 0, -{array}, -0.0)"
    zero = f"{'' if m == 'max' else '-'}np.sum({zeros_of}, axis=-1, initial=-0.0)"
    return f"np.where((extremum := np.{m}({array}, axis=-1)) == 0, {zero}, extremum)"


def numpy_code(expr: sp.Basic, select: bool = False, bfloat16: bool = False) -> str:
    return _bare(NumpyPrinter({"select": select, "bfloat16": bfloat16}).doprint(expr))
