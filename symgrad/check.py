"""A gradient checker that works at ties and kinks.

``symgrad.check(fn, *inputs, ties=None)`` checks the gradient that ``fn``'s backward gives at
``inputs`` (small inputs: it makes a few forward calls per input element), exactly where finite
differences alone cannot: at elements tied for a window's extremum and at the kinks of
elementwise ops.  It does not read the gradient code under test; it finds the structure by
probing the forward:

1. One-sided finite differences of every output in every input element (second order, from
   steps of 2**-12 and 2**-11 on each side, exact on the small dyadic values tests use) give D+
   and D-.  An output is smooth in an element when they agree (to 2**-7, relative: a smooth
   function's curvature moves them apart by O(2**-24));
   where they differ the element sits at a tie or a kink.
2. A tie: two or more elements of one output's window at a kink together.  The claimed policy's
   winner (first/last in the window's order: the inputs' order, then row-major order, as symgrad
   and the frameworks scan windows) is perturbed by 2**-5 in the direction that makes it the
   strict winner, and the gradient there (finite differences again, now off the tie) is what
   backward must give; split averages that over every tied element made the winner in turn; all
   sums it (and is reported as not a subgradient: its mass exceeds the upstream gradient).
3. A kink of one element (relu at 0, abs at 0, clamp at a bound): the policy picks among the
   op's tied pieces in the order of its definition (``symgrad.ops``; the argument order setting
   applies): first/last must equal the one-sided derivative on the side where that piece wins,
   split their average, all their sum.  Without an op definition (a user function), first/last
   must equal one of the two one-sided derivatives.  A join with one slope (celu at 0, elu with
   alpha 1: a kink of the second derivative only), where the differences agree, is found from
   the definition (a max/min node of the element tied there) and checked as a kink.
4. Mass: the gradients of a tied window's elements add up to the window's derivative along
   moving all its elements together (the upstream gradient), except under all.
5. Unpooling: writers of one slot (repeated indices) tie; only the writer that stays moves the
   output, so the policy's writer is found from the indices.

Elements and outputs touching NaN or an infinity are not checkable and are counted as skipped.
What it decides: ops where each output is one max/min over elements (windows, reductions,
elementwise max/min of inputs) or an elementwise function with kinks, as every catalog op is.  An
expression where one element enters several max/min nodes that tie at once is outside that model
(the side that makes an element the strict winner of one node may change another): its report is
not meaningful there.

``fn`` is one of: a generated module (``symgrad.load``), a ``symgrad.torch`` op or any function
of torch tensors with autograd, a ``symgrad.jax`` op or any differentiable JAX function, a pair
``(forward, vjp)`` of NumPy functions (``forward(*xs) -> y``, ``vjp(g, *xs) -> gradients``), or an
object with the generated modules' ``forward(*xs) -> (y, saved)`` and ``backward(g, saved)``.
``op=`` (and ``params``) name the symgrad op a user function computes, for its kinks' pieces.

``modes`` says which mode's derivative is checked: ``"reverse"`` (the default: backward, the
vjp), ``"forward"`` (the jvp: a module's ``jvp``, a ``symgrad.torch`` op's ``jvp``,
``torch.func.jvp``, ``jax.jvp``, or a ``(forward, vjp, jvp)`` triple's third function,
``jvp(tangents, *xs)`` with a tangent per input, None for the non-float ones) against the policy as
above, or ``"both"``: the reverse checks, and forward mode against reverse mode.  For every
checked output o and every element e it depends on (ties and kinks included), the probes t = +-e_e
and g = e_o must give <jvp(t), g> == <t, vjp(g)>; each disagreement is a failure of kind
``"modes"`` (expected: reverse mode's value, got: forward mode's).  PyTorch 2.13's ``fmax`` fails
it at a tie: reverse mode gives (1, 0), forward mode (0, 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .ops import OPS, resolve
from .policy import POLICIES

MODES = ("reverse", "forward", "both")
H = 2.0 ** -12  # finite-difference step
DELTA = 2.0 ** -5  # how far a tied element is moved to make it the strict winner
KINK = 2.0 ** -7  # one-sided derivatives further apart than this (relative) are a kink


@dataclass(frozen=True)
class Failure:
    """One gradient entry that differs from what the policy says."""

    input: str  # the input's name
    index: tuple  # the element of that input
    output: tuple  # the output element whose gradient it is
    expected: float
    got: float
    kind: str  # "smooth", "tie", "kink", "mass", "unpool", "modes"
    detail: str

    def __str__(self) -> str:
        return (f"{self.input}{list(self.index)} <- output{list(self.output)}: expected "
                f"{self.expected!r}, got {self.got!r} ({self.kind}: {self.detail})")


@dataclass
class Report:
    """What check found: ``ok``, the failures, and counts of what was checked."""

    ties: str
    ok: bool = True
    failures: list = field(default_factory=list)
    outputs: int = 0  # output elements checked
    tied_windows: int = 0
    kinks: int = 0
    skipped: int = 0  # output elements touching NaN or an infinity
    not_subgradient: int = 0  # tied windows whose gradient mass exceeds the upstream gradient ('all')
    modes: str = "reverse"  # the mode(s) checked: reverse, forward or both
    compared: int = 0  # (output, element) entries where forward and reverse mode were compared ('both')

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        modes = {"reverse": "", "forward": ", forward mode", "both": ", forward and reverse mode"}[self.modes]
        head = (f"symgrad.check ({self.ties}{modes}): {'ok' if self.ok else f'{len(self.failures)} failure(s)'}; "
                f"{self.outputs} outputs, {self.tied_windows} tied windows, {self.kinks} kinks, "
                f"{self.skipped} skipped (NaN/inf)")
        if self.modes == "both":
            head += f"; {self.compared} entries compared between forward and reverse mode"
        if self.not_subgradient:
            head += f"; {self.not_subgradient} tied windows not a subgradient (policy 'all')"
        return "\n".join([head] + [f"  {f}" for f in self.failures[:20]])

    def _fail(self, failure: Failure) -> None:
        self.ok = False
        self.failures.append(failure)


# ----------------------------------------------------------------------------- adapting fn

class _Target:
    """fn as forward(xs) -> y, vjp(xs, g) -> gradients and jvp(xs, ts) -> y's tangent (None
    where fn has no forward mode), on float64 NumPy arrays."""

    def __init__(self, fn, inputs):
        self.names = tuple(getattr(fn, "INPUTS", None) or getattr(fn, "inputs", None) or
                           [f"input{k}" for k in range(len(inputs))])
        kind = _kind(fn, inputs)
        self.op = getattr(fn, "OP", None) or getattr(fn, "op", None)
        self.params = getattr(fn, "PARAMS", None) or getattr(fn, "params", None) or {}
        self.ties = getattr(fn, "TIES", None) or getattr(fn, "ties", None)
        self.module = fn if kind == "module" else getattr(fn, "module", None)
        # inputs the op defines as having no gradient (fractional pooling's samples): not probed
        spec = OPS.get(self.op) if isinstance(self.op, str) else None
        self.constant = spec.constant_inputs if spec is not None and "expr" not in self.params else ()
        self.kind = kind
        if kind == "jax":  # jax.vjp of a symgrad.jax op refuses to differentiate its constant inputs
            skip = {k for k, n in enumerate(self.names) if n in self.constant}
            self.forward, self.vjp, self.jvp = _jax_calls(fn, skip)
        else:
            self.forward, self.vjp, self.jvp = {"module": _module_calls, "torch": _torch_calls,
                                                "pair": _pair_calls}[kind](fn)


def _kind(fn, inputs) -> str:
    if isinstance(fn, tuple) and len(fn) in (2, 3) and all(callable(f) for f in fn):
        return "pair"
    if hasattr(fn, "forward") and hasattr(fn, "backward") and not callable(fn):
        return "module"
    roots = {type(x).__module__.partition(".")[0] for x in inputs}
    if "torch" in roots or type(fn).__module__ == "symgrad.torch":
        return "torch"
    if "jax" in roots or "jaxlib" in roots or type(fn).__module__ == "symgrad.jax":
        return "jax"
    raise TypeError("symgrad.check: fn must be a generated module, a (forward, vjp[, jvp]) tuple of NumPy "
                    "functions, or a torch/JAX function given torch/JAX inputs; got "
                    f"{type(fn).__name__} with inputs of type {', '.join(sorted(roots))}")


def _module_calls(m):
    def forward(xs):
        y = m.forward(*xs)[0]  # with return_indices=True: (output, indices)
        return np.asarray(y[0] if isinstance(y, tuple) else y, dtype=np.float64)

    def vjp(xs, g):
        _, saved = m.forward(*xs)
        return list(m.backward(g, saved))

    def jvp(xs, ts):
        _, saved = m.forward(*xs)
        return np.asarray(m.jvp(*ts, saved), dtype=np.float64)
    return forward, vjp, (jvp if callable(getattr(m, "jvp", None)) else None)


def _pair_calls(pair):
    fwd, vjp = pair[:2]
    jvp = (lambda xs, ts: np.asarray(pair[2](ts, *xs), dtype=np.float64)) if len(pair) == 3 else None
    return (lambda xs: np.asarray(fwd(*xs), dtype=np.float64),
            lambda xs, g: list(vjp(g, *xs)), jvp)


def _torch_calls(fn):
    import torch

    def tensors(xs, grad=False):
        return [torch.tensor(x, requires_grad=grad and x.dtype.kind == "f") for x in xs]

    def forward(xs):
        with torch.no_grad():
            return fn(*tensors(xs)).numpy().astype(np.float64)

    def vjp(xs, g):
        ts = tensors(xs, grad=True)
        floats = [t for t in ts if t.requires_grad]
        grads = iter(torch.autograd.grad(fn(*ts), floats, torch.tensor(g), allow_unused=True))
        out = []
        for t in ts:
            if not t.requires_grad:
                out.append(None)
                continue
            d = next(grads)
            out.append(np.zeros(t.shape) if d is None else d.numpy())
        return out

    def jvp(xs, ts):
        primals = tensors(xs)
        if type(fn).__module__ == "symgrad.torch" and callable(getattr(fn, "jvp", None)):
            # a symgrad.torch op: its operators have no forward-mode formula; its jvp runs the module's
            tangents = [None if t is None else torch.tensor(t) for t in ts]
            return fn.jvp(tangents, primals).detach().numpy().astype(np.float64)
        floats = [k for k, t in enumerate(ts) if t is not None]

        def of_floats(*fs):
            args = list(primals)
            for k, f in zip(floats, fs):
                args[k] = f
            return fn(*args)
        try:
            _, out = torch.func.jvp(of_floats, tuple(primals[k] for k in floats),
                                    tuple(torch.tensor(ts[k]) for k in floats))
        except Exception as e:  # noqa: BLE001 - any failure of forward mode is fn's
            raise TypeError("symgrad.check: this mode needs fn's forward mode, and torch.func.jvp of fn "
                            f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        return out.detach().numpy().astype(np.float64)
    return forward, vjp, jvp


def _jax_calls(fn, skip=frozenset()):
    import jax
    import jax.numpy as jnp

    def forward(xs):
        return np.asarray(fn(*[jnp.asarray(x) for x in xs]), dtype=np.float64)

    def vjp(xs, g):
        floats = [k for k, x in enumerate(xs) if x.dtype.kind == "f" and k not in skip]

        def of_floats(*fs):
            args = list(xs)
            for k, f in zip(floats, fs):
                args[k] = f
            return fn(*[jnp.asarray(a) for a in args])
        _, pull = jax.vjp(of_floats, *[jnp.asarray(xs[k]) for k in floats])
        grads = iter(pull(jnp.asarray(g)))
        return [np.asarray(next(grads)) if k in floats else None for k in range(len(xs))]

    def jvp(xs, ts):
        floats = [k for k, t in enumerate(ts) if t is not None]

        def of_floats(*fs):
            args = list(xs)
            for k, f in zip(floats, fs):
                args[k] = f
            return fn(*[jnp.asarray(a) for a in args])
        try:
            _, out = jax.jvp(of_floats, tuple(jnp.asarray(xs[k]) for k in floats),
                             tuple(jnp.asarray(ts[k]) for k in floats))
        except Exception as e:  # noqa: BLE001 - any failure of forward mode is fn's
            raise TypeError("symgrad.check: this mode needs fn's forward mode, and jax.jvp of fn "
                            f"failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
        return np.asarray(out, dtype=np.float64)
    return forward, vjp, jvp


def _as_arrays(inputs) -> list:
    out = []
    for x in inputs:
        if type(x).__module__.partition(".")[0] == "torch":
            x = x.detach().cpu().numpy()
        x = np.asarray(x)
        out.append(x.astype(np.float64) if x.dtype.kind == "f" else x)
    return out


# ----------------------------------------------------------------------------- the checker

def check(fn, *inputs, ties: str | None = None, op: str | None = None, params: dict | None = None,
          order: str | None = None, rtol: float = 1e-6, atol: float = 1e-9, modes: str = "reverse") -> Report:
    """Check fn's gradient at these inputs, ties and kinks included, against the tie policy
    ``ties`` (default: the one fn carries, as generated modules and symgrad ops do).  ``modes``:
    "reverse" (backward), "forward" (the jvp) or "both" (backward, and the jvp against it).
    Returns a Report; ``bool(report)`` is whether every checked entry matched."""
    if not inputs:
        raise ValueError("symgrad.check: give the inputs to check the gradient at")
    if not isinstance(modes, str) or modes not in MODES:
        raise ValueError(f"symgrad.check: modes must be one of {', '.join(MODES)}, got {modes!r}")
    xs = _as_arrays(inputs)
    target = _Target(fn, inputs)
    ties = ties or target.ties
    if ties not in POLICIES:
        raise ValueError(f"symgrad.check: ties must be one of {', '.join(POLICIES)} (or carried by fn), "
                         f"got {ties!r}")
    if modes != "reverse" and target.jvp is None:
        has = "a (forward, vjp) pair" if target.kind == "pair" else "a module without jvp"
        raise TypeError(f"symgrad.check: modes={modes!r} needs fn's forward mode, and {has} has none; "
                        "give a module with jvp, a (forward, vjp, jvp) triple, or a torch/JAX function")
    report = Report(ties, modes=modes)
    target.rank_sign = _rank_sign(op or target.op, params if params is not None else target.params)
    pieces = _Pieces.of(op or target.op, params if params is not None else target.params,
                        order or getattr(target.module, "ORDER", None), ties)
    y0 = target.forward(xs)
    floats = [k for k, x in enumerate(xs) if x.dtype.kind == "f" and
              (k >= len(target.names) or target.names[k] not in target.constant)]
    elements = [(k, i) for k in floats for i in np.ndindex(xs[k].shape)]
    m = y0.size
    W = F = N = None
    if modes != "forward":  # W: row o is the gradient that backward gives for upstream gradient e_o
        W = np.zeros((m, len(elements)))
        for o in range(m):
            g = np.zeros(y0.shape)
            g.reshape(-1)[o] = 1.0
            grads = target.vjp([x.copy() for x in xs], g.astype(_dtype(y0, xs)))
            W[o] = [np.asarray(grads[k], dtype=np.float64)[i] for k, i in elements]
    if modes != "reverse":  # F (N): column e is the jvp's output tangent for the tangent +e (-e)
        F = _jvp_columns(target, xs, elements, y0, 1.0)
        N = _jvp_columns(target, xs, elements, y0, -1.0) if modes == "both" else None
    Dp, Dm = _one_sided(target, xs, elements, y0)
    writers = _unpool_writers(target, xs, y0)
    for o in range(m):
        checked = _check_output(report, target, xs, elements, y0, o, (F if W is None else W)[o], Dp[o], Dm[o],
                                ties, pieces, writers.get(o), rtol, atol)
        if checked and modes == "both":
            _compare_modes(report, target, elements, y0, o, W[o], F[o], N[o], Dp[o], Dm[o], writers.get(o),
                           rtol, atol)
    return report


def _jvp_columns(target, xs, elements, y0, sign):
    """(outputs, elements): column e is jvp's output tangent for the tangent sign * e_e."""
    F = np.zeros((y0.size, len(elements)))
    for e, (k, i) in enumerate(elements):
        ts = [np.zeros(x.shape, dtype=x.dtype) if x.dtype.kind == "f" and
              (j >= len(target.names) or target.names[j] not in target.constant) else None
              for j, x in enumerate(xs)]
        ts[k][i] = sign
        F[:, e] = np.asarray(target.jvp([x.copy() for x in xs], ts), dtype=np.float64).reshape(-1)
    return F


