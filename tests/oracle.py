"""A reference for the documented results, written from README.md's tables and the tie-policy and
NaN rules in symgrad/policy.py's docstring, and nothing else of symgrad's: which pieces or window
elements win, what the output is, and what gradient each input element receives.

Python loops over scalars: meant for small inputs (the tests here use up to a few hundred
elements).  Comparisons are exact: pieces are affine in the inputs with float coefficients, and two
pieces of one variable are compared through their difference (so x and 0.01*x at x = inf do not
tie: x - 0.01*x = 0.99*x > 0), as the derivation compares them for real x.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np

NAN = float("nan")


# ----------------------------------------------------------------------------- tie policies

def policy_weights(winners: list[int], ties: str) -> dict[int, float]:
    """{index: weight} for the winners of one max/min (in their order)."""
    if ties == "first":
        return {winners[0]: 1.0}
    if ties == "last":
        return {winners[-1]: 1.0}
    if ties == "split":
        return {i: 1.0 / len(winners) for i in winners}
    if ties == "all":
        return {i: 1.0 for i in winners}
    raise ValueError(ties)


def window_winners(values: list[float], kind: str) -> list[int]:
    """Indices of the winners of a window: its NaN elements if it holds any (NaN dominates both
    max and min, and NaNs tie), else the elements equal to its max (min)."""
    nans = [i for i, v in enumerate(values) if math.isnan(v)]
    if nans:
        return nans
    best = max(values) if kind == "max" else min(values)
    return [i for i, v in enumerate(values) if v == best]


# ----------------------------------------------------------------------------- elementwise

class Lin:
    """An affine piece sum_i c_i x_i + c0 of the op's inputs."""

    def __init__(self, coeffs: dict[int, float], const: float = 0.0):
        self.coeffs = {i: float(c) for i, c in coeffs.items() if c != 0}
        self.const = float(const)

    def is_nan(self, point) -> bool:
        return any(math.isnan(point[i]) for i in self.coeffs)

    def value(self, point) -> float:
        v = self.const
        for i, c in self.coeffs.items():
            v = v + c * point[i]
        return v

    def grad(self, n: int) -> list[float]:
        return [self.coeffs.get(i, 0.0) for i in range(n)]


def _sign(x) -> int:
    return (x > 0) - (x < 0)


def compare(p: Lin, q: Lin, point) -> int:
    """sign(p - q) at a point without NaN: exact, and through the difference for one variable."""
    diff = {i: Fraction(p.coeffs.get(i, 0.0)) - Fraction(q.coeffs.get(i, 0.0))
            for i in set(p.coeffs) | set(q.coeffs)}
    diff = {i: c for i, c in diff.items() if c != 0}
    c0 = Fraction(p.const) - Fraction(q.const)
    if not diff:
        return _sign(c0)
    if len(diff) == 1:
        (i, c), = diff.items()
        x = point[i]
        if math.isinf(x):
            return _sign(c) * _sign(x)
        return _sign(c * Fraction(x) + c0)
    # pieces in two inputs (maximum(a, b)): compare their values as numbers, infinities included
    a, b = p.value(point), q.value(point)
    return (a > b) - (a < b)


class Node:
    """max/min of pieces and inner nodes, in the order the README writes them."""

    def __init__(self, kind: str, *args):
        self.kind, self.args = kind, args

    def evaluate(self, point, ties: str, n: int):
        """(value, gradient over the n inputs, the winning piece as a Lin, is NaN)."""
        evaluated = []
        for a in self.args:
            if isinstance(a, Node):
                evaluated.append(a.evaluate(point, ties, n))
            else:
                evaluated.append((a.value(point), a.grad(n), a, a.is_nan(point)))
        nans = [i for i, e in enumerate(evaluated) if e[3]]
        if nans:
            winners = nans
        else:
            sign = 1 if self.kind == "max" else -1
            winners = [i for i, e in enumerate(evaluated)
                       if all(sign * compare(e[2], o[2], point) >= 0 for o in evaluated)]
        weights = policy_weights(winners, ties)
        grad = [sum(w * evaluated[i][1][k] for i, w in weights.items()) for k in range(n)]
        first = evaluated[winners[0]]
        return (NAN if nans else first[0]), grad, first[2], bool(nans)


