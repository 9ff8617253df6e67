"""Derivation of the two ops that are not a max/min of pieces: max_unpool*d and logsumexp.

SymPy objects only, like ``derive``; ``derive.derive`` hands these kinds over to here.

max_unpool*d (kind "unpool").  In one plane, output slot j receives the input elements whose
index is j.  Written in the W-matrix view, y = W x with W[j, i] a product of indicators of
index equalities: [idx_i = j] times, for the policies that keep one writer of a slot,
[idx_k != j] for every other element k that would take the slot over (earlier ones for
'first', later ones for 'last').  W does not depend on x (indices are integers, not
differentiable), so dy/dx = W exactly and backward is W^T g: a gather,
grad_x[i] = g[idx_i] (times i's weight in its slot).  The derivation is carried out on a
representative plane of 2 input elements and 3 output slots with symbolic indices, and checked
on every assignment of the indices: W x is the forward (the writes in row-major order), W is the
Jacobian of that forward (for 'first' and 'last'), and W^T g is the gather.

logsumexp (kind "logsumexp").  y = t log(sum_i exp(x_i / t)); dy/dx_i = exp(x_i / t) / sum_k
exp(x_k / t) = exp((x_i - y) / t), softmax(x / t).  The derivation shows the stable form (any
shift m leaves y unchanged), that the gradient sums to 1, and the limit t -> 0+ on a window with
a 2-way tie above a smaller element: the gradient tends to (1/2, 1/2, 0), the split policy's W
of that window (policy.weights, evaluated there), and y tends to the max.
"""

from __future__ import annotations

import functools
import itertools

import sympy as sp

from . import policy as _policy
from .derivation import Derivation, Step
from .ops import Op

UNPOOL_INPUTS = 2  # representative plane: input elements
UNPOOL_SLOTS = 3  # and output slots
LSE_WINDOW = 3  # representative logsumexp window


def unpool_symbols():
    xs = sp.symbols(f"x0:{UNPOOL_INPUTS}", real=True)
    idx = sp.symbols(f"i0:{UNPOOL_INPUTS}", integer=True, nonnegative=True)
    gs = sp.symbols(f"g0:{UNPOOL_SLOTS}", real=True)
    return xs, idx, gs


def unpool_weights(idx, slots: int, ties: str) -> sp.Matrix:
    """W[j, i] for a plane of len(idx) elements written into `slots` slots, under a policy."""
    n = len(idx)

    policy = _policy.TIES[ties]

    def w(j, i):
        e = sp.KroneckerDelta(idx[i], j)
        for k in policy.writer_excluded_by(i, n):
            e *= 1 - sp.KroneckerDelta(idx[k], j)
        return e

    return sp.Matrix(slots, n, lambda j, i: w(j, i))


def _writes(x, idx, slots: int, keep: str) -> list:
    """The forward as a program: zeros, then the writes in row-major order of the input; of
    several writes to one slot the first or the last stays."""
    out = [sp.S.Zero] * slots
    done = [False] * slots
    for i in range(len(x)):
        j = idx[i]
        if keep == "last" or not done[j]:
            out[j] = x[i]
            done[j] = True
    return out


