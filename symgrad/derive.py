"""Derivation: from an op to its backward rule, as SymPy objects only.

For every max/min node of the forward, with pieces p_i and policy weights w_i (``policy.weights``):

1. W-form: y = sum_i w_i * p_i, each w_i a product of comparison indicators (for split, E_i / C
   with C = sum_k E_k, differentiated by the quotient rule so that C stays one factor).
2. Raw derivative: dy/dv = sum_i (dp_i/dv) w_i + sum_i p_i (dw_i/dv).  Differentiating an
   indicator gives a DiracDelta on its boundary: d[g > 0]/dv = delta(g) dg/dv.  The product rule is
   applied factor by factor, so a window of n elements costs O(n^2) small terms, not a diff of the
   whole expanded product.
3. Delta elimination: terms are grouped by their delta; each group's coefficient f is replaced by
   f restricted to the delta's support (sifting: f(x) delta(x_i - x_j) = f|_{x_i = x_j} delta(x_i - x_j)).
   On that support a remaining indicator is identified with its non-strict form (they differ on a
   set of measure zero there).  Each group's coefficient then cancels to 0; the derivation checks
   it and fails loudly if it does not.
4. Final partials: dy/dv = sum_i (dp_i/dv) w_i, with no delta left.  Nested nodes (clamp) are
   joined by the chain rule through their intermediate symbols u0, u1, ...

Each derivation also checks its weights: sum_i w_i = 1 for first/last/split (= number of tied
winners for all), exhaustively over every weak ordering of up to 4 pieces, numerically beyond.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

import numpy as np
import sympy as sp

from . import policy as _policy
from .indicators import Indicator, MaxOf, MinOf, _Extremum, substitute
from .ops import Op

EXHAUSTIVE_UP_TO = 4
NUMERIC_SAMPLES = 4000


@dataclass(frozen=True)
class Step:
    """One step of a derivation: a title, one sentence, and labelled SymPy objects."""

    title: str
    note: str
    items: tuple[tuple[str, sp.Basic], ...]


@dataclass
class Node:
    """One max/min of the forward, written in the W-matrix view."""

    symbol: sp.Symbol  # its value: y for the output, u0, u1, ... for inner nodes
    kind: str  # "max" | "min"
    pieces: tuple[sp.Expr, ...]
    weights: list[sp.Expr]  # w_i
    count: sp.Expr | None  # C for split (w_i = E_i / C), else None
    w_form: sp.Expr = None
    raw: dict = field(default_factory=dict)  # var -> derivative with DiracDelta terms
    delta_groups: dict = field(default_factory=dict)  # var -> [(delta, coeff, sifted)]
    partials: dict = field(default_factory=dict)  # var -> final partial (no delta)

    @property
    def forward(self) -> sp.Expr:
        return (MaxOf if self.kind == "max" else MinOf)(*self.pieces)


@dataclass
class Derivation:
    op: Op
    inputs: tuple[sp.Symbol, ...]
    forward: sp.Expr  # nested MaxOf/MinOf in the inputs
    nodes: list[Node]  # inner nodes first, the output node last
    partials: dict  # input symbol -> dy/dinput (may use inner node symbols)
    steps: list[Step]
    checks: list[str]

    @property
    def output(self) -> Node:
        return self.nodes[-1]


# ---------------------------------------------------------------------------------- symbols

def window_symbols(n: int) -> tuple[sp.Symbol, ...]:
    return sp.symbols(f"x0:{n}", real=True)


def input_symbols(op: Op) -> tuple[sp.Symbol, ...]:
    if op.spec.kind == "elementwise":
        return tuple(sp.Symbol(name, real=True) for name in op.spec.inputs)
    return window_symbols(op.window_size())


# ---------------------------------------------------------------------------------- nodes

def _split_nodes(expr: sp.Expr, inner: list[tuple[sp.Symbol, _Extremum]]) -> sp.Expr:
    """Replace nested MaxOf/MinOf by intermediate symbols u0, u1, ... (innermost first)."""
    if isinstance(expr, _Extremum):
        args = [_split_nodes(a, inner) for a in expr.args]
        u = sp.Symbol(f"u{len(inner)}", real=True)
        inner.append((u, type(expr)(*args)))
        return u
    if expr.args:
        return expr.func(*[_split_nodes(a, inner) for a in expr.args])
    return expr


def _make_node(symbol, ext: _Extremum, ties: str) -> Node:
    kind = ext.kind
    pieces = tuple(ext.args)
    ws = _policy.weights(pieces, ties, kind)
    count = None
    if ties == "split":
        # weights() returns E_i / C; keep E_i and C apart for the quotient rule.
        count = sp.denom(ws[0]) if len(pieces) > 1 else None
        if count is not None:
            ws = [sp.numer(w) for w in ws]
    node = Node(symbol, kind, pieces, ws, count)
    num = sp.Add(*[w * p for w, p in zip(ws, pieces)])
    node.w_form = num / count if count is not None else num
    return node


# ---------------------------------------------------------------------------------- calculus

def _d_product(factors: list[sp.Expr], v: sp.Symbol) -> list[tuple[sp.Expr, sp.Expr]]:
    """Product rule over a factor list: [(d factor_k / dv, other factors), ...] for factors in v."""
    out = []
    for k, f in enumerate(factors):
        if v in f.free_symbols:
            rest = factors[:k] + factors[k + 1:]
            # the factors are already canonical indicators: skip Mul's flattening
            out.append((sp.diff(f, v), sp.Mul._from_args(rest) if len(rest) > 1 else sp.Mul(*rest)))
    return out


def _delta_terms(node: Node, v: sp.Symbol, numerator: bool) -> list[sp.Expr]:
    """The DiracDelta terms of d(sum_i p_i E_i)/dv (numerator) or d(sum_i E_i)/dv (count)."""
    terms = []
    for p, w in zip(node.pieces, node.weights):
        for dfactor, rest in _d_product(list(sp.Mul.make_args(w)), v):
            terms.append((p if numerator else sp.S.One) * dfactor * rest)
    return terms


def _group_by_delta(terms: list[sp.Expr]) -> dict:
    groups: dict = {}
    for t in terms:
        if t == 0:
            continue
        deltas = [f for f in sp.Mul.make_args(t) if isinstance(f, sp.DiracDelta)]
        assert len(deltas) == 1, t
        d = deltas[0]
        groups.setdefault(d, []).append(t / d)
    return groups


def _support(gap: sp.Expr) -> tuple[sp.Symbol, sp.Expr]:
    """Solve the (linear) gap = 0 for its last symbol: the delta's support as var = value."""
    var = sorted(gap.free_symbols, key=lambda s: s.name)[-1]
    a = gap.coeff(var)
    rest = sp.expand(gap - a * var)
    if a == 0 or var in rest.free_symbols:
        raise AssertionError(f"cannot sift a delta whose argument is not linear: {gap}")
    return var, -rest / a


