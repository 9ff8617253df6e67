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

A static window (pool, maxout) of more than ALL_VARIABLES_UP_TO elements is derived on a
representative window of REPRESENTATIVE_STATIC_WINDOW elements, its own W-form stated generically
and its weights checked at its real size in linear time (_derive_large_window).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import sympy as sp

from . import policy as _policy
from .indicators import Indicator, Literal, MaxOf, MinOf, _Extremum, substitute
from .ops import MAX_WINDOW, Op
from .derivation import Derivation, Node, Step
from .derive_special import derive_special
from .derive_order import derive_order
from .printers import text
from . import regions as _regions
from .regions import Regions
from .scaled import Picked, Scaled

EXHAUSTIVE_UP_TO = 4
NUMERIC_SAMPLES = 4000
# Delta elimination is carried out for every variable of windows up to this size, and the raw
# derivative kept for display.  Beyond it, it is carried out for representative positions: the
# first (every partner comes after it), the middle (partners on both sides) and the last (every
# partner before it).  Any other position is one of these up to a relabeling that keeps the
# order of the other elements, which maps its delta groups onto theirs.
ALL_VARIABLES_UP_TO = 32
# A static window (pool, maxout) of more elements than ALL_VARIABLES_UP_TO is derived on a
# representative window of this size (see _derive_large_window): its W-form has n weights of n-1
# indicators each, O(n^2) SymPy objects to build, differentiate, check and cache (minutes and
# gigabytes at n = 1000), where the rule it yields does not depend on n.
REPRESENTATIVE_STATIC_WINDOW = ALL_VARIABLES_UP_TO


# ---------------------------------------------------------------------------------- symbols

def window_symbols(n: int) -> tuple[sp.Symbol, ...]:
    return sp.symbols(f"x0:{n}", real=True)


def input_symbols(op: Op) -> tuple[sp.Symbol, ...]:
    if op.spec.strategy.elementwise:
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


def _reversed(expr: sp.Expr) -> sp.Expr:
    """Every max/min with its arguments in reverse order (the 'reversed' argument order)."""
    if isinstance(expr, _Extremum):
        return type(expr)(*[_reversed(a) for a in reversed(expr.args)])
    return expr


def _make_node(symbol, ext: _Extremum, ties: str) -> Node:
    kind = ext.kind
    pieces = tuple(ext.args)
    ws = _policy.weights(pieces, ties, kind)
    count = None
    if _policy.TIES[ties].splits:
        # weights() returns E_i / C; keep E_i and C apart for the quotient rule.
        count = sp.denom(ws[0]) if len(pieces) > 1 else None
        if count is not None:
            ws = [sp.numer(w) for w in ws]
    node = Node(symbol, kind, pieces, ws, count)
    num = sp.Add(*[w * p for w, p in zip(ws, pieces)])
    node.w_form = num / count if count is not None else num
    return node


# ---------------------------------------------------------------------------------- calculus

def _delta_groups(node: Node, v: sp.Symbol, numerator: bool) -> dict:
    """The DiracDelta terms of d(sum_i p_i E_i)/dv (numerator) or of d(sum_i E_i)/dv (count),
    by the product rule over each E_i's indicator factors, grouped by their delta:
    {delta: [(scalar coefficient, other indicator factors), ...]}.
    """
    groups: dict = {}
    for p, w in zip(node.pieces, node.weights):
        if numerator and p == 0:
            continue
        factors = sp.Mul.make_args(w)
        for k, f in enumerate(factors):
            if not isinstance(f, Indicator) or v not in f.rel.free_symbols:
                continue
            d = f._eval_derivative(v)  # sign * delta(g) * dg/dv
            if d == 0:
                continue
            delta = next(a for a in sp.Mul.make_args(d) if isinstance(a, sp.DiracDelta))
            scalar = d / delta
            groups.setdefault(delta, []).append(
                ((p if numerator else sp.S.One) * scalar, factors[:k] + factors[k + 1:]))
    return groups


def _group_expr(terms: list) -> sp.Expr:
    return sp.Add(*[c * sp.Mul(*rest) for c, rest in terms])


def _support(gap: sp.Expr) -> tuple[sp.Symbol, sp.Expr]:
    """Solve the (linear) gap = 0 for its last symbol: the delta's support as var = value."""
    var = sorted((s for s in gap.free_symbols if not isinstance(s, Literal)), key=lambda s: s.name)[-1]
    a = gap.coeff(var)
    rest = sp.expand(gap - a * var)
    if a == 0 or var in rest.free_symbols:
        raise AssertionError(f"cannot sift a delta whose argument is not linear: {gap}")
    return var, -rest / a


_NON_STRICT: dict = {}
_SUBSTITUTED: dict = {}


def _non_strict(f: Indicator) -> Indicator:
    if f not in _NON_STRICT:
        _NON_STRICT[f] = f.non_strict()
    return _NON_STRICT[f]


def _sift_term(coeff: sp.Expr, factors: tuple, var: sp.Symbol, value: sp.Expr):
    """One term restricted to var = value: (coefficient, set of non-strict indicators) or None.

    Indicators are idempotent ([a]*[a] = [a]), so a set of them is the product exactly; a set
    also makes equal products compare equal without rebuilding a large SymPy product.
    """
    inds = set()
    for f in factors:
        if var in f.rel.free_symbols:
            key = (f, var, value)
            if key not in _SUBSTITUTED:
                _SUBSTITUTED[key] = substitute(f, var, value)
            f = _SUBSTITUTED[key]
            if f == 0:
                return None
            if f == 1:
                continue
        inds.add(_non_strict(f))
    return coeff.xreplace({var: value}), frozenset(inds)