X = Lin({0: 1.0})
A, B = Lin({0: 1.0}), Lin({1: 1.0})


def _const(c) -> Lin:
    return Lin({}, c)


def _clamp(lo, hi) -> Node:
    if lo is None:
        return Node("min", X, _const(hi))
    if hi is None:
        return Node("max", X, _const(lo))
    return Node("min", Node("max", X, _const(lo)), _const(hi))


def elementwise_form(op: str, params: dict) -> tuple[Node, int]:
    """(the op as nested max/min of pieces, number of inputs), from README's table."""
    if op == "maximum":
        return Node("max", A, B), 2
    if op == "minimum":
        return Node("min", A, B), 2
    if op == "relu":
        return Node("max", _const(0.0), X), 1
    if op == "clamp":
        return _clamp(params.get("min"), params.get("max")), 1
    if op == "hardtanh":
        return _clamp(params.get("min_val", -1.0), params.get("max_val", 1.0)), 1
    if op == "relu6":
        return _clamp(0.0, 6.0), 1
    if op == "leaky_relu":
        a = params.get("negative_slope", 0.01)
        return Node("max" if a <= 1 else "min", X, Lin({0: a})), 1
    if op == "abs":
        return Node("max", X, Lin({0: -1.0})), 1
    raise ValueError(op)


def elementwise(op: str, params: dict, ties: str, inputs, grad_output):
    """(output, gradients) of an elementwise op; broadcasting as NumPy does."""
    form, n = elementwise_form(op, params)
    inputs = [np.asarray(x) for x in inputs]
    assert len(inputs) == n
    shape = np.broadcast_shapes(*[x.shape for x in inputs])
    full = [np.broadcast_to(x, shape).astype(np.float64) for x in inputs]
    g = np.broadcast_to(np.asarray(grad_output, dtype=np.float64), shape)
    y = np.zeros(shape)
    grads = [np.zeros(shape) for _ in inputs]
    for idx in np.ndindex(*shape):
        value, grad, _, _ = form.evaluate([float(x[idx]) for x in full], ties, n)
        y[idx] = value
        for k in range(n):
            grads[k][idx] = grad[k] * g[idx] if grad[k] else 0.0
    out = []
    for gr, x in zip(grads, inputs):
        lead = gr.ndim - x.ndim
        gr = gr.sum(axis=tuple(range(lead))) if lead else gr
        axes = tuple(i for i, s in enumerate(x.shape) if s == 1 and gr.shape[i] != 1)
        out.append(gr.sum(axis=axes, keepdims=True) if axes else gr)
    return y, out


# ----------------------------------------------------------------------------- windows

def _tuple(v, d):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * d