def _sift_term(term: sp.Expr, var: sp.Symbol, value: sp.Expr) -> sp.Expr:
    factors = []
    for f in sp.Mul.make_args(term):
        if isinstance(f, Indicator):
            f = substitute(f, var, value)
            f = f.non_strict() if isinstance(f, Indicator) else f
        else:
            f = f.xreplace({var: value})
        factors.append(f)
    return sp.Mul(*factors)


def _sift(delta: sp.DiracDelta, coeff: sp.Expr) -> sp.Expr:
    """coeff restricted to the support of delta, indicators taken non-strict there."""
    var, value = _support(delta.args[0])
    sifted = sp.Add(*[_sift_term(t, var, value) for t in sp.Add.make_args(coeff)])
    return sifted if sifted == 0 else sp.expand(sifted)


def _differentiate(node: Node, v: sp.Symbol) -> None:
    regular = sp.Add(*[sp.diff(p, v) * w for p, w in zip(node.pieces, node.weights)])
    num_groups = _group_by_delta(_delta_terms(node, v, numerator=True))
    groups = []
    if node.count is None:
        raw = regular + sp.Add(*[d * sp.Add(*c) for d, c in num_groups.items()])
        for d, c in num_groups.items():
            groups.append((d, sp.Add(*c), _sift(d, sp.Add(*c))))
        partial = regular
    else:
        cnt_groups = _group_by_delta(_delta_terms(node, v, numerator=False))
        num = sp.Add(*[w * p for w, p in zip(node.weights, node.pieces)])
        dnum = regular + sp.Add(*[d * sp.Add(*c) for d, c in num_groups.items()])
        dcnt = sp.Add(*[d * sp.Add(*c) for d, c in cnt_groups.items()])
        raw = dnum / node.count - num * dcnt / node.count**2
        for label, gs in (("N", num_groups), ("C", cnt_groups)):
            for d, c in gs.items():
                groups.append((d, sp.Add(*c), _sift(d, sp.Add(*c))))
        partial = regular / node.count
    for d, coeff, sifted in groups:
        if sifted != 0:
            raise AssertionError(f"delta terms of d{node.symbol}/d{v} did not cancel: {d}*{sifted}")
    node.raw[v] = raw
    node.delta_groups[v] = groups
    node.partials[v] = partial


