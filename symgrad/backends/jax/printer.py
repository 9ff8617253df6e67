"""The jax backend's printer: ``JaxCodePrinter`` subclasses SymPy's ``JaxPrinter`` and adds the
nodes of the lowered kernel description (lower.py), printed as jax.numpy code (``jnp``).
Comparisons are printed as comparisons, Boolean connectives as ``& | ~``; numbers as Python
floats (weak scalars: JAX computes with them in the working dtype, as NumPy does); the extremum
of two operands as the generated module's ``_maximum``/``_minimum`` (NumPy's rule for every
dtype, where XLA's max/min differ at +0/-0)."""

from __future__ import annotations

import sympy as sp
from sympy.printing.numpy import JaxPrinter

from ..host import winners
from ..host.winners import Dialect
from ..printing import ConditionPrinter, float_value, fold_calls
from ..printing import bare as _bare
from ..printing import operand as _operand

_EXACT = 2 ** 53  # integers up to this size are doubles exactly


def _float_literal(value: float) -> str:
    if value != value:
        return "jnp.nan"
    if value in (float("inf"), float("-inf")):
        return "jnp.inf" if value > 0 else "(-jnp.inf)"
    return repr(value)


class JaxCodePrinter(ConditionPrinter, JaxPrinter):
    """SymPy's JAX printer, with ``jnp`` as the module name and the lowered nodes added."""

    _module = "jax.numpy"
    AND, OR, NOT, TRUE, FALSE = "&", "|", "~", "True", "False"  # elementwise operators

    def __init__(self, settings=None):
        super().__init__({"strict": True, "fully_qualified_modules": True, **(settings or {})})

    def _module_format(self, fqn, register=True):
        if fqn.startswith("jax.numpy."):  # the generated modules import jax.numpy as jnp
            fqn = "jnp." + fqn[len("jax.numpy."):]
        return super()._module_format(fqn, register)

    def _print_IeeeNot(self, expr):
        return f"~{self._print(expr.args[0])}"

    def _print_IsNan(self, expr):
        return f"jnp.isnan({_bare(self._print(expr.args[0]))})"

    def _print_SignBit(self, expr):
        return f"jnp.signbit({_bare(self._print(expr.args[0]))})"

    def _print_IsFinite(self, expr):
        return f"jnp.isfinite({_bare(self._print(expr.args[0]))})"

    def _print_exp(self, expr):
        return f"jnp.exp({self._print(expr.args[0])})"

    def _print_expm1(self, expr):
        return f"jnp.expm1({self._print(expr.args[0])})"

    def _print_log(self, expr):
        return f"jnp.log({self._print(expr.args[0])})"

    def _print_sigmoid(self, expr):
        return f"(1 / (1 + jnp.exp(-{self.parenthesize(expr.args[0], 60, strict=True)})))"

    def _print_Select(self, expr):
        cond, a, b = expr.args
        if a.is_number and b.is_number:  # two numbers: typed, so the array has the working dtype
            return (f"jnp.where({_bare(self._print(cond))}, dtype.type({self._print(a)}), "
                    f"dtype.type({self._print(b)}))")
        # jnp.where(c, a, 0) is +0.0 where c is false, as the NumPy module's bitwise select
        return f"jnp.where({_bare(self._print(cond))}, {self._print(a)}, {self._print(b)})"

    def _print_Quotient(self, expr):
        return f"{_operand(self, expr.args[0])} / {_operand(self, expr.args[1])}"

    def _print_Product(self, expr):
        return f"{_operand(self, expr.args[0])} * {_operand(self, expr.args[1])}"

    def _print_Count(self, expr):
        # the number of conditions that hold, added up in the working dtype
        return "(" + " + ".join(f"jnp.asarray({_bare(self._print(a))}, dtype)" for a in expr.args) + ")"

    def _print_MaxOf(self, expr):
        return fold_calls(self, "_maximum", expr.args)

    def _print_MinOf(self, expr):
        return fold_calls(self, "_minimum", expr.args)

    # numbers: Python floats (weak scalars); an integer or fraction that a double holds exactly is
    # printed as written, a larger one as the double it rounds to, inf where it overflows
    def _print_Float(self, expr):
        return _float_literal(float_value(expr))

    def _print_Literal(self, expr):
        # a parameter kept as a symbol (indicators.Literal): its value, a negative one in
        # parentheses, as it stands in a product
        text = _float_literal(expr.value)
        return f"({text})" if text.startswith("-") else text

    def _print_Integer(self, expr):
        if abs(int(expr)) <= _EXACT:
            return super()._print_Integer(expr)
        return _float_literal(float_value(expr))

    def _print_Rational(self, expr):
        if abs(int(expr.p)) <= _EXACT and int(expr.q) <= _EXACT:
            return super()._print_Rational(expr)
        return _float_literal(float_value(expr))


