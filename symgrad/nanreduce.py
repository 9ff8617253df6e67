"""NaN-aware reductions (nanmax, nanmin): what the NaN rules 'skip' and 'fill' add to a reduction's
lowering (policy.py holds the rules, ops.py the ops, conventions.py the presets).

'skip' needs nothing here: its comparisons are fmax's ('lose': a NaN never takes over, a number
always takes over from a NaN) and its mask hit is IEEE equality with the NaN-skipping extremum.

'fill' is the reading PyTorch and JAX users write, where(isnan(x), -inf, x) reduced (+inf for a
min) with NaN put back where a slice holds only NaN: the NaNs are -inf for the count of a tie and
get no gradient (the where's backward selects 0 for them, exactly +0), so an element v of a slice
with saved output m is

    counted  (v == m) | (isnan(v) & (m == -inf | isnan(m)))
    weight   isnan(v) ? 0 : (g / count) * counted

and jvp's term (PyTorch's amax jvp: where(mask, t, 0) of the filled tangent) is
counted & !isnan(v) ? t : 0.
"""

from __future__ import annotations

import sympy as sp

from .indicators import IsNan
from .lower import COUNT, EXTREMUM, GRAD_OUTPUT, HIT, V, Quotient, Select, Selection

# what a NaN is read as under 'fill', by the extremum
FILL = {"max": -sp.oo, "min": sp.oo}


def fill_hit(kind: str) -> sp.Basic:
    """[v is counted among its slice's winners] under 'fill'."""
    filled_out = sp.Or(sp.Eq(EXTREMUM, FILL[kind], evaluate=False), IsNan(EXTREMUM))
    return sp.Or(sp.Eq(V, EXTREMUM, evaluate=False), sp.And(IsNan(V), filled_out))


def fill_selection(kind: str) -> Selection:
    """The mask under 'fill' (split only): the hits counted with the NaNs read as -inf (+inf),
    the NaNs' weight 0."""
    weight = Select(IsNan(V), 0, Quotient(GRAD_OUTPUT, COUNT) * HIT)
    return Selection("mask", kind, None, None, fill_hit(kind), weight, True)


def fill_tangent_term() -> sp.Expr:
    """jvp's term of an element under 'fill' with PyTorch's tangent sum: the tangent where the
    element is counted and a number (where(mask, where(isnan, 0, t), 0))."""
    return Select(sp.And(HIT, sp.Not(IsNan(V))), GRAD_OUTPUT, 0)