# ---------------------------------------------------------------------------------- checks

def weak_orderings(n: int):
    """Every weak ordering of n elements, as integer ranks (ties share a rank)."""
    seen = set()
    for ranks in itertools.product(range(n), repeat=n):
        used = sorted(set(ranks))
        norm = tuple(used.index(r) for r in ranks)
        if norm not in seen:
            seen.add(norm)
            yield norm


def evaluate(expr: sp.Expr, env: dict) -> np.ndarray:
    """Evaluate an indicator expression on NumPy arrays (a small, independent evaluator)."""
    if isinstance(expr, Indicator):
        rel = expr.rel
        a, b = evaluate(rel.lhs, env), evaluate(rel.rhs, env)
        ops = {sp.StrictGreaterThan: np.greater, sp.GreaterThan: np.greater_equal,
               sp.StrictLessThan: np.less, sp.LessThan: np.less_equal}
        return ops[type(rel)](a, b).astype(np.float64)
    if expr.is_Symbol:
        return env[expr]
    if expr.is_Number:
        return float(expr)
    if expr.is_Add:
        return sum(evaluate(a, env) for a in expr.args)
    if expr.is_Mul:
        return functools.reduce(np.multiply, (evaluate(a, env) for a in expr.args))
    if expr.is_Pow:
        return evaluate(expr.base, env) ** float(expr.exp)
    raise TypeError(f"cannot evaluate {expr!r}")


@functools.lru_cache(maxsize=None)
def check_weights(ties: str, kind: str, n: int) -> str:
    """Check sum_i w_i (1, or the number of tied winners for 'all'); return what was checked."""
    qs = window_symbols(n)
    ws = _policy.weights(qs, ties, kind)
    total = sp.Add(*ws)
    sign = 1 if kind == "max" else -1
    if n <= EXHAUSTIVE_UP_TO:
        count = 0
        for ranks in weak_orderings(n):
            vals = dict(zip(qs, [sign * sp.Integer(r) for r in ranks]))
            got = total.xreplace(vals)
            want = 1 if ties != "all" else ranks.count(max(ranks))
            if got != want:
                raise AssertionError(f"{ties}: sum of weights is {got}, not {want}, at ranks {ranks}")
            count += 1
        return f"sum_i w_i = {'1' if ties != 'all' else 'the number of tied winners'} " \
               f"at all {count} weak orderings of {n} elements (exhaustive)"
    rng = np.random.default_rng(n)
    vals = rng.integers(0, 3, size=(n, NUMERIC_SAMPLES)).astype(np.float64) * sign
    env = dict(zip(qs, vals))
    got = evaluate(total, env)
    extreme = vals.max(axis=0) if sign > 0 else vals.min(axis=0)
    want = np.ones(NUMERIC_SAMPLES) if ties != "all" else (vals == extreme).sum(axis=0)
    # split sums k rounded values of 1/k: equal up to rounding, not bit for bit
    if not np.allclose(got, want, rtol=1e-12, atol=0):
        raise AssertionError(f"{ties}: sum of weights differs from {want[:3]} on random ties")
    return f"sum_i w_i = {'1' if ties != 'all' else 'the number of tied winners'} " \
           f"on {NUMERIC_SAMPLES} random tie-heavy windows of {n} elements (numeric)"


