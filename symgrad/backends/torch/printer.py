"""The torch backend's printer: ``TorchCodePrinter`` subclasses SymPy's PyTorch printer
(``sympy.printing.pytorch.TorchPrinter``) with ``printing.ConditionPrinter`` first, and adds the
nodes of the lowered kernel description (lower.py).  Everything it prints is a torch operation or
a Python operator on tensors: no NumPy, no ``.item()``, no branch on a tensor's values, so the
code traces under ``torch.compile(fullgraph=True)`` and runs on every device.

Numbers: PyTorch computes a Python number with a float16 tensor in float32 (its "opmath" type),
where NumPy rounds the number to float16 first.  So a number that float16 or float32 cannot hold
exactly is printed as a name (``_n0``, ...) bound, in each function, to the number rounded to the
working dtype (the module's ``_NUMBERS[dtype]``): the same value NumPy computes with.  A number
dividing by a tensor is printed ``torch.div(number, tensor)``, because ``number / tensor`` is
``tensor.reciprocal() * number`` in PyTorch, which rounds twice.
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp

try:  # SymPy >= 1.13
    from sympy.printing.pytorch import TorchPrinter as _SympyTorchPrinter
except ImportError:  # pragma: no cover - older SymPy: its NumPy printer, with the module torch
    from sympy.printing.numpy import NumPyPrinter as _NumPyBase

    class _SympyTorchPrinter(_NumPyBase):
        _module = "torch"

from ...lower import Shared
from ..printing import ConditionPrinter, bare, bfloat16_value, float_value

_SMALL = 256  # integers up to this size are exact in every dtype (bfloat16 included)


def atom(s: str) -> str:
    """s as an operand: a name or number as it is, anything else in one pair of parentheses."""
    return s if s.replace("_", "").replace(".", "").isalnum() else f"({bare(s)})"


def float_literal(value: float) -> str:
    """A double as the shortest Python literal that reads back as it (inf and NaN as float())."""
    if value != value:
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else '(-float("inf"))'
    return repr(value)


def rounded(value: float, dtype: str) -> float:
    """value rounded once to dtype (float16, float32, float64), as NumPy rounds a Python number
    used with an array of that dtype (+-inf beyond its range)."""
    if dtype == "float64" or value != value:
        return value
    with np.errstate(over="ignore"):
        return float(getattr(np, dtype)(value))


def _name(code: str) -> bool:
    """Whether code is a name or a view of one by constant indices (rows[..., 0]): cheap to
    write twice (Inductor computes it once)."""
    return code.split("[", 1)[0].isidentifier()


def nan_test(a: str) -> str:
    """Whether each element of a (code) is NaN: a name as (v != v), which Inductor vectorizes on
    the CPU (its torch.isnan is a scalar loop); anything else through torch.isnan (computed once)."""
    return f"({a} != {a})" if _name(a) else f"torch.isnan({a})"


def sign_test(a: str) -> str:
    """Whether each element of a (code) has its sign bit set (-0, negative numbers, NaNs with the
    bit): a name as (ones.copysign(v) < 0), the same test, which Inductor vectorizes on the CPU
    (its torch.signbit is a scalar loop, 10x the rest of a pooling's forward); anything else
    through torch.signbit."""
    return f"(torch.ones_like({a}).copysign({a}) < 0)" if _name(a) else f"torch.signbit({a})"


class TorchCodePrinter(ConditionPrinter, _SympyTorchPrinter):
    """SymPy's PyTorch printer with the lowered nodes added.

    Settings: ``bfloat16`` (the code of an op computed in bfloat16 on float32 tensors holding
    bfloat16 values: every number rounded to bfloat16, every product, sum and quotient rounded
    by the module's ``_bf16``).  ``numbers`` collects, in order of first use, the numbers printed
    as names (see the module docstring)."""

    AND, OR, NOT, TRUE, FALSE = "&", "|", "~", "True", "False"  # torch's elementwise operators
    _default_settings = {**_SympyTorchPrinter._default_settings, "bfloat16": False}

    def __init__(self, settings=None, numbers: list | None = None):
        super().__init__(settings or {})
        self.numbers = numbers if numbers is not None else []

    # -- numbers

    def _number(self, value: float) -> str:
        if self._settings["bfloat16"]:
            return float_literal(bfloat16_value(value))
        if value != value or math.isinf(value) or (
                rounded(value, "float16") == value and rounded(value, "float32") == value):
            return float_literal(value)  # the same value in every working dtype
        if value not in self.numbers:
            self.numbers.append(value)
        return f"_n{self.numbers.index(value)}"

    def _print_Float(self, expr):
        return self._number(float_value(expr))

    def _print_Literal(self, expr):
        text = self._number(expr.value)
        return f"({text})" if text.startswith("-") else text

    def _print_Integer(self, expr):
        if abs(int(expr)) <= _SMALL:
            return str(int(expr))
        text = self._number(float_value(expr))
        return f"({text})" if text.startswith("-") else text

    def _print_Rational(self, expr):
        text = self._number(float_value(expr))
        return f"({text})" if text.startswith("-") else text

    def _print_NaN(self, expr):
        return 'float("nan")'

    def _print_Infinity(self, expr):
        return 'float("inf")'

    def _print_NegativeInfinity(self, expr):
        return '(-float("inf"))'

    # -- arithmetic

    def _rounded(self, text: str) -> str:
        return f"_bf16({bare(text)})" if self._settings["bfloat16"] else text

    def _print_Mul(self, expr, *args, **kwargs):
        num, den = sp.fraction(expr)
        if den != 1 and num.is_number:  # number / tensor: one division (see the module docstring)
            return self._rounded(f"torch.div({self._print(num)}, {bare(self._print(den))})")
        return self._rounded(super()._print_Mul(expr, *args, **kwargs))

    def _print_Add(self, expr, *args, **kwargs):
        return self._rounded(super()._print_Add(expr, *args, **kwargs))

    def _print_Pow(self, expr, rational=False):
        base, exp = expr.args
        if exp == -1:
            return self._rounded(f"torch.div(1, {bare(self._print(base))})")
        if exp == sp.S.Half:
            return f"torch.sqrt({bare(self._print(base))})"
        if exp.is_Integer and exp > 0:
            return self._rounded(f"{atom(self._print(base))}**{int(exp)}")
        return f"torch.pow({bare(self._print(base))}, {self._print(exp)})"

    def _print_Quotient(self, expr):
        a, b = expr.args
        if a.is_number:
            return self._rounded(f"torch.div({self._print(a)}, {bare(self._print(b))})")
        return self._rounded(f"{self._operand(a)} / {self._operand(b)}")

    def _print_Product(self, expr):
        return self._rounded(f"{self._operand(expr.args[0])} * {self._operand(expr.args[1])}")

    def _operand(self, e) -> str:
        """An operand of a division: a shared temporary's name as it is, anything else in
        parentheses."""
        return self._print(e) if isinstance(e, Shared) else f"({bare(self._print(e))})"

    # -- the lowered nodes

    def _print_IeeeNot(self, expr):
        return f"~{self._print(expr.args[0])}"

    def _print_IsNan(self, expr):
        return nan_test(bare(self._print(expr.args[0])))

    def _print_SignBit(self, expr):
        return sign_test(bare(self._print(expr.args[0])))

    def _print_IsFinite(self, expr):
        return f"torch.isfinite({bare(self._print(expr.args[0]))})"

    def _print_exp(self, expr):
        return f"torch.exp({bare(self._print(expr.args[0]))})"

    def _print_expm1(self, expr):
        return f"torch.expm1({bare(self._print(expr.args[0]))})"

    def _print_log(self, expr):
        return f"torch.log({bare(self._print(expr.args[0]))})"

    def _print_sigmoid(self, expr):  # as the NumPy backend writes it, operation for operation
        return f"(1 / (1 + torch.exp(-{self.parenthesize(expr.args[0], 60, strict=True)})))"

    def _print_Select(self, expr):
        cond, a, b = expr.args
        c = bare(self._print(cond))
        if a.is_number and b.is_number:  # two numbers: a tensor of the working dtype
            return f"torch.where({c}, torch.full_like({atom(c)}, {self._print(a)}, dtype=dtype), {self._print(b)})"
        return f"torch.where({c}, {bare(self._print(a))}, {bare(self._print(b))})"

    def _print_Count(self, expr):
        # the number of conditions that hold, added up in the working dtype
        return "(" + " + ".join(f"{atom(self._print(c))}.to(dtype)" for c in expr.args) + ")"

    def _print_MaxOf(self, expr):
        return self._fold("_maximum", expr.args)

    def _print_MinOf(self, expr):
        return self._fold("_minimum", expr.args)

    def _fold(self, fn, args):
        out = bare(self._print(args[0]))
        for a in args[1:]:
            out = f"{fn}({out}, {bare(self._print(a))}, dtype)"
        return out

    def _print_Symbol(self, expr):
        return expr.name


def torch_code(expr: sp.Basic, numbers: list, bfloat16: bool = False) -> str:
    """expr as torch code; numbers not exact in every working dtype are named (appended to
    ``numbers``)."""
    return bare(TorchCodePrinter({"bfloat16": bfloat16}, numbers).doprint(expr))
