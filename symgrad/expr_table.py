"""`symgrad conventions --expr EXPR`: an expression's gradient at each of its kinks and ties, under
each tie policy (the generated module, symgrad.load_expr) and under PyTorch's and JAX's own
autodiff of the same expression written with their operations, side by side.

The points are found from the expression's max/min nodes (two arguments equal), the arguments of
Heaviside and sign (= 0) and the boundaries of Piecewise conditions (both sides equal): nested
non-smooth parts are replaced by each of their pieces in turn, the smooth equation is solved with
SymPy, and a solution is kept where the equation holds for the expression as written. With one
input, every real solution (within +-LIMIT where there are infinitely many); with several, the
first variable is solved for and the others are set to 1 (then 2, 1/2, -1, 0: the first value that
gives a real point).
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field

import numpy as np
import sympy as sp

from . import expr as _expr
from .indicators import MaxOf, MinOf
from .policy import POLICIES
from .table import _number

FRAMEWORKS = ("torch", "jax")
INSTALL = {"torch": "pip install torch", "jax": 'pip install "jax[cpu]"'}
LIMIT = 100  # |x| bound on the points listed where a tie has infinitely many
MAX_ALTERNATIVES = 64  # smooth forms of one side of a tie
MAX_POINTS = 32
TRIALS = (sp.S.One, sp.Integer(2), sp.Rational(1, 2), sp.S.NegativeOne, sp.S.Zero)


class NotInFramework(Exception):
    """The expression has a part that a framework does not spell (one line)."""


# ----------------------------------------------------------------------------- the points

def _ties(e: sp.Expr):
    """(label, node, a, b): the pairs whose equality is a tie or kink of e (at node), outermost
    first."""
    seen = set()
    for node in sp.preorder_traversal(e):
        pairs = []
        if isinstance(node, (MaxOf, MinOf)):
            args = node.args
            pairs = [(node.kind, args[i], args[j]) for i in range(len(args))
                     for j in range(i + 1, len(args))]
        elif isinstance(node, (_expr.HeavisideOf, _expr.SignOf)):
            name = "Heaviside" if isinstance(node, _expr.HeavisideOf) else "sign"
            pairs = [(name, node.args[0], sp.S.Zero)]
        elif isinstance(node, _expr.PiecewiseOf):
            pairs = [("Piecewise", c.rel.lhs, c.rel.rhs) for _, c in node.branches()[0]]
        for kind, a, b in pairs:
            if (a, b) not in seen:
                seen.add((a, b))
                yield kind, node, a, b


def _alternatives(e: sp.Expr) -> list:
    """The smooth expressions e equals piece by piece (each max/min replaced by each argument,
    each Piecewise by each branch, Heaviside/sign by their values)."""
    for node in sp.preorder_traversal(e):
        if isinstance(node, (MaxOf, MinOf)):
            alts = node.args
        elif isinstance(node, _expr.PiecewiseOf):
            pairs, last = node.branches()
            alts = [v for v, _ in pairs] + [last]
        elif isinstance(node, _expr.HeavisideOf):
            alts = [sp.S.Zero, sp.S.One] + list(node.args[1:])
        elif isinstance(node, _expr.SignOf):
            alts = [sp.S.NegativeOne, sp.S.Zero, sp.S.One]
        else:
            continue
        out = []
        for a in alts:
            for s in _alternatives(e.xreplace({node: a})):
                if s not in out:
                    out.append(s)
        return out[:MAX_ALTERNATIVES]
    return [e]


def _plain(e: sp.Expr) -> sp.Expr:
    """e in SymPy's own functions, to evaluate at a point."""
    if not e.args:
        return e
    args = [_plain(a) for a in e.args]
    if isinstance(e, MaxOf):
        return sp.Max(*args)
    if isinstance(e, MinOf):
        return sp.Min(*args)
    if isinstance(e, _expr.SignOf):
        return sp.sign(args[0])
    if isinstance(e, _expr.HeavisideOf):
        return sp.Heaviside(*args) if len(args) == 2 else sp.Heaviside(args[0], sp.S.Half)
    if isinstance(e, _expr.PiecewiseOf):
        pairs, last = e.branches()
        return sp.Piecewise(*[(_plain(v), _plain(c.rel)) for v, c in pairs], (_plain(last), True))
    if isinstance(e, _expr.sigmoid):
        return 1 / (1 + sp.exp(-args[0]))
    return e.func(*args)


def _real(v) -> bool:
    try:
        c = complex(sp.N(v, 30))
    except (TypeError, ValueError):
        return False
    return c.imag == 0 and math.isfinite(c.real)


def _holds(a: sp.Expr, b: sp.Expr, point: dict) -> bool:
    try:
        d = sp.N(_plain(a - b).subs(point), 50)
    except (TypeError, ValueError, ZeroDivisionError):
        return False
    try:
        return d == 0 or abs(complex(d)) < 1e-40
    except (TypeError, ValueError):
        return False