def _compare_modes(report, target, elements, y0, o, w, f, n, dp, dm, slot_writers, rtol, atol):
    """Forward mode against reverse mode at output o: <jvp(+-e), e_o> == <+-e, vjp(e_o)> for
    every element e that o depends on in either mode or in its finite differences."""
    out_index = tuple(int(v) for v in np.unravel_index(o, y0.shape))
    deps = [e for e in range(len(elements)) if dp[e] != 0 or dm[e] != 0 or w[e] != 0 or f[e] != 0 or n[e] != 0]
    kinks = [e for e in deps if _kink(dp[e], dm[e])]
    if slot_writers is not None and len(slot_writers) > 1:
        where = lambda e: f"at a slot of {len(slot_writers)} writers"  # noqa: E731
    else:
        where = lambda e: (f"at a tie of {len(kinks)} elements" if len(kinks) >= 2 and e in kinks  # noqa: E731
                           else "at a kink" if e in kinks else "away from ties and kinks")
    for e in deps:
        report.compared += 1
        for sign, got in ((1.0, f[e]), (-1.0, n[e])):
            expected = sign * w[e]
            if (np.isnan(expected) and np.isnan(got)) or _close(got, expected, rtol, atol):
                continue
            d = "+e" if sign > 0 else "-e"
            report._fail(Failure(target.names[elements[e][0]], tuple(int(v) for v in elements[e][1]), out_index,
                                 float(expected), float(got), "modes",
                                 f"forward mode <jvp({d}), e_o> = {float(got)!r}, reverse mode "
                                 f"<{d}, vjp(e_o)> = {float(expected)!r}, {where(e)}"))
            break  # one failure per entry: the -e probe only adds news when +e agrees


