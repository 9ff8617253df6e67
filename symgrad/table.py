"""The conventions table: each op's gradient at ties, kinks, NaN and inf, under each framework
convention and each plain policy, measured by running the generated modules (never typed in)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .conventions import CONVENTIONS
from .policy import POLICIES

INF, NAN = math.inf, math.nan

# (op, params, situation, inputs): the gradient of each input at that point, with grad_output = 1.
SITUATIONS = [
    ("maximum", {}, "a = b", ([1.0], [1.0])),
    ("maximum", {}, "a = NaN, b = 1", ([NAN], [1.0])),
    ("maximum", {}, "a = b = NaN", ([NAN], [NAN])),
    ("minimum", {}, "a = b", ([1.0], [1.0])),
    ("minimum", {}, "a = 1, b = NaN", ([1.0], [NAN])),
    ("relu", {}, "x = 0", ([0.0],)),
    ("relu", {}, "x = NaN", ([NAN],)),
    ("clamp", {"min": 0}, "x = min", ([0.0],)),
    ("clamp", {"min": -1.0, "max": 1.0}, "x = min, max", ([-1.0, 1.0],)),
    ("clamp", {"min": -1.0, "max": 1.0}, "x = NaN", ([NAN],)),
    ("hardtanh", {}, "x = -1, 1", ([-1.0, 1.0],)),
    ("hardtanh", {}, "x = NaN", ([NAN],)),
    ("relu6", {}, "x = 0, 6", ([0.0, 6.0],)),
    ("relu6", {}, "x = NaN", ([NAN],)),
    ("leaky_relu", {}, "x = 0", ([0.0],)),
    ("leaky_relu", {}, "x = NaN, +inf, -inf", ([NAN, INF, -INF],)),
    ("abs", {}, "x = 0, -0.0", ([0.0, -0.0],)),
    ("abs", {}, "x = NaN, +inf", ([NAN, INF],)),
    ("amax", {}, "[1, 1, 0]", ([1.0, 1.0, 0.0],)),
    ("amax", {}, "[1, 1, 1]", ([1.0, 1.0, 1.0],)),
    ("amax", {}, "[NaN, 1, NaN]", ([NAN, 1.0, NAN],)),
    ("amin", {}, "[0, 1, 0]", ([0.0, 1.0, 0.0],)),
    ("amin", {}, "[1, NaN]", ([1.0, NAN],)),
    ("max", {}, "[1, 1, 0]", ([1.0, 1.0, 0.0],)),
    ("max", {}, "[NaN, 1, NaN]", ([NAN, 1.0, NAN],)),
    ("min", {}, "[1, NaN]", ([1.0, NAN],)),
    ("max_pool1d", {"kernel_size": 3}, "[2, 2, 2]", ([[2.0, 2.0, 2.0]],)),
    ("max_pool1d", {"kernel_size": 3}, "[NaN, 1, NaN]", ([[NAN, 1.0, NAN]],)),
    ("max_pool1d", {"kernel_size": 3}, "[NaN, 1, 0]", ([[NAN, 1.0, 0.0]],)),
    ("max_pool1d", {"kernel_size": 2, "padding": 1}, "[-inf, -inf], padding 1", ([[-INF, -INF]],)),
    ("adaptive_max_pool1d", {"output_size": 1}, "[2, 2, 2]", ([[2.0, 2.0, 2.0]],)),
    ("adaptive_max_pool1d", {"output_size": 1}, "[NaN, 1, NaN]", ([[NAN, 1.0, NAN]],)),
    ("adaptive_max_pool1d", {"output_size": 2}, "[1, 3, 1] (windows overlap)", ([[1.0, 3.0, 1.0]],)),
    ("maxout", {"pieces": 2}, "[1, 1]", ([[1.0, 1.0]],)),
    ("maxout", {"pieces": 2}, "[NaN, 1]", ([[NAN, 1.0]],)),
]
# issue 30: fmax/fmin, rrelu, softshrink
SITUATIONS += [
    ("fmax", {}, "a = b", ([1.0], [1.0])),
    ("fmax", {}, "a = NaN, b = 1", ([NAN], [1.0])),
    ("fmax", {}, "a = b = NaN", ([NAN], [NAN])),
    ("fmin", {}, "a = b", ([1.0], [1.0])),
    ("fmin", {}, "a = 1, b = NaN", ([1.0], [NAN])),
    ("rrelu", {}, "x = 0", ([0.0],)),
    ("rrelu", {}, "x = NaN, +inf, -inf", ([NAN, INF, -INF],)),
    ("softshrink", {}, "x = -0.5, 0.5", ([-0.5, 0.5],)),
    ("softshrink", {}, "x = NaN, +inf, -inf", ([NAN, INF, -INF],)),
]
# issue 30: the margin losses (reduction='none'; a ; b ; c for input1 ; input2 ; target)
SITUATIONS += [
    ("l1_loss", {}, "input = target", ([1.0], [1.0])),
    ("l1_loss", {}, "input = NaN, target = 1", ([NAN], [1.0])),
    ("margin_ranking_loss", {}, "input1 = input2, y = 1", ([1.0], [1.0], [1.0])),
    ("margin_ranking_loss", {"margin": 0.5}, "margin = y (input1 - input2)", ([1.5], [1.0], [1.0])),
    ("margin_ranking_loss", {}, "input1 = NaN, y = -1", ([NAN], [1.0], [-1.0])),
]
COLUMNS = list(CONVENTIONS) + list(POLICIES)


def _number(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    f = Fraction(v).limit_denominator(64)
    if float(f) != v:
        return repr(v)
    return str(f.numerator) if f.denominator == 1 else f"{f.numerator}/{f.denominator}"


def _cell(grads) -> str:
    parts = []
    for g in grads:
        flat = [_number(float(v)) for v in np.asarray(g).ravel()]
        parts.append(flat[0] if len(flat) == 1 else "[" + ", ".join(flat) + "]")
    return " ; ".join(parts)


def measure(column: str, op: str, params: dict, inputs) -> str:
    from .api import load
    from .ops import OPS
    if column not in CONVENTIONS and op in OPS and OPS[op].policies and column not in OPS[op].policies:
        return "refused"  # a policy the op does not define (threshold's 'all')
    kw = {"convention": column} if column in CONVENTIONS else {"ties": column}
    module = load(op, **kw, **params)
    index = getattr(module, "INDEX_INPUTS", ())  # (a composed loss's class indices: hinge.py)
    arrays = [np.array(x, dtype=np.int64 if name in index else np.float64)
              for name, x in zip(module.INPUTS, inputs)]
    y, saved = module.forward(*arrays)
    return _cell([g for g in module.backward(np.ones_like(y), saved) if g is not None])


def markdown() -> str:
    head = "| op | at | " + " | ".join(COLUMNS) + " | torch vs jax |"
    rule = "|" + "---|" * (len(COLUMNS) + 3)
    rows = [head, rule]
    for op, params, situation, inputs in SITUATIONS:
        label = op + (f"({', '.join(f'{k}={v}' for k, v in params.items())})" if params else "")
        cells = [measure(c, op, params, inputs) for c in COLUMNS]
        flag = "DIFFER" if cells[COLUMNS.index("torch")] != cells[COLUMNS.index("jax")] else "same"
        rows.append(f"| `{label}` | {situation} | " + " | ".join(cells) + f" | {flag} |")
    notes = ("Gradient of each input with grad_output = 1 (a ; b for two inputs), measured by running "
             "the generated modules; the last column flags where the torch and jax presets differ. "
             "max_pool2d/3d follow max_pool1d. The presets follow reverse mode: PyTorch's forward "
             "mode (torch.func.jvp) of fmax gives a tie to b (0 ; 1), its backward to a (1 ; 0), "
             "which `symgrad.check(..., modes=\"both\")` reports (fmin's two modes agree). "
             "Regenerate with `symgrad conventions --update docs/conventions.md`.")
    return "\n".join(rows) + "\n\n" + notes + "\n"


START = "<!-- conventions-table: generated by `symgrad conventions`; do not edit -->"
END = "<!-- conventions-table: end -->"


def update(text: str, table: str) -> str:
    """text with the block between the markers replaced by table."""
    if START not in text or END not in text:
        raise ValueError("the file has no conventions-table markers")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}{END}{tail}"

# issue 30: the NaN-aware reductions (symgrad/nanreduce.py)
SITUATIONS += [
    ("nanmax", {}, "[1, NaN, 1]", ([1.0, NAN, 1.0],)),
    ("nanmax", {}, "[NaN, NaN]", ([NAN, NAN],)),
    ("nanmax", {}, "[-inf, NaN, -inf]", ([-INF, NAN, -INF],)),
    ("nanmin", {}, "[NaN, 1, 1]", ([NAN, 1.0, 1.0],)),
]

# issue 30: hard activations
SITUATIONS += [
    ("hardsigmoid", {}, "x = -3, 3", ([-3.0, 3.0],)),
    ("hardsigmoid", {}, "x = NaN, +inf, -inf", ([NAN, INF, -INF],)),
]
SITUATIONS += [
    ("threshold", {"threshold": 1, "value": 5}, "x = 1 (the threshold)", ([1.0],)),
    ("threshold", {"threshold": 1, "value": 5}, "x = NaN, +inf, -inf", ([NAN, INF, -INF],)),
]
SITUATIONS += [  # issue 30: hardshrink
    ("hardshrink", {}, "x = -0.5, 0.5", ([-0.5, 0.5],)),
    ("hardshrink", {}, "x = NaN, +inf, -inf", ([NAN, INF, -INF],)),
]

# issue 30: the hinge losses (symgrad/hinge.py, composed: the target selects and has no gradient,
# so a cell holds the input's gradient only)
SITUATIONS += [
    ("hinge_embedding_loss", {}, "x = margin (1), t = -1", ([1.0], [-1.0])),
    ("hinge_embedding_loss", {}, "x = NaN, t = -1, 0", ([NAN, NAN], [-1.0, 0.0])),
    ("multi_margin_loss", {}, "x = [1, 0], y = 0 (z = 0)", ([[1.0, 0.0]], [0])),
    ("multi_margin_loss", {}, "x = [1, NaN], y = 0", ([[1.0, NAN]], [0])),
]
SITUATIONS += [  # issue 30: hardswish
    ("hardswish", {}, "x = -3, 3", ([-3.0, 3.0],)),
    ("hardswish", {}, "x = NaN, +inf, -inf", ([NAN, INF, -INF],)),
]
SITUATIONS += [  # issue 30: elu
    ("elu", {"alpha": 2.5}, "x = 0 (alpha = 2.5)", ([0.0],)),
    ("elu", {"alpha": 2.5}, "x = NaN, +inf, -inf (alpha = 2.5)", ([NAN, INF, -INF],)),
]
