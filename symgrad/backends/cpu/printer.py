"""The CPU backend's printer: the C-family printer (``backends/cfamily/printer.py``) for a host
compiler, C99 whose output needs only the helpers ``sg_isnan``, ``sg_inf_f`` and ``sg_nan_f``,
which the .c file defines, and ``bool`` from <stdbool.h>: NaN-propagating selects for MaxOf/MinOf,
each number a literal of the compute type (float kernels do no double math).  The window geometry
is printed in C's 64-bit integer arithmetic, with Min and Max as the .c file's sg_min/sg_max."""

from __future__ import annotations

import math
from dataclasses import replace

import sympy as sp

from ..cfamily.printer import ARITHMETIC, REAL_TYPES, CFamilyPrinter
from ..printing import bare, integer_code

C_REAL_TYPES = REAL_TYPES  # float (float16 and float32 compute in it) and double


class CPrinter(CFamilyPrinter):
    """C99 for a host compiler, in one compute type (``real_type``: float or double): the
    C-family printing, which the CUDA kernels' shares; with ``branch_free``, selects and
    NaN-propagating max/min as selects of bits (the .c file's sg_pick_*/sg_keep_*) and the
    connectives as & and |."""

    _default_settings = {**CFamilyPrinter._default_settings, "branch_free": False}

    def _print_Count(self, expr):
        # each condition as a select of 1 and 0 rather than a conversion of the bool: gcc 12 does
        # not vectorize a loop converting a bool to float (abs's backward under the torch preset,
        # whose weight divides by the count of its ties, 16M float32: 119 ms, a scalar loop),
        # and does vectorize the select; same values (0 or 1, added in the compute type)
        one, zero = f"({self.real_type})1", f"({self.real_type})0"
        return "(" + " + ".join(f"({bare(self._print(a))} ? {one} : {zero})" for a in expr.args) + ")"

    # branch_free (the selection functions sg_hit and sg_weight, and max pooling's mask-form fold
    # sg_combine: backends/cpu/__init__.py's _selection): every condition a value, never a jump.
    # A branch on the data's comparisons is mispredicted as often as the data decides (max_pool2d
    # split's backward, 64x16x8x8 float32 on inputs that change between calls: 300-360 us
    # branched, 82 us branch-free); the select of bits (sg_pick/sg_keep) is the same value bit for
    # bit, and the connectives are the non-short-circuit & and | of two bools (0 or 1)
    def _print_And(self, expr):
        return self._bool_join(expr, "&" if self._settings["branch_free"] else self.AND)

    def _print_Or(self, expr):
        return self._or_join(expr, "|" if self._settings["branch_free"] else self.OR)

    def _print_Select(self, expr):
        if not self._settings["branch_free"]:
            return super()._print_Select(expr)
        cond, a, b = expr.args
        c, rt = bare(self._print(cond)), self.real_type
        if _positive_zero(b):  # cond ? a : +0 as a mask of a's bits
            return f"sg_keep_{rt}({c}, {bare(self._print(a))})"
        return f"sg_pick_{rt}({c}, {bare(self._print(a))}, {bare(self._print(b))})"

    def _fold(self, args, rel):
        if not self._settings["branch_free"]:
            return super()._fold(args, rel)
        if self._settings["half_constants"]:  # (the parent's rule: NumPy's float16 keeps the first of equals)
            rel += "="
        out = self._print(args[0])
        for a in args[1:]:
            b = self._print(a)
            out = f"sg_pick_{self.real_type}(sg_isnan({bare(out)}) | ({out} {rel} {b}), {bare(out)}, {bare(b)})"
        return out

    # exp and expm1 as the .c file's branch-free sg_exp_f/sg_expm1_f (templates/_exp.c.jinja, placed
    # where the op's expressions hold them: uses_exp), which the elementwise loops vectorize
    # (the C library's expf/expm1f are calls, which keep a loop scalar: elu 16M float32, 183 ms)
    def _print_exp(self, expr):
        return f"sg_exp_{self.real_type[0]}({self._print(expr.args[0])})"

    def _print_expm1(self, expr):
        return f"sg_expm1_{self.real_type[0]}({self._print(expr.args[0])})"


def uses_exp(exprs) -> bool:
    """Whether any of exprs holds exp or expm1 (the printer's sg_exp_*/sg_expm1_*, which the .c
    file then defines: templates/_exp.c.jinja)."""
    from sympy.codegen.cfunctions import expm1
    return any(sp.sympify(e).has(sp.exp, expm1) for e in exprs)


def _positive_zero(e) -> bool:
    """e is the number +0 (a select's else-value that a mask of the other's bits gives exactly)."""
    e = sp.sympify(e)
    return e.is_Number and e == 0 and not (e.is_Float and math.copysign(1.0, float(e)) < 0)


def c_code(expr: sp.Basic, real_type: str, names: dict | None = None, half_constants: bool = False,
           branch_free: bool = False) -> str:
    """One expression as C in the compute type real_type, without outer parentheses; names:
    {symbol name: C identifier} for the symbols spelled otherwise in the .c (an expression's
    inputs, with symgrad's prefix: cfamily.naming.c_identifiers); half_constants: numbers rounded to
    float16 first and each product and sum rounded to float16 (sg_hround), as NumPy's float16
    computes them (the C-family printer's setting); branch_free: selects, NaN-propagating max/min
    and the connectives without a conditional (CPrinter's setting: the selection functions)."""
    return bare(CPrinter({"real_type": real_type, "names": dict(names or {}),
                          "half_constants": half_constants, "branch_free": branch_free}).doprint(expr))


# floating-point parts (fractional pooling's starts, not yet a kind of this backend) in double;
# Min and Max as the .c file's sg_min/sg_max of 64-bit integers
C_ARITHMETIC = replace(ARITHMETIC, real=lambda s: f"(double)({s})",
                       min=lambda a, b: f"sg_min({a}, {b})", max=lambda a, b: f"sg_max({a}, {b})")


def c_integer_code(expr: sp.Basic, names: dict | None = None) -> str:
    """An expression of the window geometry in C's 64-bit integer arithmetic (see
    ``cfamily.printer.ARITHMETIC``: every quotient has a nonnegative numerator where its value is used, or
    one whose value a Max with 0 or a Min with a bound decides alike: a ceiling of a numerator
    n <= 0 prints as (n + q - 1) / q, which C truncates to a value <= 0, as the ceiling is)."""
    return integer_code(expr, C_ARITHMETIC, names)


def c_real_geometry_code(expr: sp.Basic, real_type: str, names: dict | None = None) -> str:
    """An expression of the window geometry whose floating-point parts are in real_type (float or
    double: fractional pooling's starts in the compute type, as the NumPy module's _starts), each
    truncated to long long as C's cast does; the integer parts as c_integer_code's."""
    return integer_code(expr, replace(C_ARITHMETIC, real=lambda s: f"({real_type})({s})"), names)