def _dtype(y0, xs):
    floats = [x.dtype for x in xs if x.dtype.kind == "f"]
    return floats[0] if floats else np.float64


def _moved(xs, k, i, by):
    out = [x.copy() for x in xs]
    out[k][i] = out[k][i] + by
    return out


def _one_sided(target, xs, elements, y0):
    """D+ and D-: (outputs, elements) one-sided differences of second order, each from the points
    x, x +- H and x +- 2H on its side: (-3 f(x) + 4 f(x + H) - f(x + 2H)) / 2H and its mirror, exact
    on a linear piece (and on dyadic inputs), O(H**2) off a curved one (exp, hardswish's
    parabola), where a first-order difference is O(H) off."""
    m = y0.size
    Dp, Dm = np.zeros((m, len(elements))), np.zeros((m, len(elements)))
    with np.errstate(invalid="ignore", over="ignore"):
        for e, (k, i) in enumerate(elements):
            for D, side in ((Dp, 1.0), (Dm, -1.0)):
                one, two = (target.forward(_moved(xs, k, i, side * n * H)) for n in (1, 2))
                D[:, e] = (side * (4 * (one - y0) - (two - y0)) / (2 * H)).reshape(-1)
    return Dp, Dm


def _central(target, xs, k, i, o):
    with np.errstate(invalid="ignore", over="ignore"):
        return float((target.forward(_moved(xs, k, i, H)).reshape(-1)[o]
                      - target.forward(_moved(xs, k, i, -H)).reshape(-1)[o]) / (2 * H))


