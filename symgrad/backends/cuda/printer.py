"""The CUDA backend's printer: the C-family printer (``backends/cfamily/printer.py``) for CUDA
device code, and the window geometry in C's 64-bit integer arithmetic with its floating-point
parts in the compute type ``A`` of the kernel's template function."""

from __future__ import annotations

from dataclasses import replace

import sympy as sp

from ..cfamily.printer import ARITHMETIC, REAL_TYPES, CFamilyPrinter
from ..printing import bare as _bare
from ..printing import integer_code

CUDA_REAL_TYPES = REAL_TYPES


class CudaPrinter(CFamilyPrinter):
    """C99 for CUDA device code in one compute type (``real_type``: float or double): the
    C-family printing (device qualifiers are the templates', not the printer's)."""


def cuda_code(expr: sp.Basic, real_type: str, names: dict | None = None, half_constants: bool = False,
              bfloat16_constants: bool = False) -> str:
    """One expression as CUDA C in the compute type real_type, without outer parentheses; names:
    {symbol name: C identifier} for the symbols spelled otherwise in the .cu (the inputs'
    mangled names, cfamily.naming.c_identifiers); half_constants (bfloat16_constants): numbers rounded
    to float16 (bfloat16) first, each product and sum rounded to it."""
    return _bare(CudaPrinter({"real_type": real_type, "names": dict(names or {}),
                              "half_constants": half_constants,
                              "bfloat16_constants": bfloat16_constants}).doprint(expr))


CUDA_ARITHMETIC = replace(ARITHMETIC, real=lambda s: f"(A)({s})")


def cuda_integer_code(expr: sp.Basic, names: dict | None = None) -> str:
    """An expression of the window geometry in C's 64-bit integer arithmetic: for nonnegative p
    and positive q, p / q is floor(p / q) and (p + q - 1) / q is ceiling(p / q) (every quotient
    the geometry divides has a nonnegative numerator where its value is used; a negative one only
    in a condition that a comparison beside it already decides); floating-point parts in the
    compute type A of the template function, truncated to long long as C's cast does."""
    return integer_code(expr, CUDA_ARITHMETIC, names)