@functools.lru_cache(maxsize=8)
def _unpool(ties: str):
    xs, idx, gs = unpool_symbols()
    W = unpool_weights(idx, UNPOOL_SLOTS, ties)
    y = W * sp.Matrix(xs)
    jac = y.jacobian(sp.Matrix(xs))
    back = W.T * sp.Matrix(gs)
    steps = [
        Step("forward", "one plane: input x0, x1 written into 3 slots at indices i0, i1 (zeros "
             "elsewhere)", tuple((f"y_{j}", y[j]) for j in range(UNPOOL_SLOTS))),
        Step("W-form", {"first": "first: slot j keeps the first writer, W[j,i] = [i_i = j] * "
                                 "prod_{k<i} [i_k != j]",
                        "last": "last: slot j keeps the last writer, W[j,i] = [i_i = j] * "
                                "prod_{k>i} [i_k != j]",
                        "all": "all: W[j,i] = [i_i = j] (the selection matrix; every writer of a "
                               "slot gets its gradient)"}[ties],
             tuple((f"W[{j},{i}]", W[j, i]) for j in range(UNPOOL_SLOTS) for i in range(UNPOOL_INPUTS))),
        Step("derivative", "the indices are integers, not differentiable, so dy_j/dx_i = W[j,i]: no "
             "DiracDelta arises", tuple((f"dy_{j}/dx{i}", jac[j, i]) for j in range(UNPOOL_SLOTS)
                                        for i in range(UNPOOL_INPUTS))),
        Step("backward", "grad_x = W^T g: a gather, grad_x[i] = g[i_i] (times x_i's weight in its slot)",
             tuple((f"grad_x{i}", back[i]) for i in range(UNPOOL_INPUTS))),
    ]
    # checks on every assignment of the indices
    unique = dup = 0
    for assign in itertools.product(range(UNPOOL_SLOTS), repeat=UNPOOL_INPUTS):
        env = dict(zip(idx, assign))
        Wv = W.xreplace(env)
        program = sp.Matrix(_writes(xs, assign, UNPOOL_SLOTS, _policy.TIES[ties].keeps))
        if list(Wv * sp.Matrix(xs)) != list(program) and (ties != "all" or len(set(assign)) == len(assign)):
            raise AssertionError(f"unpool {ties}: W x != the writes at indices {assign}")
        if ties != "all" or len(set(assign)) == len(assign):
            if program.jacobian(sp.Matrix(xs)) != Wv:
                raise AssertionError(f"unpool {ties}: the Jacobian of the writes != W at {assign}")
        gather = [gs[j] for j in assign]
        bv = list(Wv.T * sp.Matrix(gs))
        if len(set(assign)) == len(assign) or ties == "all":
            if bv != gather:
                raise AssertionError(f"unpool {ties}: W^T g != the gather at {assign}")
        lhs = sp.expand((Wv * sp.Matrix(xs)).dot(sp.Matrix(gs)))
        rhs = sp.expand(sp.Matrix(xs).dot(sp.Matrix(bv)))
        if lhs != rhs:
            raise AssertionError(f"unpool {ties}: <W x, g> != <x, W^T g> at {assign}")
        unique += len(set(assign)) == len(assign)
        dup += len(set(assign)) != len(assign)
    checks = [
        f"all {unique + dup} index assignments of a plane of {UNPOOL_INPUTS} elements into "
        f"{UNPOOL_SLOTS} slots: <W x, g> = <x, W^T g> (W^T is the adjoint)",
        f"the {unique} assignments without duplicates: W x is the forward's writes, W its Jacobian "
        f"and W^T g the gather g[i] (every policy gives the same W there)",
    ]
    if ties == "all":
        checks.append(f"the {dup} assignments with duplicates: W^T g is the gather to each writer "
                      f"(PyTorch's backward); the forward keeps the last write, whose Jacobian "
                      f"sends the slot's gradient to the last writer only, so under 'all' backward is "
                      f"that Jacobian's transpose only where writers of a slot hold equal values (as "
                      f"after max_pool, whose overlapping windows pick one element twice)")
    else:
        checks.append(f"the {dup} assignments with duplicates: W x is the forward keeping the {ties} "
                      f"write, W its Jacobian, so backward W^T g is its exact adjoint")
    return xs, y, jac, steps, checks


def lse_symbols():
    xs = sp.symbols(f"x0:{LSE_WINDOW}", real=True)
    t = sp.Symbol("t", positive=True)
    return xs, t


