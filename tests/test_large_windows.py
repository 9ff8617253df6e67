"""Static windows larger than ALL_VARIABLES_UP_TO: derived on a representative window, checked
for their own size in linear time, and generated for their real size.  Every expected value here
comes from a brute-force NumPy oracle written from the tie-policy definitions, not from symgrad."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
import sympy as sp

import symgrad
from symgrad import cli, policy
from symgrad.derive import (ALL_VARIABLES_UP_TO, _make_node, check_window_weights, derive,
                            running_weights, uniform_relations, window_symbols)
from symgrad.indicators import Indicator, MaxOf, MinOf
from symgrad.ops import resolve
from symgrad.printers import text

from conftest import POLICIES, tie_heavy

# ----------------------------------------------------------------------------- the oracle


def oracle_weights(windows: np.ndarray, ties: str, kind: str = "max") -> np.ndarray:
    """Each element's weight in its window (last axis, scan order), from the policy definitions."""
    best = windows.max(axis=-1, keepdims=True) if kind == "max" else windows.min(axis=-1, keepdims=True)
    hit = (windows == best).astype(np.float64)
    if ties == "all":
        return hit
    if ties == "split":
        return hit / hit.sum(axis=-1, keepdims=True)
    n = windows.shape[-1]
    pick = hit.argmax(axis=-1) if ties == "first" else n - 1 - hit[..., ::-1].argmax(axis=-1)
    return (np.arange(n) == pick[..., None]).astype(np.float64)


def oracle_pool(x: np.ndarray, kernel: tuple, stride: tuple, ties: str, g_seed: int):
    """max pooling without padding: (y, g, grad_x), every window's weights scattered back."""
    d = len(kernel)
    spatial = tuple(range(x.ndim - d, x.ndim))
    view = np.lib.stride_tricks.sliding_window_view(x, kernel, axis=spatial)
    lead = x.ndim - d
    view = view[(slice(None),) * lead + tuple(slice(None, None, s) for s in stride)]
    outs = view.shape[lead:lead + d]
    windows = view.reshape(view.shape[:lead + d] + (-1,))  # row-major scan order within the window
    y = windows.max(axis=-1)
    g = np.random.default_rng(g_seed).integers(-3, 4, size=y.shape).astype(np.float64)
    w = oracle_weights(windows, ties) * g[..., None]
    grad = np.zeros_like(x)
    for k, off in enumerate(itertools.product(*[range(n) for n in kernel])):
        # the element at offset off of every window: distinct input elements for distinct windows
        sl = tuple(slice(o, o + s * (m - 1) + 1, s) for o, s, m in zip(off, stride, outs))
        grad[(slice(None),) * lead + sl] += w[..., k]
    return y, g, grad