def _sift(delta: sp.DiracDelta, terms: list) -> sp.Expr:
    """A delta group restricted to the delta's support, indicators taken non-strict, summed."""
    var, value = _support(delta.args[0])
    acc: dict = {}
    for coeff, factors in terms:
        sifted = _sift_term(coeff, factors, var, value)
        if sifted is not None:
            c, inds = sifted
            acc[inds] = acc.get(inds, sp.S.Zero) + c
    return sp.Add(*[sp.expand(c) * sp.Mul(*inds) for inds, c in acc.items() if sp.expand(c) != 0])


def _regular_part(node: Node, v: sp.Symbol) -> sp.Expr:
    """sum_i (dp_i/dv) w_i: the part of the derivative without delta terms."""
    return sp.Add(*[(sp.S.One if p == v else sp.diff(p, v)) * w
                    for p, w in zip(node.pieces, node.weights) if v in p.free_symbols])


def _differentiate(node: Node, v: sp.Symbol, show: bool = True) -> None:
    """dy/dv: regular part plus delta groups; each group is sifted and must cancel to 0.

    ``show`` keeps the raw derivative and the groups as SymPy expressions for display (building
    them costs more than the derivation itself for large windows).
    """
    regular = _regular_part(node, v)
    num_groups = _delta_groups(node, v, numerator=True)
    cnt_groups = _delta_groups(node, v, numerator=False) if node.count is not None else {}
    groups = []
    for gs in (num_groups, cnt_groups):
        for d, terms in gs.items():
            sifted = _sift(d, terms)
            if sifted != 0:
                raise AssertionError(f"delta terms of d{node.symbol}/d{v} did not cancel: {d}*{sifted}")
            groups.append((d, _group_expr(terms) if show else None, sifted))
    if node.count is None:
        node.partials[v] = regular
        raw = (regular + sp.Add(*[d * _group_expr(t) for d, t in num_groups.items()])) if show else None
    else:
        node.partials[v] = regular / node.count
        if show:
            num = sp.Add(*[w * p for w, p in zip(node.weights, node.pieces)])
            dnum = regular + sp.Add(*[d * _group_expr(t) for d, t in num_groups.items()])
            dcnt = sp.Add(*[d * _group_expr(t) for d, t in cnt_groups.items()])
            raw = dnum / node.count - num * dcnt / node.count**2
        else:
            raw = None
    if show:
        node.raw[v] = raw
        node.delta_groups[v] = groups


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


def evaluate(expr: sp.Expr, env: dict, _memo: dict | None = None) -> np.ndarray:
    """Evaluate an indicator expression on NumPy arrays (a small, independent evaluator)."""
    memo = {} if _memo is None else _memo
    if expr in memo:
        return memo[expr]
    memo[expr] = value = _evaluate(expr, env, memo)
    return value


def _evaluate(expr: sp.Expr, env: dict, memo: dict) -> np.ndarray:
    """Indicators and products of indicators stay Boolean arrays; sums and powers are float."""
    evaluate_ = functools.partial(evaluate, env=env, _memo=memo)
    if isinstance(expr, Indicator):
        rel = expr.rel
        ops = {sp.StrictGreaterThan: np.greater, sp.GreaterThan: np.greater_equal,
               sp.StrictLessThan: np.less, sp.LessThan: np.less_equal}
        return ops[type(rel)](evaluate_(rel.lhs), evaluate_(rel.rhs))
    if expr.is_Symbol:
        return env[expr]
    if expr.is_Number:
        return float(expr)
    if expr.is_Add:
        return sum(np.asarray(evaluate_(a), dtype=np.float64) for a in expr.args)
    if expr.is_Mul:
        vals = [evaluate_(a) for a in expr.args]
        if all(isinstance(v, np.ndarray) and v.dtype == bool for v in vals):
            return np.logical_and.reduce(vals)
        return functools.reduce(np.multiply, (np.asarray(v, dtype=np.float64) for v in vals))
    if expr.is_Pow:
        return np.asarray(evaluate_(expr.base), dtype=np.float64) ** float(expr.exp)
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
    got = np.asarray(evaluate(total, env), dtype=np.float64)
    extreme = vals.max(axis=0) if sign > 0 else vals.min(axis=0)
    want = np.ones(NUMERIC_SAMPLES) if ties != "all" else (vals == extreme).sum(axis=0)
    # split sums k rounded values of 1/k: equal up to rounding, not bit for bit
    if not np.allclose(got, want, rtol=1e-12, atol=0):
        raise AssertionError(f"{ties}: sum of weights differs from {want[:3]} on random ties")
    return f"sum_i w_i = {'1' if ties != 'all' else 'the number of tied winners'} " \
           f"on {NUMERIC_SAMPLES} random tie-heavy windows of {n} elements (numeric)"


# How a product of one comparison against several elements reduces to their running extremum:
# prod_j [a > x_j] = [a > max_j x_j], prod_j [a < x_j] = [a < min_j x_j] (non-strict alike).
# Per comparison class: its text, the comparison, the running extremum, the empty product's bound.
_RUNNING = {sp.StrictGreaterThan: (">", np.greater, np.maximum, -np.inf),
            sp.GreaterThan: (">=", np.greater_equal, np.maximum, -np.inf),
            sp.StrictLessThan: ("<", np.less, np.minimum, np.inf),
            sp.LessThan: ("<=", np.less_equal, np.minimum, np.inf)}


