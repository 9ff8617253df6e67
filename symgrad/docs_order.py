"""Documentation pages of the order statistics (sort, topk, cummax, cummin), from docs.py's blocks:
every formula printed from the derivation object (``derive_order``), every number of the worked
example from running the generated module, W at a tie drawn as the matrix the derivation gives."""

from __future__ import annotations

import numpy as np

from .conventions import preset_for
from .derivations import derive
from .docs import (C, Bullets, Code, Display, M, Page, Para, Section, _num_tex, _op_label, intro,
                   module_for)
from .docs_special import _code_section, _displays, _example_lines, _items
from .kinds.median import selects_one
from .ops import Op
from .printers import latex


def _step(d, title: str):
    return next(s for s in d.steps if s.title == title)


def _matrix(rows) -> str:
    cols = len(rows[0]) if rows else 0
    body = r" \\ ".join(" & ".join(_num_tex(v) for v in row) for row in rows)
    return r"\left[\begin{array}{" + "c" * cols + "} " + body + r" \end{array}\right]"


def _tie_section(d) -> Section:
    """W at a tie, drawn: the derivation's rows (ranks, or outputs of a prefix) at the tie point."""
    s = Section("W at a tie")
    if any(st.title == "W at a tie" for st in d.steps):
        step = _step(d, "W at a tie")
        rows = [list(m) for _, m in step.items]
        s.blocks.append(Para([f"At {step.note}; the tie policy decides which of the equal elements "
                              "holds which rank:"]))
        s.blocks.append(Display(r"W_{\text{tie}}", [_matrix(rows)]))
    if any(st.title == "midpoint (JAX)" for st in d.steps):  # a median of an even count (derive_median)
        step = _step(d, "midpoint (JAX)")
        s.blocks.append(Para([step.note[0].upper() + step.note[1:], ":"]))
        s.blocks.append(Display(r"W_{\text{midpoint}}", [_matrix([list(m) for _, m in step.items])]))
    if any(st.title == "tree split (JAX)" for st in d.steps):
        step = _step(d, "tree split (JAX)")
        s.blocks.append(Para([step.note, ":"]))
        s.blocks.append(Display(r"W_{\text{tree}}", [_matrix([list(m) for _, m in step.items])]))
    return s


def _example(op: Op) -> Section:
    mod, _, _ = module_for(op)
    x = np.array([1.0, 0.0, 1.0, 2.0, 1.0, 0.0])
    out, saved = mod.forward(x)
    y, idx = out if isinstance(out, tuple) else (out, None)  # (a median without dim: the value only)
    g = np.arange(1, y.size + 1, dtype=np.float64).reshape(y.shape)
    (gx,) = mod.backward(g, saved)
    s = Section("Worked example")
    s.blocks.append(Para(["One row with three tied 1s and two tied 0s; ", M("g"), " (grad_output) is "
                          "1, 2, 3, ...; the numbers are what the generated module returns (output: "
                          "the values):"]))
    names, arrays = ("x", "output", "indices", "grad_output", "grad_x"), (x, y, idx, g, gx)
    s.blocks.append(Code("python", _example_lines(*zip(*[(n, a) for n, a in zip(names, arrays) if a is not None]))))
    return s


def _frameworks(op: Op) -> Section:
    s = Section("PyTorch and JAX")
    s.blocks.append(Bullets([[C(f"--convention {name}"), f": ties {p.ties}, NaN {p.nan}. {p.note}."]
                             for name, p in ((n, preset_for(n, op.name, op.params)) for n in ("torch", "jax"))]))
    return s


def order_page(op: Op) -> Page:
    d = derive(op)
    secs = []
    s = Section("Forward and W-form")
    s.blocks.append(Para([_step(d, "forward").note[0].upper() + _step(d, "forward").note[1:], ":"]))
    s.blocks += _displays(_items(d, "forward"))
    s.blocks.append(Para(["W-form, ", M("y = W x"), ": ", _step(d, "W-form").note, ":"]))
    s.blocks += _displays(_items(d, "W-form"))
    secs.append(s)
    secs.append(_tie_section(d))
    s = Section("Backward")
    s.blocks.append(Para([_step(d, "backward").note, ":"]))
    s.blocks += [Display(r"\left(W^{\top} g\right)_{%s}" % label[6:], [latex(e)])
                 for label, e in _items(d, "backward")]
    secs.append(s)
    s = Section("Checks")
    s.blocks.append(Bullets([[c] for c in d.checks]))
    secs.append(s)
    secs += [_frameworks(op), _example(op), _code_section(op)]
    _, _, name = module_for(op)
    what = "the element of one rank" if selects_one(op.name) else "the element of each rank"
    return Page(f"{_op_label(op)}: {what} (tie policy {op.ties})", intro(op), secs, None,
                name[:-3])