def _kink(dp: float, dm: float) -> bool:
    """The one-sided derivatives differ by more than a smooth function's curvature over H can
    make them (a kink changes the slope by O(1); curvature by O(H))."""
    return abs(dp - dm) > KINK * max(1.0, abs(dp), abs(dm))


def _close(a, b, rtol, atol) -> bool:
    return abs(a - b) <= atol + rtol * abs(b)


def _check_output(report, target, xs, elements, y0, o, w, dp, dm, ties, pieces, slot_writers, rtol, atol):
    out_index = np.unravel_index(o, y0.shape)
    deps = [e for e in range(len(elements)) if dp[e] != 0 or dm[e] != 0 or w[e] != 0]
    values = [xs[elements[e][0]][elements[e][1]] for e in deps]
    if not np.isfinite(y0.reshape(-1)[o]) or not np.all(np.isfinite(values)) or \
            not (np.all(np.isfinite(dp[deps])) and np.all(np.isfinite(dm[deps]))):
        report.skipped += 1
        return False
    report.outputs += 1
    name = lambda e: target.names[elements[e][0]]  # noqa: E731

    def fail(e, expected, kind, detail):
        report._fail(Failure(name(e), tuple(int(v) for v in elements[e][1]), tuple(int(v) for v in out_index),
                             float(expected), float(w[e]), kind, detail))

    if slot_writers is not None and len(slot_writers) > 1:
        _check_unpool_slot(report, elements, w, o, slot_writers, ties, fail, rtol, atol)
        return True
    kinks = [e for e in deps if _kink(dp[e], dm[e])]
    # several elements at a kink of pieces that combine inputs (l1_loss's input - target) are each
    # at a kink of the same node, not elements tied with each other
    tied = kinks if len(kinks) >= 2 and not pieces.combine_inputs() else []
    if target.rank_sign:  # an order statistic: a middle rank of a tie block has no kink to probe
        tied = kinks = _rank_block(target, xs, elements, y0, o)
        deps = sorted(set(deps) | set(tied))
    for e in deps:
        if e in tied:
            continue
        # a join with one slope (celu at 0) is a kink the differences cannot see
        join = e not in kinks and pieces.at_join(xs, elements[e], out_index)
        if e in kinks or join:
            report.kinks += 1
            expected, why = pieces.at_kink(xs, elements[e], out_index, dp[e], dm[e], w[e])
            why += " (pieces joined with one slope)" if join else ""
        else:
            expected, why = (dp[e] + dm[e]) / 2, "central differences"
        if expected is not None and not _close(w[e], expected, rtol, atol):
            fail(e, expected, "kink" if e in kinks or join else "smooth", why)
    if tied:
        _check_tie(report, target, xs, elements, o, w, dp, dm, tied, deps, ties, fail, rtol, atol)
    return True


