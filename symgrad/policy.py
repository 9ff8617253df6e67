"""Tie policies: the one place that decides who wins a tie, and what NaN does.

In the W-matrix view, max over pieces p_0..p_{n-1} is sum_i w_i * p_i, where each weight w_i is
a product of comparison indicators. A policy decides which comparisons are strict:

    first  w_i = prod_{j<i} [p_i > p_j] * prod_{j>i} [p_i >= p_j]   (one winner: the lowest index)
    last   w_i = prod_{j<i} [p_i >= p_j] * prod_{j>i} [p_i > p_j]   (one winner: the highest index)
    split  w_i = E_i / sum_k E_k,  E_i = prod_{j!=i} [p_i >= p_j]   (tied winners share equally)
    all    w_i = E_i                                                 (each tied winner gets it all)

min is the same with every comparison reversed.  'all' is not a subgradient: at a k-way tie the
weights sum to k.

NaN rules.  What a comparison with NaN means is a second choice, made here too (``NAN_RULES``).
symgrad's default is ``dominate``: a NaN beats every number in both max and min, and NaNs tie with
each other, so a window holding a NaN has output NaN and its gradient goes to its NaN elements
under the policy (first NaN, last NaN, split among the NaNs, or each NaN).  The other rules exist
to reproduce frameworks exactly (see conventions.py): they read the same W-form with IEEE
comparisons (false whenever a NaN is involved) in the way each framework's kernel does.  The
forward output is NaN for a window holding NaN under every rule of ``NAN_RULES``.

``OP_NAN_RULES`` holds the rules only some ops admit (the ops that name them in
``OpSpec.nan_rules``): ``lose``, the NaN-ignoring extremum of fmax/fmin, whose forward returns the
number where one operand is NaN (NaN only where both are).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sympy as sp

from .indicators import IeeeNot, Indicator, IsNan, Literal, compare, crossing_form

@dataclass(frozen=True)
class Policy:
    """A tie policy: who gets the gradient where pieces tie, as the W-row it writes.

    ``winners`` says how a tie is resolved: ``one`` (a single winner by position: ``first`` or
    ``last``, as ``strict_before`` says whether a later piece must beat earlier ones strictly),
    ``shared`` (tied winners share equally: E_i / sum_k E_k) or ``each`` (every tied winner gets
    the whole gradient).  ``weights`` builds the W-row; everything else is lowered from it.
    """

    name: str
    rule: str  # one line: who gets the gradient at a tie
    subgradient: bool  # False: the weights of a tie sum to more than 1
    winners: str  # "one" | "shared" | "each"
    strict_before: bool | None  # one winner: must a later piece beat earlier ones strictly?
    summary: str  # the W-row in a few words, for derivation steps

    @property
    def single(self) -> bool:
        """One winner per tie, by position (a running scan can find it)."""
        return self.winners == "one"

    @property
    def splits(self) -> bool:
        """Tied winners share the gradient (the weights have a count in the denominator)."""
        return self.winners == "shared"

    @property
    def keeps(self) -> str:
        """Of several writers of one slot (unpooling), the one whose value stays: the first under
        ``first``, else the last (the order PyTorch's forward writes in)."""
        return "first" if self.name == "first" else "last"

    def formula(self, kind: str) -> str:
        """w_k in one line, for a max (or a min: every comparison reversed)."""
        ge, gt = (">=", ">") if kind == "max" else ("<=", "<")
        if self.single:
            b, a = (gt, ge) if self.strict_before else (ge, gt)
            return f"w_k = prod_(j<k) [x_k {b} x_j] * prod_(j>k) [x_k {a} x_j]"
        e = f"E_k = prod_(j!=k) [x_k {ge} x_j]"
        return f"w_k = E_k / sum_j E_j, {e}" if self.splits else f"w_k = {e}"

    def weights(self, pieces: tuple[sp.Expr, ...], kind: str) -> list[sp.Expr]:
        """The W-matrix row of an extremum: w_i for each piece, as indicator products."""
        return weights(pieces, self.name, kind)

    def writer_excluded_by(self, i: int, n: int) -> range:
        """Unpooling: the writers k whose write to the same slot takes it from writer i (first:
        an earlier writer keeps the slot; last: a later one overwrites it; each: none)."""
        if self.winners == "each":
            return range(0)
        return range(i) if self.keeps == "first" else range(i + 1, n)


TIES = {
    "first": Policy("first", "a tie goes wholly to the tied element that comes first", True, "one", True,
                    "strict comparison against earlier pieces, non-strict against later ones"),
    "last": Policy("last", "a tie goes wholly to the tied element that comes last", True, "one", False,
                   "non-strict against earlier pieces, strict against later ones"),
    "split": Policy("split", "a k-way tie gives each tied element 1/k", True, "shared", None,
                    "w_i = E_i / C, E_i = [p_i attains the extremum], C = number of pieces attaining it"),
    "all": Policy("all", "a k-way tie gives each tied element the whole gradient "
                  "(NOT a subgradient: the weights of a k-way tie sum to k)", False, "each", None,
                  "w_i = E_i = [p_i attains the extremum] (not a subgradient)"),
}
POLICIES = tuple(TIES)
DEFAULT_POLICY = "first"


def tie(name: str) -> Policy:
    return TIES[name]


@dataclass(frozen=True)
class NanRule:
    """What a comparison with NaN means, and so where the gradient of a window holding NaN goes.

    ``ieee``: comparisons are IEEE (false whenever a NaN is involved) and the rule is read off the
    W-form in the way one framework's kernel does; else NaN dominates (symgrad's default).
    ``mask``: the rule reads ties as a mask of hits (split/all), never as a running scan.
    For a running scan (first/last), ``nan_takes_over`` says whether a NaN takes over from the
    running winner ("number": from a number only, as a strict win; "always"; "never") and
    ``nan_is_taken_over`` whether a later element takes over from a NaN winner.  Where the
    running winner ends on a whole window follows in closed form (the NumPy backend's
    ``numpy_scan_winner``).
    """

    name: str
    rule: str  # one line: where the gradient of a window holding NaN goes
    policies: tuple[str, ...]  # the tie policies it can be combined with
    ieee: bool = True
    mask: bool = False
    nan_takes_over: str | None = None  # scan: "number" | "always" | "never"
    nan_is_taken_over: bool | None = None  # scan
    # mask, split: the weight is computed as arithmetic, hit * g / count (0 hits: 0/0 = NaN),
    # not as a select
    split_as_arithmetic: bool = False
    whole_gradient_at_nan: bool = False  # NaN among the window's elements: each gets all of g
    # a NaN loses to every number (fmax/fmin): the forward ignores NaN, and in the scan reading a
    # NaN never takes over while a number always takes over from a NaN
    nan_loses: bool = False

    @property
    def winner_is_output(self) -> bool:
        """Scan: the winner's value is the window's output (a NaN, when the window holds one).
        Under keep/replace a number can win a window holding NaN, whose output is NaN: the output
        is then a separate NaN-propagating fold."""
        return self.nan_takes_over != "never" and not self.nan_is_taken_over

    @property
    def count_can_be_zero(self) -> bool:
        """A split count of tied winners can be 0 (no element equals a NaN extremum): the division
        then goes inside each select (which yields 0), not around the sum."""
        return self.ieee

    def comparison(self, ind: Indicator, survive: bool) -> sp.Basic:
        """The Boolean the generated code evaluates for one W-form factor [p_i beats p_j].

        ``survive`` says which way the factor reads in a scan over the pieces: False when p_i comes
        after p_j (p_i must take over from p_j), True when p_i comes before p_j (p_i keeps the
        gradient unless p_j takes over).  With no NaN every rule gives the same value.
        """
        if not self.ieee:
            return nan_aware(ind)
        ieee = code_relation(ind)
        if self.nan_loses:
            return nan_losing(ind, survive)
        if self.mask:
            return ieee
        partner_takes = code_relation(_opposite(ind))  # [p_j beats p_i] the other way round
        if self.nan_takes_over == "never":  # keep
            return IeeeNot(partner_takes) if survive else ieee
        if self.nan_is_taken_over:  # replace
            return ieee if survive else IeeeNot(partner_takes)
        # last_nan: a NaN always takes over, nothing takes over from a NaN
        if survive:
            return IeeeNot(sp.Or(partner_takes, isnan_of(ind.rel.rhs)))
        return sp.Or(ieee, isnan_of(ind.rel.lhs))

    def hit(self, v: sp.Expr, extremum: sp.Expr) -> sp.Basic:
        """[v attains its window's extremum] (split/all masks)."""
        if not self.ieee:
            return nan_aware_equal(v, extremum)
        return sp.Eq(v, extremum, evaluate=False)


NAN_RULES = {
    "dominate": NanRule("dominate", "a NaN beats every number and NaNs tie with each other: the "
                        "gradient goes to the NaN element(s) by the tie policy", POLICIES,
                        ieee=False, nan_takes_over="number", nan_is_taken_over=False),
    "keep": NanRule("keep", "comparisons with NaN are false and a later element takes over only "
                    "on a true comparison: a NaN never takes over, and a NaN that comes first keeps "
                    "the gradient", ("first", "last"), nan_takes_over="never", nan_is_taken_over=False),
    "replace": NanRule("replace", "a later element takes over unless the running winner beats "
                       "it: a NaN takes over and is taken over by the next element (the gradient "
                       "goes to the first winner after the last NaN)", ("first", "last"),
                       nan_takes_over="always", nan_is_taken_over=True),
    "last_nan": NanRule("last_nan", "a NaN always takes over and a number never takes over from a "
                        "NaN: the gradient goes to the last NaN", ("first", "last"),
                        nan_takes_over="always", nan_is_taken_over=False),
    "zero": NanRule("zero", "equality with NaN is false: a window holding NaN sends no gradient "
                    "(0 to every element)", ("split", "all"), mask=True),
    "nan": NanRule("nan", "the split weight is computed as hit * g / count: a window holding NaN "
                   "has no hit and count 0, so every element gets NaN", ("split",), mask=True,
                   split_as_arithmetic=True),
    "each": NanRule("each", "a window holding NaN gives every element the whole gradient",
                    ("split",), mask=True, whole_gradient_at_nan=True),
}
DEFAULT_NAN = "dominate"

# rules only the ops that name them (OpSpec.nan_rules) admit
OP_NAN_RULES = {
    "lose": NanRule("lose", "a NaN loses to every number (fmax/fmin): the output is NaN only where "
                    "every operand is; in the scan over the operands a NaN never takes over and a "
                    "number always takes over from a NaN, so the gradient goes to the winning number "
                    "by the tie policy, and where every operand is NaN to the first",
                    POLICIES, nan_loses=True),
}
ALL_NAN_RULES = {**NAN_RULES, **OP_NAN_RULES}


def nan_rule(name: str) -> NanRule:
    return ALL_NAN_RULES[name]


def check_nan(nan: object, ties: str, op_rules: tuple[str, ...] = ()) -> str:
    """Validate a NaN rule name against the tie policy (None means the default); ``op_rules``:
    the rules of OP_NAN_RULES the op admits."""
    if nan is None:
        return DEFAULT_NAN
    known = {**NAN_RULES, **{k: OP_NAN_RULES[k] for k in op_rules if k in OP_NAN_RULES}}
    if not isinstance(nan, str):
        raise TypeError(f"nan must be one of {', '.join(known)} (a string), got {nan!r}")
    if nan not in known:
        if nan in OP_NAN_RULES:
            raise ValueError(f"NaN rule {nan!r} is defined for "
                             f"{' and '.join(OP_NAN_RULES_OPS.get(nan, ()))} only; expected one of: "
                             f"{', '.join(known)}")
        raise ValueError(f"unknown NaN rule {nan!r}; expected one of: {', '.join(known)}")
    if ties not in known[nan].policies:
        raise ValueError(f"NaN rule {nan!r} expects tie policy {' or '.join(known[nan].policies)}, "
                         f"not ties={ties!r}; pass nan= (or ties=) to match")
    return nan


OP_NAN_RULES_OPS = {"lose": ("fmax", "fmin")}  # the ops admitting each (for the error message)

# order statistics (issue 29): NaN ranks as the largest value, as PyTorch and JAX sort, top-k and
# their cumulative max/min rank it
OP_NAN_RULES["largest"] = NanRule(
    "largest", "a NaN ranks above every number (+inf included) and NaNs tie with each other, as "
    "PyTorch and JAX sort and select: a descending sort or a largest top-k puts the NaNs first, an "
    "ascending one last", POLICIES, ieee=False)
ALL_NAN_RULES["largest"] = OP_NAN_RULES["largest"]
OP_NAN_RULES_OPS["largest"] = ("sort", "topk")


def check_policy(ties: object) -> str:
    """Validate a policy name (None means the default)."""
    if ties is None:
        return DEFAULT_POLICY
    if not isinstance(ties, str):
        raise TypeError(f"ties must be one of {', '.join(POLICIES)} (a string), got {ties!r}")
    if ties not in POLICIES:
        raise ValueError(f"unknown tie policy ties={ties!r}; expected one of: {', '.join(POLICIES)}")
    return ties


def _beats(a: sp.Expr, b: sp.Expr, kind: str, strict: bool) -> Indicator:
    """[a beats b] for a max (a > b) or a min (a < b)."""
    if kind == "max":
        return compare(sp.Gt if strict else sp.Ge, a, b)
    return compare(sp.Lt if strict else sp.Le, a, b)


@functools.lru_cache(maxsize=64)
def weights(pieces: tuple[sp.Expr, ...], policy: str, kind: str) -> list[sp.Expr]:
    """The W-matrix row of an extremum: w_i for each piece, as indicator products."""
    n = len(pieces)
    p = TIES[policy]
    if p.single:
        strict_before = p.strict_before  # first: must beat earlier pieces strictly
        return [
            sp.Mul(*[_beats(pieces[i], pieces[j], kind, strict_before if j < i else not strict_before)
                     for j in range(n) if j != i])
            for i in range(n)
        ]
    wins = [sp.Mul(*[_beats(pieces[i], pieces[j], kind, False) for j in range(n) if j != i])
            for i in range(n)]
    if not p.splits:
        return wins
    count = sp.Add(*wins)
    return [w / count for w in wins]


# ---------------------------------------------------------------------------------------------
# NaN semantics of a comparison, used when the derivation is lowered to code.

def isnan_of(e: sp.Expr) -> sp.Basic:
    """isnan(e) for the pieces that occur here: numbers, symbols, c*symbol, c*symbol + d.

    A piece c*x is NaN where x is.  A Literal coefficient (a framework's slope of 0) counts as a
    number here: the frameworks test x (x > 0, x >= 0) and compute x * 0 only for the piece they
    return, so its NaN at x = +-inf is that output's, not a NaN among the pieces."""
    if e.is_number:
        return sp.false
    coeff, rest = e.as_coeff_Mul()
    lits = [f for f in sp.Mul.make_args(rest) if isinstance(f, Literal)]
    if lits:
        rest = sp.Mul(*[f for f in sp.Mul.make_args(rest) if not isinstance(f, Literal)])
        if rest.is_number:
            return sp.false
    if coeff.is_number and coeff.is_finite and coeff != 0 and rest.is_Symbol:
        return IsNan(rest)
    offset, linear = e.as_coeff_Add()
    if offset != 0 and offset.is_finite and linear is not e and not linear.is_number:
        return isnan_of(linear)  # x - 0.5 (softshrink's pieces) is NaN where x is
    return IsNan(e)


def code_relation(ind: Indicator):
    """The comparison as emitted: two linear pieces of one variable are compared through the
    variable (x >= 0.01*x is emitted as x >= 0: equal for real x, and right at +-inf where both
    pieces overflow)."""
    crossing = crossing_form(ind)
    return ind.rel if crossing is None else crossing


_OPPOSITE = {sp.GreaterThan: sp.StrictLessThan, sp.StrictGreaterThan: sp.LessThan,
             sp.LessThan: sp.StrictGreaterThan, sp.StrictLessThan: sp.GreaterThan}


def _opposite(ind: Indicator) -> Indicator:
    """[a >= b] -> [a < b]: the comparison that is true exactly when ind is false (no NaN)."""
    rel = ind.rel
    return Indicator(_OPPOSITE[type(rel)](rel.lhs, rel.rhs, evaluate=False))


def nan_aware(ind: Indicator) -> sp.Basic:
    """[rel] under the 'dominate' rule.

    non-strict  [a >= b]  ->  (a >= b) | isnan(a)
    strict      [a > b]   ->  (a > b) | (isnan(a) & ~isnan(b))

    The NaN terms follow the pieces: x and 0.01*x are NaN together, a tie.
    """
    rel = code_relation(ind)
    nan_a, nan_b = isnan_of(ind.rel.lhs), isnan_of(ind.rel.rhs)
    if ind.strict:
        # a and b NaN together (x vs 0.01*x) tie, and a tie is no strict win
        return rel if nan_a == nan_b else sp.Or(rel, sp.And(nan_a, sp.Not(nan_b)))
    return sp.Or(rel, nan_a)


def nan_losing(ind: Indicator, survive: bool) -> sp.Basic:
    """[p_i beats p_j] under the 'lose' rule (IEEE comparisons; a NaN loses to every number).

    The scan over the pieces: p_i comes first (``survive``) and keeps the gradient unless p_j
    takes over; p_j takes over where it is a number and beats p_i or p_i is NaN:

    survive    isnan(p_j) | (!(p_j beats p_i) & !isnan(p_i))
    take over  !isnan(p_i) & ((p_i beats p_j) | isnan(p_j))

    A NaN never takes over, a number always takes over from a NaN; where both are NaN the one
    that comes first keeps the gradient (under every policy: no other weight is 1 there).
    """
    ieee = code_relation(ind)
    nan_i, nan_j = isnan_of(ind.rel.lhs), isnan_of(ind.rel.rhs)
    if survive:
        partner_takes = code_relation(_opposite(ind))
        return sp.Or(nan_j, sp.And(IeeeNot(partner_takes), sp.Not(nan_i)))
    return sp.And(sp.Not(nan_i), sp.Or(ieee, nan_j))


def lower_comparison(ind: Indicator, nan: str, survive: bool) -> sp.Basic:
    """``nan_rule(nan).comparison(ind, survive)``."""
    return nan_rule(nan).comparison(ind, survive)


def lower_hit(v: sp.Expr, extremum: sp.Expr, nan: str) -> sp.Basic:
    """``nan_rule(nan).hit(v, extremum)``."""
    return nan_rule(nan).hit(v, extremum)


def nan_aware_equal(v: sp.Expr, extremum: sp.Expr) -> sp.Basic:
    """[v is the extremum of its window] given the extremum under the NaN rule: (v == m) | isnan(v)."""
    return sp.Or(sp.Eq(v, extremum, evaluate=False), isnan_of(v))

# kthvalue, median, nanmedian (issue 29, part 2): kthvalue ranks NaN as the largest value; a median
# either lets a NaN decide the row (PyTorch: the NaN(s) get the gradient by the tie policy; JAX:
# none) or leaves the NaNs out
OP_NAN_RULES_OPS["largest"] += ("kthvalue",)
OP_NAN_RULES.update({
    "propagate": NanRule(
        "propagate", "a row holding NaN has output NaN and sends no gradient (jnp.median fills such "
        "a row with NaN before it sorts)", POLICIES, ieee=False),
    "omit": NanRule(
        "omit", "NaNs are left out: the median of the row's numbers; a row of NaNs only has output "
        "NaN and its gradient goes to its NaNs by the tie policy (torch.nanmedian)", POLICIES,
        ieee=False),
    "omit_zero": NanRule(
        "omit_zero", "NaNs are left out: the median of the row's numbers; a row of NaNs only has "
        "output NaN and sends no gradient (jnp.nanmedian)", POLICIES, ieee=False),
})
ALL_NAN_RULES.update({k: OP_NAN_RULES[k] for k in ("propagate", "omit", "omit_zero")})
OP_NAN_RULES_OPS.update({"propagate": ("median",), "omit": ("nanmedian",), "omit_zero": ("nanmedian",)})

# NaN-aware reductions (issue 30: nanmax/nanmin; symgrad/nanreduce.py lowers 'fill')
OP_NAN_RULES["skip"] = NanRule(
    "skip", "a NaN takes no part (np.nanmax): the output is the extremum of the slice's numbers, "
    "NaN where it holds none; the gradient goes to the numbers attaining it by the tie policy, "
    "read as fmax's scan under first/last (a NaN never takes over, a number always takes over "
    "from a NaN, so a slice of NaNs keeps it on its first element) and as a mask of the numbers "
    "attaining it under split/all (a slice of NaNs sends none)", POLICIES, nan_loses=True)
OP_NAN_RULES["fill"] = NanRule(
    "fill", "a NaN is read as -inf (max; +inf for min) and sends no gradient, as "
    "where(isnan(x), -inf, x) reduced, NaN put back where a slice holds only NaN, which is what "
    "PyTorch and JAX users write: a split counts the NaNs of a slice whose extremum is -inf among "
    "its tied elements (each -inf gets g / count, the NaNs 0), a slice of NaNs sends none",
    ("split",), mask=True, split_as_arithmetic=True, nan_loses=True)
ALL_NAN_RULES.update(skip=OP_NAN_RULES["skip"], fill=OP_NAN_RULES["fill"])
OP_NAN_RULES_OPS.update(skip=("nanmax", "nanmin"), fill=("nanmax", "nanmin"))
