"""`symgrad conventions --expr EXPR`: an expression's gradient at each of its kinks and ties, under
each tie policy (the generated module, symgrad.load_expr) and under PyTorch's and JAX's own
autodiff of the same expression written with their operations, side by side.

The points are found from the expression's max/min nodes (two arguments equal), the arguments of
Heaviside and sign (= 0) and the boundaries of Piecewise conditions (both sides equal): nested
non-smooth parts are replaced by each of their pieces in turn, the smooth equation is solved with
SymPy (numerically, on a grid over +-LIMIT, where it finds no closed form), and a solution is kept
where the equation holds for the expression as written and the tied pair attains its max/min. With
one input, every real solution (within +-LIMIT where there are infinitely many); with several, the
others are set to 1 (then 2, 1/2, -1, 0: the first value that gives a point) and the first is
solved for.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field

import mpmath
import numpy as np
import sympy as sp
from sympy.polys.polyerrors import BasePolynomialError

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


def _at(e: sp.Expr, point: dict):
    """e's value at the point, to 60 digits (None where it has none)."""
    at = {k: sp.Float(sp.N(v, 70), 70) for k, v in point.items()}
    try:
        c = complex(sp.N(_plain(e).subs(at), 60))
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return c if c.imag == 0 and math.isfinite(c.real) else None


def _holds(a: sp.Expr, b: sp.Expr, point: dict) -> bool:
    """a = b at the point (to 1e-40)."""
    d = _at(a - b, point)
    return d is not None and abs(d) < 1e-40


def _attains(node: sp.Expr, a: sp.Expr, point: dict) -> bool:
    """a (one of a max's or min's arguments) is the max or min at the point."""
    va = _at(a, point)
    if va is None:
        return False
    for c in node.args:
        vc = _at(c, point)
        if vc is None or (vc.real > va.real + 1e-40 if node.kind == "max"
                          else vc.real < va.real - 1e-40):
            return False
    return True


def _numeric_roots(eq: sp.Expr, v: sp.Symbol) -> list:
    """Roots of eq in [-LIMIT, LIMIT] where it changes sign on a grid, refined to 60 digits
    (a root where eq touches 0 without crossing is missed)."""
    f = sp.lambdify(v, eq, "mpmath")
    with mpmath.workdps(70):
        return _crossings(f)


def _crossings(f) -> list:
    grid = [mpmath.mpf(k) / 20 for k in range(-20 * LIMIT, 20 * LIMIT + 1)]
    roots = []

    def at(t):
        try:
            y = f(t)
        except (ValueError, ZeroDivisionError, OverflowError, TypeError):
            return None
        return y if isinstance(y, mpmath.mpf) else None

    prev = None
    for t in grid:
        y = at(t)
        if y is not None and y == 0:
            roots.append(sp.Float(t, 60))
        elif y is not None and prev is not None and prev[1] != 0 and (prev[1] < 0) != (y < 0):
            try:
                r = mpmath.findroot(f, (prev[0], t), solver="anderson")
            except (ValueError, ZeroDivisionError):
                r = None
            if r is not None and prev[0] <= r <= t:
                roots.append(sp.Float(r, 60))
        prev = (t, y) if y is not None else None
    return roots


def _solutions(eq: sp.Expr, v: sp.Symbol) -> list:
    """The real solutions of eq = 0 (exact where SymPy finds them, else numeric)."""
    try:
        if eq.is_polynomial(v):
            return list(dict.fromkeys(sp.real_roots(sp.Poly(eq, v))))
        s = sp.solveset(eq, v, sp.S.Reals)
        if not isinstance(s, sp.FiniteSet):
            s = s.intersect(sp.Interval(-LIMIT, LIMIT))
        if isinstance(s, sp.FiniteSet):
            return list(s)
    except (NotImplementedError, ValueError, TypeError, BasePolynomialError):
        pass
    return _numeric_roots(eq, v)


def _ties_in_double(pairs, syms, doubles) -> bool | None:
    """Whether some tied pair is equal in float64 at the doubles (None where Python's math cannot
    evaluate a side)."""
    for a, b in pairs:
        try:
            fa, fb = (sp.lambdify(syms, _plain(e), "math") for e in (a, b))
            if fa(*doubles) == fb(*doubles):
                return True
        except Exception:  # noqa: BLE001 (a function Python's math lacks, a domain error)
            return None
    return False


@dataclass
class Point:
    values: tuple  # exact SymPy numbers, in input order
    labels: list = field(default_factory=list)
    pairs: list = field(default_factory=list)  # the tied (a, b)

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
                # with several inputs, the others at 1 (or the next trial value that gives a point)
                for t in (TRIALS if others else (None,)):
                    at = {o: t for o in others}
                    found = False
                    for value in _solutions(eq.subs(at), v):
                        point = {**at, v: value}
                        # a tie of a max/min counts where the tied pair attains it
                        if _real(value) and _holds(a, b, point) and (
                                not isinstance(node, (MaxOf, MinOf)) or _attains(node, a, point)):
                            values = tuple(point[s] for s in syms)
                            p = points.setdefault(Point(values).doubles(), Point(values))
                            if label not in p.labels:
                                p.labels.append(label)
                                p.pairs.append((a, b))
                            found = True
                    if found:
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
            # (torch.heaviside has no derivative; 0 is the frameworks' gradient of a step)
            u = vals[0]
            return m.where(u > 0, const(1.0), m.where(u == 0, vals[1], const(0.0)))
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
        if v.is_Rational:
            return sp.sstr(v)
        if v.is_Float:  # found numerically
            return f"{float(v)!r} (numeric)"
        return f"{sp.sstr(v)} ({_number(float(sp.N(v, 30)))})"
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
    symbols = {s.name: s for s in parsed.expr.free_symbols}
    syms = [symbols[n] for n in parsed.inputs]
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
        except Exception as exc:  # noqa: BLE001 (the framework's own refusal, shown in the note)
            cells[fw] = ["n/a"] * len(points)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            notes.append(f"{fw} column: {fw} failed: {type(exc).__name__}: {first}")
    body = []
    for k, p in enumerate(points):
        t, j = cells["torch"][k], cells["jax"][k]
        both = all(cells[fw][k] not in ("n/a", "not installed") for fw in FRAMEWORKS)
        flag = ("DIFFER" if t != j else "same") if both else ""
        at = _point_text(parsed.inputs, p.values)
        # (where the policies differ, the module saw a tie, whatever Python's math rounds to)
        if len({cells[c][k] for c in POLICIES}) == 1 and \
                _ties_in_double(p.pairs, syms, p.doubles()) is False:
            at += " (no tie in float64)"
        body.append([at, "; ".join(p.labels)]
                    + [cells[c][k] for c in list(POLICIES) + list(FRAMEWORKS)] + [flag])
    notes.insert(0, "Gradient of each input with grad_output = 1 (a ; b for two inputs) at the "
                 "double nearest each point: the policies by running the generated modules "
                 "(symgrad.load_expr), torch and jax by their own autodiff (torch.autograd, "
                 "jax.grad; float64, CPU) of the expression written with their operations: max/min "
                 "of two terms torch.maximum/minimum and jnp.maximum/minimum, of a term and a "
                 "constant torch.clamp and jnp.clip, Piecewise torch.where and jnp.where, relu "
                 "torch.relu and jax.nn.relu. \"(no tie in float64)\": the point is not a double, "
                 "and at the double nearest it the pieces differ, so every column gives that "
                 "side's gradient.")
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