@functools.lru_cache(maxsize=4)
def _logsumexp():
    xs, t = lse_symbols()
    m = sp.Symbol("m", real=True)
    d = sp.Symbol("d", positive=True)
    S = sp.Add(*[sp.exp(x / t) for x in xs])
    y = t * sp.log(S)
    grads = [sp.diff(y, x) for x in xs]
    ysym = sp.Symbol("y", real=True)
    soft = [sp.exp((x - ysym) / t) for x in xs]
    for g, s in zip(grads, soft):
        if sp.simplify(g - s.xreplace({ysym: y})) != 0:
            raise AssertionError(f"logsumexp: {g} is not {s}")
    total = sp.simplify(sp.Add(*grads))
    if total != 1:
        raise AssertionError(f"logsumexp: the gradient sums to {total}, not 1")
    shifted = m + t * sp.log(sp.Add(*[sp.exp((x - m) / t) for x in xs]))
    if sp.simplify(sp.expand_log(y - shifted, force=True)) != 0:
        raise AssertionError("logsumexp: the shifted form differs")
    # the limit t -> 0+ at a 2-way tie above a smaller element: x = (m, m, m - d), d > 0
    tie = {xs[0]: m, xs[1]: m, xs[2]: m - d}
    at_tie = [sp.simplify(g.xreplace(tie)) for g in grads]
    limits = [sp.limit(e, t, 0, "+") for e in at_tie]
    y_tie = sp.simplify(y.xreplace(tie))
    y_limit = sp.limit(y_tie, t, 0, "+")
    # the split policy's W of this window, from policy.weights, at the same point (numbers)
    split = [w.xreplace({xs[0]: 1, xs[1]: 1, xs[2]: 0}) for w in _policy.weights(xs, "split", "max")]
    if limits != split:
        raise AssertionError(f"logsumexp: the t -> 0+ limit {limits} is not the split W {split}")
    if y_limit != m:
        raise AssertionError(f"logsumexp: y tends to {y_limit}, not max = {m}")
    # and with one strict maximum: x = (m, m - d, m - 2d) -> (1, 0, 0)
    one = {xs[0]: m, xs[1]: m - d, xs[2]: m - 2 * d}
    limits1 = [sp.limit(sp.simplify(g.xreplace(one)), t, 0, "+") for g in grads]
    split1 = [w.xreplace({xs[0]: 2, xs[1]: 1, xs[2]: 0}) for w in _policy.weights(xs, "split", "max")]
    if limits1 != split1:
        raise AssertionError(f"logsumexp: the t -> 0+ limit {limits1} is not the split W {split1}")
    steps = [
        Step("forward", "the smooth max of a representative window x0, x1, x2 (the rule is the same "
             "for every length), temperature t > 0", (("y", y),)),
        Step("stable form", "any shift m leaves y unchanged; the code takes m = max(x) (0 where it is "
             "infinite), so every exp is at most 1", (("y", shifted),)),
        Step("derivative", "dy/dx_i = exp(x_i/t) / sum_k exp(x_k/t) = exp((x_i - y)/t): softmax(x/t), "
             "summing to 1", tuple((f"dy/dx{i}", g) for i, g in enumerate(grads))
             + tuple((f"dy/dx{i} (as computed)", s) for i, s in enumerate(soft))),
        Step("limit t -> 0+", "at a 2-way tie above a smaller element, x = (m, m, m - d) with d > 0, "
             "the gradient tends to the split policy's W (1/k on the k tied maxima, 0 elsewhere) and "
             "y to the max",
             tuple((f"dy/dx{i} at the tie", e) for i, e in enumerate(at_tie))
             + tuple((f"lim dy/dx{i}", e) for i, e in enumerate(limits))
             + tuple((f"split w_{i}", e) for i, e in enumerate(split))
             + (("y at the tie", y_tie), ("lim y", y_limit))),
    ]
    checks = [
        "dy/dx_i = exp((x_i - y)/t) for every i, and sum_i dy/dx_i = 1 (SymPy simplify)",
        "m + t log(sum_i exp((x_i - m)/t)) = y for a symbolic shift m",
        f"lim t->0+ of the gradient at (m, m, m - d) = {limits} = the split policy's W there; "
        f"at (m, m - d, m - 2d) = {limits1}; lim y = m (SymPy limit)",
    ]
    return xs, t, y, grads, soft, steps, checks, limits, split


def derive_special(op: Op):
    """The Derivation of an unpool or logsumexp op (no max/min nodes: ``nodes`` is empty)."""
    if op.spec.strategy.scatter:  # unpooling
        xs, y, jac, steps, checks = _unpool(op.ties)
        partials = {x: sp.Matrix(jac[:, i]) for i, x in enumerate(xs)}
        return Derivation(op, xs, y, [], partials, list(steps), list(checks))
    xs, t, y, grads, soft, steps, checks, _, _ = _logsumexp()
    return Derivation(op, xs, y, [], dict(zip(xs, grads)), list(steps), list(checks))
