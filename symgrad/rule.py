"""The rule of a derivation in a few lines: what `symgrad derive` prints first (one screen), before
the step-by-step derivation that `--full` adds.

Every line is read off the Derivation object: the forward (its first step), W's row (the W-form
step where it is short, else the tie policy's formula for the output's max/min), the backward (the
last step, and the op kind's W^T g line) and the value the policy gives at a tie, which is the
final partials evaluated exactly (SymPy) at the kinks of a one-input op, or where every input is
equal and every max/min's pieces tie."""

from __future__ import annotations

import sympy as sp

from . import policy as _policy
from .derivation import Derivation
from .indicators import literal_values
from .ops import Op
from .printers import text

SHORT = 12  # a step with at most this many one-line items is printed whole in the rule
WIDTH = 100  # cli.WIDTH: longer items count as long
COMMAND = "    "  # a command's indent: `symgrad derive` prints such a line whole, never wrapped
TIE_POINT = sp.Integer(0)  # where every input ties, for ops of several inputs


def _items(items, skip=frozenset()) -> list[str]:
    """Each item as `label = formula`; all of them where they are few and short, else the first two."""
    lines = [f"{label.strip()} = {text(expr)}" for label, expr in items if label.strip() not in skip]
    if len(lines) <= SHORT and all(len(ln) <= WIDTH - 14 for ln in lines):
        return lines
    return lines[:2] + ([f"... ({len(lines) - 2} more: --full shows all)"] if len(lines) > 2 else [])


def _labelled(label: str, lines: list[str]) -> list[str]:
    """lines under one label, in a column: `  forward:  y = ...`, continued below it."""
    lead = f"  {label + ':':<10} "
    return [(lead if i == 0 else " " * len(lead)) + ln for i, ln in enumerate(lines)]


def _value(v: sp.Expr) -> str:
    v = sp.simplify(v)
    return repr(float(v)) if v.is_Float else text(v)


def _max_min_nodes(d: Derivation) -> bool:
    """The forward is a nest of max/min of pieces (not unpooling, logsumexp or an expression)."""
    return bool(d.nodes) and all(hasattr(n, "pieces") for n in d.nodes)


def _in_inputs(d: Derivation) -> dict:
    from .docs import _in_inputs as in_inputs  # docs.py holds the node-to-input substitution
    return in_inputs(d)


def _at(d: Derivation, point: dict) -> list[str]:
    """dy/dx = value for each input at point, a few to a line."""
    env = _in_inputs(d)
    values = [f"d{d.output_symbol}/d{s} = {_value(literal_values(p).xreplace(env).xreplace(point))}"
              for s, p in d.partials.items()]
    return [", ".join(values[i:i + 6]) for i in range(0, len(values), 6)]


def _all_tie(d: Derivation, point: dict) -> bool:
    """Every max/min of the forward has all its pieces equal at point."""
    env = _in_inputs(d)
    return all(len({sp.simplify(literal_values(p).xreplace(env).xreplace(point)) for p in node.pieces}) == 1
               for node in d.nodes)


def tie_lines(d: Derivation) -> list[str]:
    """The partials at the ties: at each kink of a one-input op, else where all inputs tie."""
    if not _max_min_nodes(d):
        return []
    if len(d.inputs) == 1:
        from .docs import _kinks
        (x,) = d.inputs
        return [f"at the kink {x} = {text(k)}: {', '.join(_at(d, {x: k}))}" for k in sorted(_kinks(d))]
    point = {x: TIE_POINT for x in d.inputs}
    if not _all_tie(d, point):
        return []
    names = " = ".join(str(x) for x in d.inputs)
    return [f"where every input ties ({names} = {TIE_POINT}):"] + _at(d, point)


def _w_row(op: Op, d: Derivation) -> list[str]:
    w = {s.title: s for s in d.steps}.get("W-form")
    nodes = {str(n.symbol) for n in d.nodes} if _max_min_nodes(d) else set()
    if w is not None and w.items:
        lines = _items(w.items, skip=nodes)
        if not lines[-1].startswith("..."):
            return lines
    if nodes:
        return [_policy.TIES[op.ties].formula(d.output.kind) + f"  (k = 0..{len(d.output.pieces) - 1})"]
    return []


def _is_w_row(d: Derivation) -> bool:
    """One max/min whose pieces are the inputs (a window): its partials, once the delta terms
    cancel (the derivation's check), are W's row, dy/dx_k = w_k."""
    return _max_min_nodes(d) and len(d.nodes) == 1 and list(d.output.pieces) == list(d.inputs)


def _backward(op: Op, d: Derivation, last) -> list[str]:
    """The partials of the output (W's row for a window), else the last step (unpooling, logsumexp)."""
    if _is_w_row(d) and len(d.inputs) > 2:
        return [f"d{d.output_symbol}/dx_k = w_k: W's row is the gradient of the output"]
    if op.spec.strategy.special or not d.partials:
        return _items(last.items)
    out = d.output_symbol if _max_min_nodes(d) else "out"
    return _items([(f"d{out}/d{x}", p) for x, p in d.partials.items()])


def _expression_ties(op: Op) -> list[str]:
    if not op.spec.strategy.expression:
        return []
    return ["each kink under each policy, PyTorch and JAX:",
            f"{COMMAND}symgrad conventions --expr '{op.params['expr']}' --inputs {' '.join(op.params['inputs'])}"]


def rule_lines(op: Op, d: Derivation, full_command: str | None) -> list[str]:
    """The rule section: forward, W's row, backward, the value at a tie, and (full_command not
    None) the command that prints the whole derivation."""
    steps = [s for s in d.steps if s.items]
    lines = ["", "== the rule =="]
    lines += _labelled("forward", _items(steps[0].items))
    lines += _labelled("W's row", _w_row(op, d))
    back = _backward(op, d, steps[-1]) + [ln.strip() for ln in op.spec.strategy.backward(op) if ln.startswith("  ")]
    lines += _labelled("backward", back)
    lines += _labelled("at a tie", tie_lines(d) + _expression_ties(op))
    if full_command:
        lines += ["", "The derivation, step by step:", COMMAND + full_command]
    return lines