def jax_code(expr: sp.Basic) -> str:
    """expr as jax.numpy code (an expression of the kernel's names, ``dtype`` and the module's
    helpers)."""
    return _bare(JaxCodePrinter().doprint(expr))


# ----------------------------------------------------------------------------- whole rows (reductions)
# The closed forms of a row's winner (host.winners, in the jax.numpy dialect) and its extremum
# (as host.printer.numpy_extremum_reduce): the same indices and values as the NumPy module's, with no
# Python branch on array values (jnp.argmax/argmin, like NumPy's, return the first NaN).

JAX = Dialect(module="jnp", axis="axis=-1", keep="keepdims=True", reduce={"max": "max", "min": "min"},
              flip="{a}[..., ::-1]", count="{h}", inf="jnp.inf", arange="jnp.arange({n})",
              numbers_hit=("hit = rows == jnp.nan{m}(rows, axis=-1, keepdims=True)  # NaNs passed over",))


def jax_scan_winner(extremum: str, order: str, nan, name: str = "_winner") -> str:
    """A function `name(rows)`: the index, along the last axis, that the running scan of the
    lowered `take` ends on (winners.scan_winner in jax.numpy)."""
    return winners.function(name, winners.SCAN_DOC, winners.scan_winner(JAX, extremum, order, nan))


def jax_fold_winner(extremum: str, zeros: str | None = None, name: str = "_fold_winner") -> str:
    """A function `name(rows)`: the index of the element that folding the row with the extremum
    step returns (winners.fold_winner in jax.numpy)."""
    m = "max" if extremum == "max" else "min"
    return winners.function(name, winners.fold_doc(m), winners.fold_winner(JAX, m, zeros))


def jax_extremum_reduce(extremum: str, array: str, zeros: str | None = None, skip_nan: bool = False) -> str:
    """The extremum along the last axis (NaN propagating), as host.printer.numpy_extremum_reduce;
    under the zeros rule 'ordered' a zero extremum is +0 where the row holds a +0 (max; min: -0
    where it holds a -0), the sign NumPy's sum of the row's zeros from -0 gives; under 'first'
    ('second') the row's first (last) zero.  ``skip_nan`` (nanmax/nanmin): the extremum of the row
    with each NaN read as -inf (+inf for a min), NaN where the row holds only NaN."""
    m = "max" if extremum == "max" else "min"
    if skip_nan:
        filled = f"jnp.where(jnp.isnan({array}), {JAX.neg_inf(extremum)}, {array})"
        # the filled rows named where first read (the reduction reads them first)
        reduce = jax_extremum_reduce(extremum, "filled", zeros).replace("filled", f"(filled := {filled})", 1)
        return f"jnp.where(jnp.isnan({array}).all(axis=-1), jnp.nan, {reduce})"
    if zeros is None:
        return f"jnp.{m}({array}, axis=-1)"
    if zeros in ("first", "second"):  # a zero extremum is the row's first (last) zero
        at = (JAX.first_true if zeros == "first" else JAX.last_true)(f"({array} == 0)")
        zero = f"jnp.take_along_axis({array}, ({at})[..., None], axis=-1)[..., 0]"
        return f"jnp.where((extremum := jnp.{m}({array}, axis=-1)) == 0, {zero}, extremum)"
    if zeros != "ordered":
        raise ValueError(f"no reduction for the zeros rule {zeros!r}")
    wins = f"~jnp.signbit({array})" if m == "max" else f"jnp.signbit({array})"
    zero = f"jnp.where((({array} == 0) & {wins}).any(axis=-1), {'0.0, -0.0' if m == 'max' else '-0.0, 0.0'})"
    return f"jnp.where((extremum := jnp.{m}({array}, axis=-1)) == 0, {zero}.astype({array}.dtype), extremum)"