def uniform_relations(node: Node) -> tuple[type, type]:
    """The comparison classes (before, after) of a window node's weights, required uniform.

    Every w_k must compare x_k with each other element exactly once, through one comparison for
    all earlier elements and one for all later ones: w_k = prod_{j<k} [x_k B x_j] *
    prod_{j>k} [x_k A x_j].  That is the form whose weights for any window length the checks
    and the relabeling argument of _derive_large_window speak about.
    """
    index = {p: i for i, p in enumerate(node.pieces)}
    sides: dict = {"before": set(), "after": set()}
    for k, w in enumerate(node.weights):
        partners = []
        for f in sp.Mul.make_args(w):
            if not isinstance(f, Indicator):
                continue
            rel = f.rel if index.get(f.rel.lhs) == k else f.rel.reversed
            if index.get(rel.lhs) != k or rel.rhs not in index:
                raise AssertionError(f"w_{k} compares {f.rel}, not x{k} with another element")
            j = index[rel.rhs]
            partners.append(j)
            sides["before" if j < k else "after"].add(type(rel))
        if sorted(partners) != [j for j in range(len(node.pieces)) if j != k]:
            raise AssertionError(f"w_{k} does not compare x{k} once with every other element")
    if len(sides["before"]) != 1 or len(sides["after"]) != 1:
        raise AssertionError(f"the weights of {node.symbol} compare earlier elements by "
                             f"{sides['before']} and later ones by {sides['after']}: not one "
                             f"comparison per side")
    return next(iter(sides["before"])), next(iter(sides["after"]))


def running_weights(vals: np.ndarray, before: type, after: type) -> np.ndarray:
    """prod_{j<k} [x_k B x_j] * prod_{j>k} [x_k A x_j] for every k of windows ``vals`` (n, samples),
    through prefix and suffix running extrema: O(n) per window where the product has n - 1
    factors per element."""
    def beats(rel: type, edges: np.ndarray) -> np.ndarray:
        _, compare_, running, empty = _RUNNING[rel]
        acc = running.accumulate(edges, axis=0)  # acc[k] = extremum of edges[0..k]
        shifted = np.concatenate([np.full((1, vals.shape[1]), empty), acc[:-1]])
        return compare_(edges, shifted)
    return beats(before, vals) & beats(after, vals[::-1])[::-1]


