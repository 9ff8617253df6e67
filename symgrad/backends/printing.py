"""What the backends' code printers share: one SymPy node in, one string out, no math decided.

Each backend's printer (``backends/<name>/printer.py``) subclasses a SymPy code printer and adds the
nodes of the lowered kernel description (lower.py).  A comparison is printed as a comparison, never
through Heaviside or a subtraction (``inf - inf`` is NaN)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import sympy as sp

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


def bfloat16_value(value: float) -> float:
    """A double rounded to the nearest bfloat16 (8 significant bits, ties to even; subnormals
    below 2**-126 in steps of 2**-133; +-inf beyond its range), as a double: the value JAX gives a
    Python number used with a bfloat16 array.  Pure Python (the generator needs no ml_dtypes)."""
    if value != value or value in (math.inf, -math.inf) or value == 0:
        return value
    step = max(math.frexp(value)[1] - 8, -133)  # the bfloat16 spacing at value
    out = round(math.ldexp(value, -step)) * 2.0 ** step  # round(): ties to even, exact scaling
    if abs(out) >= 2.0 ** 128:
        return math.copysign(math.inf, value)
    return math.copysign(out, value) if out == 0 else out


def fold_calls(printer, fn: str, args) -> str:
    """A left fold of a binary function over printed operands: fn(fn(a0, a1), a2) ... (an n-ary
    max/min as its framework's two-operand calls, in the order written)."""
    out = printer._print(args[0])
    for a in args[1:]:
        out = f"{fn}({out}, {printer._print(a)})"
    return out


def weak_comparisons(args) -> list:
    """The operands of an OR, each pair (a == b, a > b) of the same two operands joined into
    a >= b (and (a == b, a < b) into a <= b) in the place of the strict comparison: the same
    truth for every pair of floats (NaN: both false; -0 and +0: both true), one comparison
    instead of three operations."""
    args, used = list(args), set()  # used: the equalities joined
    for i, rel in enumerate(args):
        if not isinstance(rel, (sp.StrictGreaterThan, sp.StrictLessThan)):
            continue
        j = next((j for j, e in enumerate(args) if j not in used and isinstance(e, sp.Eq)
                  and {e.lhs, e.rhs} == {rel.lhs, rel.rhs}), None)
        if j is not None:
            weak = sp.GreaterThan if isinstance(rel, sp.StrictGreaterThan) else sp.LessThan
            args[i] = weak(rel.lhs, rel.rhs, evaluate=False)
            used.add(j)
    return [a for k, a in enumerate(args) if k not in used]


class ConditionPrinter:
    """Comparisons and Boolean connectives in a backend's operators (AND, OR, NOT, TRUE, FALSE,
    set by each printer): a comparison is printed as a comparison, in parentheses; a connective
    joins its printed operands.  Listed first among a printer's bases, so these methods win."""

    AND = OR = NOT = TRUE = FALSE = ""

    def _print_Relational(self, expr):
        return f"({self._print(expr.lhs)} {INFIX[expr.rel_op]} {self._print(expr.rhs)})"

    def _bool_join(self, expr, sep, args=None):
        return "(" + f" {sep} ".join(self._print(a) for a in (expr.args if args is None else args)) + ")"

    def _print_And(self, expr):
        return self._bool_join(expr, self.AND)

    def _print_Or(self, expr):
        return self._or_join(expr, self.OR)

    def _or_join(self, expr, sep):
        """An OR's operands joined by sep, an equality and a strict comparison of the same two
        operands printed as one weak comparison (weak_comparisons)."""
        args = weak_comparisons(expr.args)
        return self._print(args[0]) if len(args) == 1 else self._bool_join(expr, sep, args)

    def _print_Not(self, expr):
        return f"{self.NOT}{self._print(expr.args[0])}"

    def _print_BooleanTrue(self, expr):
        return self.TRUE

    def _print_BooleanFalse(self, expr):
        return self.FALSE


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


# the order in which terms and factors of the geometry are printed (symgrad.geometry's symbols)
_ORDER = {name: k for k, name in enumerate("i x q j u length out k s p d alpha ratio".split())}


@dataclass(frozen=True)
class Arithmetic:
    """How a backend writes the geometry's integer and floating-point arithmetic (its printer's
    settings): floor(p / q), ceiling(p / q), Mod(p, q), Min/Max (None: not printable there), the
    connectives, a cast of an integer to the floating-point type, and int()'s truncation."""

    floor_div: Callable[[str, str], str]
    ceil_div: Callable[[str, str], str]
    mod: Callable[[str, str], str]
    min: Callable[[str, str], str] | None
    max: Callable[[str, str], str] | None
    AND: str
    OR: str
    NOT: str
    TRUE: str
    real: Callable[[str], str] = lambda s: s
    trunc: Callable[[str], str] = lambda s: f"int({s})"


def integer_code(e: sp.Basic, arithmetic: Arithmetic, names: dict | None = None) -> str:
    """An expression of ``symgrad.geometry`` as code: sums and products of integers, floor and
    ceiling of a quotient, Mod, Min and Max; comparisons and connectives; floor of a
    floating-point product (truncation: its operands are nonnegative), where a quotient of
    integers is a floating-point division.  ``names`` renames symbols ({symbol or its name: code});
    the others are printed as they are named."""
    a = arithmetic
    names = {str(k): v for k, v in (names or {}).items()}

    def name(sym) -> str:
        return names.get(sym.name, sym.name)

    def rank(t) -> tuple:  # the geometry's symbols in the order they are read: i * s + j * d - p
        ranks = [_ORDER.get(str(x), len(_ORDER)) for x in t.free_symbols] or [len(_ORDER)]
        return (min(ranks), sp.default_sort_key(t))

    def terms(e):  # in the symbols' order, those with a minus sign after the others, numbers last
        return sorted(e.args, key=lambda t: (t.is_number, t.could_extract_minus_sign(), rank(t)))

    def code(e, inner=False) -> str:
        """e as code; ``inner``: an operand of a product (a sum or a quotient in parentheses)."""
        if e.is_Symbol:
            return name(e)
        if e.is_Integer:
            return str(e)
        if e is sp.true:
            return a.TRUE
        if isinstance(e, sp.core.relational.Relational):
            return f"({code(e.lhs)} {e.rel_op} {code(e.rhs)})"
        if isinstance(e, (sp.And, sp.Or)):
            return "(" + f" {a.AND if isinstance(e, sp.And) else a.OR} ".join(code(t) for t in e.args) + ")"
        if isinstance(e, sp.Not):
            return f"{a.NOT}{code(e.args[0])}"
        if isinstance(e, sp.floor) and not sp.fraction(sp.together(e.args[0]))[1].free_symbols:
            return a.trunc(code(e.args[0]))  # a floating-point product, nonnegative: truncated
        if isinstance(e, (sp.floor, sp.ceiling)):
            p, q = sp.fraction(sp.together(e.args[0]))
            s = (a.floor_div if isinstance(e, sp.floor) else a.ceil_div)(code(p), code(q, True))
            return f"({s})" if inner else s
        if isinstance(e, sp.Mod):
            s = a.mod(code(e.args[0], True), code(e.args[1], True))
            return f"({s})" if inner else s
        if isinstance(e, (sp.Min, sp.Max)):
            join = a.min if isinstance(e, sp.Min) else a.max
            if join is None:
                raise ValueError(f"{type(e).__name__} is not printed in this backend's integer arithmetic")
            out = code(e.args[0])
            for t in e.args[1:]:
                out = join(out, code(t))
            return out
        if e.is_Add:
            ts = terms(e)
            s = code(ts[0]) if not ts[0].could_extract_minus_sign() else f"-{code(-ts[0], True)}"
            for t in ts[1:]:  # a subtracted sum in parentheses
                s += f" - {code(-t, (-t).is_Add)}" if t.could_extract_minus_sign() else f" + {code(t)}"
            return f"({s})" if inner else s
        if e.is_Mul:
            p, q = sp.fraction(e)
            if q != 1:  # integers divided in floating point (fractional pooling's step)
                return f"{a.real(code(p))} / {a.real(code(q))}"
            factors = sorted(e.args, key=lambda f: (not f.is_Add, not f.is_number, rank(f)))
            s = " * ".join(code(f, True) for f in factors)
            return f"({s})" if inner else s
        raise ValueError(f"not an expression of the window geometry: {e}")

    return code(sp.sympify(e))


def atom(s: str) -> str:
    """s as an operand: in parentheses unless it is a name or a number."""
    return s if s.replace("_", "").isalnum() else f"({s})"


PYTHON = Arithmetic(lambda p, q: f"{atom(p)} // {q}", lambda p, q: f"-(-{atom(p)} // {q})",
                    lambda p, q: f"{p} % {q}", lambda p, q: f"min({p}, {q})",
                    lambda p, q: f"max({p}, {q})", "&", "|", "~", "True", real=lambda s: f"({s})")


def python_integer_code(expr: sp.Basic, names: dict | None = None) -> str:
    """An expression of the window geometry in Python's integer arithmetic (ints and NumPy
    integer arrays, in the NumPy modules and the CUDA loaders): floor division ``//``,
    ceiling(p / q) as -(-p // q), conditions joined by & and | (they hold for arrays too)."""
    return integer_code(expr, PYTHON, names)


def pool_axis_code(g, a: int, code: Callable[[sp.Basic, dict], str]) -> dict:
    """Pooling's geometry (symgrad.geometry) along spatial axis a, printed by a C-like backend's
    integer printer `code` as its pool kernels name it: window p<a>, element k<a>, input
    coordinate i<a>, constants K<a> S<a> P<a> D<a>."""
    names = {"i": f"p{a}", "j": f"k{a}", "x": f"i{a}", "length": f"l{a}", "out": f"o{a}",
             "k": f"K{a}", "s": f"S{a}", "p": f"P{a}", "d": f"D{a}", "q": f"q{a}"}
    return {"coordinate": code(g.coordinate, names),
            "outside": bare(code(sp.to_nnf(sp.Not(g.inside)), names)),
            "inside": bare(code(g.inside, names)),
            "coordinate_of_local": code(g.coordinate, names | {"j": f"(local % K{a})"}),
            "offset": code(g.offset, names),
            "holds": code(g.holds, names),
            "holder": code(g.holder, names),
            "holder_operand": atom(code(g.holder, names))}
