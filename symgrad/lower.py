"""Lowering: a Derivation becomes a backend-neutral kernel description.

After this step no math is decided anywhere else: printers turn each SymPy node into text and
templates place that text.  The description says

* which comparisons the code makes, with the NaN rule applied (``policy.NanRule.comparison``);
* how a window's winner is found: a running ``scan`` (first/last: the indicator products are
  equivalent to one pass that replaces the running winner when a later element beats it with the
  comparison the W-form uses against earlier elements, O(n) comparisons instead of O(n^2)), or a
  ``mask`` of the elements attaining the extremum (split/all);
* what forward saves (a window-local index in the smallest unsigned type, or the input itself);
* the gradient expression of every input in terms of grad_output, as selects over conditions.

Lowered-only node types: ``Select(cond, a, b)`` (cond ? a : b), ``Quotient(a, b)`` and
``Count(c0, c1, ...)`` (how many of the conditions hold, in the working dtype).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import sympy as sp

from . import geometry as _geometry
from . import policy as _policy
from .derive import Derivation, Node
from .ops import _num
from .indicators import Indicator, IsNan, MaxOf, MinOf, SignBit, compare
from . import regions as _regions
from .conventions import LSE_HALF as _LSE_HALF
from .regions import Regions
from .scaled import Picked


class _SortsAsWritten:
    """Sorts (SymPy's sort key, which orders the operands of + and * when printed) as it would
    with every shared temporary inside replaced by its value (see ``Shared``)."""

    def sort_key(self, order=None):
        inner = self.atoms(Shared)
        if not inner:
            return super().sort_key(order)
        return self.xreplace({s: s._value for s in inner}).sort_key(order)


class Select(_SortsAsWritten, sp.Function):
    """Select(cond, a, b): a where cond holds, else b."""

    nargs = 3

    @classmethod
    def eval(cls, cond, a, b):
        if cond is sp.true:
            return a
        if cond is sp.false:
            return b
        return None


class Quotient(_SortsAsWritten, sp.Function):
    """Quotient(a, b): a / b, kept apart so every backend prints one division."""

    nargs = 2


class Product(_SortsAsWritten, sp.Function):
    """Product(a, b): a * b, kept apart so every backend prints one multiplication of these two
    operands (SymPy flattens a * (b * c) into one product, whose order rounds differently)."""

    nargs = 2


class Count(_SortsAsWritten, sp.Function):
    """Count(c0, c1, ...): the number of conditions that hold, in the working dtype."""


GRAD_OUTPUT = sp.Symbol("grad_output", real=True)
V, BEST, EXTREMUM, HIT, COUNT = sp.symbols("v best extremum hit count", real=True)


@dataclass(frozen=True)
class Assign:
    name: str
    expr: sp.Basic
    boolean: bool = False  # a condition (bool in C), not a number of the working type


@dataclass(frozen=True)
class ElementwiseKernel:
    inputs: tuple[str, ...]
    intermediates: tuple[Assign, ...]  # node values used by the gradients (u0, ...)
    output: sp.Expr  # forward value
    grads: tuple[Assign, ...]  # grad_<input> in terms of grad_output, inputs, intermediates
    saved: tuple[str, ...]  # what forward keeps for backward
    broadcast: bool  # several inputs: gradients are summed back to each input's shape
    adjoints: tuple[Assign, ...] = ()  # expressions: g_<node> = dy/d<node> * grad_output, outermost first
    wrt: tuple[str, ...] | None = None  # expressions: the inputs whose gradients backward returns
    # broadcast: how a broadcast input's gradient is summed back (conventions.BROADCAST_SUMS)
    broadcast_sum: str = "numpy"


@dataclass(frozen=True)
class Selection:
    """How a window's winner(s) are found and weighted."""

    form: str  # "scan" | "mask"
    extremum: str  # "max" | "min"
    take: sp.Basic | None  # scan: later element v replaces the running winner best
    order: str | None  # scan: "first" (strict) or "last" (non-strict) winner among equals
    hit: sp.Basic | None  # mask: element v attains the window's extremum
    weight: sp.Expr | None  # mask: gradient of a hit element, in grad_output, hit, count
    counts: bool  # mask: the weight needs the number of hits
    # scan: how the running scan treats NaN (its NaN rule), which fixes its winner over a whole
    # window in closed form (NanRule.nan_takes_over, .nan_is_taken_over)
    nan: _policy.NanRule | None = None
    # the window's extremum so far, folded with the next element v (NaN propagating; of equal
    # values, the one the zeros rule says: ``extremum_step``): in BEST and V
    combine: sp.Basic | None = None

    @property
    def winner_is_output(self) -> bool:
        """scan: the winner's value is the output (else the output is a fold of the max/min)."""
        return self.nan is None or self.nan.winner_is_output


# what a window kernel's windows are (WindowKernel.windows, from Kind.windows), by which the
# backends choose their templates: the op kind that has them is not the backends' business
WINDOW_FORMS = {
    "strided": "windows of a static size at a stride along each spatial axis, with padding and "
               "dilation (max pooling)",
    "blocks": "groups of consecutive channels that never overlap (maxout)",
    "sampled": "windows of a static size at starts drawn per (N, C) plane from random samples "
               "(fractional max pooling)",
    "rows": "the slices along the reduced dims, one row each (amax, amin, max, min)",
    "spans": "windows between the floor and the ceiling of the output's share of the input along "
             "each axis, known from the input's length at run time (adaptive max pooling)",
}


@dataclass(frozen=True)
class WindowKernel:
    windows: str  # the form of the windows (WINDOW_FORMS)
    window: int  # elements per window (representative size for reductions)
    selection: Selection
    # scan: the saved window-local index's NumPy dtype (the smallest unsigned type holding the
    # window's indices) where the window's size is known when the code is generated (Kind.static);
    # None: the mask form, or a size known only at run time (the loader picks the type then)
    index_dtype: str | None
    saved: tuple[str, ...]
    padding_takes_part: bool = False  # pooling: padding is -inf and competes (JAX) or never wins
    axes: _geometry.AxisGeometry | None = None  # the windows along each axis (None: reductions)
    # what an element's gradient starts from before its windows' terms are added
    # (conventions.GRAD_STARTS): "+0", "-0" (the terms' sum exactly, a -0 kept), or "slices"
    grad_start: str = "+0"
    # bfloat16: how an element's windows' gradients are added (conventions.BFLOAT16_ADDS);
    # "bfloat16" (each add rounded) where the preset says so and each window has one winner
    bfloat16_adds: str = "float32"
    # adaptive windows: the order an element's windows' gradients are added (conventions.GRAD_ORDERS)
    grad_order: str = "output"
    # reductions under conventions.TANGENT_SUMS "torch": jvp adds this term (hit times the tangent,
    # in GRAD_OUTPUT and HIT) along each slice in PyTorch's at::sum order, then divides the sum by
    # the count once; None: jvp adds the weights
    tangent_term: sp.Expr | None = None
    # what the backends branch on besides the form, from the Kind: the windows (their places and
    # sizes) are known when the code is generated (Kind.static and not Kind.runtime_windows);
    # they never overlap (Kind.disjoint); they are found at run time, per input (Kind.runtime_windows);
    # two of them may hold one element (Kind.overlaps: by the parameters, or by the input)
    static_windows: bool = False
    disjoint: bool = False
    runtime_windows: bool = False
    overlaps: bool = False
    # the inputs an (N, C) plane's windows are placed by besides x, as the kernels name them
    # (Kind.plane_inputs: fractional pooling's samples)
    plane_inputs: tuple[str, ...] = ()
    # the mask's saved count of hits (Selection.counts), as a NumPy dtype name: the smallest
    # unsigned type holding window + 1 values where the windows are static; None: not saved, or
    # picked by the loader at run time
    count_dtype: str | None = None
    # where a saved index's or count's dtype is picked at run time (index_dtype or count_dtype None:
    # the smallest unsigned type holding the window's size, which only the input gives), the dtype
    # compiled kernels write and read it in (the loader narrows it to that type and widens it back)
    runtime_saved_dtype: str = "int64"
    # windows placed per plane by samples (Kind.sampling, Kind.sample_of): how their starts are
    # drawn, in words; the sample that drives each spatial axis
    sampling: str = ""
    sample_of: tuple[int, ...] = ()
    # mask: a window can have no hit under the NaN rule (NanRule.count_can_be_zero: comparisons
    # with NaN false), so a count can be 0
    count_can_be_zero: bool = False
    # segments (windows given by an index): their initial element, counting and output (SegmentRule)
    segment: "SegmentRule | None" = None
    # the forward ignores NaN (nanmax/nanmin: NaN only where a window holds nothing else)
    skips_nan: bool = False


def smallest_index_dtype(n: int) -> str:
    """The smallest unsigned type holding window-local indices 0..n-1."""
    for t in ("uint8", "uint16", "uint32", "uint64"):
        if n - 1 <= np.iinfo(t).max:
            return t
    raise ValueError(f"window of {n} elements is too large")


# ----------------------------------------------------------------------------- conditions

def _condition(factors: list[sp.Expr], nan: str, roles: dict) -> sp.Basic:
    """A product of indicators as one Boolean, each comparison under the NaN rule and its role."""
    rule = _policy.nan_rule(nan)
    return sp.And(*[rule.comparison(f, roles[f]) for f in factors])


def factor_roles(nodes: list[Node]) -> dict:
    """{indicator: survive} for every W-form factor [p_i beats p_j] of every node: True when p_i
    comes before p_j (p_i keeps the gradient unless p_j takes over), False when after."""
    roles: dict = {}
    for node in nodes:
        index = {p: i for i, p in enumerate(node.pieces)}
        for i, w in enumerate(node.weights):
            for f in sp.Mul.make_args(w):
                if not isinstance(f, Indicator):
                    continue
                j = index[f.rel.rhs]
                assert index[f.rel.lhs] == i, (f, i)
                if roles.get(f, j > i) != (j > i):
                    raise AssertionError(f"{f} plays two roles; the NaN rule cannot read it")
                roles[f] = j > i
    return roles


def _common_coefficient(partial: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
    """(c, partial / c): c the factor, without numbers and indicators, that every term of
    partial's numerator shares (1: none)."""
    held = {f: sp.Dummy() for f in partial.atoms(Indicator)}  # plain symbols meanwhile
    num, den = sp.fraction(partial.xreplace(held))
    groups: dict = {}  # per product of indicators, its coefficient
    for term in sp.Add.make_args(sp.expand(num)):
        coeff, inds = term.as_independent(*held.values(), as_Add=False)
        groups[inds] = groups.get(inds, sp.S.Zero) + coeff
    parts = {sp.S.One if c.is_number else c.as_coeff_Mul()[1] for c in groups.values()}
    common = parts.pop() if len(parts) == 1 else sp.S.One
    rest = sp.cancel(num / common) / den if common != 1 else num / den
    return common, rest.xreplace({v: f for f, v in held.items()})


def _split_term(term: sp.Expr) -> tuple[sp.Expr, list[Indicator]]:
    coeff, inds = [], []
    for f in sp.Mul.make_args(term):
        (inds if isinstance(f, Indicator) else coeff).append(f)
    return sp.Mul(*coeff), inds


GRADIENT_FORMS = {
    "sum": "a sum over the pieces of (condition ? coefficient * g : 0)",
    "nested": "(condition ? coefficient * g : (next condition ? ... : 0)): one piece's term or +0 "
              "(single-winner policies: at most one condition holds)",
    "scaled": "a sum over the pieces of coefficient * (condition ? g : 0), as reverse-mode "
              "autodiff of a where() gives it",
    "product": "g * (a sum over the pieces of (condition ? coefficient : 0)): g times a weight, "
               "so a weight of 0 gives a zero with g's sign (and NaN for an infinite g)",
    "chained": "the input's coefficient in its piece times the product form's g * weight (the "
               "weight's numbers kept inside), as reverse-mode autodiff of jnp.maximum(0, piece) "
               "gives it: NaN where the coefficient is infinite and the weight 0",
}


def lower_partial(partial: sp.Expr, nan: str = "dominate", roles: dict | None = None,
                  form: str = "sum") -> sp.Expr:
    """grad_output * partial as selects, divided by counts where the policy splits.

    Under 'dominate' a count is never 0 and the sum is divided once.  Under IEEE rules a count
    can be 0 (a NaN equals nothing); the division then goes inside each select, which yields 0.
    ``form`` (GRADIENT_FORMS) says how the terms make the gradient: the value is the same
    wherever no term is zero, and the form decides the sign of a zero gradient.
    """
    roles = roles or {}
    if form == "chained":
        common, rest = _common_coefficient(partial)
        return common * lower_partial(rest, nan, roles, "product")
    if partial.is_Add and len({sp.fraction(t)[1] for t in partial.args}) > 1 and form != "nested":
        # an input in several nodes (softshrink's x in both): each chain term has its own counts
        return sp.Add(*[lower_partial(t, nan, roles, form) for t in partial.args])
    num, den = sp.fraction(partial)
    counts = []
    for factor in sp.Mul.make_args(den):
        if factor == 1:
            continue
        # a piece's constant factor (Max(x, y/2)) can leave a number in the denominator, alone or
        # as the content of a count (2*[a] + 2*[b]): it divides the numerator instead
        content, factor = factor.as_content_primitive()
        num = num / content
        if factor.is_number:
            num = num / factor
            continue
        conds = []
        for term in sp.Add.make_args(factor):
            coeff, inds = _split_term(term)
            if coeff != 1 or not inds:
                raise AssertionError(f"unexpected count term {term}")
            conds.append(_condition(inds, nan, roles))
        counts.append(Count(*conds))
    count = sp.Mul(*counts)
    inner = bool(counts) and _policy.nan_rule(nan).count_can_be_zero
    if form not in GRADIENT_FORMS:
        raise ValueError(f"unknown gradient form {form!r}")
    if form == "nested" and counts:
        raise ValueError("the nested gradient form needs a single-winner policy (no counts)")
    factor = sp.S.One if form == "product" else GRAD_OUTPUT  # product: g multiplies the weight
    total = []
    for term in sp.Add.make_args(_expand_outside_indicators(num)):
        coeff, inds = _split_term(term)
        if coeff == 0:
            continue
        value = factor * coeff
        if inner:
            value = Quotient(value, count)
        if not inds:
            total.append(value)
        elif form == "scaled":
            total.append(coeff * Select(_condition(inds, nan, roles), GRAD_OUTPUT, sp.S.Zero))
        else:
            total.append(Select(_condition(inds, nan, roles), value, sp.S.Zero))
    if form == "nested":
        out = sp.S.Zero
        for t in reversed(total):
            out = Select(t.args[0], t.args[1], out) if isinstance(t, Select) else t
        return out
    out = sp.Add(*total) if total else sp.S.Zero
    out = Quotient(out, count) if (counts and not inner) else out
    return GRAD_OUTPUT * out if form == "product" else out


def _expand_outside_indicators(e: sp.Expr) -> sp.Expr:
    """sp.expand(e), each indicator's comparison kept as written (the key of its role: a piece
    such as margin - target*(input1 - input2) is not expanded inside it)."""
    held = {f: sp.Dummy() for f in e.atoms(Indicator)}
    groups: dict = {}  # the terms of one product of indicators: one coefficient, as written
    for term in sp.Add.make_args(sp.expand(e.xreplace(held))):
        coeff, inds = term.as_independent(*held.values(), as_Add=False)
        groups.setdefault(inds, []).append(coeff)
    back = {v: f for f, v in held.items()}
    return sp.Add(*[sp.Add(*cs) * inds.xreplace(back) for inds, cs in groups.items()])


# ----------------------------------------------------------------------------- selection

def _relations(w: sp.Expr, k: int, index: dict) -> dict:
    """{j: comparison class of x_k against x_j} read off the factors of w_k (one pass)."""
    out = {}
    for f in sp.Mul.make_args(w):
        if isinstance(f, Indicator):
            rel = f.rel if index.get(f.rel.lhs) == k else f.rel.reversed
            if index.get(rel.lhs) != k or rel.rhs not in index:
                raise AssertionError(f"w_{k} compares {f.rel}, not x{k} with another element")
            out[index[rel.rhs]] = type(rel)
    return out


def selection(node: Node, xs: tuple[sp.Symbol, ...], nan: str = "dominate",
              ties: str = "first") -> Selection:
    """Recognize the W-form of a window node and lower it to a scan or a mask, under a NaN rule."""
    n = len(xs)
    kind = node.kind
    rule = _policy.nan_rule(nan)
    if node.count is not None or rule.mask:
        return _mask_selection(node, kind, rule, split=node.count is not None or _policy.TIES[ties].splits)
    if n == 1:
        # a window of one element: it always wins, whatever the policy
        return Selection("scan", kind, sp.false, "first", None, None, False)
    index = {x: i for i, x in enumerate(xs)}
    before, after = set(), set()
    for k in range(n):
        rels = _relations(node.weights[k], k, index)
        if set(rels) != set(range(n)) - {k}:
            raise AssertionError(f"w_{k} does not compare x{k} with every other element")
        before |= {r for j, r in rels.items() if j < k}
        after |= {r for j, r in rels.items() if j > k}
    strict = {sp.StrictGreaterThan, sp.StrictLessThan}
    if len(before) == 1 and len(after) == 1 and (before <= strict) != (after <= strict):
        # Scan: element k beats every earlier element (with the 'before' comparison) iff it
        # beats the running winner of the earlier ones; later elements must beat it in turn.
        (rel,) = before
        take = rule.comparison(Indicator(rel(V, BEST, evaluate=False)), False)
        order = "first" if rel in strict else "last"
        return Selection("scan", kind, take, order, None, None, False, nan=rule)
    if (before | after) <= {sp.GreaterThan, sp.LessThan}:
        return _mask_selection(node, kind, rule, split=False)
    raise AssertionError(f"unrecognized W-form for {node.symbol}")


def _mask_selection(node: Node, kind: str, rule: _policy.NanRule, split: bool) -> Selection:
    """split/all: every element attaining the extremum is hit; weights by policy and NaN rule."""
    if rule.mask and rule.nan_loses:  # 'fill' (nanmax/nanmin)
        from .nanreduce import fill_selection
        return fill_selection(kind)
    hit = rule.hit(V, EXTREMUM)
    if not split:
        weight = Select(HIT, GRAD_OUTPUT, 0)
    elif rule.split_as_arithmetic:
        weight = Quotient(GRAD_OUTPUT, COUNT) * HIT  # arithmetic: 0 hits, count 0 -> NaN
    else:
        weight = Select(HIT, Quotient(GRAD_OUTPUT, COUNT), 0)
    if rule.whole_gradient_at_nan:
        weight = Select(IsNan(EXTREMUM), GRAD_OUTPUT, weight)
    return Selection("mask", kind, None, None, hit, weight, split)


# ----------------------------------------------------------------------------- forward zeros

def extremum_step(kind: str, a: sp.Expr, b: sp.Expr, zeros: str, nan_loses: bool = False,
                  first_nan: bool = False, last_nan: bool = False) -> sp.Expr:
    """One step max(a, b) (or min) of a forward, as a select: NaN propagates (a NaN operand is
    returned), and where a == b the rule ``zeros`` (conventions.ZERO_RULES) says which operand is
    returned, which decides the sign of a zero output.

    first    b where isnan(b) or b beats a strictly, else a
    second   a where isnan(a) or a beats b strictly, else b
    ordered  as second, and a where a == b and -0 is b (max) or a (min): -0 is below +0

    Two linear pieces of one variable are compared, and tested for NaN, through the variable, as
    the gradients are (``policy.code_relation``, ``policy.isnan_of``): leaky_relu's x > 0.01*x is
    x > 0, which is how the frameworks decide it, and right where 0.0*x is NaN (x = +-inf).

    ``nan_loses`` (the NaN rule 'lose': fmax/fmin): a NaN operand is not returned unless both
    are NaN (isnan tests the other operand: b where isnan(a) or b beats a, and so on).
    ``first_nan`` (a window's fold, best then v): under ``first`` a NaN b replaces a only where a
    is not NaN, so a row's first NaN, its sign and payload, is the output, as under ``second``.
    ``last_nan`` (a segment's fold where its winning NaN is its last, SegmentRule.nan_last): under
    ``second`` and ``ordered`` a NaN a is kept only where b is not NaN, so the last NaN is the
    output, as under ``first`` without ``first_nan``.
    """
    rel = sp.StrictGreaterThan if kind == "max" else sp.StrictLessThan

    def beats(p, q):
        # as the gradients compare (policy's code relation): two linear pieces of one variable
        # through the variable (0.0*x < x is x > 0, also at x = +-inf where 0.0*x is NaN)
        ind = compare(rel, p, q)
        return _policy.code_relation(ind) if isinstance(ind, Indicator) else rel(p, q, evaluate=False)

    if zeros == "first":
        takes = _policy.isnan_of(a if nan_loses else b)
        if first_nan and not nan_loses:
            takes = sp.And(takes, sp.Not(_policy.isnan_of(a)))
        return Select(sp.Or(takes, beats(b, a)), b, a)
    keeps = _policy.isnan_of(b if nan_loses else a)
    if last_nan and not nan_loses:
        keeps = sp.And(keeps, sp.Not(_policy.isnan_of(b)))
    cond = sp.Or(keeps, beats(a, b))
    if zeros == "ordered":
        negative = b if kind == "max" else a  # the operand that is -0 where a max must take a
        tie = sp.Eq(a, b, evaluate=False)
        # a number a (never -0: SymPy has one zero) is what a max of a tie returns: no sign test
        cond = sp.Or(cond, tie if kind == "max" and a.is_number else sp.And(tie, SignBit(negative)))
    elif zeros != "second":
        raise ValueError(f"unknown zero rule {zeros!r}")
    return Select(cond, a, b)


def forward_code(e: sp.Expr, zeros: str | None, nan_loses: bool = False, first_nan: bool = False,
                 last_nan: bool = False) -> sp.Expr:
    """A forward value with every max/min as folded ``extremum_step``s under the rule ``zeros``
    (None: left as MaxOf/MinOf, which the printers write as np.maximum/np.minimum; with
    ``nan_loses``, the NaN rule 'lose', None is 'first', as np.fmax/np.fmin return)."""
    if zeros is None and nan_loses:
        zeros = "first"
    if zeros is None or not e.args:
        return e
    args = [forward_code(a, zeros, nan_loses, first_nan, last_nan) for a in e.args]
    if isinstance(e, (MaxOf, MinOf)):
        out = args[0]
        for b in args[1:]:
            out = extremum_step(e.kind, out, b, zeros, nan_loses, first_nan, last_nan)
        return out
    return e.func(*args)


# ----------------------------------------------------------------------------- lowering

def lower(d: Derivation):
    """The backend-neutral kernel of a derivation, made by the lowering its op kind names
    (``Kind.lowering``, one of LOWERINGS)."""
    return LOWERINGS[d.op.spec.strategy.lowering](d)


def _lower_elementwise(d: Derivation) -> ElementwiseKernel:
    """A max/min of pieces of the inputs: its nodes' values, and each input's partial."""
    op = d.op
    if isinstance(d.output_map, Regions):
        return _lower_regions(d)
    loses = _policy.nan_rule(op.nan).nan_loses
    inter = tuple(Assign(str(n.symbol), forward_code(n.forward, op.zeros, loses)) for n in d.nodes[:-1])
    roles = factor_roles(d.nodes)
    grads = []
    for s in d.inputs:
        if _enters_negated(op.spec.forward(op.params, d.inputs).args, s):  # as autodiff: the gradient of -s negated
            g = -lower_partial(-d.partials[s], op.nan, roles, op.gradient)
        else:
            g = lower_partial(d.partials[s], op.nan, roles, op.gradient)
        if _policy.nan_rule(op.nan).whole_gradient_at_nan:  # a NaN among the pieces: all of g
            any_nan = sp.Or(*[_policy.isnan_of(p) for p in d.output.pieces])
            scale = d.output_map.grad_scale if d.output_map is not None else 1
            g = Select(any_nan, GRAD_OUTPUT * scale * sp.diff(sum(d.output.pieces), s), g)
        grads.append(Assign(f"grad_{s}", g))
    grads = tuple(grads)
    output = forward_code(d.output.forward, op.zeros, loses)
    if isinstance(d.output_map, Picked):  # W times the pieces' values (threshold): selects
        w = d.output
        picked = sp.Add(*[q * e for q, e in zip(d.output_map.values, w.weights)])
        form = "nested" if w.count is None else "sum"
        output = lower_partial(picked / (w.count or 1), op.nan, roles, form).xreplace({GRAD_OUTPUT: 1})
    elif d.output_map is not None:  # (u + shift) / divisor of the outermost node (scaled.Scaled)
        output = d.output_map.code(output, Quotient)
    return ElementwiseKernel(
        inputs=tuple(str(s) for s in d.inputs),
        intermediates=inter,
        output=output,
        grads=grads,
        saved=tuple(str(s) for s in d.inputs),
        broadcast=len(d.inputs) > 1,
        broadcast_sum=op.broadcast_sum if len(d.inputs) > 1 else "numpy",
    )


def _lower_regions(d: Derivation) -> ElementwiseKernel:
    """An output and gradient written per region (regions.Regions: hardswish, elu): every node's
    value (the outermost's too: the output may read it), the output as written (or the W-form's
    selects of the regions' values), and the gradient as common + the selects of the regions'
    entries."""
    op, r = d.op, d.output_map
    loses = _policy.nan_rule(op.nan).nan_loses
    root = d.nodes[-1].symbol
    output = r.output if not isinstance(r.output, sp.Tuple) else \
        _region_selects(d, r.output, "nested" if d.nodes[-1].count is None else "sum")
    grad = r.common + _region_selects(d, r.tree, op.gradient)
    reads_root = any(_regions.NODE in e.free_symbols for e in (output, grad))  # (else not computed)
    inter = tuple(Assign(str(n.symbol), forward_code(n.forward, op.zeros, loses))
                  for n in (d.nodes if reads_root else d.nodes[:-1]))
    return ElementwiseKernel(
        inputs=tuple(str(s) for s in d.inputs), intermediates=inter,
        output=output.xreplace({_regions.NODE: root}),
        grads=(Assign(f"grad_{d.inputs[0]}", grad.xreplace({_regions.NODE: root})),),
        saved=tuple(str(s) for s in d.inputs), broadcast=False, broadcast_sum="numpy")


def _region_selects(d: Derivation, tree, form: str) -> sp.Expr:
    """sum over the regions of W's weights times tree's entries, as lower_partial's selects (each
    entry a placeholder meanwhile, so that nothing expands it)."""
    held: dict = {}

    def hold(entry, _piece):
        return held.setdefault(entry, sp.Dummy()) if entry != 0 else sp.S.Zero

    weights = _regions.weighted(tree, d.nodes[-1].symbol, {n.symbol: n for n in d.nodes}, hold)
    selects = lower_partial(weights, d.op.nan, factor_roles(d.nodes), form).xreplace({GRAD_OUTPUT: 1})
    return selects.xreplace({v: e for e, v in held.items()})


def _enters_negated(pieces, s: sp.Symbol) -> bool:
    """The first piece (as written) holding input s has a derivative in s with a minus sign (l1_loss's target
    in input - target): a framework's autodiff negates that input's gradient last (sub's and
    neg's backward), which decides the sign of a zero gradient."""
    first = next((p for p in pieces if p.has(s)), None)
    return first is not None and sp.diff(first, s).could_extract_minus_sign()


def _lower_window(d: Derivation) -> WindowKernel:
    """A window's extremum: the selection (scan or mask) from the policy and NaN rule, on the
    kind's windows (their form, WINDOW_FORMS, and what the backends branch on, from the Kind)."""
    op = d.op
    sel = selection(d.output, d.inputs, op.nan, op.ties)
    fold = MaxOf if sel.extremum == "max" else MinOf
    loses = _policy.nan_rule(op.nan).nan_loses  # (nanmax/nanmin: NaN skipped, else the second)
    sel = replace(sel, combine=forward_code(fold(BEST, V), op.zeros or ("second" if loses else None), loses,
                                            first_nan=True))  # (of a row's NaNs the first: the NumPy module's)
    kind = op.spec.strategy
    static = kind.static
    index_dtype = smallest_index_dtype(op.window_size()) if (sel.form == "scan" and static) else None
    saved = ("index",) if sel.form == "scan" else ("x", "output")
    # a written gradient (grad_output itself on the winner) needs one winner per window and
    # windows that never overlap (Kind.disjoint: maxout); elsewhere the terms are added into +0
    written_fits = sel.form == "scan" and kind.disjoint
    grad_start = "+0" if op.grad_start == "written" and not written_fits else op.grad_start
    # windows that can share an element (by the parameters where they decide it): only there does
    # an element's gradient add several terms, which a preset may round one add at a time
    overlaps = kind.overlaps(op.params) if callable(kind.overlaps) else kind.overlaps
    bfloat16_adds = op.bfloat16_adds if sel.form == "scan" and overlaps else "float32"
    grad_order = op.grad_order if kind.grad_orders else "output"
    # the sum, then one division, where the weight is (g / count) * hit (the split as arithmetic)
    split_arithmetic = sel.form == "mask" and sel.weight == Quotient(GRAD_OUTPUT, COUNT) * HIT
    tangent_term = HIT * GRAD_OUTPUT if (op.tangent_sum == "torch" and kind.tangent_sums
                                         and split_arithmetic) else None
    if op.tangent_sum == "torch" and sel.form == "mask" and _policy.nan_rule(op.nan).nan_loses:
        from .nanreduce import fill_tangent_term  # 'fill' (nanmax/nanmin)
        tangent_term = fill_tangent_term()
    static_windows = static and not kind.runtime_windows
    count_dtype = smallest_index_dtype(op.window_size() + 1) if (sel.counts and static_windows) else None
    return WindowKernel(kind.windows, op.window_size(), sel, index_dtype, saved,
                        op.padding_mode == "neg_inf", kind.axes(op.params), grad_start, bfloat16_adds,
                        grad_order, tangent_term, static_windows, kind.disjoint, kind.runtime_windows,
                        overlaps, kind.plane_inputs, count_dtype, sampling=kind.sampling,
                        sample_of=kind.sample_of(op.spec.spatial) if kind.sample_of else (),
                        count_can_be_zero=_policy.nan_rule(op.nan).count_can_be_zero,
                        skips_nan=_policy.nan_rule(op.nan).nan_loses)


# ----------------------------------------------------------------------------- linearity

def piecewise_linear(kernel) -> bool:
    """Whether backward, between kinks and ties, is constant in the inputs (it is always linear
    in grad_output): every input or node value is read only by conditions (comparisons, NaN
    tests, counts of conditions), never as a number.  The generated jvp is then also the
    derivative of backward with respect to grad_output, and its derivative with respect to the
    inputs is 0 almost everywhere, which is all double backward needs."""
    if isinstance(kernel, (WindowKernel, UnpoolKernel)) or type(kernel).__name__ == "OrderKernel":
        return True
    if isinstance(kernel, LogSumExpKernel):
        return False
    values = set(kernel.inputs) | {a.name for a in kernel.intermediates}
    return not any(_read_as_number(a.expr, values) for a in kernel.adjoints + kernel.grads)


def _read_as_number(e: sp.Basic, names: set) -> bool:
    """Whether a symbol named in ``names`` occurs in e outside a condition."""
    if isinstance(e, sp.Symbol):
        return e.name in names
    if isinstance(e, Select):
        return any(_read_as_number(a, names) for a in e.args[1:])
    if isinstance(e, (Count, IsNan)) or _is_boolean(e):
        return False
    return any(_read_as_number(a, names) for a in e.args)


# ----------------------------------------------------------------------------- expressions

def _plain(ind: Indicator) -> sp.Basic:
    """A Piecewise condition as written: an IEEE comparison (false when NaN is involved)."""
    return type(ind.rel)(ind.rel.lhs, ind.rel.rhs, evaluate=False)


def select_tree(pw, leaf) -> sp.Expr:
    """PiecewiseOf(v1, [c1], ..., vn) as nested selects: c1 ? leaf(v1) : (c2 ? ... : leaf(vn))."""
    pairs, last = pw.branches()
    out = leaf(last)
    for v, c in reversed(pairs):
        out = Select(_plain(c), leaf(v), out)
    return out


def _weight_code(w: Node, coeffs: list) -> sp.Expr:
    """sum_i c_i w_i of a W-form node as code (selects under the NaN rule 'dominate')."""
    num = sp.Add(*[c * e for c, e in zip(coeffs, w.weights)])
    expr = num / w.count if w.count is not None else num
    return lower_partial(expr, "dominate", factor_roles([w])).xreplace({GRAD_OUTPUT: sp.S.One})


def node_code(n) -> sp.Expr:
    """The value of an expression node as code."""
    if n.kind in ("smooth", "copy", "max", "min"):
        return n.value
    if n.kind == "heaviside":
        return _weight_code(n.wnode, [0, 1])
    if n.kind == "sign":
        return _weight_code(n.wnode, [1, -1])
    if n.kind == "heaviside0":
        u, h0 = n.value.args
        # np.heaviside(u, h0): 1 above 0, h0 at 0, 0 below, NaN for NaN
        return Select(sp.StrictGreaterThan(u, 0, evaluate=False), sp.S.One,
                      Select(sp.Eq(u, 0, evaluate=False), h0,
                             Select(sp.StrictLessThan(u, 0, evaluate=False), sp.S.Zero, u)))
    return select_tree(n.value, lambda v: v)


def _term(n, partial: sp.Expr, bar: sp.Expr) -> sp.Expr:
    """bar * partial as code, for one consumer node (None: the output)."""
    if n is None or n.kind in ("smooth", "copy"):
        return bar * partial
    if n.kind in ("max", "min"):
        return lower_partial(partial, "dominate", factor_roles([n.wnode])).xreplace({GRAD_OUTPUT: bar})
    if n.kind == "piecewise":
        return select_tree(partial, lambda v: bar * v)
    raise AssertionError(f"{n.kind} has no partials")


def lower_expression(d) -> ElementwiseKernel:
    """An expression's kernel: node values (forward), then the chain rule in reverse (backward):
    g_<node> = sum over its consumers c of g_c * dc/d<node>, grad_<input> likewise."""
    inputs = d.inputs
    inter = tuple(Assign(str(n.symbol), node_code(n)) for n in d.nodes)
    contrib: dict = {}
    for a, p in d.root_partials.items():
        if p != 0:
            contrib.setdefault(a, []).append(_term(None, p, GRAD_OUTPUT))
    adjoints = []
    for n in reversed(d.nodes):
        bar = sp.Add(*contrib.pop(n.symbol, []))
        if bar == 0:
            continue
        if not bar.is_Symbol:
            adjoints.append(Assign(f"g_{n.symbol}", bar))
            bar = sp.Symbol(f"g_{n.symbol}", real=True)
        for a, p in n.partials.items():
            if p != 0:
                contrib.setdefault(a, []).append(_term(n, p, bar))
    grads = tuple(Assign(f"grad_{s}", sp.Add(*contrib.get(s, []))) for s in inputs)
    return ElementwiseKernel(
        inputs=tuple(str(s) for s in inputs), intermediates=inter, output=d.root, grads=grads,
        saved=tuple(str(s) for s in inputs), broadcast=len(inputs) > 1, adjoints=tuple(adjoints),
        wrt=tuple(d.op.params["wrt"]))


def _reached(names: set, assigns) -> set:
    """names and every name that their assignments among ``assigns`` read, transitively."""
    by_name = {a.name: a for a in assigns}
    frontier, seen = list(names), set()
    while frontier:
        name = frontier.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in by_name:
            frontier += [s.name for s in by_name[name].expr.free_symbols]
    return seen


def backward_plan(kernel: ElementwiseKernel, names, share: bool = True) -> tuple[tuple, tuple, tuple]:
    """(intermediates, adjoints, grads) that the gradients of ``names`` need, in order.

    With ``share``, what these statements repeat is computed once (``share_common``): each
    shared temporary comes just before its first use, in the intermediates (when a recomputed
    node uses it), the adjoints, or among the gradients (so ``grads`` may hold temporaries: the
    Assigns whose names are not grad_<input>)."""
    grads = tuple(a for a in kernel.grads if a.name[len("grad_"):] in names)
    needed = set().union(*[a.expr.free_symbols for a in grads]) if grads else set()
    seen = _reached({s.name for s in needed}, kernel.adjoints)
    adjoints = tuple(a for a in kernel.adjoints if a.name in seen)
    used = _reached(seen, kernel.intermediates)
    inter = tuple(a for a in kernel.intermediates if a.name in used)
    if not share:
        return inter, adjoints, grads
    taken = set(kernel.inputs) | {a.name for a in kernel.intermediates + kernel.adjoints + kernel.grads}
    inter, rest = share_common([inter, adjoints + grads], taken)
    first = next(k for k, a in enumerate(rest) if a.name in {g.name for g in grads}) if grads else len(rest)
    return tuple(inter), tuple(rest[:first]), tuple(rest[first:])


# ----------------------------------------------------------------------------- sharing

# A shared temporary's name says what it holds: a comparison, a NaN test, a condition built of
# them (And/Or/Not), a count of conditions, or another value.
def _prefix(e: sp.Basic) -> str:
    if isinstance(e, sp.core.relational.Relational):
        return "cmp"
    if isinstance(e, IsNan):
        return "isnan"
    if isinstance(e, Count):
        return "count"
    if _is_boolean(e):
        return "cond"
    return "t"


class Shared(sp.Symbol):
    """A shared temporary (or a statement read by a later one): a symbol that sorts as the value
    it stands for.  The printers order the operands of + and * by SymPy's sort key, so a sum or
    product that reads the temporary is written in the order it had with the value in place."""

    def __new__(cls, name: str, value: sp.Basic, boolean: bool = False):
        known = value.is_commutative
        obj = sp.Symbol.__xnew__(cls, name, **({"real": True} if known and not boolean else {}))
        if not known:
            # SymPy cannot say that a condition (or a select on one) commutes, and keeps such
            # terms apart from the others when it orders a sum; so it does with the name
            obj._assumptions = obj._assumptions.copy()
            obj._assumptions["commutative"] = None
        obj._value = value
        return obj

    def __getnewargs__(self):
        return (self.name, self._value, _is_boolean(self._value))

    def _hashable_content(self):
        return super()._hashable_content() + (self._value,)

    def sort_key(self, order=None):
        return self._value.sort_key(order)


def _is_boolean(e: sp.Basic) -> bool:
    return isinstance(e, sp.logic.boolalg.Boolean) and not isinstance(e, sp.Expr)


def _shareable(e: sp.Basic) -> bool:
    """Worth a name, and naming it keeps every operation: not an atom, a constant or -atom, and
    not a negative power, which the printers write as a division of the product it sits in (a/b, not
    a*(1/b))."""
    if not e.args or isinstance(e, (sp.logic.boolalg.BooleanAtom, sp.Number, sp.NumberSymbol)):
        return False
    if isinstance(e, sp.Expr) and e.is_number:
        return False
    if e.is_Pow and e.exp.is_number and e.exp.is_negative:
        return False
    if e.is_Mul and len(e.args) == 2 and e.args[0] == -1 and not e.args[1].args:
        return False  # -x reads as well as a name for it
    return True


def _rebuild(e: sp.Basic, args: list) -> sp.Basic:
    if all(a is b for a, b in zip(args, e.args)):
        return e
    if isinstance(e, sp.core.relational.Relational):
        return e.func(*args, evaluate=False)
    return e.func(*args)


def _operands(e: sp.Basic, back: dict) -> tuple:
    """e's operands in the order the printers evaluate them (temporaries read back as their
    values through ``back``), where that order can change a rounding: + and * of two operands
    commute exactly (IEEE) and And/Or are exact in any order, so those come sorted; sums and
    products of three or more keep their order (SymPy's print order: as_ordered_terms/factors)."""
    from sympy.core.mul import _keep_coeff
    if e.is_Add:
        ops = e.as_ordered_terms()
        return ("+", _keyed([_inline(o, back) for o in ops], len(ops) > 2))
    if e.is_Mul:
        c, rest = e.as_coeff_Mul()
        if c.is_negative:  # printed with a leading minus: -(a*b*c) rounds as (-a)*b*c
            e = _keep_coeff(-c, rest)
        ops = [_inline(o, back) for o in (e.as_ordered_factors() if e.is_Mul else [e])]
        num = [f for f in ops if not (f.is_Pow and f.exp.is_Rational and f.exp.is_negative)]
        den = [f for f in ops if f not in num]
        return ("*", _keyed(num, len(num) > 2), _keyed(den, len(den) > 2))
    return (e.func, _keyed([_inline(o, back) for o in e.args], not isinstance(e, (sp.And, sp.Or))))


def _keyed(ops: list, ordered: bool) -> tuple:
    return tuple(ops) if ordered else tuple(sorted(ops, key=sp.default_sort_key))


def _inline(e: sp.Basic, defs: dict) -> sp.Basic:
    if e in defs:
        return _inline(defs[e], defs)
    if not e.args:
        return e
    return _rebuild(e, [_inline(a, defs) for a in e.args])


def share_common(groups: list, taken: set) -> list:
    """Common subexpressions of a backward, computed once.

    ``groups`` are lists of Assign, in order: the recomputed node values, then the adjoints and
    gradients.  A subexpression that the statements evaluate more than once, at least once
    outside the node values (the forward's nodes are the derivation's own sharing), gets a
    temporary (cmp0, cond0, count0, t0, ...: names not in ``taken``), assigned just before the
    first statement that uses it; every occurrence then reads the temporary.  Same operations in
    the same order: a named subexpression is evaluated as written, and where naming it would
    reorder a sum or product of three or more operands (the printers order them by SymPy's sort
    key), that operand is not named.  Returns the groups with the temporaries inserted.
    """
    stmts = [(g, a) for g, group in enumerate(groups) for a in group]
    banned: set = set()
    for _ in range(64):
        shared = _repeated([a.expr for g, a in stmts], [g > 0 for g, a in stmts]) - banned
        if not shared:
            return [list(g) for g in groups]
        try:
            out, defs, bad = _name(stmts, shared, taken, len(groups))
        except AssertionError:  # SymPy rewrote a statement around a temporary: share nothing
            break
        if not bad:
            return out
        banned |= bad
    return [list(g) for g in groups]


def _repeated(exprs: list, counts: list) -> set:
    """Subexpressions met twice (tree_cse: below a repeat nothing is counted again), at least
    once in an expression whose flag in ``counts`` is set."""
    seen, again, outside = set(), set(), set()

    def visit(e, flag):
        if not _shareable(e):
            for a in e.args:
                visit(a, flag)
            return
        if flag:
            outside.add(e)
        if e in seen:
            again.add(e)
            return
        seen.add(e)
        for a in e.args:
            visit(a, flag)

    for e, flag in zip(exprs, counts):
        visit(e, flag)
    return again & outside


def _name(stmts, shared, taken, n_groups):
    names: dict = {}
    defs: dict = {}
    numbers: dict = {}
    out = [[] for _ in range(n_groups)]

    def fresh(prefix):
        while True:
            k = numbers.get(prefix, 0)
            numbers[prefix] = k + 1
            if f"{prefix}{k}" not in taken:
                return f"{prefix}{k}"

    def build(e, group, whole=None):
        if not e.args:
            return e
        if e in names:
            return names[e]
        new = _rebuild(e, [build(a, group) for a in e.args])
        if e in shared and whole is not None:  # a whole statement: later ones read its name
            names[e] = Shared(whole.name, e, whole.boolean)
            defs[names[e]] = new
            return new
        if e in shared:
            boolean = _is_boolean(e)
            sym = Shared(fresh(_prefix(e)), e, boolean)
            names[e] = sym
            defs[sym] = new
            out[group].append(Assign(sym.name, new, boolean))
            return sym
        return new

    for g, a in stmts:
        out[g].append(Assign(a.name, build(a.expr, g, a), a.boolean))
    # check: inlined back, every statement is what it was, evaluated in the same order
    bad: set = set()
    by_name = {a.name: a for group in out for a in group}
    for g, a in stmts:
        new = by_name[a.name].expr
        if _inline(new, defs) != a.expr:
            raise AssertionError(f"sharing changed {a.name}: {a.expr} -> {new}")
        _check_order(new, defs, names, bad, set())
    return out, defs, bad


def _check_order(new, defs, names, bad, done):
    """Put in ``bad`` the named subexpressions inside a sum or product of three or more operands
    whose print order naming them changed (SymPy sorts operands by their sort key)."""
    if new in defs:
        if new in done:
            return
        done.add(new)
        new = defs[new]
    if not new.args:
        return
    if new.is_Add or new.is_Mul:
        old = _inline(new, defs)
        if _operands(old, {}) != _operands(new, defs):
            # a named operand (or factor of one) changes the shape SymPy sorts by: unname it;
            # failing that, everything named inside
            shallow = {f for t in sp.Add.make_args(old) for f in sp.Mul.make_args(t)}
            shallow |= {f.base for f in shallow if f.is_Pow} | set(sp.Add.make_args(old))
            shallow = {e for e in shallow if e in names and e != old}
            bad.update(shallow or {e for e in sp.preorder_traversal(old) if e in names and e != old})
    for b in new.args:
        _check_order(b, defs, names, bad, done)


# ----------------------------------------------------------------------------- unpool, logsumexp

class IsFinite(sp.Function):
    """IsFinite(a): a is neither infinite nor NaN."""

    nargs = 1


M_SHIFT, SUM, Y, T = sp.symbols("shift total y t", real=True)
MAX_VALUE = sp.Symbol("m", real=True)


@dataclass(frozen=True)
class UnpoolKernel:
    """Scatter forward, gather backward, per (N, C) plane over the flat spatial output.

    keep: which writer of a slot written several times stays ("first" or "last", row-major
    order of the input); each_writer: backward gives every writer of a slot its gradient
    (policy 'all'), else only the writer that stayed (forward saves which ones did).
    """

    spatial: int
    keep: str
    each_writer: bool
    saved: tuple[str, ...]


@dataclass(frozen=True)
class LogSumExpKernel:
    """y = shift + t log(sum exp((v - shift) / t)) along each slice, shift = the slice's max
    where it is finite (else 0); backward grad_output * exp((v - y) / t)."""

    temperature: sp.Expr
    shift: sp.Expr  # in m (the slice's max)
    term: sp.Expr  # in v (an element) and shift
    output: sp.Expr  # in shift and total (the sum of the terms)
    weight: sp.Expr  # in grad_output, v and y
    saved: tuple[str, ...]
    # float16/bfloat16 (conventions.LSE_HALF): "float32" (computed in float32, rounded once) or
    # "torch" (torch.logsumexp's ops one by one, each rounded to the dtype)
    half: str = "float32"


def lower_special(d: Derivation):
    """Unpooling's or logsumexp's kernel: its own rule, not a max/min of pieces."""
    return lower(d)


def _lower_scatter(d: Derivation) -> UnpoolKernel:
    """Unpooling: which writer of a slot keeps it, and whether every writer gets its gradient."""
    op = d.op
    policy = _policy.TIES[op.ties]
    each = policy.winners == "each"
    saved = ("indices",) if each else ("indices", "wins")
    return UnpoolKernel(op.spec.spatial, policy.keeps, each, saved)


def _lower_logsumexp(d: Derivation) -> LogSumExpKernel:
    """logsumexp: the max shifted out (0 where not finite), and softmax as the weight."""
    op = d.op
    t = sp.S.One if op.params["temperature"] == 1 else _num(op.params["temperature"])
    scaled = (lambda e: e) if t == 1 else (lambda e: Quotient(e, t))  # noqa: E731 (t = 1: no division)
    shift = Select(IsFinite(MAX_VALUE), MAX_VALUE, sp.S.Zero)
    term = sp.exp(scaled(V - M_SHIFT))
    output = M_SHIFT + t * sp.log(SUM)
    weight = GRAD_OUTPUT * sp.exp(scaled(V - Y))
    half = _LSE_HALF.get(op.convention or "", "float32") if t == 1 else "float32"
    return LogSumExpKernel(t, shift, term, output, weight, ("x", "output"), half)


# ----------------------------------------------------------------------------- order statistics

TOTAL, TIED = sp.symbols("total tied", real=True)


@dataclass(frozen=True)
class OrderKernel:
    """An order statistic (kinds/order.py): each output the element of one rank of its row.

    select: "rank" (sort, topk: the row ranked, outputs the first `k` ranks; None: every rank) or
    "prefix" (cummax/cummin: output i the first rank of x[0..i]).  descending: the largest ranks
    first.  Ranks compare a total-order key of each element: NaN above +inf, NaNs equal, and +0
    equal to -0 unless ``zeros_ordered`` (-0 below +0, XLA's total order).  ``ties``: "first"
    (equal elements rank by index), "last" (by index reversed) or "block" (split/all: the values
    and indices of a stable sort; every element of a tie block gathers ``weight``, in TOTAL, the
    block's outputs' gradients added, and TIED, the block's size).  ``tree``: the gradient of
    jax.lax.associative_scan's tree of binary max/min (order_form "tree") instead.
    ``nan_sends_nothing``: an output that is NaN sends no gradient (NaN rule 'zero').
    ``grad_form``: how first/last's gradient reaches its element: "written" (grad_output itself,
    a -0 stays -0), "added" (into +0) or "negated" (-(0 - grad_output), the rest -0: the gradient
    of -top_k(-x)).  ``saved``: what forward keeps for backward and jvp."""

    select: str
    k: int | None
    descending: bool
    zeros_ordered: bool
    ties: str
    weight: sp.Expr | None
    tree: bool
    nan_sends_nothing: bool
    grad_form: str
    saved: tuple[str, ...]
    # select "one" (kthvalue, median, nanmedian: kinds/median.py): how the row's rank is found
    # ("k", "middle", "middle_of_numbers"), whether two middle ranks are averaged (JAX's
    # midpoint), and the NaN rule (an output that is NaN sends nothing: nan_sends_nothing)
    rank: str = ""
    midpoint: bool = False
    nan: str = ""


def _lower_one(op) -> OrderKernel:
    """kthvalue, median, nanmedian: one rank of each row (ascending; kinds/median.py)."""
    from .kinds.median import midpoint
    policy = _policy.TIES[op.ties]
    rank = {"kthvalue": "k", "median": "middle", "nanmedian": "middle_of_numbers"}[op.name]
    sends_nothing = op.nan in ("propagate", "omit_zero")
    saved = ("indices",) if policy.single and not sends_nothing else ("indices", "x")
    weight = None if policy.single else (Quotient(TOTAL, TIED) if policy.splits else TOTAL)
    return OrderKernel("one", None, False, False, op.ties if policy.single else "block", weight, False,
                       sends_nothing, "written" if op.grad_start == "written" else "added", saved,
                       rank, midpoint(op), op.nan)


def _lower_order(d: Derivation) -> OrderKernel:
    """An order statistic: the rank key, the tie rule and what backward gathers."""
    from .kinds.median import selects_one
    from .kinds.order import cumulative, descending
    op = d.op
    if selects_one(op.name):
        return _lower_one(op)
    policy = _policy.TIES[op.ties]
    prefix = cumulative(op.name)
    tree = prefix and op.order_form == "tree"
    ties = op.ties if policy.single else "block"
    if op.order_form == "reversed" and descending(op) and policy.single:  # the ascending order reversed
        ties = "last" if ties == "first" else "first"
    grad_form = "written" if op.grad_start == "written" else "added"
    if op.order_form == "negated" and not descending(op):
        grad_form = "negated"
    weight = None if policy.single else (Quotient(TOTAL, TIED) if policy.splits else TOTAL)
    if tree:
        saved = ("x",)
    elif policy.single:
        saved = ("indices",)
    elif prefix:  # each output's block of equal extrema, how many tie (and the NaN outputs: 'zero')
        saved = ("block_start", "tied") + (("values",) if op.nan == "zero" else ())
    else:  # the whole ranking, and each rank's tie block
        saved = ("order", "block_start", "block_size")
    return OrderKernel("prefix" if prefix else "rank", op.params.get("k"), descending(op),
                       op.zeros == "ordered", ties, weight, tree, op.nan == "zero",
                       grad_form, saved)


# the lowering of each op kind (Kind.lowering)
LOWERINGS = {"elementwise": _lower_elementwise, "window": _lower_window,
             "expression": lower_expression, "scatter": _lower_scatter, "logsumexp": _lower_logsumexp,
             "order": _lower_order}
# the kernel each lowering makes
KERNEL_TYPES = {"elementwise": ElementwiseKernel, "window": WindowKernel, "expression": ElementwiseKernel,
                "scatter": UnpoolKernel, "logsumexp": LogSumExpKernel, "order": OrderKernel}


def kernel_form(kernel) -> str:
    """The form of a lowered kernel, by which a backend chooses its templates: a window kernel's
    windows (WINDOW_FORMS), else the kernel's type ("ElementwiseKernel", "UnpoolKernel", ...)."""
    return kernel.windows if isinstance(kernel, WindowKernel) else type(kernel).__name__


def form_of(kind) -> str:
    """kernel_form of the kernels an op kind (a kinds.Kind) lowers to, before any is made."""
    return kind.windows or KERNEL_TYPES[kind.lowering].__name__


@dataclass(frozen=True)
class Artifacts:
    """What every backend gets for one op: the derivation (for the docstring), the lowered kernel
    (for the code: every decision made) and what the kernel is (piecewise linear: the jvp is also
    double backward).  The lowering makes it (``artifacts``); the backends only read it."""

    op: "Op"
    derivation: Derivation
    kernel: object  # ElementwiseKernel | WindowKernel | UnpoolKernel | LogSumExpKernel
    piecewise_linear: bool


def artifacts(d: Derivation) -> Artifacts:
    """Lower a derivation into what the backends render."""
    kernel = lower(d)
    return Artifacts(d.op, d, kernel, piecewise_linear(kernel))


# ----------------------------------------------------------------------------- segments (issue 33)

WINDOW_FORMS["segments"] = ("the elements whose index is j, one segment per output j, after an "
                            "initial element where it takes part (scatter_max, segment_max)")


@dataclass(frozen=True)
class SegmentRule:
    """What a segment kernel adds to the window kernel: where each segment starts, how a split
    counts its ties, what its output is among equal hits.

    initial: "input" (scatter: input[j] is segment j's initial element) or "fill" (segment_max: the
    op's identity, ``fill``, is the output of an empty segment and gets no gradient).
    include_initial: the initial element takes part in every segment, first (include_self); else
    only in an empty one (scatter: output input[j], gradient g[j]).
    count_initial: a split's count adds [initial == output] where the initial does not take part
    (kinds.segment.FRAMEWORK_RULES: PyTorch's include_self=False tie bug, JAX's -inf fill).
    hit: [v attains the segment's extremum] in V and EXTREMUM (the scan's winner is the first or
    last hit; the mask's hits share the gradient).
    zeros: which of the hits the output is (its sign of zero): "first", "second" (the last) or
    "ordered" (+0 above -0).
    beats_start: the scan starts at the dtype's lowest finite value (max), which an element must
    beat strictly; a segment none beats is 0 (torch_scatter's CPU max: the pyg preset, NaN rule
    'keep' from that start).
    nan_last: a segment holding NaN outputs its last NaN (in segment order), bits and all, else its
    first: the winning NaN, the one the gradient goes to (a scan under 'last': its last hit), or
    the framework's (the torch preset: scatter_reduce lets each NaN src take over, in index order
    on the CPU).  The fold (the selection's combine) keeps that NaN.
    nan_picked: where the extremum is NaN, the element the output is (``zeros``: its first or last
    hit) is that NaN already: the hit holds every NaN and the pick runs from nan_last's end.
    """

    initial: str
    include_initial: bool
    count_initial: bool
    fill: str
    hit: sp.Basic
    zeros: str
    beats_start: bool = False
    nan_last: bool = False
    nan_picked: bool = False


def _lower_segment(d: Derivation, keeps_first: bool = False) -> WindowKernel:
    """A segment's extremum: the window kernel of its selection, with the segment's rule; under a
    framework preset the split's weight as the framework forms it (g * (1 / count): JAX).
    keeps_first: NaN rule 'keep' is a scan from the window's first element (a bag's), which the
    segments build only from torch_scatter's start (the pyg preset)."""
    from .kinds.segment import FRAMEWORK_RULES
    op = d.op
    kernel = _lower_window(d)
    sel = kernel.selection
    framework = FRAMEWORK_RULES.get(op.convention or "", {})
    if framework.get("reciprocal") and sel.form == "mask" and sel.counts:
        sel = replace(sel, weight=GRAD_OUTPUT * Select(HIT, Quotient(sp.S.One, COUNT), sp.S.Zero))
    scatter = "include_self" in op.params
    beats_start = bool(framework.get("beats_start"))
    if op.nan == "keep" and not beats_start and not keeps_first:
        raise ValueError(f"{op.name}: NaN rule 'keep' is built from the start of torch_scatter's scan "
                         f"only: pass convention='pyg' (or another NaN rule)")
    if beats_start and (op.ties != "first" or op.nan != "keep"):
        raise ValueError(f"{op.name}: convention='pyg' is torch_scatter's rule: ties 'first' and nan "
                         f"'keep', not ties={op.ties!r}, nan={op.nan!r}")
    nan_last = sel.order == "last" or bool(framework.get("nan_last"))
    if nan_last:  # (the window's fold keeps the first NaN)
        loses = _policy.nan_rule(op.nan).nan_loses
        fold = MaxOf if sel.extremum == "max" else MinOf
        sel = replace(sel, combine=forward_code(fold(BEST, V), op.zeros or ("second" if loses else "first"),
                                                loses, last_nan=True))
    hit = sel.hit if sel.form == "mask" else _policy.nan_rule("dominate").hit(V, EXTREMUM)
    zeros = op.zeros or ("first" if sel.order != "last" else "second")
    rule = SegmentRule(
        initial="input" if scatter else "fill",
        include_initial=bool(op.params.get("include_self", False)),
        count_initial=bool(framework.get("count_initial")) and sel.counts,
        fill="-inf" if sel.extremum == "max" else "inf",
        hit=hit, zeros=zeros, beats_start=beats_start, nan_last=nan_last,
        nan_picked=hit.has(_policy.isnan_of(V)) and zeros == ("second" if nan_last else "first"))
    return replace(kernel, selection=sel, segment=rule, saved=("x", "output") if sel.form == "mask"
                   else ("index",))


LOWERINGS["segment"] = _lower_segment


def beats_start(op) -> bool:
    """Whether a segment op's preset starts each scan at the dtype's lowest value (the pyg preset,
    SegmentRule.beats_start), which only the NumPy and cpu backends build (--backend all leaves
    the others out)."""
    from .kinds.segment import FRAMEWORK_RULES
    return bool(FRAMEWORK_RULES.get(op.convention or "", {}).get("beats_start"))  # (segment ops only)
KERNEL_TYPES["segment"] = WindowKernel


def skips_nan(op) -> bool:
    """A window op whose forward skips NaN (nanmax/nanmin: WindowKernel.skips_nan), which the
    torch, jax and cuda backends do not build yet (``refuses``)."""
    return not op.spec.strategy.elementwise and _policy.nan_rule(op.nan).nan_loses


# ----------------------------------------------------------------------------- bags (issue 33)

WINDOW_FORMS["bags"] = ("the table rows an index list's bag gathers, one bag per output row, no "
                        "initial element (embedding_bag_max)")


@dataclass(frozen=True)
class BagRule:
    """What a bag kernel adds to a segment's (kinds/bag.py, kinds/roi.py): the layout of its
    table, rows and bags from the op's inputs (the NumPy module's partial _<layout>_layout), what
    its forward computes, where a framework's running max starts (a float literal; None: at the
    bag's first element)."""

    layout: str
    forward_doc: str
    floor: str | None


@dataclass(frozen=True)
class BagKernel(WindowKernel):
    """A window kernel of the form "bags": a segment's, with its bag rule."""

    bag: BagRule | None = None


def _lower_bag(d: Derivation) -> BagKernel:
    """A bag's extremum (kinds/bag.py): a segment's kernel with no initial element (an empty bag
    is 0); a split counts a framework's fill only as kinds.bag.FRAMEWORK_COUNTS says."""
    from dataclasses import fields as dataclass_fields

    from .kinds.bag import FLOORS, FRAMEWORK_COUNTS, LAYOUTS
    op = d.op
    kernel = _lower_segment(d, keeps_first=True)
    counts = kernel.segment.count_initial and FRAMEWORK_COUNTS.get(op.convention or "", False)
    layout = LAYOUTS[op.name]
    rule = BagRule(layout["partial"], layout["forward_doc"], FLOORS.get(op.name, {}).get(op.convention or ""))
    fields = {f.name: getattr(kernel, f.name) for f in dataclass_fields(kernel)}
    return BagKernel(**(fields | {"segment": replace(kernel.segment, fill="0", count_initial=counts)}), bag=rule)


LOWERINGS["bag"] = _lower_bag
KERNEL_TYPES["bag"] = BagKernel


def bag_layout(op) -> str | None:
    """A bag op's layout before it is lowered (BagRule.layout; None: no bag op): a framework
    backend that builds some layouts only refuses the others (its ``refuses``)."""
    from .kinds.bag import LAYOUTS
    return LAYOUTS.get(op.name, {}).get("partial")
