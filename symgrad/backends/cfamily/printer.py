"""The C-family printer: what the C ("cpu") and CUDA backends print alike, one level below both.

``CFamilyPrinter`` subclasses SymPy's ``C99CodePrinter`` (the C99 -> C/CUDA ladder of SymPy and
SymForce), one printer per compute type (``float`` or ``double``).  Comparisons and Boolean
connectives are printed as C operators, ``IsNan`` as the helper ``sg_isnan``, ``Select`` as ``?:``,
``MaxOf``/``MinOf`` as NaN-propagating selects (the semantics of ``np.maximum``/``np.minimum``, not
``fmax``/``fmin``, which drop NaN), and every number as a literal of the compute type: the value
NumPy would use (a Python float cast to float32 for float kernels), with an ``f`` suffix in float
kernels, so a float kernel does no double-precision math.  The output needs only the helpers
``sg_isnan``, ``sg_inf_f`` and ``sg_nan_f`` (with half_constants ``sg_hround``, with
bfloat16_constants ``sg_bround``), which each backend's source defines, and ``bool``.

``ARITHMETIC``: the window geometry in C's 64-bit integer arithmetic, which each backend completes
with its floating-point cast (and C with Min and Max).  The children, ``backends/cpu/printer.py``
and ``backends/cuda/printer.py``, hold only what differs."""

from __future__ import annotations

import math

import numpy as np
import sympy as sp
from sympy.printing.c import C99CodePrinter

from ..printing import ConditionPrinter
from ..printing import bfloat16_value, float_value
from ..printing import bare as _bare
from ..printing import Arithmetic, atom
from ..printing import operand as _operand


REAL_TYPES = ("float", "double")  # the compute types (float16 and float32 compute in float)