def _solutions(eq: sp.Expr, v: sp.Symbol) -> list:
    s = sp.solveset(eq, v, sp.S.Reals)
    if not isinstance(s, sp.FiniteSet):
        s = s.intersect(sp.Interval(-LIMIT, LIMIT))
    return list(s) if isinstance(s, sp.FiniteSet) else []


@dataclass
class Point:
    values: tuple  # exact SymPy numbers, in input order
    labels: list = field(default_factory=list)

    def doubles(self) -> tuple:
        return tuple(float(sp.N(v, 30)) for v in self.values)


def kinks(parsed: _expr.Parsed) -> list[Point]:
    """The points where a comparison of the expression ties, sorted, each with the ties there."""
    symbols = {s.name: s for s in parsed.expr.free_symbols}
    syms = [symbols[n] for n in parsed.inputs]
    points: dict[tuple, Point] = {}
    for kind, node, a, b in _ties(parsed.expr):
        label = f"{kind}: {sp.sstr(a)} = {sp.sstr(b)}"
        for a1 in _alternatives(a):
            for b1 in _alternatives(b):
                eq = sp.expand(a1 - b1)
                if eq == 0 or not eq.free_symbols:
                    continue
                v = next(s for s in syms if s in eq.free_symbols)
                others = [s for s in syms if s is not v]
                for sol in _solutions(eq, v) if not others else sp.solve(eq, v):
                    for t in (TRIALS if others else (None,)):
                        at = {o: t for o in others}
                        value = sp.simplify(sol.subs(at)) if others else sol
                        point = {**at, v: value}
                        # a tie of a max/min counts where the tied pair attains it
                        if _real(value) and _holds(a, b, point) and (
                                not isinstance(node, (MaxOf, MinOf)) or _holds(node, a, point)):
                            key = tuple(sp.nsimplify(point[s]) if point[s].is_Float else point[s]
                                        for s in syms)
                            p = points.setdefault(key, Point(key))
                            if label not in p.labels:
                                p.labels.append(label)
                            break
    return sorted(points.values(), key=Point.doubles)


# ----------------------------------------------------------------------------- the frameworks

def _framework(text: str, inputs: tuple[str, ...], fw: str):
    """The expression (validated by expr.parse) as a function of the framework's arrays, built from
    its AST: a max/min of two terms is torch.maximum/minimum (jnp.maximum/minimum), of a term and a
    constant torch.clamp (jnp.clip), Piecewise torch.where (jnp.where)."""
    if fw == "torch":
        import torch as m
        nn = m
        const = lambda v: m.tensor(v, dtype=m.float64)  # noqa: E731
        clamp = m.clamp
        fns = {"atan": m.atan}
    else:
        import jax
        import jax.numpy as m
        nn = jax.nn
        const = lambda v: m.asarray(v, dtype=m.float64)  # noqa: E731
        clamp = m.clip
        fns = {"atan": m.arctan}
    body = ast.parse(text.strip(), mode="eval").body
    compare = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
               ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}

    def constant(node) -> bool:
        return not any(isinstance(n, ast.Name) and n.id in inputs for n in ast.walk(node))

    def extremum(name, nodes, env):
        big = name.lower() == "max"
        acc, acc_const = ev(nodes[0], env), constant(nodes[0])
        for node in nodes[1:]:
            v, v_const = ev(node, env), constant(node)
            if acc_const and v_const:
                acc = m.maximum(acc, v) if big else m.minimum(acc, v)
            elif acc_const or v_const:
                u, c = (v, acc) if acc_const else (acc, v)
                bound = float(c)
                acc = clamp(u, min=bound) if big else clamp(u, max=bound)
            else:
                acc = m.maximum(acc, v) if big else m.minimum(acc, v)
            acc_const = acc_const and v_const
        return acc

    def ev(node, env):
        if isinstance(node, ast.Constant):
            return const(float(node.value))
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            return const({"pi": math.pi, "E": math.e}[node.id])
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand, env)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left, env), ev(node.right, env)
            op = type(node.op)
            return {ast.Add: a.__add__, ast.Sub: a.__sub__, ast.Mult: a.__mul__,
                    ast.Div: a.__truediv__, ast.Pow: a.__pow__}[op](b)
        name, args = node.func.id, node.args
        if name in ("max", "Max", "min", "Min"):
            return extremum(name, args, env)
        if name == "Piecewise":
            *pairs, last = args
            out = ev(last.elts[0], env)
            for pair in reversed(pairs):
                value, cond = pair.elts
                test = compare[type(cond.ops[0])](ev(cond.left, env), ev(cond.comparators[0], env))
                out = m.where(test, ev(value, env), out)
            return out
        vals = [ev(a, env) for a in args]
        if name in ("abs", "Abs"):
            return m.abs(vals[0])
        if name in ("relu", "sigmoid"):
            return getattr(nn, name)(vals[0])
        if name == "Heaviside":
            if len(vals) == 1:
                raise NotInFramework("Heaviside(u) takes the tie policy's value at 0, which "
                                     "frameworks lack: write Heaviside(u, h0)")
            return m.heaviside(vals[0], vals[1])
        return fns.get(name, getattr(m, name, None))(*vals)

    return lambda *xs: ev(body, dict(zip(inputs, xs)))


