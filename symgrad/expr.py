"""Expression mode: a safe parser for user expressions, and the Op that stands for one.

The expression is parsed, never evaluated as Python: the string is checked (length, characters),
parsed with ``ast`` in "eval" mode, its size and nesting depth are bounded, and only then is a
WHITELIST of node types walked to build SymPy objects directly:

* numbers (int, float; not bool, complex or strings), declared input names, ``pi``, ``E``;
* ``+ - * / **`` and unary ``-``/``+``;
* calls of known functions by name, with positional arguments only (``FUNCTIONS``).

Anything else (attribute access, subscripts, lambda, comprehensions, keywords, strings, f-strings,
conditional expressions, unknown names or functions, names with a leading underscore) is refused
with one ``ValueError`` line.  Symbols are real.  ``eval``, ``sympify`` and ``parse_expr`` are never
called on the text.

What the non-smooth functions become (the derivation rewrites them into the W-matrix view):

* ``Max(a, b, ...)``, ``Min(a, b, ...)``: ``MaxOf``/``MinOf`` with the arguments in the order
  written (the order and the tie policy decide the gradient at a tie);
* ``Abs(u)`` (``abs``): ``max(u, -u)``; ``relu(u)``: ``max(0, u)`` (the catalog's relu);
* ``Heaviside(u)``: the weight of ``u`` in ``max(0, u)`` (the policy's derivative of relu, so
  H(0) is 0/1/(1/2)/1 for first/last/split/all); ``Heaviside(u, h0)``: ``h0`` at 0, as given;
* ``sign(u)``: the weight of ``u`` minus that of ``-u`` in ``max(u, -u)`` (the policy's derivative
  of abs: sign(0) is +1/-1/0/0);
* ``Piecewise((v1, c1), ..., (vn, True))``: the first branch whose condition (a comparison, strict
  or not as written) holds; the policy does not apply, the condition decides the boundary.

Their a.e. derivatives carry no delta: Heaviside and sign have derivative 0 away from 0, a
Piecewise the derivative of the branch in force.
"""

from __future__ import annotations

import ast
import keyword
import operator
import re
import struct
from dataclasses import dataclass

import mpmath
import sympy as sp

from .indicators import Indicator, MaxOf, MinOf

MAX_CHARS = 2000  # characters of an expression
MAX_NODES = 400  # AST nodes
MAX_DEPTH = 32  # AST nesting depth
MAX_ARGS = 8  # arguments of one Max/Min (a wider max is a reduction: amax)
MAX_POWER = 64  # |exponent| of a numeric power
MAX_INPUTS = 16
MAX_NAME = 32  # characters of an input name
MAX_INT_DIGITS = 30

_ALLOWED_CHARS = re.compile(r"[A-Za-z0-9_+\-*/().,<>= \t\n]*")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
from .naming import is_reserved_name  # noqa: E402 (the one list of reserved names, every backend)


class ExprError(ValueError):
    """A refused expression (one line)."""


# ----------------------------------------------------------------------------- special functions

class HeavisideOf(sp.Function):
    """Heaviside(u) under the tie policy (h0 None), or with the value h0 at 0."""

    is_real = True

    def _sympystr(self, printer):
        return "Heaviside(%s)" % ", ".join(printer._print(a) for a in self.args)


class SignOf(sp.Function):
    """sign(u) under the tie policy (the policy's derivative of abs)."""

    nargs = 1
    is_real = True

    def _sympystr(self, printer):
        return "sign(%s)" % printer._print(self.args[0])


class PiecewiseOf(sp.Function):
    """PiecewiseOf(v1, [c1], v2, [c2], ..., vn): the first vi whose condition [ci] holds, else vn."""

    is_real = True

    def branches(self):
        a = self.args
        return [(a[k], a[k + 1]) for k in range(0, len(a) - 1, 2)], a[-1]

    def _sympystr(self, printer):
        pairs, last = self.branches()
        inner = ", ".join(f"({printer._print(v)}, {printer._print(c.rel)})" for v, c in pairs)
        return f"Piecewise({inner}, ({printer._print(last)}, True))"


class sigmoid(sp.Function):  # noqa: N801 (printed as written)
    """1 / (1 + exp(-u)), with the derivative sigmoid(u) * (1 - sigmoid(u)) (no inf/inf for large
    negative u, where exp(-u)/(1 + exp(-u))**2 would give NaN)."""

    nargs = 1
    is_real = True

    def fdiff(self, argindex=1):
        return self * (1 - self)