def _check_tie(report, target, xs, elements, o, w, dp, dm, tied, deps, ties, fail, rtol, atol):
    """Elements tied for one output: perturb the policy's winner(s) into strict winners."""
    report.tied_windows += 1
    order = sorted(tied, key=lambda e: (elements[e][0], elements[e][1]))  # the window's scan order

    def strict(e):
        """The output's derivatives in the tied elements with e made the strict winner."""
        side = 1.0 if abs(dp[e]) >= abs(dm[e]) else -1.0  # the side where e moves the output
        moved = _moved(xs, *elements[e], side * DELTA)
        return {t: _central(target, moved, *elements[t], o) for t in tied}

    if target.rank_sign:  # an order statistic's tie block: its ranks, not one strict winner
        expected, why = _rank_expected(target, xs, elements, o, order, ties)
    elif ties in ("first", "last"):
        winner = order[0] if ties == "first" else order[-1]
        expected = strict(winner)
        why = f"{len(tied)} elements tied: the {ties} ({_where(elements[winner])}) made the strict winner"
    else:
        rows = [strict(e) for e in tied]
        expected = {t: sum(r[t] for r in rows) / (len(rows) if ties == "split" else 1) for t in tied}
        why = (f"{len(tied)} elements tied: the mean over each tied element made the strict winner" if ties == "split"
               else f"{len(tied)} elements tied: the sum over each tied element made the strict winner")
    for t in tied:
        if not _close(w[t], expected[t], rtol, atol):
            fail(t, expected[t], "tie", why)
    # mass: moving the window's elements together moves the output by the upstream gradient
    along = _along(target, xs, elements, deps, o)
    mass = float(sum(w[e] for e in deps))
    if ties == "all":
        if mass > along + atol:
            report.not_subgradient += 1
    elif not _close(mass, along, rtol, atol):
        report._fail(Failure(target.names[elements[tied[0]][0]], tuple(int(v) for v in elements[tied[0]][1]),
                             tuple(int(v) for v in np.unravel_index(o, target.forward(xs).shape)),
                             along, mass, "mass",
                             f"the window's gradients add up to {mass!r}, its upstream gradient is {along!r}"))