def framework_grads(fw: str, text: str, inputs: tuple[str, ...], columns: list) -> list:
    """Each input's gradient (grad_output = 1) at the points: columns[i] the values of input i."""
    f = _framework(text, inputs, fw)
    if fw == "torch":
        import torch
        xs = [torch.tensor(c, dtype=torch.float64, requires_grad=True) for c in columns]
        y = f(*xs)
        gs = torch.autograd.grad(y.sum(), xs, allow_unused=True)
        return [np.zeros(len(columns[0])) if g is None else g.detach().numpy() for g in gs]
    import jax
    import jax.numpy as jnp
    with jax.enable_x64(True):
        xs = [jnp.asarray(c, dtype=jnp.float64) for c in columns]
        gs = jax.grad(lambda *a: jnp.sum(f(*a)), argnums=tuple(range(len(xs))))(*xs)
        return [np.asarray(g, dtype=np.float64) for g in gs]


def _available(fw: str) -> bool:
    try:
        __import__(fw)
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- the table

def _point_text(names, values) -> str:
    def one(v):
        return sp.sstr(v) if v.is_Rational else f"{sp.sstr(v)} ({_number(float(sp.N(v, 30)))})"
    return ", ".join(f"{n} = {one(v)}" for n, v in zip(names, values))


def rows(text: str, inputs=None) -> tuple[list[str], list[list[str]], list[str]]:
    """(header, rows, notes) of the table; the last column flags where torch and jax differ."""
    from .api import load_expr
    parsed = _expr.parse(text, inputs)
    points = kinks(parsed)
    notes = []
    if len(points) > MAX_POINTS:
        notes.append(f"the {MAX_POINTS} of {len(points)} points nearest the origin")
        near = sorted(points, key=lambda p: sum(v * v for v in p.doubles()))[:MAX_POINTS]
        points = [p for p in points if p in near]
    header = ["at", "tie"] + list(POLICIES) + list(FRAMEWORKS) + ["torch vs jax"]
    if not points:
        return header, [], [f"no kinks or ties found in {parsed.text} (they come from max, min, "
                            f"abs, relu, Heaviside, sign and Piecewise)"]
    columns = [[p.doubles()[i] for p in points] for i in range(len(parsed.inputs))]
    cells: dict[str, list[str]] = {}

    def per_point(grads) -> list[str]:
        return [" ; ".join(_number(float(np.asarray(g, dtype=np.float64).ravel()[k]))
                           for g in grads) for k in range(len(points))]

    for pol in POLICIES:
        module = load_expr(parsed.text, inputs=parsed.inputs, ties=pol)
        arrays = [np.array(c, dtype=np.float64) for c in columns]
        y, saved = module.forward(*arrays)
        cells[pol] = per_point(module.backward(np.ones_like(y), saved))
    for fw in FRAMEWORKS:
        if not _available(fw):
            cells[fw] = ["not installed"] * len(points)
            notes.append(f"{fw} column: not installed (`{INSTALL[fw]}`)")
            continue
        try:
            cells[fw] = per_point(framework_grads(fw, parsed.text, parsed.inputs, columns))
        except NotInFramework as exc:
            cells[fw] = ["n/a"] * len(points)
            notes.append(f"{fw} column: {exc}")
    body = []
    for k, p in enumerate(points):
        t, j = cells["torch"][k], cells["jax"][k]
        both = all(_available(fw) and cells[fw][k] != "n/a" for fw in FRAMEWORKS)
        flag = ("DIFFER" if t != j else "same") if both else ""
        body.append([_point_text(parsed.inputs, p.values), "; ".join(p.labels)]
                    + [cells[c][k] for c in list(POLICIES) + list(FRAMEWORKS)] + [flag])
    notes.insert(0, "Gradient of each input with grad_output = 1 (a ; b for two inputs) at the "
                 "double nearest each point: the policies by running the generated modules "
                 "(symgrad.load_expr), torch and jax by their own autodiff (torch.autograd, "
                 "jax.grad; float64, CPU) of the expression written with their operations: max/min "
                 "of two terms torch.maximum/minimum and jnp.maximum/minimum, of a term and a "
                 "constant torch.clamp and jnp.clip, Piecewise torch.where and jnp.where, relu "
                 "torch.relu and jax.nn.relu.")
    return header, body, notes


def markdown(text: str, inputs=None) -> str:
    header, body, notes = rows(text, inputs)
    parsed = _expr.parse(text, inputs)
    lines = [f"`{parsed.text}`", ""]
    if body:
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        lines.append("")
    return "\n".join(lines + notes) + "\n"