def pool_windows(d: int, params: dict, shape: tuple) -> tuple[tuple, dict]:
    """(output shape, {output index: [input index or None (padding)]}) with PyTorch's sizes."""
    k = _tuple(params["kernel_size"], d)
    s = _tuple(params.get("stride") or k, d)
    p = _tuple(params.get("padding", 0), d)
    dl = _tuple(params.get("dilation", 1), d)
    ceil = params.get("ceil_mode", False)
    lead, spatial = shape[:-d], shape[-d:]
    outs = []
    for L, ki, si, pi, di in zip(spatial, k, s, p, dl):
        num = L + 2 * pi - di * (ki - 1) - 1
        o = (-(-num // si) if ceil else num // si) + 1
        if ceil and (o - 1) * si >= L + pi:
            o -= 1
        outs.append(o)
    windows = {}
    for b in np.ndindex(*lead):
        for o in itertools.product(*[range(n) for n in outs]):
            elems = []
            for off in itertools.product(*[range(n) for n in k]):
                pos = tuple(o[i] * s[i] - p[i] + off[i] * dl[i] for i in range(d))
                inside = all(0 <= pos[i] < spatial[i] for i in range(d))
                elems.append(b + pos if inside else None)
            windows[b + o] = elems
    return tuple(lead) + tuple(outs), windows


def maxout_windows(pieces: int, shape: tuple) -> tuple[tuple, dict]:
    n, c = shape[:2]
    out = (n, c // pieces) + tuple(shape[2:])
    return out, {idx: [(idx[0], idx[1] * pieces + j) + idx[2:] for j in range(pieces)]
                 for idx in np.ndindex(*out)}


def reduction_windows(params: dict, shape: tuple) -> tuple[tuple, dict]:
    rank = len(shape)
    dim = params.get("dim")
    if dim is None or dim == ():
        dims = tuple(range(rank))
    else:
        dims = tuple(sorted({d % max(rank, 1) for d in _tuple(dim, 1)})) if rank else ()
    keep = params.get("keepdim", False)
    kept = [i for i in range(rank) if i not in dims]
    out_shape = tuple(1 if i in dims else shape[i] for i in range(rank)) if keep \
        else tuple(shape[i] for i in kept)
    windows = {}
    for kidx in np.ndindex(*[shape[i] for i in kept]):
        elems = []
        for ridx in np.ndindex(*[shape[i] for i in dims]):
            full = [0] * rank
            for i, v in zip(kept, kidx):
                full[i] = v
            for i, v in zip(dims, ridx):
                full[i] = v
            elems.append(tuple(full))
        oidx = tuple(0 if i in dims else kidx[kept.index(i)] for i in range(rank)) if keep else kidx
        windows[oidx] = elems
    return out_shape, windows


def adaptive_windows(d: int, params: dict, shape: tuple) -> tuple[tuple, dict]:
    """(output shape, {output index: [input index]}): PyTorch's adaptive windows, window i of an
    axis of length L covering floor(i*L/out) <= j < ceil((i+1)*L/out) (None: out = L)."""
    lead, spatial = shape[:-d], shape[-d:]
    size = _tuple(params["output_size"], d)
    size = size * d if len(size) == 1 else size
    outs = tuple(L if o is None else o for L, o in zip(spatial, size))
    ranges = [[range(math.floor(Fraction(i * L, o)), math.ceil(Fraction((i + 1) * L, o)))
               for i in range(o)] for L, o in zip(spatial, outs)]
    windows = {}
    for b in np.ndindex(*lead):
        for o in itertools.product(*[range(n) for n in outs]):
            windows[b + o] = [b + pos for pos in itertools.product(*[ranges[a][o[a]] for a in range(d)])]
    return tuple(lead) + outs, windows


def windows_of(op: str, params: dict, shape: tuple) -> tuple[tuple, dict]:
    if op.startswith("adaptive_max_pool"):
        return adaptive_windows(int(op[17]), params, shape)
    if op.startswith("max_pool"):
        return pool_windows(int(op[8]), params, shape)
    if op == "maxout":
        return maxout_windows(params["pieces"], shape)
    if op in ("amax", "amin"):
        return reduction_windows(params, shape)
    raise ValueError(op)


def windowed(op: str, params: dict, ties: str, x, grad_output=None):
    """(output, gradient) of a window op: padding never wins, overlapping windows accumulate."""
    kind = "min" if op == "amin" else "max"
    x = np.asarray(x, dtype=np.float64)
    out_shape, windows = windows_of(op, params, x.shape)
    y = np.zeros(out_shape)
    gx = np.zeros(x.shape)
    g = None if grad_output is None else np.asarray(grad_output, dtype=np.float64)
    for oidx, elems in windows.items():
        inside = [e for e in elems if e is not None]
        values = [float(x[e]) for e in inside]
        winners = window_winners(values, kind)
        y[oidx] = NAN if math.isnan(values[winners[0]]) else values[winners[0]]
        if g is not None:
            for i, w in policy_weights(winners, ties).items():
                gx[inside[i]] += w * g[oidx]
    return y, [gx]


def reference(op: str, params: dict, ties: str, inputs, grad_output):
    """(output, [gradient of each input]) of any op under the documented rules."""
    if op in ("maximum", "minimum", "relu", "clamp", "hardtanh", "relu6", "leaky_relu", "abs"):
        return elementwise(op, params, ties, inputs, grad_output)
    (x,) = inputs
    return windowed(op, params, ties, x, grad_output)
