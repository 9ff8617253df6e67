"""The derivation: steps, delta elimination, agreement with SymPy's own calculus away from ties."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import sympy as sp

from symgrad import policy
from symgrad.derive import check_weights, derive, derive_window, window_symbols
from symgrad.indicators import Indicator, MaxOf, MinOf
from symgrad.ops import resolve

from conftest import ELEMENTWISE, POLICIES, case_id, sympy_value

OPS = [(op, params) for op, params, _ in ELEMENTWISE] + [
    ("max_pool2d", {"kernel_size": 2}), ("amax", {}), ("amin", {"dim": 1}), ("maxout", {"pieces": 3})]


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params", OPS, ids=[case_id(*c) for c in OPS])
def test_deltas_appear_then_cancel(op, params, ties):
    d = derive(resolve(op, ties, **params))
    assert [s.title for s in d.steps] == ["forward", "W-form", "raw derivative", "delta elimination",
                                          "final partials"]
    raw = [e for n in d.nodes for e in n.raw.values()]
    assert any(e.has(sp.DiracDelta) for e in raw)  # differentiating the indicators made deltas
    groups = [g for n in d.nodes for gs in n.delta_groups.values() for g in gs]
    assert any(coeff != 0 for _, coeff, _ in groups)  # ... with something to cancel
    assert all(sifted == 0 for _, _, sifted in groups)  # ... and the sifting cancelled each group
    for e in d.partials.values():
        assert not e.has(sp.DiracDelta, sp.Heaviside)


@pytest.mark.parametrize("op,params", OPS[:16], ids=[case_id(*c) for c in OPS[:16]])
def test_partials_equal_sympy_diff_away_from_ties(op, params):
    """Away from kinks every policy gives SymPy's own derivative of Max/Min."""
    rng = np.random.default_rng(0)
    for ties in POLICIES:
        d = derive(resolve(op, ties, **params))
        plain = d.forward.replace(lambda e: isinstance(e, MaxOf), lambda e: sp.Max(*e.args))
        plain = plain.replace(lambda e: isinstance(e, MinOf), lambda e: sp.Min(*e.args))
        for _ in range(12):
            env = {s: sp.Rational(int(rng.integers(-700, 700)), 97) for s in d.inputs}
            for s in d.inputs:
                want = sp.diff(plain, s).xreplace(env).doit()
                assert want.is_number and not want.has(sp.Heaviside)  # away from kinks
                inner = dict(env)
                for node in d.nodes[:-1]:
                    inner[node.symbol] = sympy_value(node.forward, inner)
                assert sympy_value(d.partials[s], inner) == want, (ties, s, env)


def test_sympy_heaviside_form_is_wrong_at_a_three_way_tie_and_ours_is_not():
    xs = window_symbols(3)
    tie = {x: sp.Integer(1) for x in xs}
    heaviside = sp.Max(*xs).rewrite(sp.Heaviside)
    sympy_sum = sum(sp.diff(heaviside, x) for x in xs).xreplace(tie)
    sympy_sum = sympy_sum.replace(lambda e: isinstance(e, sp.DiracDelta), lambda e: sp.S.Zero)
    assert sympy_sum == sp.Rational(3, 4)  # Heaviside(0) = 1/2 products lose a quarter
    fdiff_sum = sum(sp.Max(*xs).fdiff(i + 1) for i in range(3)).xreplace(tie)
    assert fdiff_sum == sp.Rational(3, 2)  # and Max's own derivative counts 3/2
    for ties in POLICIES:
        node = derive_window(3, ties)
        ours = sum(node.partials[x].xreplace(tie) for x in xs)
        assert ours == (3 if ties == "all" else 1)


@pytest.mark.parametrize("ties", ["first", "last"])
def test_first_and_last_pick_one_winner_in_every_weak_ordering(ties):
    xs = window_symbols(4)
    node = derive_window(4, ties)
    for ranks in itertools.product(range(4), repeat=4):
        vals = [node.partials[x].xreplace(dict(zip(xs, map(sp.Integer, ranks)))) for x in xs]
        winners = [i for i, r in enumerate(ranks) if r == max(ranks)]
        want = winners[0] if ties == "first" else winners[-1]
        assert vals == [int(i == want) for i in range(4)], ranks


def test_weight_check_fails_on_a_broken_policy(monkeypatch):
    """The built-in check can fail: weights with every comparison strict lose ties."""
    def strict(pieces, pol, kind):
        return [sp.Mul(*[Indicator(sp.Gt(pieces[i], pieces[j])) for j in range(len(pieces)) if j != i])
                for i in range(len(pieces))]
    monkeypatch.setattr(policy, "weights", strict)
    check_weights.cache_clear()
    try:
        with pytest.raises(AssertionError, match="sum of weights"):
            check_weights("first", "max", 3)
        with pytest.raises(AssertionError, match="sum of weights"):
            check_weights("first", "max", 6)
    finally:
        check_weights.cache_clear()


def test_27_element_window_derives_every_variable():
    d = derive(resolve("max_pool3d", kernel_size=3))
    assert len(d.partials) == 27
    for s, e in d.partials.items():
        inds = [f for f in sp.Mul.make_args(e) if isinstance(f, Indicator)]
        assert len(inds) == 26 and all(s in f.free_symbols for f in inds)
    assert any("all 27 variables" in c for c in d.checks)


def test_large_windows_eliminate_deltas_for_representatives():
    node = derive_window(40, "split")
    assert len(node.partials) == 40
    xs = window_symbols(40)
    rng = np.random.default_rng(1)
    vals = rng.integers(0, 2, size=40)
    env = dict(zip(xs, map(sp.Integer, vals)))
    got = [node.partials[x].xreplace(env) for x in xs]
    k = int((vals == vals.max()).sum())
    assert got == [sp.Rational(int(v == vals.max()), k) for v in vals]


def test_clamp_is_joined_by_the_chain_rule():
    d = derive(resolve("clamp", "split", min=0, max=6))
    (x,) = d.inputs
    u0 = d.nodes[0].symbol
    assert d.partials[x] == d.nodes[1].partials[u0] * d.nodes[0].partials[x]
    for value, want in [(-1, 0), (0, sp.Rational(1, 2)), (3, 1), (6, sp.Rational(1, 2)), (7, 0)]:
        env = {x: sp.Integer(value)}
        env[u0] = sympy_value(d.nodes[0].forward, env)
        assert d.partials[x].xreplace(env) == want


@pytest.mark.parametrize("ties", POLICIES)
def test_checks_cover_exhaustive_and_numeric(ties):
    assert "all 75 weak orderings" in check_weights(ties, "max", 4)
    assert "random tie-heavy" in check_weights(ties, "min", 7)
