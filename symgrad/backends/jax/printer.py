"""The jax backend's printer: ``JaxCodePrinter`` subclasses SymPy's ``JaxPrinter`` and adds the
nodes of the lowered kernel description (lower.py), printed as jax.numpy code (``jnp``).
Comparisons are printed as comparisons, Boolean connectives as ``& | ~``; numbers as Python
floats (weak scalars: JAX computes with them in the working dtype, as NumPy does); the extremum
of two operands as the generated module's ``_maximum``/``_minimum`` (NumPy's rule for every
dtype, where XLA's max/min differ at +0/-0)."""

from __future__ import annotations

import sympy as sp
from sympy.printing.numpy import JaxPrinter

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
# The NumPy module's closed forms of a row's winner (host.printer.numpy_scan_winner,
# numpy_fold_winner, numpy_extremum_reduce) in jax.numpy: the same indices and values, with no
# Python branch on array values (jnp.argmax/argmin, like NumPy's, return the first NaN).

def _first_true(h: str) -> str:
    return f"jnp.argmax({h}, axis=-1)"


def _last_true(h: str) -> str:
    return f"{h}.shape[-1] - 1 - jnp.argmax({h}[..., ::-1], axis=-1)"


def jax_arg_extremum(extremum: str, order: str, array: str) -> str:
    """The index of a row's first (order first) or last extremum, NaN winning."""
    arg = "jnp.argmax" if extremum == "max" else "jnp.argmin"
    if order == "first":
        return f"{arg}({array}, axis=-1)"
    return f"{array}.shape[-1] - 1 - {arg}({array}[..., ::-1], axis=-1)"


def jax_scan_winner(extremum: str, order: str, nan, name: str = "_winner") -> str:
    """A function `name(rows)`: the index, along the last axis, that the running scan of the
    lowered `take` ends on (as host.printer.numpy_scan_winner: NaN by the scan's NaN rule)."""
    m = "max" if extremum == "max" else "min"
    pick = _first_true if order == "first" else _last_true
    takes, taken = ("number", False) if nan is None else (nan.nan_takes_over, nan.nan_is_taken_over)
    if takes == "number" and not taken:
        body = [f"    return {jax_arg_extremum(extremum, order, 'rows')}"]
    elif takes == "always" and not taken:
        body = ["    nan = jnp.isnan(rows)  # rows holding NaN: their last NaN",
                f"    return jnp.where(nan.any(axis=-1), {_last_true('nan')}, "
                f"{jax_arg_extremum(extremum, order, 'rows')})"]
    elif takes == "never" and not taken:
        body = [f"    hit = rows == jnp.nan{m}(rows, axis=-1, keepdims=True)  # NaNs passed over",
                f"    return jnp.where(jnp.isnan(rows[..., 0]), 0, {pick('hit')})"]
    elif takes == "always" and taken:
        body = ["    nan = jnp.isnan(rows)",
                f"    last_nan = jnp.where(nan.any(axis=-1), {_last_true('nan')}, -1)",
                "    after = jnp.arange(rows.shape[-1]) > last_nan[..., None]",
                f"    rest = jnp.where(after, rows, {'-' if m == 'max' else ''}jnp.inf)",
                f"    hit = after & (rows == jnp.{m}(rest, axis=-1, keepdims=True))",
                f"    return jnp.where(after[..., -1], {pick('hit')}, rows.shape[-1] - 1)"]
    else:
        raise ValueError(f"no closed form for a scan where NaN takes over {takes!r} and "
                         f"is taken over {taken!r}")
    return "\n".join([f"def {name}(rows):", '    """The element the running scan of each row (last axis) ends on."""']
                     + body)


def jax_fold_winner(extremum: str, zeros: str | None = None, name: str = "_fold_winner") -> str:
    """A function `name(rows)`: the index of the element that folding the row with the extremum
    step returns (as host.printer.numpy_fold_winner): the first NaN, else the last element equal
    to the extremum; under the zeros rule 'ordered' a +0 (max) or -0 (min) among them first."""
    m = "max" if extremum == "max" else "min"
    ordered = []
    if zeros == "ordered":
        sign = "~jnp.signbit(rows)" if m == "max" else "jnp.signbit(rows)"
        ordered = [f"    preferred = hit & {sign}  # -0 is below +0",
                   "    hit = jnp.where(preferred.any(axis=-1, keepdims=True), preferred, hit)"]
    elif zeros not in (None, "second"):
        raise ValueError(f"no fold winner for the zeros rule {zeros!r}")
    return "\n".join([
        f"def {name}(rows):",
        f'    """The element the running {m} of each row (last axis) returns."""',
        "    nan = jnp.isnan(rows)",
        f"    hit = rows == jnp.{m}(rows, axis=-1, keepdims=True)",
        *ordered,
        f"    return jnp.where(nan.any(axis=-1), {_first_true('nan')}, {_last_true('hit')})"])


def jax_extremum_reduce(extremum: str, array: str, zeros: str | None = None) -> str:
    """The extremum along the last axis (NaN propagating), as host.printer.numpy_extremum_reduce;
    under the zeros rule 'ordered' a zero extremum is +0 where the row holds a +0 (max; min: -0
    where it holds a -0), the sign NumPy's sum of the row's zeros from -0 gives."""
    m = "max" if extremum == "max" else "min"
    if zeros is None:
        return f"jnp.{m}({array}, axis=-1)"
    if zeros != "ordered":
        raise ValueError(f"no reduction for the zeros rule {zeros!r}")
    wins = f"~jnp.signbit({array})" if m == "max" else f"jnp.signbit({array})"
    zero = f"jnp.where((({array} == 0) & {wins}).any(axis=-1), {'0.0, -0.0' if m == 'max' else '-0.0, 0.0'})"
    return f"jnp.where((extremum := jnp.{m}({array}, axis=-1)) == 0, {zero}.astype({array}.dtype), extremum)"