# ---------------------------------------------------------------------------------- derive

def _chain(nodes: list[Node], inputs) -> dict:
    """dy/dinput through the intermediate node symbols (chain rule)."""
    total: dict = {}
    for node in nodes:
        t = {}
        for s in inputs:
            d = node.partials.get(s, sp.S.Zero)
            for inner in nodes:
                if inner.symbol in node.partials:
                    d += node.partials[inner.symbol] * total[inner.symbol][s]
            t[s] = d
        total[node.symbol] = t
    return total[nodes[-1].symbol]


@functools.lru_cache(maxsize=64)
def _derive_cached(op_key: tuple, op: Op) -> Derivation:
    spec = op.spec
    inputs = input_symbols(op)
    if spec.kind == "elementwise":
        forward = spec.forward(op.params, inputs)
    else:
        forward = (MaxOf if spec.extremum == "max" else MinOf)(*inputs)
    inner: list = []
    root = _split_nodes(forward, inner)
    # the outermost extremum becomes the output y
    y = sp.Symbol("y", real=True)
    last_sym, last_ext = inner.pop()
    assert last_sym == root
    inner.append((y, last_ext))
    nodes = [_make_node(sym, ext, op.ties) for sym, ext in inner]
    checks = []
    for node in nodes:
        for v in sorted(set().union(*[p.free_symbols for p in node.pieces]), key=lambda s: s.name):
            _differentiate(node, v)
        checks.append(check_weights(op.ties, node.kind, len(node.pieces)))
    partials = _chain(nodes, inputs)
    return Derivation(op, inputs, forward, nodes, partials, _steps(op, forward, nodes, partials), checks)


def derive(op: Op) -> Derivation:
    """Derive the backward of an op (cached by op, parameters and policy)."""
    key = (op.name, tuple(sorted((k, repr(v)) for k, v in op.params.items())), op.ties)
    return _derive_cached(key, op)


def _steps(op: Op, forward, nodes: list[Node], partials) -> list[Step]:
    y = nodes[-1].symbol
    ys = [(str(n.symbol), n.forward) for n in nodes]
    steps = [Step("forward", f"{op.name} as max/min of its pieces, in argument order", tuple(ys))]
    items = []
    for n in nodes:
        items.append((str(n.symbol), n.w_form))
        for i, w in enumerate(n.weights):
            label = f"E_{i}" if n.count is not None else f"w_{i}"
            items.append((label, w))
        if n.count is not None:
            items.append(("C", n.count))
    note = {
        "first": "first: strict comparison against earlier pieces, non-strict against later ones",
        "last": "last: non-strict against earlier pieces, strict against later ones",
        "split": "split: w_i = E_i / C, E_i = [p_i attains the extremum], C = number of pieces attaining it",
        "all": "all: w_i = E_i = [p_i attains the extremum] (not a subgradient)",
    }[op.ties]
    steps.append(Step("W-form", note, tuple(items)))
    raw = tuple((f"d{n.symbol}/d{v}", e) for n in nodes for v, e in n.raw.items())
    steps.append(Step("raw derivative", "differentiating an indicator gives a DiracDelta on its boundary", raw))
    delta_items = []
    for n in nodes:
        for v, groups in n.delta_groups.items():
            for d, coeff, sifted in groups:
                delta_items.append((f"d{n.symbol}/d{v}: coefficient of {d}", coeff))
                delta_items.append(("  sifted and cancelled", sifted))
    steps.append(Step("delta elimination",
                      "f*delta(g) = f|_{g=0}*delta(g) (sifting); on the support, indicators are "
                      "taken non-strict (they differ on a null set), and each group cancels to 0",
                      tuple(delta_items)))
    fin = [(f"d{n.symbol}/d{v}", e) for n in nodes for v, e in n.partials.items()]
    if len(nodes) > 1:
        fin += [(f"dy/d{s} (chain rule)", e) for s, e in partials.items()]
    steps.append(Step("final partials", "what is left after the delta terms cancel", tuple(fin)))
    return steps
