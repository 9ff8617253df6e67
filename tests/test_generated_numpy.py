"""Generated NumPy modules against independent oracles.

* central finite differences (float64) on tie-free inputs, every op and policy;
* exact ties: the backward equals the SymPy derivation evaluated exactly at tie-heavy points,
  with windows enumerated here, independently of the generated geometry code;
* per-window gradient mass: 1 for first/last/split, the number of tied winners for all;
* the NaN rule; dtypes; the motivating example against a plain per-window loop.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import sympy as sp

import symgrad
from symgrad.derive import derive, derive_window, input_symbols
from symgrad.ops import resolve

from conftest import ELEMENTWISE, POLICIES, WINDOWED, case_id, sympy_value, tie_free, tie_heavy


def _loss_grad_fd(module, inputs, g, eps=1e-6):
    """Central differences of L = sum(forward(inputs) * g) for every input element."""
    grads = []
    for i, x in enumerate(inputs):
        gx = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            vals = []
            for sign in (1, -1):
                xs = [a.copy() for a in inputs]
                xs[i][idx] += sign * eps
                vals.append(np.sum(module.forward(*xs)[0] * g))
            gx[idx] = (vals[0] - vals[1]) / (2 * eps)
        grads.append(gx)
    return grads


# ------------------------------------------------------------------------ finite differences

@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shapes", ELEMENTWISE, ids=[case_id(*c) for c in ELEMENTWISE])
def test_fd_elementwise(op, params, shapes, ties):
    rng = np.random.default_rng(1)
    m = symgrad.load(op, ties=ties, **params)
    flat = tie_free(rng, (sum(math.prod(s) for s in shapes),), gap=0.05) * 3
    inputs, start = [], 0
    for s in shapes:
        inputs.append(flat[start:start + math.prod(s)].reshape(s))
        start += math.prod(s)
    y, saved = m.forward(*inputs)
    g = rng.normal(size=y.shape)
    got = m.backward(g, saved)
    want = _loss_grad_fd(m, inputs, g)
    assert len(got) == len(inputs)
    for a, b, x in zip(got, want, inputs):
        assert a.shape == x.shape and a.dtype == x.dtype
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shape", WINDOWED, ids=[case_id(*c) for c in WINDOWED])
def test_fd_windowed(op, params, shape, ties):
    rng = np.random.default_rng(2)
    m = symgrad.load(op, ties=ties, **params)
    x = tie_free(rng, shape)
    y, saved = m.forward(x)
    g = rng.normal(size=y.shape)
    (got,) = m.backward(g, saved)
    (want,) = _loss_grad_fd(m, [x], g)
    assert got.shape == x.shape and got.dtype == x.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------ exact ties vs SymPy

KINK_VALUES = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0, 6.0, 7.0])


def _elementwise_oracle(op, params, ties, inputs, g):
    """Exact gradient from the derivation: each element's partials evaluated by SymPy."""
    d = derive(resolve(op, ties, **params))
    syms = d.inputs
    shape = np.broadcast_shapes(*[x.shape for x in inputs])
    full = [np.broadcast_to(x, shape) for x in inputs]
    grads = [np.zeros(shape) for _ in inputs]
    gb = np.broadcast_to(g, shape)
    for idx in np.ndindex(shape):
        env = {s: sp.nsimplify(float(x[idx])) for s, x in zip(syms, full)}
        for node in d.nodes[:-1]:  # intermediate values u0, ...
            env[node.symbol] = sympy_value(node.forward, env)
        for k, s in enumerate(syms):
            grads[k][idx] = float(sp.nsimplify(float(gb[idx])) * sympy_value(d.partials[s], env))
    out = []
    for gr, x in zip(grads, inputs):  # sum broadcast gradients back to the input's shape
        lead = gr.ndim - x.ndim
        gr = gr.sum(axis=tuple(range(lead))) if lead else gr
        axes = tuple(i for i, n in enumerate(x.shape) if n == 1 and gr.shape[i] != 1)
        out.append(gr.sum(axis=axes, keepdims=True) if axes else gr)
    return out


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shapes", ELEMENTWISE, ids=[case_id(*c) for c in ELEMENTWISE])
def test_ties_elementwise_equal_sympy(op, params, shapes, ties):
    rng = np.random.default_rng(3)
    m = symgrad.load(op, ties=ties, **params)
    if len(shapes) == 1:
        inputs = [np.concatenate([KINK_VALUES, rng.choice(KINK_VALUES, size=math.prod(shapes[0]))])]
    else:
        inputs = [tie_heavy(rng, s) for s in shapes]
    y, saved = m.forward(*inputs)
    g = rng.integers(-3, 4, size=y.shape).astype(np.float64)
    got = m.backward(g, saved)
    want = _elementwise_oracle(op, params, ties, inputs, g)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def _pool_windows(params, spatial_shape):
    """Every window as a list of input positions (None for padding), by PyTorch's size rule."""
    d = len(spatial_shape)
    ks, ss, ps, ds = (params["kernel_size"], params["stride"], params["padding"], params["dilation"])
    outs = []
    for L, k, s, p, dl in zip(spatial_shape, ks, ss, ps, ds):
        num = L + 2 * p - dl * (k - 1) - 1
        o = (-(-num // s) if params["ceil_mode"] else num // s) + 1
        if params["ceil_mode"] and (o - 1) * s >= L + p:
            o -= 1
        outs.append(o)
    windows = {}
    for o in itertools.product(*[range(n) for n in outs]):
        elems = []
        for off in itertools.product(*[range(k) for k in ks]):
            pos = tuple(o[i] * ss[i] - ps[i] + off[i] * ds[i] for i in range(d))
            inside = all(0 <= pos[i] < spatial_shape[i] for i in range(d))
            elems.append(pos if inside else None)
        windows[o] = elems
    return windows


def _windows_of(op, p, shape):
    """{(batch index..., output index...): [input index or None, ...]} in scan order."""
    kind = resolve(op, **p).spec.kind
    out = {}
    if kind == "pool":
        norm = resolve(op, **p).params
        sdim = resolve(op, **p).spec.spatial
        lead = shape[:-sdim]
        for b in np.ndindex(*lead):
            for o, elems in _pool_windows(norm, shape[-sdim:]).items():
                out[b + o] = [None if e is None else b + e for e in elems]
    elif kind == "maxout":
        k = p["pieces"]
        n, c = shape[:2]
        for idx in np.ndindex(n, c // k, *shape[2:]):
            out[idx] = [(idx[0], idx[1] * k + j) + idx[2:] for j in range(k)]
    else:
        norm = resolve(op, **p).params
        dims = tuple(range(len(shape))) if norm["dim"] is None else tuple(sorted(d % len(shape) for d in norm["dim"]))
        kept = [i for i in range(len(shape)) if i not in dims]
        for kidx in np.ndindex(*[shape[i] for i in kept]):
            elems = []
            for ridx in np.ndindex(*[shape[i] for i in dims]):
                full = [0] * len(shape)
                for i, v in zip(kept, kidx):
                    full[i] = v
                for i, v in zip(dims, ridx):
                    full[i] = v
                elems.append(tuple(full))
            oidx = tuple(0 if i in dims else full[i] for i in range(len(shape))) if norm["keepdim"] else kidx
            oidx = oidx if norm["keepdim"] else tuple(kidx)
            if norm["keepdim"]:
                oidx = tuple(0 if i in dims else kidx[kept.index(i)] for i in range(len(shape)))
            out[oidx] = elems
    return out


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shape", WINDOWED, ids=[case_id(*c) for c in WINDOWED])
def test_ties_windowed_equal_sympy(op, params, shape, ties):
    rng = np.random.default_rng(4)
    m = symgrad.load(op, ties=ties, **params)
    spec = resolve(op, ties, **params).spec
    x = tie_heavy(rng, shape)
    y, saved = m.forward(x)
    g = rng.integers(-3, 4, size=y.shape).astype(np.float64)
    (got,) = m.backward(g, saved)
    want = np.zeros_like(x, dtype=object)
    want[...] = sp.S.Zero
    windows = _windows_of(op, params, shape)
    assert len(windows) == y.size
    for oidx, elems in windows.items():
        node = derive_window(len(elems), ties, spec.extremum)
        xs = input_symbols(resolve("max_pool1d", kernel_size=len(elems)))
        env = {s: (-sp.oo if spec.extremum == "max" else sp.oo) if e is None else sp.Integer(int(x[e]))
               for s, e in zip(xs, elems)}
        vals = [v for v in env.values() if v.is_finite]
        assert y[oidx] == float(max(vals) if spec.extremum == "max" else min(vals))
        for s, e in zip(xs, elems):
            if e is not None:
                want[e] += sp.Integer(int(g[oidx])) * node.partials[s].xreplace(env)
    want = want.astype(np.float64)
    if ties == "split":  # sums of g/k: equal up to the rounding of each term
        np.testing.assert_allclose(got, want, rtol=4e-16 * 8, atol=1e-15)
    else:
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------ properties

@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shape", WINDOWED[:13], ids=[case_id(*c) for c in WINDOWED[:13]])
def test_window_gradient_mass(op, params, shape, ties):
    """Each window sends mass 1 (first/last/split) or its number of tied winners (all)."""
    rng = np.random.default_rng(5)
    m = symgrad.load(op, ties=ties, **params)
    x = tie_heavy(rng, shape, levels=2)
    y, saved = m.forward(x)
    windows = _windows_of(op, params, shape)
    for oidx in list(windows)[:40]:
        g = np.zeros_like(y)
        g[oidx] = 1.0
        (gx,) = m.backward(g, saved)
        vals = [x[e] for e in windows[oidx] if e is not None]
        ties_here = sum(v == max(vals) for v in vals)
        want = ties_here if ties == "all" else 1.0
        assert gx.sum() == pytest.approx(want, abs=1e-12)
        assert (gx >= 0).all()


@pytest.mark.parametrize("ties", POLICIES)
def test_nan_rule_pool_and_reduction(ties):
    """NaN dominates: the output is NaN and the gradient goes to the NaN elements by the policy."""
    x = np.array([[1.0, np.nan, 3.0, np.nan, 2.0]])
    want = {"first": [0, 1, 0, 0, 0], "last": [0, 0, 0, 1, 0],
            "split": [0, 0.5, 0, 0.5, 0], "all": [0, 1, 0, 1, 0]}[ties]
    for m in (symgrad.load("max_pool1d", kernel_size=5, ties=ties),
              symgrad.load("amax", dim=-1, ties=ties), symgrad.load("amin", dim=-1, ties=ties)):
        y, saved = m.forward(x)
        assert np.isnan(y).all()
        (gx,) = m.backward(np.ones_like(y), saved)
        np.testing.assert_array_equal(gx, [want])


@pytest.mark.parametrize("ties", POLICIES)
def test_nan_rule_elementwise(ties):
    m = symgrad.load("maximum", ties=ties)
    a, b = np.array([np.nan, 1.0, np.nan]), np.array([1.0, np.nan, np.nan])
    y, saved = m.forward(a, b)
    assert np.isnan(y).all()
    ga, gb = m.backward(np.ones(3), saved)
    both = {"first": (1, 0), "last": (0, 1), "split": (0.5, 0.5), "all": (1, 1)}[ties]
    np.testing.assert_array_equal(ga, [1, 0, both[0]])
    np.testing.assert_array_equal(gb, [0, 1, both[1]])
    y, saved = symgrad.load("relu", ties=ties).forward(np.array([np.nan]))
    assert np.isnan(y).all()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("op,params,shape", [WINDOWED[6], WINDOWED[12], WINDOWED[14]],
                         ids=["pool", "maxout", "amax"])
def test_dtypes_follow_input(op, params, shape, dtype):
    rng = np.random.default_rng(6)
    m = symgrad.load(op, **params)
    x = tie_heavy(rng, shape).astype(dtype)
    y, saved = m.forward(x)
    (gx,) = m.backward(np.ones_like(y), saved)
    assert y.dtype == dtype and gx.dtype == dtype
    y64, s64 = m.forward(x.astype(np.float64))
    np.testing.assert_array_equal(y, y64.astype(dtype))
    np.testing.assert_array_equal(gx, m.backward(np.ones_like(y64), s64)[0].astype(dtype))


@pytest.mark.parametrize("pieces_or_kernel", [1, 2, 9, 27, 256, 257])
def test_saved_index_is_smallest_unsigned_type(pieces_or_kernel):
    m = symgrad.load("maxout", pieces=pieces_or_kernel)
    x = np.arange(2 * pieces_or_kernel, dtype=np.float64).reshape(1, 2 * pieces_or_kernel)
    y, saved = m.forward(x)
    assert saved.index.dtype == (np.uint8 if pieces_or_kernel <= 256 else np.uint16)
    assert saved.index.nbytes == y.size * saved.index.itemsize
    np.testing.assert_array_equal(y, [[pieces_or_kernel - 1, 2 * pieces_or_kernel - 1]])


def test_padding_never_wins_all_neg_inf():
    """An all -inf window next to padding routes its gradient to an input element."""
    m = symgrad.load("max_pool1d", kernel_size=3, stride=1, padding=1)
    x = np.full((1, 4), -np.inf)
    y, saved = m.forward(x)
    assert (y == -np.inf).all()
    (gx,) = m.backward(np.ones_like(y), saved)
    np.testing.assert_array_equal(gx, [[2, 1, 1, 0]])  # first in-bounds element of each window


def test_window_of_only_padding_is_refused():
    m = symgrad.load("max_pool1d", kernel_size=2, dilation=3, padding=1, stride=1)
    with pytest.raises(ValueError, match="only padding"):
        m.forward(np.ones((1, 2)))


# ------------------------------------------------------------------------ the motivating example

def per_window_loop(x, k):
    """The Q&A answer's approach: one Python loop iteration per window (non-overlapping)."""
    h, w = x.shape
    out = np.zeros((h // k, w // k))
    grad = np.zeros_like(x)
    for i in range(h // k):
        for j in range(w // k):
            win = x[i * k:(i + 1) * k, j * k:(j + 1) * k]
            out[i, j] = win.max()
            a, b = np.unravel_index(np.argmax(win), win.shape)
            grad[i * k + a, j * k + b] += 1.0
    return out, grad


def test_non_overlapping_equals_per_window_loop():
    rng = np.random.default_rng(7)
    m = symgrad.load("max_pool2d", kernel_size=2)
    for x in (rng.normal(size=(6, 8)), tie_heavy(rng, (6, 8), levels=2)):
        y, saved = m.forward(x[None])
        (gx,) = m.backward(np.ones_like(y), saved)
        want_y, want_g = per_window_loop(x, 2)
        np.testing.assert_array_equal(y[0], want_y)
        np.testing.assert_array_equal(gx[0], want_g)


def test_overlapping_windows_accumulate():
    x = np.array([[[1.0, 2, 3], [4, 5, 6], [7, 8, 9]]])
    m = symgrad.load("max_pool2d", kernel_size=2, stride=1)
    y, saved = m.forward(x)
    np.testing.assert_array_equal(y, [[[5, 6], [8, 9]]])
    (gx,) = m.backward(np.array([[[1.0, 10.0], [100.0, 1000.0]]]), saved)
    np.testing.assert_array_equal(gx, [[[0, 0, 0], [0, 1, 10], [0, 100, 1000]]])


def _max_windows_per_element(op, params, shape):
    windows = _windows_of(op, params, shape)
    counts = {}
    for elems in windows.values():
        for e in elems:
            if e is not None:
                counts[e] = counts.get(e, 0) + 1
    return max(counts.values())


# windows that overlap enough for one element to be in three or more of them
OVERLAPPING = [c for c in WINDOWED[:11] if _max_windows_per_element(*c) >= 3]


@pytest.mark.parametrize("op,params,shape", OVERLAPPING, ids=[case_id(*c) for c in OVERLAPPING])
def test_overlapping_windows_add_up_in_output_order(op, params, shape):
    """An element won by several windows gets the sum of their gradients, added (in float32) in
    the order of those windows' output positions (row-major), that is, in the reverse scan order
    of its place in them: bit for bit (with three or more terms, the order changes the rounding)."""
    rng = np.random.default_rng(8)
    m = symgrad.load(op, **params)
    x = (rng.normal(size=shape) * 0.1).astype(np.float32)
    x[rng.random(shape) < 0.1] += 10  # sparse peaks, each the maximum of every window it is in
    y, saved = m.forward(x)
    g = rng.normal(size=y.shape).astype(np.float32)
    (got,) = m.backward(g, saved)
    winners = {}
    for oidx, elems in _windows_of(op, params, shape).items():  # each window's first maximum
        vals = [x[e] if e is not None else -np.inf for e in elems]
        k = int(np.argmax(vals))
        winners.setdefault(k, []).append((elems[k], oidx))
    want = np.zeros_like(x)
    for e, oidx in sorted((e, oidx) for ws in winners.values() for e, oidx in ws):
        want[e] += g[oidx]  # per element, its windows in output order
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    won = [e for ws in winners.values() for e, _ in ws]
    assert max(won.count(e) for e in set(won)) >= 3, "no element is won by three windows"


def _nan_rule_oracle(d, ties, nan_inputs):
    """d output / d input at a point where `nan_inputs` are NaN, from the W-form and the NaN rule.

    In each node, the pieces that depend on a NaN are NaN together: they all become one value N
    that dominates the node's numbers (+oo in a max node, -oo in a min node), so NaN pieces tie
    with each other and beat the rest, as the rule says.
    """
    N = sp.Symbol("N")
    nan_syms = set(nan_inputs)
    total = {}
    for node in d.nodes:
        dominant = sp.oo if node.kind == "max" else -sp.oo
        nan_pieces = [bool(p.free_symbols & nan_syms) for p in node.pieces]
        vals = [N if is_nan else p for p, is_nan in zip(node.pieces, nan_pieces)]
        from symgrad.policy import weights as policy_weights
        ws = [w.xreplace({N: dominant}) for w in policy_weights(tuple(vals), ties, node.kind)]
        grads = {}
        for s in d.inputs:
            acc = sp.S.Zero
            for p, w in zip(node.pieces, ws):
                for v in p.free_symbols:  # chain rule through inputs and inner nodes
                    dv = sp.S.One if v == s else total.get(v, {}).get(s, sp.S.Zero)
                    acc += sp.diff(p, v) * w * dv
            grads[s] = acc
        total[node.symbol] = grads
        if any(nan_pieces):
            nan_syms.add(node.symbol)
    return total[d.nodes[-1].symbol]


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shapes", ELEMENTWISE, ids=[case_id(*c) for c in ELEMENTWISE])
def test_nan_rule_every_elementwise_op(op, params, shapes, ties):
    m = symgrad.load(op, ties=ties, **params)
    d = derive(resolve(op, ties, **params))
    cases = [[np.nan]] if len(d.inputs) == 1 else [[np.nan, 1.0], [1.0, np.nan], [np.nan, np.nan]]
    for vals in cases:
        inputs = [np.array([v]) for v in vals]
        y, saved = m.forward(*inputs)
        assert np.isnan(y).all()
        got = m.backward(np.ones_like(y), saved)
        nan_inputs = [s for s, v in zip(d.inputs, vals) if np.isnan(v)]
        want = _nan_rule_oracle(d, ties, nan_inputs)
        for s, g in zip(d.inputs, got):
            assert g[0] == float(want[s]), (s, vals)


@pytest.mark.parametrize("ties", POLICIES)
@pytest.mark.parametrize("op,params,shapes", [c for c in ELEMENTWISE if len(c[2]) == 1],
                         ids=[case_id(*c) for c in ELEMENTWISE if len(c[2]) == 1])
def test_infinities_take_the_limit_of_the_derivation(op, params, shapes, ties):
    """At +-inf the gradient is the derivation's value at large finite |x| (no spurious tie
    where two pieces such as x and 0.01*x both overflow to inf)."""
    m = symgrad.load(op, ties=ties, **params)
    d = derive(resolve(op, ties, **params))
    (x,) = d.inputs
    y, saved = m.forward(np.array([np.inf, -np.inf]))
    (got,) = m.backward(np.ones(2), saved)
    for value, g in zip((10**6, -10**6), got):
        env = {x: sp.Integer(value)}
        for node in d.nodes[:-1]:
            env[node.symbol] = sympy_value(node.forward, env)
        assert g == float(sympy_value(d.partials[x], env)), value


@pytest.mark.parametrize("op,params,shape", [
    ("relu", {}, (4, 6)), ("maximum", {}, (4, 6)), ("clamp", {"min": -0.5, "max": 0.5}, (4, 6)),
    ("max_pool2d", {"kernel_size": 2}, (2, 4, 6)),  # disjoint windows
    ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}, (2, 7, 7)),  # overlapping
    ("maxout", {"pieces": 3}, (2, 6, 2)), ("amax", {"dim": 1}, (3, 5)),
], ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, -0.0])
def test_non_finite_grad_output_reaches_only_where_the_partial_is_nonzero(op, params, shape, value):
    """Where an input does not affect the output, its gradient is exactly +0.0 whatever
    grad_output holds (0 * NaN taken as 0, as np.where and PyTorch do); elsewhere it is the
    grad_output value (or a sum of copies of it)."""
    rng = np.random.default_rng(9)
    m = symgrad.load(op, **params)
    inputs = [tie_free(rng, shape) for _ in range(2 if op == "maximum" else 1)]
    y, saved = m.forward(*inputs)
    ones = m.backward(np.ones_like(y), saved)
    got = m.backward(np.full_like(y, value), saved)
    for gx, w in zip(got, ones):
        zero = w == 0
        assert zero.any() and (~zero).any()
        np.testing.assert_array_equal(gx[zero].view(np.uint64), np.zeros(zero.sum(), np.uint64))
        np.testing.assert_array_equal(gx[~zero], np.full((~zero).sum(), value))