def _sigmoid(u):
    return sigmoid(u)


# name -> (min args, max args, builder)
FUNCTIONS = {
    "Max": (1, MAX_ARGS, lambda *a: a[0] if len(a) == 1 else MaxOf(*a)),
    "Min": (1, MAX_ARGS, lambda *a: a[0] if len(a) == 1 else MinOf(*a)),
    "Abs": (1, 1, lambda u: MaxOf(u, -u)),
    "abs": (1, 1, lambda u: MaxOf(u, -u)),
    "relu": (1, 1, lambda u: MaxOf(sp.S.Zero, u)),
    "Heaviside": (1, 2, lambda *a: HeavisideOf(*a)),
    "sign": (1, 1, lambda u: SignOf(u)),
    "exp": (1, 1, sp.exp),
    "log": (1, 1, sp.log),
    "sqrt": (1, 1, sp.sqrt),
    "tanh": (1, 1, sp.tanh),
    "sinh": (1, 1, sp.sinh),
    "cosh": (1, 1, sp.cosh),
    "sin": (1, 1, sp.sin),
    "cos": (1, 1, sp.cos),
    "tan": (1, 1, sp.tan),
    "atan": (1, 1, sp.atan),
    "sigmoid": (1, 1, _sigmoid),
}
# Python's spelling of Max and Min, as abs is of Abs: `--expr "max(x, y)"` is Max(x, y)
FUNCTIONS.update(max=FUNCTIONS["Max"], min=FUNCTIONS["Min"])
SPECIAL = ("Piecewise",)  # parsed by hand: (value, condition) pairs
CONSTANTS = {"pi": sp.pi, "E": sp.E}
KNOWN = tuple(FUNCTIONS) + SPECIAL


def _known_names() -> str:
    return ", ".join(KNOWN)


# ----------------------------------------------------------------------------- checks

def check_name(name: object, what: str = "input") -> str:
    """A variable name: a plain ASCII identifier, not a keyword, builtin, known function,
    constant or a name the generated code uses itself."""
    if not isinstance(name, str):
        raise TypeError(f"{what} names must be strings, got {name!r}")
    if not _NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise ExprError(f"{what} name {name!r} must be a plain identifier: a letter, then letters, "
                        f"digits or _ (at most {MAX_NAME} characters, no leading underscore)")
    if name in FUNCTIONS or name in SPECIAL or name in CONSTANTS:
        raise ExprError(f"{what} name {name!r} is a known function or constant; choose another name")
    if is_reserved_name(name):
        raise ExprError(f"{what} name {name!r} is reserved (a keyword, builtin or a name of the "
                        f"generated code); choose another name")
    return name