def check_window_weights(node: Node, ties: str, n: int) -> str:
    """Check sum_k w_k (1, or the number of tied winners for 'all') on windows of n elements, in
    time linear in n per window, from the weights derived for a representative window ``node``.

    The weights of ``node`` must have the uniform form of ``uniform_relations``; that form is
    evaluated by running extrema (``running_weights``), first compared with the derived weights
    themselves on random tie-heavy windows of the representative size, then summed on random
    windows of n elements, tie-heavy and not.  A policy whose weights lose or double a tie fails
    either comparison.
    """
    before, after = uniform_relations(node)
    if node.count is not None and node.count != sp.Add(*node.weights):
        raise AssertionError(f"the count of {node.symbol} is not the sum of its E_i: {node.count}")
    sign = 1 if node.kind == "max" else -1
    rng = np.random.default_rng(n)
    r = len(node.pieces)
    rep = rng.integers(0, 3, size=(r, NUMERIC_SAMPLES)).astype(np.float64) * sign
    env = dict(zip(node.pieces, rep))
    memo: dict = {}
    derived = np.array([np.broadcast_to(np.asarray(evaluate(w, env, memo), dtype=np.float64),
                                        (NUMERIC_SAMPLES,)) for w in node.weights])
    if not np.array_equal(derived, running_weights(rep, before, after)):
        raise AssertionError(f"the weights of {node.symbol} differ from their running-extremum form")
    # a third of the windows tie-heavy (3 values), a third with a few ties, a third rarely tied
    high = np.repeat([3, max(3, n // 4), 4 * n], -(-NUMERIC_SAMPLES // 3))[:NUMERIC_SAMPLES]
    vals = np.floor(rng.random((n, NUMERIC_SAMPLES)) * high).astype(np.float64) * sign
    hits = running_weights(vals, before, after).sum(axis=0)
    extreme = vals.max(axis=0) if sign > 0 else vals.min(axis=0)
    want = np.ones(NUMERIC_SAMPLES) if ties != "all" else (vals == extreme).sum(axis=0)
    # split: sum_k E_k / C with C = sum_k E_k is 1 exactly when some element attains the extremum
    got = (hits > 0).astype(np.float64) if node.count is not None else hits
    if not np.array_equal(got, want):
        bad = int(np.flatnonzero(got != want)[0])
        raise AssertionError(f"{ties}: sum of weights is {got[bad]}, not {want[bad]}, on a random "
                             f"window of {n} elements")
    return (f"sum_k w_k = {'1' if ties != 'all' else 'the number of tied winners'} on "
            f"{NUMERIC_SAMPLES} random windows of {n} elements (numeric, linear in n: "
            f"{'E_k' if node.count is not None else 'w_k'} = {_running_text(before, 'x_0..x_(k-1)')}"
            f" * {_running_text(after, f'x_(k+1)..x_{n - 1}')}, equal to the derived weights of "
            f"the {r}-element window on every sample)")


def _running_text(rel: type, elements: str) -> str:
    """[x_k > running max of x_0..x_(k-1)], as the check states it."""
    symbol, _, running, _ = _RUNNING[rel]
    return f"[x_k {symbol} running {'max' if running is np.maximum else 'min'} of {elements}]"


# ---------------------------------------------------------------------------------- derive

def derive_window(n: int, ties: str, kind: str = "max") -> Node:
    """The derived extremum node of a window x0..x{n-1} (any length; used for checks and docs)."""
    return _window(n, ties, kind)[0]


@functools.lru_cache(maxsize=64)
def _window(n: int, ties: str, kind: str) -> tuple[Node, list[str]]:
    """A window's node and checks: they depend on its size, policy and max/min only, so every
    pooling configuration with the same window shares one derivation."""
    if n > MAX_WINDOW:
        raise ValueError(f"a window of {n} elements is larger than symgrad derives ({MAX_WINDOW})")
    xs = window_symbols(n)
    node = _make_node(sp.Symbol("y", real=True), (MaxOf if kind == "max" else MinOf)(*xs), ties)
    checks = [_differentiate_all(node, list(xs)), check_weights(ties, kind, n)]
    return node, checks


def _differentiate_all(node: Node, variables: list, display: bool = True) -> str:
    """Differentiate a node by every variable; return what the delta elimination covered.

    Without ``display`` the delta terms are still eliminated and checked, but the raw derivative
    and the groups are not kept as expressions (code generation needs only the partials).
    """
    n = len(variables)
    if n <= ALL_VARIABLES_UP_TO:
        for v in variables:
            _differentiate(node, v, show=display)
        return (f"delta terms eliminated and cancelled for {variables[0]}, the only variable" if n == 1 else
                f"delta terms eliminated and cancelled for all {n} variables")
    reps = sorted({0, n // 2, n - 1})
    for k, v in enumerate(variables):
        if k in reps:
            _differentiate(node, v, show=False)
        else:
            part = _regular_part(node, v)
            node.partials[v] = part / node.count if node.count is not None else part
    names = ", ".join(str(variables[k]) for k in reps)
    return (f"delta terms eliminated and cancelled for {names}; the other {n - len(reps)} "
            f"variables are the same up to relabeling")


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


@functools.lru_cache(maxsize=256)
def _derive_cached(op_key: tuple, op: Op, display: bool = True) -> Derivation:
    spec = op.spec
    if spec.strategy.static and op.window_size() > ALL_VARIABLES_UP_TO:
        return _derive_large_window(op)
    inputs = input_symbols(op)
    if spec.strategy.elementwise:
        framework = op.convention is not None and spec.framework_forward is not None
        forward = (spec.framework_forward if framework else spec.forward)(op.params, inputs)
        if isinstance(forward, dict):  # a forward per framework (hardsigmoid)
            forward = forward[op.convention]
        if op.order == "reversed":
            forward = forward.reversed_order(_reversed) if isinstance(forward, Regions) else _reversed(forward)
    else:
        forward = (MaxOf if spec.extremum == "max" else MinOf)(*inputs)
    inner: list = []
    root = _split_nodes(forward, inner)
    # an output that is an affine map of the outermost extremum (scaled.Scaled: hardsigmoid)
    scaled = root if isinstance(root, (Scaled, Picked, Regions)) else None  # (Picked: threshold)
    root = scaled.node if scaled is not None else root
    # the outermost extremum becomes the output y
    y = sp.Symbol("y", real=True)
    last_sym, last_ext = inner.pop()
    assert last_sym == root
    inner.append((last_sym if scaled is not None else y, last_ext))  # (a map: y is the map's)
    if not spec.strategy.elementwise:
        try:
            node, checks = _window(len(inputs), op.ties, spec.extremum)
        except ValueError as exc:
            raise ValueError(f"{op.name}: {exc}") from None
        nodes = [node]
        checks = list(checks) + _representative_note(op)
        return Derivation(op, inputs, forward, nodes, dict(node.partials),
                          _steps(op, forward, nodes, node.partials), checks)
    nodes = [_make_node(sym, ext, op.ties) for sym, ext in inner]
    checks = []
    for node in nodes:
        free = {s for p in node.pieces for s in p.free_symbols if not isinstance(s, Literal)}
        variables = [v for v in inputs if v in free] + sorted(
            (v for v in free if v not in inputs), key=lambda s: s.name)
        checks.append(_differentiate_all(node, variables, display))
        checks.append(check_weights(op.ties, node.kind, len(node.pieces)))
    partials = _chain(nodes, inputs)
    if isinstance(scaled, Picked):  # dy/dx = sum_i w_i dq_i/dx: the pieces' own values q
        out = nodes[-1]
        assert len(nodes) == 1 and len(scaled.values) == len(out.pieces), scaled
        stand = Node(out.symbol, out.kind, tuple(scaled.values), out.weights, out.count)
        partials = {s: _regular_part(stand, s) / (out.count or 1) for s in inputs}
    elif isinstance(scaled, Regions):  # per region (hardswish): sum_i w_i d_i, each d_i checked
        by_symbol = {n.symbol: n for n in nodes}
        (x,) = inputs
        partials = {x: _regions.partial(scaled, root, by_symbol, x)}
        checks += _regions.region_checks(scaled, root, by_symbol, x)
    elif scaled is not None:  # dy/dx = grad_scale * du/dx (the node's partials, the chain above)
        partials = {s: scaled.grad_scale * p for s, p in partials.items()}
    return Derivation(op, inputs, forward, nodes, partials, _steps(op, forward, nodes, partials), checks,
                      output_map=scaled)


def _derive_large_window(op: Op) -> Derivation:
    """A static window of more than ALL_VARIABLES_UP_TO elements, derived on a representative one.

    The derivation's inputs, forward, node and partials are those of the representative window of
    REPRESENTATIVE_STATIC_WINDOW elements, derived in full (every variable's delta groups sifted
    and cancelled); its steps state the W-form of the actual n-element window, and its checks
    check that window's weights (``check_window_weights``) and say why the rule holds for it.  The
    lowered kernel (lower.selection) reads only the form of the weights, a scan or a mask whose
    size comes from the op, so generated code is that of the n-element window.
    """
    n, r, kind = op.window_size(), REPRESENTATIVE_STATIC_WINDOW, op.spec.extremum
    node, checks = _window(r, op.ties, kind)
    checks = [f"on the representative window of {r} elements: {c}" for c in checks]
    checks += [check_window_weights(node, op.ties, n)] + _representative_note(op)
    steps = _steps(op, node.forward, [node], node.partials)
    rep = f"y ({r}-element representative window)"
    steps[0] = Step("forward", f"{op.name} as the {kind} of its {n} window elements in scan order; "
                    f"the steps below are derived on a representative window of {r} elements "
                    f"(see the checks)",
                    (("y", sp.Symbol(f"{kind}(x0, x1, ..., x{n - 1})")), (rep, node.forward)))
    weight = _policy.TIES[op.ties].formula(kind).split(" = ", 1)[1]
    steps[1] = Step("W-form", steps[1].note,
                    (("y", sp.Symbol(f"sum_(k=0..{n - 1}) w_k*x_k")),
                     (f"w_k (k = 0..{n - 1})", sp.Symbol(weight)),
                     (rep, node.w_form)) + steps[1].items[1:])
    return Derivation(op, window_symbols(r), node.forward, [node], dict(node.partials), steps, checks)


def _representative_note(op: Op) -> list[str]:
    """What a representative-window derivation stands for (adaptive pooling, large static windows)."""
    if op.spec.strategy.static and op.window_size() > ALL_VARIABLES_UP_TO:
        n, r = op.window_size(), REPRESENTATIVE_STATIC_WINDOW
        return [f"the window of {n} elements is derived on a representative window of {r} (in full "
                f"it has {n} weights of {n - 1} indicators each): every weight compares its element "
                f"with each earlier element by one comparison and each later one by another, at "
                f"any size; a delta group of dy/dx_k, on the boundary x_k = x_j, holds the factors "
                f"of w_k and w_j only, and each of their factors against a third element x_i is "
                f"fixed by the order of i, j and k, every order of which occurs in the "
                f"representative window: each group of the {n}-element window is one of its "
                f"groups up to a relabeling that keeps the order of the elements, and cancels "
                f"alike; the rule is lowered to a running scan (first/last) or a mask of the "
                f"elements attaining the extremum (split/all), of the {n} elements"]
    note = op.spec.strategy.representative_note  # a window known only at run time (adaptive)
    return [note.format(n=len(input_symbols(op)))] if note else []


def derive(op: Op, display: bool = True) -> Derivation:
    """Derive the backward of an op (cached by op, parameters and policy).

    ``display=False`` leaves out the expressions kept only to show the raw derivative and its
    delta groups (the "raw derivative" and "delta elimination" steps are then empty); the
    elimination itself and every check still run.  Code generation derives this way.
    """
    return DERIVATIONS[op.spec.strategy.derivation](op, display)


def _derive_pieces(op: Op, display: bool) -> Derivation:
    """A max/min of pieces or a window's extremum: the W-form (cached by op, parameters, policy)."""
    key = (op.name, tuple(sorted((k, repr(v)) for k, v in op.params.items())), op.ties, op.order)
    return _derive_cached(key, op, display)


def _derive_parsed(op: Op, display: bool) -> Derivation:
    """A user's expression, parsed again from the op's text (never evaluated)."""
    from .expr import parse
    return derive_expression(op, parse(op.params["expr"], op.params["inputs"]))


# how each op kind is derived (Kind.derivation): not a max/min of pieces: derive_special.py
DERIVATIONS = {"pieces": _derive_pieces, "expression": _derive_parsed,
               "special": lambda op, display: derive_special(op), "order": derive_order}


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
    note = f"{op.ties}: {_policy.TIES[op.ties].summary}"
    steps.append(Step("W-form", note, tuple(items)))
    raw = tuple((f"d{n.symbol}/d{v}", e) for n in nodes for v, e in n.raw.items())
    steps.append(Step("raw derivative", "differentiating an indicator gives a DiracDelta on its boundary", raw))
    delta_items = []
    for n in nodes:
        for v, groups in n.delta_groups.items():
            for d, coeff, sifted in groups:
                delta_items.append((f"d{n.symbol}/d{v}: coefficient of {text(d)}", coeff))
                delta_items.append(("  sifted and cancelled", sifted))
    steps.append(Step("delta elimination",
                      "f*delta(g) = f|_{g=0}*delta(g) (sifting); on the support, indicators are "
                      "taken non-strict (they differ on a null set), and each group cancels to 0",
                      tuple(delta_items)))
    fin = [(f"d{n.symbol}/d{v}", e) for n in nodes for v, e in n.partials.items()]
    if len(nodes) > 1:
        fin += [(f"dout/d{s} (chain rule)", e) for s, e in partials.items()]
    steps.append(Step("final partials", "what is left after the delta terms cancel", tuple(fin)))
    return steps


# ---------------------------------------------------------------------------------- expressions
#
# Expression mode (symgrad.expr parses the text).  The expression is cut into nodes, innermost
# first, each with a symbol, so that every max/min has pieces whose differences are affine (its
# W-form derivation above then sifts and cancels every delta group exactly):
#
#   s<k>  a smooth subexpression used as a max/min piece (x*y, exp(x), ...), differentiated by SymPy
#   u<k>  a max/min of pieces (numbers, inputs, affine combinations, node symbols): the W-form
#   h<k>  Heaviside / sign (policy weights of max(0, u) / max(u, -u)) or a Piecewise
#
# y (the output) is a smooth expression of the inputs and node symbols.  The backward is the chain
# rule through the nodes; equal subexpressions share one node.

NODE_NOTES = {
    "heaviside": "Heaviside(u) = the weight of u in max(0, u): the policy's derivative of relu "
                 "(H(0) = 0 first, 1 last, 1/2 split, 1 all); its derivative is 0 away from u = 0 "
                 "(no delta is kept)",
    "heaviside0": "Heaviside(u, h0) = [u > 0] + h0*[u = 0] (NaN for NaN u); derivative 0 away from "
                  "u = 0 (no delta is kept)",
    "sign": "sign(u) = w(u) - w(-u) in max(u, -u): the policy's derivative of abs (sign(0) = +1 "
            "first, -1 last, 0 split, 0 all); derivative 0 away from u = 0 (no delta is kept)",
    "piecewise": "Piecewise: the first branch whose condition holds (strict or not as written; the "
                 "tie policy does not apply); derivative: that branch's derivative (no delta)",
    "max": "max of pieces in the order written: the tie policy decides a tie",
    "min": "min of pieces in the order written: the tie policy decides a tie",
    "smooth": "a smooth piece, differentiated by SymPy",
    "copy": "a piece written again in a max/min: a piece of its own, with the value of the first",
}


@dataclass
class ExprNode:
    """One node of an expression: its value in inputs and earlier nodes, its a.e. partials."""

    symbol: sp.Symbol
    kind: str  # "smooth" | "copy" | "max" | "min" | "heaviside" | "heaviside0" | "sign" | "piecewise"
    value: sp.Expr
    partials: dict = field(default_factory=dict)  # atom -> partial (a.e.; no delta)
    wnode: Node | None = None  # the W-form of max/min (and of heaviside/sign: max(0,u), max(u,-u))

    @property
    def note(self) -> str:
        return NODE_NOTES[self.kind]


@dataclass
class ExprDerivation(Derivation):
    """A derivation of an expression: ``nodes`` are ExprNodes (innermost first), ``root`` is the
    output in inputs and node symbols, ``partials`` the total dy/dinput (chain rule)."""

    root: sp.Expr = None
    text: str = ""
    root_partials: dict = field(default_factory=dict)  # atom -> dout/datom


MAX_EXPANDED_TERMS = 256  # affine_in_node expands only expressions of at most this many terms


def expanded_terms(e: sp.Expr) -> int:
    """An upper bound on the number of terms of sp.expand(e), computed without expanding (and
    saturating, so that it stays cheap): a sum adds its terms' counts, a product multiplies them,
    a power (a+b+...)**n with n a positive integer has at most C(n + t - 1, t - 1) terms for t
    terms of the base, anything else (a symbol, a function call, another power) is one term."""
    cap = 10 ** 9
    if e.is_Add:
        return min(cap, sum(expanded_terms(a) for a in e.args))
    if e.is_Mul:
        out = 1
        for a in e.args:
            out = min(cap, out * expanded_terms(a))
        return out
    if e.is_Pow and e.exp.is_Integer and e.exp > 1:
        t = expanded_terms(e.base)
        if t == 1:
            return 1
        return min(cap, math.comb(min(int(e.exp), 10 ** 4) + t - 1, t - 1)) if t < 64 else cap
    return 1


def _is_affine(e: sp.Expr) -> bool:
    """An affine piece with exact coefficients (a max/min's W-form sifts and cancels its delta
    groups exactly; a folded constant such as sqrt(2)*x is a Float: its piece becomes a node)."""
    if e.is_number or e.is_Symbol:
        return True
    return not e.has(sp.Float) and all(sp.diff(e, s).is_number for s in e.free_symbols)


class _Nodes:
    def __init__(self, ties: str):
        self.ties = ties
        self.nodes: list[ExprNode] = []
        self.memo: dict = {}
        self.counts = {"s": 0, "u": 0, "h": 0}

    def add(self, prefix: str, kind: str, value: sp.Expr) -> sp.Symbol:
        key = (kind, value)
        if key in self.memo:
            return self.memo[key]
        sym = sp.Symbol(f"{prefix}{self.counts[prefix]}", real=True)
        self.counts[prefix] += 1
        node = ExprNode(sym, kind, value)
        self.nodes.append(node)
        self.memo[key] = sym
        return sym

    def copy(self, value: sp.Expr) -> sp.Symbol:
        """A node holding value again, under a symbol of its own (never shared)."""
        sym = sp.Symbol(f"s{self.counts['s']}", real=True)
        self.counts["s"] += 1
        self.nodes.append(ExprNode(sym, "copy", value))
        return sym

    def affine_in_node(self, e: sp.Expr) -> sp.Expr:
        """e as c*s + k for a smooth node s with value v (e = c*v + k), else e (-x*y: -s0).

        Only tried where expanding is cheap (expanded_terms): (x+y+z+w)**64 - exp(x) would expand
        to tens of thousands of terms (billions with 8 inputs).  Not finding a relation costs
        nothing but a node: e then becomes a smooth node of its own, a piece like any other."""
        if expanded_terms(e) > MAX_EXPANDED_TERMS:
            return e
        for n in self.nodes:
            if n.kind != "smooth" or expanded_terms(n.value) > MAX_EXPANDED_TERMS:
                continue
            k = sp.expand(e - n.value)
            if k.is_number:
                return n.symbol + k
            c = sp.cancel(e / n.value)
            if c.is_number and c != 0:
                return c * n.symbol
        return e

    def share(self, e: sp.Expr) -> sp.Expr:
        """e with the value of every smooth node replaced by its symbol (exp(s0) -> s2)."""
        table = {}
        for n in self.nodes:
            if n.kind == "smooth":
                table[n.value] = n.symbol
                if n.value.is_Pow:  # d sqrt(u) = du / (2 sqrt(u)): 1/sqrt(u) is 1/s
                    table[sp.Pow(n.value.base, -n.value.exp)] = 1 / n.symbol
        return e.xreplace(table)

    def piece(self, e: sp.Expr) -> sp.Expr:
        """e cut, as a piece of a max/min (or the argument of Heaviside/sign, a piece of max(0, u)
        or max(u, -u)): affine in inputs and node symbols, a non-affine part a smooth node of its
        own ((x+1)**2 -> s0), so that the W-form's indicators compare node values."""
        a = self.cut(e)
        if not _is_affine(a):
            a = self.affine_in_node(a)
        if not _is_affine(a):
            a = self.add("s", "smooth", a)
        if a.is_Float:  # a folded constant as the exact rational it is: deltas cancel exactly
            a = sp.Rational(a)
        return a

    def cut(self, e: sp.Expr) -> sp.Expr:
        """e over inputs and node symbols (innermost nodes created first)."""
        from .expr import HeavisideOf, PiecewiseOf, SignOf, policy_constants
        if e.is_number:  # Heaviside(0), sign(0): the policy's values
            return policy_constants(e, self.ties)
        if not e.args:
            return e
        if isinstance(e, _Extremum):
            pieces = [self.piece(a) for a in e.args]
            nums = [p for p in pieces if p.is_number]
            if nums:  # a number below another number never wins nor ties
                best = (max if e.kind == "max" else min)(nums)
                pieces = [p for p in pieces if not p.is_number or p == best]
            if len(pieces) == 1:
                return pieces[0]
            # pieces are taken in the order written, each on its own: an equal piece written
            # again (Max(x, x), Max(x, y, x), Max(1, x, 1)) is a copy of it, a piece of its own
            # that ties with it, as maximum(a, a) ties two arrays (under 'all' each gets 1)
            for i, p in enumerate(pieces):
                if p in pieces[:i]:
                    pieces[i] = self.copy(p)
            return self.add("u", e.kind, type(e)(*pieces))
        if isinstance(e, HeavisideOf):  # u is a piece of max(0, u) (Heaviside(u, h0): h0 a number)
            args = [self.piece(e.args[0])] + [self.cut(a) for a in e.args[1:]]
            return self.add("h", "heaviside" if len(args) == 1 else "heaviside0", HeavisideOf(*args))
        if isinstance(e, SignOf):  # u is a piece of max(u, -u)
            return self.add("h", "sign", SignOf(self.piece(e.args[0])))
        if isinstance(e, PiecewiseOf):
            args = [Indicator(type(a.rel)(self.cut(a.rel.lhs), self.cut(a.rel.rhs), evaluate=False))
                    if isinstance(a, Indicator) else self.cut(a) for a in e.args]
            return self.add("h", "piecewise", PiecewiseOf(*args))
        out = e.func(*[self.cut(a) for a in e.args])
        if ("smooth", out) in self.memo:  # a smooth node's value elsewhere: share it
            return self.memo[("smooth", out)]
        if isinstance(out, sp.Function) or (out.is_Pow and not out.exp.is_Integer):
            # a function call (exp, log, sqrt, tanh, ...) is evaluated once: forward and backward
            # (its derivative is written in its value where it can be: d exp(u) = exp(u) du)
            return self.add("s", "smooth", out)
        return out


def _piecewise_map(pw, f) -> sp.Expr:
    """PiecewiseOf with f applied to every branch value."""
    from .expr import PiecewiseOf
    return PiecewiseOf(*[a if isinstance(a, Indicator) else f(a) for a in pw.args])


def derive_expression(op: Op, parsed) -> ExprDerivation:
    """Derive an expression's backward (cached by text, inputs and policy)."""
    return _derive_expression(parsed.text, parsed.expr, tuple(parsed.inputs), op.ties, op)


@functools.lru_cache(maxsize=64)
def _derive_expression(text: str, expr: sp.Expr, inputs: tuple, ties: str, op: Op) -> ExprDerivation:
    from .expr import HeavisideOf, SignOf
    syms = tuple(sp.Symbol(n, real=True) for n in inputs)
    cutter = _Nodes(ties)
    root = cutter.cut(expr)
    checks = []
    for node in cutter.nodes:
        if node.kind in ("smooth", "copy"):
            node.partials = {a: cutter.share(sp.diff(node.value, a)) for a in _ordered(node.value, syms)}
        elif node.kind in ("max", "min"):
            w = _make_node(node.symbol, node.value, ties)
            node.wnode = w
            variables = _ordered(node.value, syms)
            checks.append(f"{node.symbol}: " + _differentiate_all(w, variables))
            checks.append(f"{node.symbol}: " + check_weights(ties, w.kind, len(w.pieces)))
            node.partials = {v: w.partials[v] for v in variables}
        elif node.kind in ("heaviside", "sign"):
            u = node.value.args[0]
            ext = MaxOf(sp.S.Zero, u) if node.kind == "heaviside" else MaxOf(u, -u)
            node.wnode = _make_node(node.symbol, ext, ties)
            node.partials = {}
        elif node.kind == "heaviside0":
            node.partials = {}
        else:  # piecewise
            node.partials = {a: _piecewise_map(node.value, lambda v, a=a: cutter.share(sp.diff(v, a)))
                             for a in _ordered(node.value, syms)}
    checks.append("Heaviside, sign and Piecewise nodes: a.e. derivative, no DiracDelta kept")
    # chain rule, innermost first: total[atom][input]
    total = {s: {t: (sp.S.One if s == t else sp.S.Zero) for t in syms} for s in syms}
    for node in cutter.nodes:
        total[node.symbol] = {t: sp.Add(*[p * total[a][t] for a, p in node.partials.items()])
                              for t in syms}
    root_partials = {a: cutter.share(sp.diff(root, a)) for a in _ordered(root, syms)}
    partials = {t: sp.Add(*[p * total[a][t] for a, p in root_partials.items()]) for t in syms}
    for t, e in partials.items():
        if e.has(sp.DiracDelta, sp.Heaviside, HeavisideOf, SignOf):
            raise AssertionError(f"dy/d{t} still holds a delta or step: {e}")
    d = ExprDerivation(op, syms, expr, cutter.nodes, partials, [], checks, root=root, text=text,
                       root_partials=root_partials)
    d.steps = _expr_steps(d)
    return d


def _ordered(e: sp.Expr, inputs: tuple) -> list:
    """e's free symbols: inputs in input order, then node symbols by name."""
    free = e.free_symbols
    return [s for s in inputs if s in free] + sorted((s for s in free if s not in inputs),
                                                     key=lambda s: (s.name[0], int(s.name[1:])))


def _expr_steps(d: ExprDerivation) -> list[Step]:
    items = [(str(n.symbol), n.value) for n in d.nodes] + [("out", d.root)]
    steps = [Step("forward", f"{d.text}, cut into nodes (innermost first); equal subexpressions "
                  "share a node", tuple(items))]
    notes = tuple((f"{n.symbol} ({n.kind})", sp.Symbol(n.note)) for n in d.nodes
                  if n.kind not in ("smooth", "copy"))
    steps.append(Step("non-smooth nodes", "what each becomes, and its value at its kink", notes))
    wf = []
    for n in d.nodes:
        if n.wnode is None:
            continue
        w = n.wnode
        label = (f"{n.symbol} = {text(w.forward)}" if n.kind in ("max", "min")
                 else f"{text(w.forward)} (W-form used by {n.symbol})")
        wf.append((label, w.w_form))
        for i, wi in enumerate(w.weights):
            wf.append((f"  {'E' if w.count is not None else 'w'}_{i}", wi))
        if w.count is not None:
            wf.append(("  C", w.count))
        if n.kind == "heaviside":
            wf.append((f"{n.symbol} = weight of piece 1", (w.weights[1] / w.count) if w.count is not None
                       else w.weights[1]))
        if n.kind == "sign":
            diff_ = w.weights[0] - w.weights[1]
            wf.append((f"{n.symbol} = w_0 - w_1", diff_ / w.count if w.count is not None else diff_))
    steps.append(Step("W-form", f"{d.op.ties}: {_policy.TIES[d.op.ties].summary}", tuple(wf)))
    raw, deltas = [], []
    for n in d.nodes:
        if n.kind in ("max", "min"):
            raw += [(f"d{n.symbol}/d{v}", e) for v, e in n.wnode.raw.items()]
            for v, groups in n.wnode.delta_groups.items():
                for dd, coeff, sifted in groups:
                    deltas.append((f"d{n.symbol}/d{v}: coefficient of {text(dd)}", coeff))
                    deltas.append(("  sifted and cancelled", sifted))
    steps.append(Step("raw derivative", "differentiating an indicator gives a DiracDelta on its "
                      "boundary", tuple(raw)))
    steps.append(Step("delta elimination", "sifting: each delta group restricted to its support "
                      "cancels to 0", tuple(deltas)))
    fin = [(f"d{n.symbol}/d{a}", e) for n in d.nodes for a, e in n.partials.items()]
    fin += [(f"dout/d{a}", e) for a, e in d.root_partials.items()]
    fin += [(f"dout/d{s} (chain rule)", e) for s, e in d.partials.items()]
    steps.append(Step("final partials", "a.e. partials of each node, then the chain rule", tuple(fin)))
    return steps