def _along(target, xs, elements, deps, o) -> float:
    """The derivative of output o along moving all of deps together (central differences)."""
    def moved(by):
        out = [x.copy() for x in xs]
        for e in deps:
            k, i = elements[e]
            out[k][i] += by
        return target.forward(out).reshape(-1)[o]
    return float((moved(H) - moved(-H)) / (2 * H))


def _where(element) -> str:
    k, i = element
    return f"input {k} at {list(int(v) for v in i)}"


# ----------------------------------------------------------------------------- order statistics

def _rank_sign(name, params) -> int:
    """+1 (largest first) or -1 (smallest first) for sort and topk, whose tied outputs are ranks of
    one tie block; 0 for every other op (cummax/cummin: each output one prefix's extremum)."""
    from .kinds.order import ORDER, cumulative, descending
    if name not in OPS or OPS[name].strategy is not ORDER or cumulative(name):
        return 0
    return 1 if descending(resolve(name, **(params or {}))) else -1


def _rank_block(target, xs, elements, y0, o) -> list:
    """The elements of output o's row (along dim) equal to its value, where two or more are."""
    x = xs[0]
    dim = target.params.get("dim", -1)
    axis = -1 if dim is None else dim % max(x.ndim, 1)  # (a median without dim: every element one row)
    at = tuple(np.unravel_index(o, y0.shape))
    if dim is not None and y0.ndim < x.ndim:  # (kthvalue, median: the ranked dim dropped)
        at = at[:axis] + (0,) + at[axis:]
    value = y0.reshape(-1)[o]
    block = [e for e, (k, i) in enumerate(elements) if k == 0 and x[i] == value
             and (dim is None or all(a == b for d, (a, b) in enumerate(zip(i, at)) if d != axis))]
    return block if len(block) >= 2 else []