def _check_text(text: object) -> str:
    if not isinstance(text, str):
        raise TypeError(f"expr must be a string, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise ExprError(f"expression too long: {len(text)} characters (at most {MAX_CHARS})")
    if not text.strip():
        raise ExprError("expression is empty")
    if not _ALLOWED_CHARS.fullmatch(text):
        bad = next(ch for ch in text if not _ALLOWED_CHARS.fullmatch(ch))
        raise ExprError(f"character {bad!r} is not allowed in an expression (allowed: letters, "
                        f"digits, _ + - * / ( ) , . < > = and spaces)")
    return text


def _check_size(tree: ast.AST) -> None:
    """Bound the number of nodes and the nesting depth, iteratively, before building anything."""
    count = 0
    stack = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ExprError(f"expression too large: more than {MAX_NODES} syntax nodes")
        if depth > MAX_DEPTH:
            raise ExprError(f"expression nested too deeply: more than {MAX_DEPTH} levels")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def canonical_text(text: str) -> str:
    """The expression on one line, runs of whitespace as one space (for headers and names)."""
    return " ".join(text.split())


# ----------------------------------------------------------------------------- constants
#
# A constant part of an expression (no input in it: exp(10**29), sign(2), Max(1, 2), 1e308*1e308)
# is folded to one number while the expression is built, so that the generated code holds only
# plain literals.  It is evaluated from its exact form, never from rounded parts: the builder keeps
# each constant's tree as written (_Builder.exact), SymPy evaluates its closed forms exactly
# (sums, products and powers of integers, decimals, pi and E, and sin/cos/tan of those:
# sin(2*pi) is 0, cos(pi/2) is 0, tan(pi/2) is refused), and the rest is computed with mpmath
# at increasing precision until two precisions round to the same double (sin(1e308) needs the
# 1024 bits of 10**308), which is the value printed (rounded once).
# A value beyond 2**4096 counts as infinite (as in every float type) and then follows IEEE rules
# (exp(inf) = inf, 1/inf = 0); it is kept as the number BEYOND, which every printer writes as
# +-inf.  An undefined constant (inf - inf, sin(inf)) is refused.  Heaviside(0) and sign(0) depend
# on the tie policy: they stay as they are here and the derivation gives them the policy's value.

_PREC = 113  # bits of a folded constant (more where 113 bits would round to another double)
_MAX_PREC = 2 ** 15  # the most bits a constant is evaluated with
_LIMIT = mpmath.mpf(2) ** 4096
BEYOND = sp.Float(sp.Integer(2) ** 4097, 30)  # an infinite constant (printed as inf)
_ROOTS = {"sqrt", "log"}  # functions whose argument must be >= 0 (NaN below)


class _PolicyConstant(Exception):
    """Heaviside(0) or sign(0) (their value is the tie policy's)."""


def _saturate(v):
    if mpmath.isfinite(v) and abs(v) >= _LIMIT:
        return mpmath.inf if v > 0 else -mpmath.inf
    return v


def _mp(e: sp.Expr):
    """The value of a constant SymPy expression as an mpf at mpmath's working precision (inf beyond
    2**4096, nan if undefined); _value chooses the precision."""
    if e.is_Rational:
        return _saturate(mpmath.mpf(int(e.p)) / int(e.q))
    if e.is_Float:
        return _saturate(mpmath.mpf(e._mpf_))
    if e is sp.pi:
        return +mpmath.pi
    if e is sp.E:
        return +mpmath.e
    args = [_mp(a) for a in e.args]
    if e.is_Add:
        v = mpmath.fsum(args)
    elif e.is_Mul:
        v = args[0]
        for a in args[1:]:
            v = v * a
    elif e.is_Pow:
        base, exp = args
        if base < 0 and not (mpmath.isfinite(exp) and exp == int(exp)):
            v = mpmath.nan
        elif base == 0 and exp < 0:
            v = mpmath.inf
        else:
            v = base ** exp if mpmath.isfinite(base) or exp != 0 else mpmath.mpf(1)
    elif isinstance(e, (MaxOf, MinOf)):
        v = mpmath.nan if any(mpmath.isnan(a) for a in args) else (max if e.kind == "max" else min)(args)
    elif isinstance(e, HeavisideOf):
        u = args[0]
        if u == 0:
            if len(args) == 1:
                raise _PolicyConstant
            v = args[1]
        else:
            v = u if mpmath.isnan(u) else mpmath.mpf(u > 0)
    elif isinstance(e, SignOf):
        u = args[0]
        if u == 0:
            raise _PolicyConstant
        v = u if mpmath.isnan(u) else mpmath.mpf(1 if u > 0 else -1)
    elif type(e).__name__ in _MP_FUNCTIONS:
        v = _MP_FUNCTIONS[type(e).__name__](args[0])
    else:
        raise ExprError(f"the constant part {sp.sstr(e)!r} cannot be evaluated")
    return _saturate(v)


def _mp_exp(u):
    if mpmath.isinf(u) or abs(u) > 4096:  # beyond 2**4096 (or 0) without computing it
        return mpmath.inf if u > 0 else mpmath.mpf(0)
    return mpmath.exp(u)


def _mp_periodic(f):
    def g(u):  # sin(inf) is NaN; beyond 2**1100 no double argument is that large either
        return mpmath.nan if not mpmath.isfinite(u) or abs(u) > mpmath.mpf(2) ** 1100 else f(u)
    return g


def _mp_log(u):
    if u < 0:
        return mpmath.nan
    return -mpmath.inf if u == 0 else mpmath.log(u)


_MP_FUNCTIONS = {
    "exp": _mp_exp, "log": _mp_log,
    "sinh": lambda u: mpmath.sign(u) * _mp_exp(abs(u)) / 2 if abs(u) > 4096 else mpmath.sinh(u),
    "cosh": lambda u: _mp_exp(abs(u)) / 2 if abs(u) > 4096 else mpmath.cosh(u),
    "tanh": lambda u: mpmath.sign(u) if abs(u) > 4096 else mpmath.tanh(u),
    "sin": _mp_periodic(mpmath.sin), "cos": _mp_periodic(mpmath.cos), "tan": _mp_periodic(mpmath.tan),
    "atan": lambda u: mpmath.atan(u),
    "sigmoid": lambda u: (mpmath.mpf(u > 0) if abs(u) > 4096 else 1 / (1 + mpmath.exp(-u))),
}


def _double(v) -> bytes:
    """The double v rounds to, as its bits (so -0.0 and NaN compare as themselves)."""
    return struct.pack("<d", float(v))


def _value(e: sp.Expr):
    """The value of a constant as an mpf, computed at increasing precision (from 113 bits more
    than its largest integer, which is then exact) until two successive precisions round to the
    same double: the double nearest to the exact value, rounded once.  A value within 2**-1075 of
    0 that SymPy does not know to be 0 (log(8) - 3*log(2)) becomes +-0 there."""
    bits = [int(a.p).bit_length() + int(a.q).bit_length() for a in sp.preorder_traversal(e) if a.is_Rational]
    prec = _PREC + max(bits, default=0)
    last = None
    while True:
        with mpmath.workprec(prec):
            v = _mp(e)
        if _double(v) == last or prec >= _MAX_PREC:
            return v
        last, prec = _double(v), 2 * prec


def _as_sympy(v) -> sp.Expr:
    if mpmath.isinf(v):
        return BEYOND if v > 0 else -BEYOND
    if v == int(v) and abs(v) <= 2 ** 53:  # sign(2), Heaviside(1), Max(1, 2): exact
        return sp.Integer(int(v))
    if v == 0:
        return sp.S.Zero
    prec = max(_PREC, v._mpf_[3])  # the bits it was computed with, 113 where they round alike
    with mpmath.workprec(_PREC):
        if _double(+v) == _double(v):
            prec = _PREC
    return sp.Float._new(v._mpf_, prec)


def _closed(e: sp.Expr) -> bool:
    """A number SymPy computes with exactly: integers, decimals (rationals), pi and E joined by
    sums, products and powers."""
    return e.is_Rational or e in (sp.pi, sp.E) or (
        isinstance(e, (sp.Add, sp.Mul, sp.Pow)) and all(_closed(a) for a in e.args))


def exact_form(e: sp.Expr) -> sp.Expr:
    """A constant (built unevaluated) with its closed-form parts evaluated exactly by SymPy:
    sums, products and powers of closed forms, and sin, cos, tan of them (sin(2*pi) is 0, cos(pi/6)
    is sqrt(3)/2); the other parts stay as written, for mpmath (_value).  A pole (tan(pi/2)) is
    refused: the expression is infinite or undefined there."""
    if not e.args or isinstance(e, PiecewiseOf) or e.has(Indicator):
        return e
    args = [exact_form(a) for a in e.args]
    if all(_closed(a) for a in args) and isinstance(e, (sp.Add, sp.Mul, sp.Pow, sp.sin, sp.cos, sp.tan)):
        value = e.func(*args)
        if isinstance(e, (sp.sin, sp.cos, sp.tan)) and value.has(sp.zoo, sp.oo, sp.nan):
            raise ExprError(f"the constant part {sp.sstr(e.func(*args, evaluate=False))!r} is undefined: {type(e).__name__} has "
                            f"a pole there (infinite, no number)")
        if _closed(value):
            return value
    with sp.evaluate(False):
        return e.func(*args)


def fold_constant(e: sp.Expr) -> sp.Expr:
    """e with a constant value folded to one number (e itself when it holds an input, is an exact
    rational, or holds Heaviside(0)/sign(0), whose value is the tie policy's), from e's exact form
    (exact_form: sin(2*pi) is 0), rounded once (_value)."""
    if not e.is_number or isinstance(e, PiecewiseOf) or e.has(Indicator):
        return e
    e = exact_form(e)
    if e.is_Rational or e.is_Float or e in (sp.pi, sp.E):
        return e
    try:
        v = _value(e)
    except _PolicyConstant:
        return e
    if mpmath.isnan(v):
        raise ExprError(f"the constant part {sp.sstr(e)!r} is undefined (NaN): a number was "
                        f"expected (inf - inf, 0*inf, sin(inf) and roots of negative numbers are not)")
    return _as_sympy(v)


def policy_constants(e: sp.Expr, ties: str) -> sp.Expr:
    """e with Heaviside(0) and sign(0) given the tie policy's values (H(0): the weight of u in
    max(0, u) at u = 0; sign(0): that of u minus that of -u in max(u, -u)), then folded."""
    h0 = {"first": sp.S.Zero, "last": sp.S.One, "split": sp.S.Half, "all": sp.S.One}[ties]
    s0 = {"first": sp.S.One, "last": sp.S.NegativeOne, "split": sp.S.Zero, "all": sp.S.Zero}[ties]
    table = {}
    for a in sp.preorder_traversal(e):
        if isinstance(a, (HeavisideOf, SignOf)) and a.args[0].is_number:
            u = a.args[0]
            if _value(exact_form(u)) == 0:
                table[a] = (h0 if len(a.args) == 1 else a.args[1]) if isinstance(a, HeavisideOf) else s0
    return fold_constant(e.xreplace(table)) if table else e


def _domain_base(b: sp.Expr) -> sp.Expr:
    """A base whose sign decides a domain, up to a positive factor (sqrt(2*x) is sqrt(2)*sqrt(x))."""
    c, rest = b.as_coeff_Mul()
    return rest if c.is_positive else b


def _domain_bases(e: sp.Expr) -> set:
    """The bases that e's roots, fractional powers and logs need to be >= 0."""
    out = set()
    for a in sp.preorder_traversal(e):
        if a.is_Pow and a.exp.is_integer is not True:
            b = a.base
        elif isinstance(a, sp.log):
            b = a.args[0]
        else:
            continue
        if not b.is_number:
            out.add(_domain_base(b))
    return out


# ----------------------------------------------------------------------------- the builder

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
_PY_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
_COMPARE = {ast.Lt: sp.StrictLessThan, ast.LtE: sp.LessThan, ast.Gt: sp.StrictGreaterThan,
            ast.GtE: sp.GreaterThan}


class _Builder:
    def __init__(self, declared: tuple[str, ...] | None):
        self.declared = declared
        self.names: list[str] = []  # free names in order of first appearance
        self.symbols: dict[str, sp.Symbol] = {}
        self.needs: dict[int, frozenset] = {}  # id(AST node) -> bases that must be >= 0 (as written)
        self.values: dict[int, sp.Expr] = {}  # id(AST node) -> its value
        # id(AST node) -> a constant's exact form as written (unevaluated), which its value and
        # its parents' values are computed from (fold_constant), never from rounded parts
        self.exact: dict[int, sp.Expr] = {}
        self._exact_mode = False  # building a constant's exact form: its parts' exact forms

    def build(self, node: ast.AST) -> sp.Expr:
        """The SymPy value of an AST node, its constant parts folded to numbers (fold_constant),
        and what its domain needs as written (the bases of its roots, powers and logs)."""
        if self._exact_mode:  # a part of a constant, built already
            return self.exact.get(id(node), self.values.get(id(node)))
        e = self._build(node)
        if e.is_number and not isinstance(e, PiecewiseOf):
            exact = self._exact_form(node)
            if exact.is_number:  # (not x*sin(pi), which is 0 once sin(pi) is)
                self.exact[id(node)] = exact
                e = fold_constant(exact)
        needs = set(self._child_needs(node))
        base = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ROOTS \
                and node.args:
            base = self._built_base(node.args[0])
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            exp = self._built_base(node.right)
            if exp is not None and exp.is_integer is not True:
                base = self._built_base(node.left)
        if base is not None and not base.is_number and base.is_nonnegative is not True:
            needs.add(_domain_base(base))
        self.needs[id(node)] = frozenset(needs)
        self.values[id(node)] = e
        return e

    def _exact_form(self, node: ast.AST) -> sp.Expr:
        """A constant node as written, from its parts' exact forms, unevaluated (its checks were
        made on the folded values): sin(2*pi) stays sin(2*pi), for exact_form to evaluate."""
        self._exact_mode = True
        try:
            with sp.evaluate(False):
                return self._build(node)
        finally:
            self._exact_mode = False

    def _built_base(self, node: ast.AST):
        return self.values.get(id(node))

    def _child_needs(self, node: ast.AST):
        for child in ast.iter_child_nodes(node):
            if id(child) in self.needs:
                yield from self.needs[id(child)]
            else:  # a tuple or comparison of Piecewise: its parts were built
                yield from self._child_needs(child)

    def keep_domain(self, node: ast.AST, where: str) -> None:
        """Refuse when SymPy's automatic simplification dropped a domain requirement of the
        expression as written: sqrt(z)*sqrt(z) is z, defined where sqrt(z) is not (NaN)."""
        value = self.values.get(id(node))
        if value is None:
            return
        kept = _domain_bases(value)
        for b in sorted(self.needs.get(id(node), ()), key=sp.default_sort_key):
            if b not in kept:
                raise ExprError(
                    f"SymPy would simplify {where} {ast.unparse(node)!r} to {sp.sstr(value)!r}, "
                    f"which is defined where {sp.sstr(b)} < 0 although the expression as written "
                    f"is not (NaN there: a root, fractional power or log of a negative number); "
                    f"write it without that cancellation (it must keep the expression's domain)")

    def _build(self, node: ast.AST) -> sp.Expr:
        if isinstance(node, ast.Constant):
            return self._number(node.value)
        if isinstance(node, ast.Name):
            return self._name(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.build(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            a, b = self.build(node.left), self.build(node.right)
            if isinstance(node.op, ast.Div) and b == 0:
                raise ExprError("division by zero in the expression")
            return _BINOPS[type(node.op)](a, b)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            if self._exact_mode:
                return sp.Pow(self.build(node.left), self.build(node.right), evaluate=False)
            return self._power(self.build(node.left), self.build(node.right))
        if isinstance(node, ast.Call):
            return self._call(node)
        raise ExprError(f"{_describe(node)} is not allowed in an expression (allowed: numbers, "
                        f"input names, + - * / **, and calls of {_known_names()})")

    def _number(self, v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ExprError(f"constant {v!r} is not allowed (only int and float numbers)")
        if isinstance(v, int):
            if len(str(abs(v))) > MAX_INT_DIGITS:
                raise ExprError(f"integer constant with more than {MAX_INT_DIGITS} digits")
            return sp.Integer(v)
        if v != v or v in (float("inf"), float("-inf")):
            raise ExprError(f"constant {v!r} is not finite")
        # exact: the decimal as written (0.1 is 1/10), so that equal pieces compare equal in the
        # derivation; printed back it is the same double
        return sp.Rational(repr(v))

    def _name(self, name: str) -> sp.Expr:
        if name in CONSTANTS:
            return CONSTANTS[name]
        if name in FUNCTIONS or name in SPECIAL:
            raise ExprError(f"{name} is a function: call it, e.g. {name}(x)")
        if name.startswith("_"):
            raise ExprError(f"name {name!r} is not allowed (no leading underscore)")
        if self.declared is not None:
            if name not in self.declared:
                raise ExprError(f"unknown name {name!r}: not a declared input "
                                f"({', '.join(self.declared)}), known function or constant")
        else:
            try:
                check_name(name)
            except ExprError as exc:
                raise ExprError(f"unknown name {name!r}: {exc}") from None
        if name not in self.symbols:
            if len(self.symbols) >= MAX_INPUTS:
                raise ExprError(f"too many inputs (at most {MAX_INPUTS})")
            self.symbols[name] = sp.Symbol(name, real=True)
            self.names.append(name)
        return self.symbols[name]

    def _power(self, base: sp.Expr, exp: sp.Expr) -> sp.Expr:
        if exp.is_number:
            if not exp.is_real:
                raise ExprError("exponent is not a real number")
            if abs(float(exp)) > MAX_POWER:
                raise ExprError(f"numeric exponent {exp} too large (at most {MAX_POWER} in size)")
            if base.is_number and base != 0 and float(exp) != 0:
                import math
                size = abs(math.log10(abs(float(base))) if float(base) else 0) * abs(float(exp))
                if size > 300:
                    raise ExprError("numeric power too large")
        elif base.is_number and abs(float(base)) > 1e300:
            raise ExprError("numeric base too large")
        return base ** exp

    def _call(self, node: ast.Call) -> sp.Expr:
        if not isinstance(node.func, ast.Name):
            raise ExprError(f"only known functions may be called by name, not {_describe(node.func)}")
        fname = node.func.id
        if node.keywords:
            raise ExprError(f"{fname}: keyword arguments are not allowed (positional only)")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise ExprError(f"{fname}: starred arguments are not allowed")
        if fname == "Piecewise":
            return self._piecewise(node.args)
        if fname not in FUNCTIONS:
            raise ExprError(f"unknown function {fname!r}; known: {_known_names()}")
        lo, hi, make = FUNCTIONS[fname]
        if not lo <= len(node.args) <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            raise ExprError(f"{fname} takes {want} argument(s), got {len(node.args)}")
        args = [self.build(a) for a in node.args]
        for a in node.args:
            self.keep_domain(a, f"the argument of {fname}")
        if fname == "Heaviside" and len(args) == 2 and not args[1].is_number:
            raise ExprError("Heaviside(u, h0): h0 (the value at 0) must be a number")
        if all(a.is_number for a in args):  # folded by build(), not by SymPy (exp(1e9565))
            with sp.evaluate(False):
                return make(*args)
        return make(*args)

    def _piecewise(self, args) -> sp.Expr:
        if not args:
            raise ExprError("Piecewise needs (value, condition) pairs, the last one (value, True)")
        flat = []
        for k, pair in enumerate(args):
            if not (isinstance(pair, ast.Tuple) and len(pair.elts) == 2):
                raise ExprError("Piecewise takes (value, condition) pairs")
            value, cond = pair.elts
            last = k == len(args) - 1
            if last:
                if not (isinstance(cond, ast.Constant) and cond.value is True):
                    raise ExprError("Piecewise: the last pair must be (value, True)")
                flat.append(self._branch(value))
                break
            v, c = self._branch(value), self._condition(cond)
            if c is sp.S.Zero:  # a condition on constants that does not hold: never taken
                continue
            if c is sp.S.One:  # one that holds: taken wherever no earlier branch is
                flat.append(v)
                break
            flat += [v, c]
        if len(flat) == 1:
            return flat[0]
        return PiecewiseOf(*flat)

    def _branch(self, node: ast.AST) -> sp.Expr:
        v = self.build(node)
        self.keep_domain(node, "the Piecewise value")
        return v

    def _condition(self, node: ast.AST) -> Indicator:
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE):
            raise ExprError("Piecewise: a condition must be one comparison a < b, a <= b, a > b "
                            "or a >= b (before the last pair, whose condition is True)")
        a, b = self.build(node.left), self.build(node.comparators[0])
        for side in (node.left, node.comparators[0]):
            self.keep_domain(side, "the Piecewise condition's side")
        rel = _COMPARE[type(node.ops[0])]
        if a.is_number and b.is_number:  # decided here, on the folded values
            try:
                holds = _PY_COMPARE[type(node.ops[0])](_value(exact_form(a)), _value(exact_form(b)))
            except _PolicyConstant:
                raise ExprError(f"Piecewise: the condition {ast.unparse(node)!r} compares constants "
                                f"whose value depends on the tie policy (Heaviside(0), sign(0)); "
                                f"write the constant it should be") from None
            return sp.S.One if holds else sp.S.Zero
        return Indicator(rel(a, b, evaluate=False))


def _describe(node: ast.AST) -> str:
    names = {ast.Attribute: "attribute access", ast.Subscript: "subscripting", ast.Lambda: "lambda",
             ast.ListComp: "a comprehension", ast.GeneratorExp: "a comprehension",
             ast.SetComp: "a comprehension", ast.DictComp: "a comprehension",
             ast.IfExp: "a conditional expression", ast.JoinedStr: "an f-string",
             ast.Compare: "a comparison (outside Piecewise)", ast.BoolOp: "and/or",
             ast.Tuple: "a tuple (outside Piecewise)", ast.List: "a list", ast.Dict: "a dict",
             ast.Set: "a set", ast.NamedExpr: "an assignment expression", ast.Await: "await",
             ast.Yield: "yield", ast.Starred: "a starred argument", ast.Call: "a call"}
    if isinstance(node, ast.BinOp):
        return f"operator {type(node.op).__name__}"
    if isinstance(node, ast.UnaryOp):
        return f"operator {type(node.op).__name__}"
    return names.get(type(node), type(node).__name__)


@dataclass(frozen=True)
class Parsed:
    text: str  # canonical text (one line)
    expr: sp.Expr  # SymPy, with MaxOf/MinOf/HeavisideOf/SignOf/PiecewiseOf
    inputs: tuple[str, ...]


def parse(text: object, inputs: object = None) -> Parsed:
    """Parse an expression safely; inputs: declared names (default: the free names in order of
    first appearance)."""
    text = _check_text(text)
    declared = None
    if inputs is not None:
        if isinstance(inputs, str) or not isinstance(inputs, (tuple, list)):
            raise TypeError(f"inputs must be a tuple or list of names, got {inputs!r}")
        declared = tuple(check_name(n) for n in inputs)
        if not declared:
            raise ExprError("inputs must name at least one input")
        if len(set(declared)) != len(declared):
            raise ExprError(f"inputs must not repeat a name, got {declared!r}")
        if len(declared) > MAX_INPUTS:
            raise ExprError(f"too many inputs (at most {MAX_INPUTS})")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"not a valid expression: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise ExprError(f"not a valid expression: {type(exc).__name__}") from None
    _check_size(tree)
    builder = _Builder(declared)
    expr = builder.build(tree.body)
    builder.keep_domain(tree.body, "the expression")
    if expr.has(sp.zoo, sp.nan, sp.oo, sp.S.NegativeInfinity, sp.I) or any(
            a.is_number and a.is_real is False for a in sp.preorder_traversal(expr)):
        raise ExprError("the expression has an infinite, undefined or non-real constant part")
    names = declared or tuple(builder.names)
    if not names:
        raise ExprError("the expression has no input (a constant has no gradient)")
    free = {s.name for s in expr.free_symbols}
    missing = [n for n in names if n not in free]
    if missing:
        raise ExprError(f"input {missing[0]!r} does not appear in the expression"
                        + (" (after simplification)" if missing[0] in builder.names else ""))
    return Parsed(canonical_text(text), expr, names)


def check_wrt(wrt: object, inputs: tuple[str, ...]) -> tuple[str, ...]:
    """The inputs whose gradients backward returns (default: all), in input order."""
    if wrt is None:
        return inputs
    if isinstance(wrt, str):
        wrt = (wrt,)
    if not isinstance(wrt, (tuple, list)) or not all(isinstance(w, str) for w in wrt):
        raise TypeError(f"wrt must be a name or a tuple of input names, got {wrt!r}")
    unknown = [w for w in wrt if w not in inputs]
    if unknown:
        raise ExprError(f"wrt names {unknown[0]!r}, which is not an input ({', '.join(inputs)})")
    if not wrt:
        raise ExprError("wrt must name at least one input")
    return tuple(n for n in inputs if n in wrt)


def check_module_name(name: object) -> str:
    """NAME of a generated module: a safe identifier (it becomes file, module and kernel names)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {name!r}")
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,47}", name) or keyword.iskeyword(name):
        raise ExprError(f"name {name!r} must be a lowercase identifier: a letter, then lowercase "
                        f"letters, digits or _ (at most 48 characters)")
    return name


def make_op(text: object, name: object = None, inputs: object = None, wrt: object = None,
            ties: object = None, convention: object = None, nan: object = None):
    """(Op, Parsed) for an expression: the Op names the module and carries everything that
    affects the code (expression, inputs, wrt, policy)."""
    from . import policy as _policy
    from .ops import Op, OpSpec
    parsed = parse(text, inputs)
    wrt = check_wrt(wrt, parsed.inputs)
    if convention is not None:
        raise ExprError(f"convention={convention!r}: framework conventions are defined per catalog "
                        f"op; for an expression choose ties= (first, last, split, all)")
    explicit = ties is not None
    ties = _policy.check_policy(ties)
    if nan is not None and nan != "dominate":
        if not isinstance(nan, str):
            raise TypeError(f"nan must be a string, got {nan!r}")
        raise ExprError(f"expression mode implements NaN rule 'dominate' only, not nan={nan!r}")
    if name is None:
        import hashlib
        name = "expr_" + hashlib.sha256(f"{parsed.text}|{parsed.inputs}".encode()).hexdigest()[:10]
    name = check_module_name(name)
    spec = OpSpec(name, "expression", parsed.text, inputs=parsed.inputs)
    origin = (("ties", "explicit" if explicit else "default"), ("nan", "default"),
              ("order", "default"))
    params = {"expr": parsed.text, "inputs": parsed.inputs, "wrt": wrt}
    return Op(spec, params, ties, "dominate", "given", None, origin), parsed