class CFamilyPrinter(ConditionPrinter, C99CodePrinter):
    """C99 in one compute type (``real_type``: float or double), as the C and CUDA sources print
    it (device qualifiers and the helpers' definitions are the templates', not the printer's)."""

    # names: {symbol name: C identifier}, how a user-chosen name is spelled in the .c / .cu
    # half_constants: every number rounded to float16 first (then printed as a float literal, which
    # holds it exactly), as NumPy uses a Python float with a float16 array, and every product and
    # sum rounded to float16: the float16 variant of an elementwise op whose preset computes
    # float16 in float16 (Preset.half "half")
    # bfloat16_constants: the same with bfloat16 (sg_bround), as the NumPy module computes a
    # bfloat16 op under such a preset (its _output_bf16 and _gradients_bf16; set by the CUDA
    # backend only: the cpu backend refuses bfloat16 where a preset computes in it)
    _default_settings = {**C99CodePrinter._default_settings, "real_type": "float", "names": {},
                         "half_constants": False, "bfloat16_constants": False}
    AND, OR, NOT, TRUE, FALSE = "&&", "||", "!", "true", "false"  # C's operators

    def __init__(self, settings=None):
        from sympy.codegen.ast import float32, float64, real
        settings = dict(settings or {})
        # math functions of the compute type: expf, tanhf, ... in float kernels
        settings.setdefault("type_aliases", {real: float32 if settings.get("real_type", "float") == "float"
                                             else float64})
        super().__init__(settings)
        if self._settings["real_type"] not in REAL_TYPES:
            raise ValueError(f"real_type must be one of {REAL_TYPES}, got {self._settings['real_type']!r}")

    @property
    def real_type(self) -> str:
        return self._settings["real_type"]

    def _print_Symbol(self, expr):
        c_name = self._settings["names"].get(expr.name)
        return c_name if c_name is not None else super()._print_Symbol(expr)

    # numbers: the value the NumPy backend computes with, as a literal of the compute type
    def _literal(self, value: float) -> str:
        if self.real_type == "float":
            with np.errstate(over="ignore"):
                if self._settings["bfloat16_constants"]:
                    value = bfloat16_value(value)
                value32 = np.float32(np.float16(value) if self._settings["half_constants"] else value)
            if not math.isfinite(value32):
                # a parameter beyond float's range is +-inf in a float kernel, as in NumPy
                return f"{'-' if value32 < 0 else ''}sg_inf_f()" if not math.isnan(value32) else "sg_nan_f()"
            text = str(value32)
            suffix = "f"
        else:
            value = float(value)
            if not math.isfinite(value):  # beyond double's range: +-inf, as NumPy reads it
                return (f"({'-' if value < 0 else ''}(double)sg_inf_f())" if not math.isnan(value)
                        else "((double)sg_nan_f())")
            text = repr(value)
            suffix = ""
        if "e" not in text and "." not in text:
            text += ".0"
        return text + suffix

    def _print_Float(self, expr):
        return self._literal(float_value(expr))

    def _print_Integer(self, expr):
        return self._literal(float_value(expr))

    def _print_Literal(self, expr):
        # a parameter kept as a symbol (indicators.Literal): its value, a negative one in
        # parentheses, as it stands in a product
        text = self._literal(expr.value)
        return f"({text})" if text.startswith("-") else text

    def _print_Rational(self, expr):
        return self._literal(float_value(expr))

    def _print_Zero(self, expr):
        return self._literal(0.0)

    def _print_One(self, expr):
        return self._literal(1.0)

    def _print_NegativeOne(self, expr):
        return self._literal(-1.0)

    def _print_Half(self, expr):
        return self._literal(0.5)

    def _print_Pi(self, expr):
        return self._literal(math.pi)  # M_PI needs math.h, which NVRTC does not have

    def _print_Exp1(self, expr):
        return self._literal(math.e)

    def _print_sigmoid(self, expr):
        one = self._literal(1.0)
        fn = "expf" if self.real_type == "float" else "exp"
        return f"({one} / ({one} + {fn}(-{self.parenthesize(expr.args[0], 60, strict=True)})))"

    # half_constants: each product and sum rounded to float16 where NumPy's float16 rounds it
    # (sg_hround: to float16 and back, exact in float), so a zero's sign and an underflow follow
    def _half_rounded(self, text: str) -> str:
        if self._settings["bfloat16_constants"]:
            return f"sg_bround({_bare(text)})"
        return f"sg_hround({_bare(text)})" if self._settings["half_constants"] else text

    def _half_only(self, text: str) -> str:
        # a quotient or a function's value rounded to float16 as NumPy's float16 computes it (the
        # bfloat16 functions' NumPy module rounds products, sums and quotients)
        return f"sg_hround({_bare(text)})" if self._settings["half_constants"] else text

    def _print_Mul(self, expr, *args, **kwargs):
        return self._half_rounded(super()._print_Mul(expr, *args, **kwargs))

    def _print_Add(self, expr, *args, **kwargs):
        return self._half_rounded(super()._print_Add(expr, *args, **kwargs))

    def _print_Pow(self, expr):
        # the operations the NumPy module prints (SymPy's NumPy printer): x**2 as x*x (np.square,
        # exact), x**(1/2) as sqrt, x**(-1/2) as 1/sqrt (so -inf at -0.0, as 1/np.sqrt), x**-1 as
        # 1/x, any other power as pow, never cbrt (NaN for x < 0, as np.power, where cbrt is real)
        # (half_constants: each operation's value rounded to float16, as NumPy's float16 does)
        base, r = self.parenthesize(expr.base, 50, strict=True), self._half_only
        if expr.exp == 2:
            return r(f"({base}*{base})")
        if expr.exp in (sp.S.Half, -sp.S.Half):
            root = r(f"{'sqrtf' if self.real_type == 'float' else 'sqrt'}({self._print(expr.base)})")
            return root if expr.exp > 0 else r(f"{self._literal(1.0)}/{root}")
        if expr.exp == -1:
            return r(f"{self._literal(1.0)}/{base}")
        fn = "powf" if self.real_type == "float" else "pow"
        return r(f"{fn}({self._print(expr.base)}, {self._print(expr.exp)})")

    # comparisons and Booleans (ConditionPrinter, with C's operators)
    def _print_IeeeNot(self, expr):
        # !(a <= b) as written: true when a or b is NaN (never rewritten to a > b)
        return f"!({_bare(self._print(expr.args[0]))})"

    def _print_IsNan(self, expr):
        return f"sg_isnan({_bare(self._print(expr.args[0]))})"

    def _print_SignBit(self, expr):
        # the sign bit of a number (false for NaN): v < 0, or -0, whose reciprocal is -inf
        v, zero = self.parenthesize(expr.args[0], 50, strict=True), self._literal(0.0)
        return f"({v} < {zero} || {self._literal(1.0)} / {v} < {zero})"

    def _print_IsFinite(self, expr):
        # v - v is 0 for a finite v, NaN for +-inf and NaN (no header needed for isfinite)
        a = self._print(expr.args[0])
        return f"({a} - {a} == {self._literal(0.0)})"

    def _print_exp(self, expr):
        # the compute type's function, as SymPy's C printer names it with float32 as real
        return f"{'expf' if self.real_type == 'float' else 'exp'}({self._print(expr.args[0])})"

    def _print_expm1(self, expr):
        return f"{'expm1f' if self.real_type == 'float' else 'expm1'}({self._print(expr.args[0])})"

    def _print_log(self, expr):
        return f"{'logf' if self.real_type == 'float' else 'log'}({self._print(expr.args[0])})"

    # lowered nodes
    def _print_Select(self, expr):
        cond, a, b = expr.args
        return f"({self._print(cond)} ? {self._print(a)} : {self._print(b)})"

    def _print_Quotient(self, expr):
        return self._half_only(f"{_operand(self, expr.args[0], _bare)} / {_operand(self, expr.args[1], _bare)}")

    def _print_Product(self, expr):
        return self._half_only(f"{_operand(self, expr.args[0], _bare)} * {_operand(self, expr.args[1], _bare)}")

    def _print_Count(self, expr):
        # the number of conditions that hold, added up in the compute type
        return "(" + " + ".join(f"({self.real_type})({_bare(self._print(a))})" for a in expr.args) + ")"

    def _print_MaxOf(self, expr):
        return self._fold(expr.args, ">")

    def _print_MinOf(self, expr):
        return self._fold(expr.args, "<")

    def _fold(self, args, rel):
        # np.maximum/np.minimum exactly: a when a is NaN or beats b strictly, else b (so NaN
        # propagates, and of two equal values, +0 and -0 included, the second is returned); in
        # float16 (half_constants) a when a is NaN or beats or equals b: NumPy's float16 maximum
        # and minimum return the first of equal values (np.maximum(+0, -0) is +0 there)
        if self._settings["half_constants"]:
            rel += "="
        out = self._print(args[0])
        for a in args[1:]:
            b = self._print(a)
            out = f"((sg_isnan({_bare(out)}) || {out} {rel} {b}) ? {out} : {b})"
        return out


# the window geometry in C's 64-bit integer arithmetic: for nonnegative p and positive q, p / q is
# floor(p / q) and (p + q - 1) / q is ceiling(p / q) (every quotient the geometry divides has a
# nonnegative numerator where its value is used); Mod as %, a floating-point product truncated by
# a cast to long long.  Each child adds its cast to floating point (and Min and Max where its
# source defines them)
ARITHMETIC = Arithmetic(lambda p, q: f"{atom(p)} / {q}", lambda p, q: f"({p} + {q} - 1) / {q}",
                        lambda p, q: f"{p} % {q}", None, None, "&&", "||", "!", "true",
                        trunc=lambda s: f"(long long)({s})")
