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
import builtins
import keyword
import re
from dataclasses import dataclass

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
# intermediate values of the generated code (u0, s0, h0, g_...) and the output
_INTERNAL = re.compile(r"(?:[ush][0-9]+|g_.*|grad_.*|sg_.*|M_.*|FP_.*)")

_C_WORDS = {
    "auto", "bool", "break", "case", "char", "const", "continue", "default", "do", "double", "else",
    "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict",
    "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union",
    "unsigned", "void", "volatile", "while", "class", "namespace", "template", "typename", "this",
    "new", "delete", "operator", "private", "public", "protected", "virtual", "friend", "using",
    "true", "false", "nullptr", "typeid", "throw", "try", "catch", "explicit", "mutable",
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "half", "dim3",
    # C++11-20 keywords and alternative tokens, and macros nvcc and the .cu file define
    "alignas", "alignof", "asm", "char8_t", "char16_t", "char32_t", "wchar_t", "concept", "consteval",
    "constexpr", "constinit", "const_cast", "co_await", "co_return", "co_yield", "decltype",
    "dynamic_cast", "export", "noexcept", "reinterpret_cast", "requires", "static_assert",
    "static_cast", "thread_local", "and_eq", "bitand", "bitor", "compl", "not_eq", "or_eq", "xor",
    "xor_eq", "NULL", "EOF", "INT_MAX", "INT_MIN", "UINT_MAX", "LLONG_MAX", "LLONG_MIN",
    "SYMGRAD_STORAGE_TYPES",
}
# names the generated modules use for their own values
_TEMPLATE_WORDS = {
    "np", "numpy", "dtype", "shape", "order", "operands", "output", "saved", "grad_output", "grads",
    "forward", "backward", "cp", "cupy", "ix", "index", "Saved", "INPUTS", "OP", "TIES", "PARAMS",
    "NamedTuple", "annotations", "out", "n", "i", "t", "tr", "acc", "T", "I", "lead", "axes",
    "wide", "name", "value", "array", "exc", "math",
    # fields of Saved and names of the generated modules besides forward/backward
    "output_shape", "input_shape", "jvp", "tangents", "PIECEWISE_LINEAR", "BLOCK",
}


# the C math library's functions and macros (expf(expf) would not compile; NAN is a macro)
_C_MATH = {"NAN", "INFINITY", "HUGE_VAL", "HUGE_VALF", "HUGE_VALL", "MATH_ERRNO", "MATH_ERREXCEPT",
           "math_errhandling", "isnan", "isinf", "isfinite", "isnormal", "signbit", "fpclassify",
           "isgreater", "isless", "isunordered", "fmax", "fmin", "fmaxf", "fminf", "fma", "fmaf",
           "rsqrt", "rsqrtf", "exp10", "exp10f", "sincos", "sincosf", "nan", "nanf", "assert"}


def _forbidden_names() -> set:
    import math
    libm = {n for n in dir(math) if not n.startswith("_") and callable(getattr(math, n))}
    libm |= {n + "f" for n in libm} | {n + "l" for n in libm}
    return (set(keyword.kwlist) | set(getattr(keyword, "softkwlist", [])) | set(dir(builtins))
            | _C_WORDS | _TEMPLATE_WORDS | libm | _C_MATH)


_FORBIDDEN = _forbidden_names()


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
    if name in _FORBIDDEN or _INTERNAL.fullmatch(name):
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


# ----------------------------------------------------------------------------- the builder

_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
           ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}
_COMPARE = {ast.Lt: sp.StrictLessThan, ast.LtE: sp.LessThan, ast.Gt: sp.StrictGreaterThan,
            ast.GtE: sp.GreaterThan}


class _Builder:
    def __init__(self, declared: tuple[str, ...] | None):
        self.declared = declared
        self.names: list[str] = []  # free names in order of first appearance
        self.symbols: dict[str, sp.Symbol] = {}

    def build(self, node: ast.AST) -> sp.Expr:
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
        if fname == "Heaviside" and len(args) == 2 and not args[1].is_number:
            raise ExprError("Heaviside(u, h0): h0 (the value at 0) must be a number")
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
                flat.append(self.build(value))
                break
            flat += [self.build(value), self._condition(cond)]
        if len(flat) == 1:
            return flat[0]
        return PiecewiseOf(*flat)

    def _condition(self, node: ast.AST) -> Indicator:
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE):
            raise ExprError("Piecewise: a condition must be one comparison a < b, a <= b, a > b "
                            "or a >= b (before the last pair, whose condition is True)")
        a, b = self.build(node.left), self.build(node.comparators[0])
        return Indicator(_COMPARE[type(node.ops[0])](a, b, evaluate=False))


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