def _rank_expected(target, xs, elements, o, order, ties):
    """The derivatives of output o in the t tied elements (order: index order) with the tie made
    strict in the policy's order: first ranks them by index, last by index reversed (each moved
    by at most DELTA, the one ranking first the most); split averages the t rotations of that
    order (each element holds o's rank once), all sums them."""
    t = len(order)

    def strict(seq):
        moved = [x.copy() for x in xs]
        for q, e in enumerate(seq):
            k, i = elements[e]
            moved[k][i] += target.rank_sign * (t - q) * DELTA / t
        return {e: _central(target, moved, *elements[e], o) for e in order}

    if ties in ("first", "last"):
        return strict(order if ties == "first" else order[::-1]), (
            f"{t} elements tied: ranked by index{' reversed' if ties == 'last' else ''}, made strict")
    rows = [strict(order[r:] + order[:r]) for r in range(t)]
    scale = t if ties == "split" else 1
    return ({e: sum(r[e] for r in rows) / scale for e in order},
            f"{t} elements tied: the {'mean' if ties == 'split' else 'sum'} over the {t} rotations of their ranks")


# ----------------------------------------------------------------------------- unpooling

def _unpool_writers(target, xs, y0) -> dict:
    """{output position: [elements]} of the writers of each slot, for unpooling ops (from the
    indices: only the writer that stays moves the output, so probing cannot see the others)."""
    if target.op not in OPS or not OPS[target.op].strategy.scatter:
        return {}
    x, idx = xs[0], xs[1]
    spatial = OPS[target.op].spatial
    planes = int(np.prod(x.shape[:-spatial]))
    n, size = int(np.prod(x.shape[-spatial:])), int(np.prod(y0.shape[-spatial:]))
    flat = idx.reshape(planes, n)
    writers: dict = {}
    for p in range(planes):
        for j in range(n):
            o = p * size + int(flat[p, j])
            writers.setdefault(o, []).append(p * n + j)  # element number among x's elements
    return writers


def _check_unpool_slot(report, elements, w, o, writers, ties, fail, rtol, atol):
    """Writers of one slot tie: first/last keep the first/last write (row-major) and give it the
    slot's gradient; all gives every writer the slot's gradient (not a subgradient)."""
    report.tied_windows += 1
    expected = {e: 0.0 for e in writers}
    if ties == "first":
        expected[writers[0]] = 1.0
    elif ties == "last":
        expected[writers[-1]] = 1.0
    else:
        expected = {e: 1.0 for e in writers}
        report.not_subgradient += 1
    for e, want in expected.items():
        if not _close(w[e], want, rtol, atol):
            fail(e, want, "unpool", f"{len(writers)} writers of one slot, policy {ties}")


# ----------------------------------------------------------------------------- kinks