def oracle_maxout(x: np.ndarray, pieces: int, ties: str, g_seed: int):
    n, c = x.shape[:2]
    windows = np.moveaxis(x.reshape((n, c // pieces, pieces) + x.shape[2:]), 2, -1)
    y = windows.max(axis=-1)
    g = np.random.default_rng(g_seed).integers(-3, 4, size=y.shape).astype(np.float64)
    w = oracle_weights(windows, ties) * g[..., None]
    return y, g, np.moveaxis(w, -1, 2).reshape(x.shape)


# ----------------------------------------------------------------------------- generated code

LARGE = [  # (op, params, input shape): windows of 40 and 64 elements, disjoint and overlapping
    ("max_pool1d", {"kernel_size": 40}, (2, 3, 120)),
    ("max_pool1d", {"kernel_size": 40, "stride": 7}, (2, 103)),
    ("max_pool3d", {"kernel_size": 4}, (1, 2, 8, 8, 8)),
    ("max_pool3d", {"kernel_size": 4, "stride": 2}, (2, 6, 6, 6)),
    ("maxout", {"pieces": 40}, (2, 80, 3)),
]


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shape", LARGE, ids=[f"{o}-{list(p.values())}" for o, p, _ in LARGE])
def test_generated_large_window_matches_the_numpy_oracle_at_ties(op, params, shape, ties):
    assert len(derive(resolve(op, ties, **params)).inputs) == ALL_VARIABLES_UP_TO  # representative
    rng = np.random.default_rng(len(shape) * 7 + POLICIES.index(ties))
    m = symgrad.load(op, ties=ties, **params)
    assert m.WINDOW == resolve(op, **params).window_size()
    for levels in (2, 3, 50):  # integer values, many ties (2, 3 levels) and a few (50)
        x = tie_heavy(rng, shape, levels)
        if op == "maxout":
            want_y, g, want = oracle_maxout(x, params["pieces"], ties, levels)
        else:
            k = params["kernel_size"]
            d = int(op[-2])
            kernel = (k,) * d
            want_y, g, want = oracle_pool(x, kernel, (params.get("stride", k),) * d, ties, levels)
        y, saved = m.forward(x)
        np.testing.assert_array_equal(y, want_y)
        (got,) = m.backward(g, saved)
        if ties == "split":  # sums of g/k: equal up to the rounding of each term
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-14)
        else:
            np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------------------- derivations

def _partials_at(d, values):
    env = dict(zip(d.inputs, map(sp.Integer, values)))
    return np.array([float(d.partials[s].xreplace(env)) for s in d.inputs])


@pytest.mark.parametrize("ties", POLICIES)
def test_windows_up_to_the_threshold_are_derived_in_full(ties):
    d = derive(resolve("max_pool1d", ties, kernel_size=ALL_VARIABLES_UP_TO))
    assert d.inputs == window_symbols(ALL_VARIABLES_UP_TO)
    assert len(d.output.weights) == ALL_VARIABLES_UP_TO
    assert f"all {ALL_VARIABLES_UP_TO} variables" in d.checks[0]
    assert not any("representative" in c for c in d.checks)
    assert [s.items[0][0] for s in d.steps[:2]] == ["y", "y"]
    rng = np.random.default_rng(3)
    for _ in range(4):
        vals = rng.integers(0, 3, size=ALL_VARIABLES_UP_TO)
        want = oracle_weights(vals[None].astype(np.float64), ties)[0]
        np.testing.assert_allclose(_partials_at(d, vals), want, rtol=1e-15)


@pytest.mark.parametrize("ties", POLICIES)
def test_a_large_window_is_derived_on_a_representative_window(ties):
    op = resolve("max_pool3d", ties, kernel_size=10)
    d = derive(op)
    r = ALL_VARIABLES_UP_TO
    assert d.inputs == window_symbols(r) and len(d.partials) == r
    assert d.steps[0].items[0] == ("y", sp.Symbol("max(x0, x1, ..., x999)"))
    assert "w_k (k = 0..999)" in [label for label, _ in d.steps[1].items]
    assert "delta terms eliminated and cancelled for all 32 variables" in d.checks[0]
    assert "random windows of 1000 elements" in d.checks[2]
    assert "representative window of 32" in d.checks[3]
    # the representative partials are the policy's weights (brute force), ties and no ties
    rng = np.random.default_rng(5)
    for levels in (2, 3, 100):
        vals = rng.integers(0, levels, size=r)
        want = oracle_weights(vals[None].astype(np.float64), ties)[0]
        np.testing.assert_allclose(_partials_at(d, vals), want, rtol=1e-15)


def test_the_threshold_is_where_the_representative_window_starts():
    small = derive(resolve("maxout", pieces=ALL_VARIABLES_UP_TO))
    large = derive(resolve("maxout", pieces=ALL_VARIABLES_UP_TO + 1))
    assert not any("representative" in c for c in small.checks)
    assert any(f"window of {ALL_VARIABLES_UP_TO + 1} elements is derived on a representative" in c
               for c in large.checks)
    assert small.partials == large.partials  # the representative window is the threshold's own


# ----------------------------------------------------------------------------- the linear check

RELATIONS = [sp.StrictGreaterThan, sp.GreaterThan, sp.StrictLessThan, sp.LessThan]


@pytest.mark.parametrize("before,after", list(itertools.product(RELATIONS, RELATIONS)))
def test_running_weights_equal_the_full_products(before, after):
    rng = np.random.default_rng(9)
    vals = rng.integers(0, 4, size=(50, 300)).astype(np.float64)
    cmp = {sp.StrictGreaterThan: np.greater, sp.GreaterThan: np.greater_equal,
           sp.StrictLessThan: np.less, sp.LessThan: np.less_equal}
    want = np.ones_like(vals, dtype=bool)
    for k in range(50):
        for j in range(50):
            if j != k:
                want[k] &= cmp[before if j < k else after](vals[k], vals[j])
    np.testing.assert_array_equal(running_weights(vals, before, after), want)


@pytest.mark.parametrize("kind", ["max", "min"])
@pytest.mark.parametrize("ties", POLICIES)
def test_window_weight_check_passes_for_every_policy(ties, kind):
    node = _make_node(sp.Symbol("y"), (MaxOf if kind == "max" else MinOf)(*window_symbols(6)), ties)
    for n in (7, 1000):
        assert f"random windows of {n} elements" in check_window_weights(node, ties, n)


def _broken(make_weight):
    def weights(pieces, pol, kind):
        n = len(pieces)
        return [sp.Mul(*[make_weight(pieces, i, j) for j in range(n) if j != i]) for i in range(n)]
    return weights


@pytest.mark.parametrize("name,weight,match", [
    # every comparison strict: a tie has no winner
    ("strict", lambda p, i, j: Indicator(sp.Gt(p[i], p[j])), "sum of weights"),
    # every comparison non-strict under 'first': a tie has several winners
    ("non-strict", lambda p, i, j: Indicator(sp.Ge(p[i], p[j])), "sum of weights"),
    # one comparison per side, but which one depends on the position
    ("mixed", lambda p, i, j: Indicator((sp.Gt if i % 2 else sp.Ge)(p[i], p[j])), "one comparison per side"),
    # a weight that is not a product of comparisons alone
    ("scaled", lambda p, i, j: (2 if j == (i + 1) % len(p) else 1) * Indicator(
        (sp.Gt if j < i else sp.Ge)(p[i], p[j])), "running-extremum form"),
])
def test_window_weight_check_fails_on_a_broken_policy(monkeypatch, name, weight, match):
    monkeypatch.setattr(policy, "weights", _broken(weight))
    node = _make_node(sp.Symbol("y"), MaxOf(*window_symbols(6)), "first")
    with pytest.raises(AssertionError, match=match):
        check_window_weights(node, "first", 500)


def test_uniform_relations_reads_the_policy():
    xs = window_symbols(5)
    got = {t: uniform_relations(_make_node(sp.Symbol("y"), MinOf(*xs), t)) for t in POLICIES}
    assert got == {"first": (sp.StrictLessThan, sp.LessThan), "last": (sp.LessThan, sp.StrictLessThan),
                   "split": (sp.LessThan, sp.LessThan), "all": (sp.LessThan, sp.LessThan)}


# ----------------------------------------------------------------------------- the CLI

class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_generate_prints_one_progress_line_on_a_terminal_only(monkeypatch, tmp_path, capsys, terminal):
    err = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    # a window no other test derives, so that this command runs the derivation
    rc = cli.main(["generate", "max_pool1d", "--kernel-size", "37", "--ties", "last" if terminal else "first",
                   "--backend", "all", "--out", str(tmp_path)])
    assert rc == 0
    if terminal:
        assert err.getvalue() == "symgrad: deriving max_pool1d (37-element window)...\n"
    else:
        assert err.getvalue() == ""
    assert "wrote" in capsys.readouterr().out


def test_derive_text_wraps_long_lines_between_factors(capsys):
    assert cli.main(["derive", "max_pool2d", "--kernel-size", "3", "--ties", "split", "--full"]) == 0
    out = capsys.readouterr().out.split("\n")
    assert max(map(len, out)) <= cli.WIDTH
    d = derive(resolve("max_pool2d", "split", kernel_size=3))
    (w_form,) = [s for s in d.steps if s.title == "W-form"]
    label, expr = w_form.items[1]  # E_0: a product of 8 indicators
    start = out.index(next(line for line in out if line.startswith(f"  {label} = ")))
    lines = [out[start]] + list(itertools.takewhile(lambda s: s.startswith(cli.CONTINUATION), out[start + 1:]))
    assert len(lines) > 1 or len(lines[0]) <= cli.WIDTH
    for line in lines[:-1]:
        assert line.endswith("*") or line.endswith("+")  # cut between factors or terms
    # the lines hold the whole expression: the same text once the cuts are undone
    assert "".join(s.strip() for s in lines).replace(" ", "") == \
        f"{label} = {text(expr)}".replace(" ", "")


def test_wrap_keeps_indicators_and_powers_whole():
    line = "  f = " + "*".join(f"[x{i} >= 0.5*x{i + 1}]" for i in range(20)) + "*x0**2"
    lines = cli.wrap(line, 60)
    assert all(len(s) <= 60 for s in lines)
    assert "".join(s.strip() for s in lines).replace(" ", "") == line.replace(" ", "")
    for s in lines:
        assert s.count("[") == s.count("]")
    assert "x0**2" in lines[-1]


# ----------------------------------------------------------------------------- docs

@pytest.mark.parametrize("ties", POLICIES)
def test_docs_weights_of_a_large_window_match_the_oracle(ties):
    """The docs' worked example reads a large window's W without deriving its n-element node."""
    from symgrad import docs
    op = resolve("max_pool1d", ties, kernel_size=40)
    rng = np.random.default_rng(11)
    x = tie_heavy(rng, (90,), 3)
    # three windows: plain, with leading padding (None), overlapping the first
    windows = [[(0, i) for i in range(40)], [None] * 5 + [(0, i) for i in range(35)],
               [(0, i) for i in range(50, 90)]]
    got = docs._window_weights(op, derive(op), (x,), windows)
    cols = np.array([[-np.inf if e is None else x[e[1]] for e in w] for w in windows])
    want = oracle_weights(cols, ties)
    for o, w in enumerate(windows):
        for k, e in enumerate(w):
            assert (got[o][k] is None) == (e is None)
            if e is not None:
                assert float(got[o][k]) == pytest.approx(want[o, k], rel=1e-15)
