"""symgrad.check at a join with one slope (issue 30): celu at 0 (every alpha) and elu with alpha 1
join their pieces max(0, x) and the exp piece with the same first derivative, so the one-sided
differences see no kink; the checker finds the join from the op's definition (the tied max node)
and holds the gradient there to the policy: 1 under first/last/split, the pieces' sum 2 under
all.  Oracle: the pieces' slopes at 0 from SymPy (alpha * exp(x / s) / s and 1), combined by the
README's policy weights; a planted wrong value at the join must be caught.
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

import symgrad
from symgrad.policy import POLICIES

X = np.array([-1.0, -0.0, 0.0, 0.5, 2.0])
WEIGHTS = {"first": (1, 0), "last": (0, 1), "split": (0.5, 0.5), "all": (1, 1)}  # (exp piece's, x's)
CASES = [("elu", 1.0), ("celu", 0.5)]


def _at_zero(op, alpha, ties):
    """The policy's gradient at 0: its weights times each piece's slope there (SymPy)."""
    x = sp.Symbol("x", real=True)
    s = alpha if op == "celu" else 1
    a, s = sp.nsimplify(alpha), sp.nsimplify(s)
    slopes = [sp.diff(a * (sp.exp(x / s) - 1), x).subs(x, 0), sp.Integer(1)]
    assert slopes[0] == slopes[1]  # the join: one slope
    return float(sum(w * d for w, d in zip(WEIGHTS[ties], slopes)))


def _planted(module, value):
    """module's (forward, vjp) with the gradient at x = +-0 replaced by value."""
    def forward(x):
        return module.forward(x)[0]

    def vjp(g, x):
        gx = np.array(module.backward(g, module.forward(x)[1])[0])
        gx[x == 0] = value * g[x == 0]
        return [gx]
    return forward, vjp


@pytest.mark.parametrize("op,alpha,ties", [
    pytest.param(op, alpha, ties, marks=() if (op, ties) in (("celu", "all"), ("elu", "first")) else pytest.mark.slow)
    for op, alpha in CASES for ties in POLICIES])
def test_the_join_is_checked_under_every_policy(op, alpha, ties):
    module = symgrad.load(op, ties=ties, alpha=alpha)
    want = _at_zero(op, alpha, ties)
    gx = module.backward(np.ones_like(X), module.forward(X)[1])[0]
    assert (gx[X == 0] == want).all()  # the module follows the policy
    report = symgrad.check(module, X, rtol=1e-5, atol=1e-7)
    assert report.ok and report.kinks == 2, str(report)  # +0 and -0: joins
    wrong = 1.0 if ties == "all" else 0.0  # 'all' given the smooth slope; the others nothing
    bad = symgrad.check(_planted(module, wrong), X, ties=ties, op=op, params={"alpha": alpha}, rtol=1e-5, atol=1e-7)
    assert not bad.ok and {f.kind for f in bad.failures} == {"kink"}, str(bad)
    assert all(f.expected == pytest.approx(want, rel=1e-5) and f.got == wrong for f in bad.failures)
    assert "pieces joined with one slope" in str(bad)


def test_without_the_definition_the_join_is_smooth():
    """A user function without op=: the differences alone, which see a smooth point (1)."""
    module = symgrad.load("celu", ties="split", alpha=0.5)
    assert symgrad.check(_planted(module, 1.0), X, ties="all", rtol=1e-5, atol=1e-7).ok