class _Pieces:
    """An elementwise op's pieces, from its definition (symgrad.ops), to say which one-sided
    derivative the policy's piece has at a kink."""

    def __init__(self, op, ties):
        self.op, self.ties = op, ties
        self._expr = None  # (symbols, the forward expression), made on first use

    @classmethod
    def of(cls, name, params, order, ties):
        if name not in OPS or not OPS[name].strategy.elementwise:
            return cls(None, ties)
        try:
            return cls(resolve(name, ties, order=order, **{k: v for k, v in (params or {}).items()}), ties)
        except (TypeError, ValueError):
            return cls(None, ties)

    def combine_inputs(self) -> bool:
        """Whether a piece of the op's max/min nodes holds several inputs (the losses)."""
        if self.op is None:
            return False
        import sympy as sp

        from .indicators import MaxOf, MinOf
        spec = self.op.spec
        expr = spec.forward(self.op.params, [sp.Symbol(n, real=True) for n in spec.inputs])
        return any(len(a.free_symbols) > 1 for n in sp.preorder_traversal(expr)
                   if isinstance(n, (MaxOf, MinOf)) for a in n.args if not isinstance(a, (MaxOf, MinOf)))

    def at_kink(self, xs, element, out_index, dp, dm, got):
        """(expected gradient, why) at a kink of one element; expected None: anything allowed."""
        if self.ties == "split":
            return (dp + dm) / 2, "the mean of the one-sided derivatives"
        if self.ties == "all":
            return dp + dm, "the sum of the one-sided derivatives"
        side = self._side(xs, element[0], out_index)
        if side is None:
            if _close(got, dp, 1e-9, 1e-12) or _close(got, dm, 1e-9, 1e-12):
                return None, ""
            return dp, f"{self.ties} must be one of the one-sided derivatives {dm!r}, {dp!r}"
        return (dp, f"the {self.ties} piece wins above it") if side > 0 else \
            (dm, f"the {self.ties} piece wins below it")

    def at_join(self, xs, element, out_index) -> bool:
        """Whether the element sits where two pieces of one of the op's max/min nodes in it tie
        although the one-sided differences agree: a join with one slope (celu at 0, elu with
        alpha 1), a kink of the second derivative only, where the policy still decides (all: the
        pieces' sum).  False without the op's definition."""
        if self.op is None:
            return False
        symbols, expr, env = self._definition(xs, out_index)
        node = _tied_node(expr, env)
        return node is not None and symbols[element[0]] in node.free_symbols

    def _definition(self, xs, out_index):
        """(the inputs' symbols, the op's forward expression, the symbols' values at out_index)."""
        import sympy as sp

        from .indicators import MaxOf, MinOf
        spec = self.op.spec
        if self._expr is None:
            symbols = [sp.Symbol(n, real=True) for n in spec.inputs]
            expr = spec.forward(self.op.params, symbols)
            if self.op.order == "reversed":
                expr = expr.replace(lambda e: isinstance(e, (MaxOf, MinOf)), lambda e: e.func(*reversed(e.args)))
            self._expr = (symbols, expr)
        symbols, expr = self._expr
        shape = np.broadcast_shapes(*[x.shape for x in xs])
        return symbols, expr, {s: float(np.broadcast_to(x, shape)[out_index]) for s, x in zip(symbols, xs)}

    def _side(self, xs, k, out_index):
        """+1 when the policy's piece of the tied node wins above the kink (input k moving up),
        -1 below, None when the op's definition is not known."""
        if self.op is None:
            return None
        from .indicators import MaxOf
        symbols, expr, env = self._definition(xs, out_index)
        node = _tied_node(expr, env)
        if node is None:
            return None
        vals = [_value(a, env) for a in node.args]
        ext = max(vals) if isinstance(node, MaxOf) else min(vals)
        tied = [a for a, v in zip(node.args, vals) if v == ext]
        chosen = tied[0] if self.ties == "first" else tied[-1]
        # the chosen piece wins on the side where it beats the other tied pieces
        up = {**env, symbols[k]: env[symbols[k]] + DELTA}
        c = _value(chosen, up)
        rest = [_value(a, up) for a in tied if a is not chosen]
        beats = all(c > r for r in rest) if isinstance(node, MaxOf) else all(c < r for r in rest)
        return 1 if beats else -1


def _tied_node(expr, env):
    """The innermost max/min node of expr whose arguments tie at env (the kink's node)."""
    from .indicators import MaxOf, MinOf
    found = None
    for node in _preorder(expr):
        if isinstance(node, (MaxOf, MinOf)):
            vals = [_value(a, env) for a in node.args]
            ext = max(vals) if isinstance(node, MaxOf) else min(vals)
            if sum(v == ext for v in vals) >= 2:
                found = node
    return found


def _value(expr, env) -> float:
    """The value of an op definition's expression (max/min nodes as max/min)."""
    from .indicators import MaxOf, MinOf
    if isinstance(expr, (MaxOf, MinOf)):
        vals = [_value(a, env) for a in expr.args]
        return max(vals) if isinstance(expr, MaxOf) else min(vals)
    return float(expr.xreplace(env))


def _preorder(expr):
    yield expr
    for a in expr.args:
        yield from _preorder(a)
