"""Documentation pages of max_unpool*d and logsumexp (see ``docs``: the same blocks and writers).

Every formula is printed from the derivation object (``derive_special``) and every number of
the worked examples comes from running the generated module.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from . import policy as _policy
from .derivations import derive  # the disk cache's, as code generation's (display kept)
from .docs import (C, Bullets, Code, Display, M, Page, Para, Section, Table, _array_text,
                   _conventions_section, _in_catalog, _num_tex, _op_label, backward_source, intro,
                   module_for)
from .ops import Op, resolve
from .printers import latex
from .backends.common import cli_arguments

LSE_TEMPERATURES = (1.0, 0.1, 0.01)  # the t -> 0+ table of the logsumexp page


def _items(d, title: str) -> list:
    return list(next(s for s in d.steps if s.title == title).items)


def _displays(items) -> list:
    out = []
    for label, expr in items:
        out.append(Display(_label_tex(label), [latex(expr)]))
    return out


def _label_tex(label: str) -> str:
    """'dy_0/dx1' -> a LaTeX fraction, 'W[0,1]' -> W_{0,1}, 'grad_x0' -> (W^T g)_{0}, ..."""
    if label.startswith("d") and "/d" in label:
        num, den = label[1:].split(" ")[0].split("/d")
        return r"\frac{\partial %s}{\partial %s}" % (_sym(num), _sym(den))
    if label.startswith("W["):
        return "W_{%s}" % label[2:-1]
    if label.startswith("grad_x"):
        return r"\left(W^{\top} g\right)_{%s}" % label[6:]
    return _sym(label)


def _sym(name: str) -> str:
    if "_" in name:
        a, b = name.split("_", 1)
        return "%s_{%s}" % (a, b)
    if name[0] == "x" and name[1:].isdigit():
        return "x_{%s}" % name[1:]
    return name


def _code_section(op: Op) -> Section:
    mod, source, name = module_for(op)
    code = Section("The generated NumPy backward")
    code.blocks.append(Para(["From ", C(f"generated/numpy/{name}" if _in_catalog(op) else name),
                             " (", C(f"symgrad generate {op.name} {cli_arguments(op)} --out DIR".replace("  ", " ")),
                             "), as emitted:"]))
    code.blocks.append(Code("python", backward_source(source)))
    return code


def _example_lines(names, arrays) -> str:
    width = max(len(n) for n in names)
    return "\n".join(f"{n:<{width}} = {_array_text(a)}" for n, a in zip(names, arrays))


# ------------------------------------------------------------------------------ unpool

def unpool_example(op: Op):
    """A small unbatched example (one channel): input 1, 2, 3, ...; each element's index is a
    position inside its pooling window (the window's last position for even, its first for odd
    positions along each dim), so overlapping windows give duplicate indices."""
    d = op.spec.spatial
    k, s, p = op.params["kernel_size"], op.params["stride"], op.params["padding"]
    in_spatial = (3,) if d == 1 else ((2, 2) if d == 2 else (1, 2, 2))
    out_spatial = tuple((i - 1) * st - 2 * pd + kk for i, st, pd, kk in zip(in_spatial, s, p, k))
    if op.params["output_size"] is not None:
        out_spatial = op.params["output_size"]
    idx = np.zeros(in_spatial, dtype=np.int64)
    for pos in np.ndindex(*in_spatial):
        coords = []
        for a, i in enumerate(pos):
            off = k[a] - 1 if i % 2 == 0 else 0
            coords.append(min(max(i * s[a] - p[a] + off, 0), out_spatial[a] - 1))
        idx[pos] = np.ravel_multi_index(tuple(coords), out_spatial)
    x = np.arange(1, idx.size + 1, dtype=np.float64).reshape((1,) + in_spatial)
    indices = idx.reshape((1,) + in_spatial)
    mod, _, _ = module_for(op)
    y, saved = mod.forward(x, indices)
    g = np.arange(1, y.size + 1, dtype=np.float64).reshape(y.shape)
    gx, gi = mod.backward(g, saved)
    return x, indices, y, g, gx, gi


def _unpool_w(op: Op, indices: np.ndarray, size: int) -> list[list[int]]:
    flat = indices.ravel().tolist()
    W = [[0] * len(flat) for _ in range(size)]
    policy = _policy.TIES[op.ties]
    for i, j in enumerate(flat):  # W[j, i] = [i_i = j] * prod_k [i_k != j] over the excluding writers
        W[j][i] = int(all(flat[k] != j for k in policy.writer_excluded_by(i, len(flat))))
    return W


def _unpool_page(op: Op) -> Page:
    d = derive(op)
    secs = []
    s = Section("Forward and W-form")
    s.blocks.append(Para([f"{op.name} scatters each (N, C) plane of ", C("input"), " into a plane of "
                          "zeros at the flat positions ", C("indices"), " (PyTorch's ",
                          C(f"max_pool{op.spec.spatial}d(return_indices=True)"), " format). On a "
                          "representative plane of two elements ", M("x_{0}, x_{1}"), " written into "
                          "three slots at symbolic indices ", M("i_{0}, i_{1}"), ", with ",
                          M(r"\delta_{a b}"), " the Kronecker delta (1 where a = b, else 0), the "
                          "forward is:"]))
    s.blocks += _displays(_items(d, "forward"))
    s.blocks.append(Para([f"W-form: ", M("y = W x"), " with every entry a product of index "
                          "indicators; ", next(st.note for st in d.steps if st.title == "W-form"), ":"]))
    s.blocks += _displays(_items(d, "W-form"))
    secs.append(s)
    s = Section("Derivative and backward")
    note = next(st.note for st in d.steps if st.title == "derivative")
    s.blocks.append(Para([note[0].upper() + note[1:], ". The Jacobian is W itself:"]))
    s.blocks += _displays(_items(d, "derivative")[:UNPOOL_SHOWN])
    s.blocks.append(Para(["Backward is ", M(r"W^{\top} g"), ": ",
                          next(st.note for st in d.steps if st.title == "backward").split(": ", 1)[1],
                          ":"]))
    s.blocks += _displays(_items(d, "backward"))
    s.blocks.append(Para(["The indices get no gradient: ", C("backward"), " returns ",
                          C("(grad_input, None)"), ", as PyTorch does."]))
    secs.append(s)
    s = Section("Checks")
    s.blocks.append(Bullets([[c] for c in d.checks]))
    secs.append(s)
    secs.append(_conventions_section(op))
    x, indices, y, g, gx, _ = unpool_example(op)
    s = Section("Worked example")
    dup = len(set(indices.ravel().tolist())) < indices.size
    s.blocks.append(Para(["One channel, unbatched; ", M("g"), " (grad_output) is 1, 2, 3, ... in "
                          "row-major order" + ("; two elements share an index (overlapping pooling "
                                               "windows pick one position twice), so the tie policy "
                                               "decides which stays and who gets the slot's g"
                                               if dup else "; the indices are unique") +
                          ". The numbers are what the generated module returns (its gradient for ",
                          C("indices"), " is None):"]))
    s.blocks.append(Code("python", _example_lines(
        ("input", "indices", "grad_output", "output", "grad_input"), (x, indices, g, y, gx))))
    W = _unpool_w(op, indices, y.size)
    s.blocks.append(Para(["Its ", M("W"), f" has one row per output slot ({len(W)}) and one column "
                          f"per input element ({indices.size}):"]))
    body = r" \\ ".join(" & ".join(_num_tex(v) for v in row) for row in W)
    s.blocks.append(Display("W", [r"\left[\begin{array}{" + "c" * indices.size + "} " + body
                                  + r" \end{array}\right]"]))
    s.blocks.append(Para(["and ", C("grad_input"), " is ", M(r"W^{\top} g"),
                          (": every writer of a slot gets its g, while the forward keeps the last "
                           "write" if _policy.TIES[op.ties].winners == "each" else
                           f": the {op.ties} writer of a slot gets its g, the others 0, and "),
                          *([] if _policy.TIES[op.ties].winners == "each" else [M("W x"), " is the output"]), "."]))
    secs.append(s)
    secs.append(_code_section(op))
    return _page(op, secs, f"{_op_label(op)}: scatter forward, gather backward (tie policy {op.ties})")


UNPOOL_SHOWN = 4  # derivative entries shown (the rest follow the same pattern)


# ------------------------------------------------------------------------------ logsumexp

def _lse_example(op: Op):
    mod, _, _ = module_for(op)
    x = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 2.0]])
    y, saved = mod.forward(x)
    g = np.arange(1, y.size + 1, dtype=np.float64).reshape(y.shape)
    (gx,) = mod.backward(g, saved)
    return x, y, g, gx


def _lse_page(op: Op) -> Page:
    d = derive(op)
    t = op.params["temperature"]
    secs = []
    s = Section("Forward")
    s.blocks.append(Para(["The smooth max with temperature ", M("t"), f" (here t = {t!r}), on a "
                          "representative window ", M("x_{0}, x_{1}, x_{2}"), " (the rule is the same "
                          "for every length):"]))
    s.blocks += _displays(_items(d, "forward"))
    s.blocks.append(Para([next(st.note for st in d.steps if st.title == "stable form"), ":"]))
    s.blocks += _displays(_items(d, "stable form"))
    secs.append(s)
    s = Section("Derivative")
    s.blocks.append(Para([next(st.note for st in d.steps if st.title == "derivative"),
                          ". SymPy's derivative, then the form the code computes:"]))
    s.blocks += _displays(_items(d, "derivative"))
    secs.append(s)
    s = Section("The limit t to 0+: the split policy's W")
    s.blocks.append(Para(["At a 2-way tie above a smaller element, ", M("x = (m, m, m - d)"),
                          " with ", M("d > 0"), ", the derivative is:"]))
    items = _items(d, "limit t -> 0+")
    at = [(lbl, e) for lbl, e in items if lbl.endswith("at the tie") and lbl.startswith("dy")]
    lims = [e for lbl, e in items if lbl.startswith("lim dy")]
    split = [e for lbl, e in items if lbl.startswith("split")]
    for (lbl, e), lim in zip(at, lims):
        i = lbl[len("dy/dx"):].split(" ")[0]
        s.blocks.append(Display(r"\frac{\partial y}{\partial x_{%s}}" % i,
                                [latex(e) + r" \to " + latex(lim)], rel="="))
    y_tie = next(e for lbl, e in items if lbl == "y at the tie")
    y_lim = next(e for lbl, e in items if lbl == "lim y")
    s.blocks.append(Display("y", [latex(y_tie) + r" \to " + latex(y_lim)]))
    s.blocks.append(Para(["as ", M(r"t \to 0^{+}"), " (SymPy's limit). The split policy's weights of "
                          "the same window (", C("policy.weights"), " evaluated at a 2-way tie above a "
                          "smaller element) are ", M(r"\left(" + ", ".join(latex(w) for w in split) + r"\right)"),
                          ": 1/k on the k tied maxima, 0 elsewhere, the limit above. This is why the op "
                          "names the policy split; at t > 0 every element gets a positive share."]))
    rows = []
    xt = np.array([[1.0, 1.0, 0.0]])
    for tt in LSE_TEMPERATURES:
        other = resolve(op.name, dim=op.params["dim"], keepdim=op.params["keepdim"], temperature=tt)
        mod, _, _ = module_for(other)
        yv, saved = mod.forward(xt)
        (gv,) = mod.backward(np.ones_like(yv), saved)
        rows.append([[repr(tt)], [_array_text(yv)], [_array_text(gv[0])]])
    s.blocks.append(Para(["Measured with the generated modules (dim=-1) on ", C("[1, 1, 0]"),
                          " with grad_output 1:"]))
    s.blocks.append(Table([["t"], ["output"], ["gradient"]], rows))
    secs.append(s)
    s = Section("Checks")
    s.blocks.append(Bullets([[c] for c in d.checks]))
    secs.append(s)
    secs.append(_conventions_section(op))
    x, y, g, gx = _lse_example(op)
    s = Section("Worked example")
    s.blocks.append(Para(["Two rows, the first with a 2-way tie; ", M("g"), " (grad_output) is 1, 2. "
                          "The numbers are what the generated module returns:"]))
    s.blocks.append(Code("python", _example_lines(("x", "grad_output", "output", "grad_x"), (x, g, y, gx))))
    secs.append(s)
    secs.append(_code_section(op))
    return _page(op, secs, f"{_op_label(op)}: the smooth max and its t to 0+ limit")


def _page(op: Op, secs: list, title: str) -> Page:
    _, _, name = module_for(op)
    return Page(title, intro(op), secs, None, name[:-3])


def special_page(op: Op) -> Page:
    return _unpool_page(op) if op.spec.strategy.scatter else _lse_page(op)


__all__ = ["special_page", "unpool_example"]


# ------------------------------------------------------------------------------ expressions

def _expr_command(op: Op, verb: str, tail: str) -> str:
    """The CLI command of an expression op: `symgrad <verb> --expr '...' ... <tail>`."""
    expr, inputs, wrt = op.params["expr"], op.params["inputs"], op.params["wrt"]
    args = [f"--expr '{expr}'", f"--inputs {' '.join(inputs)}"]
    if tuple(wrt) != tuple(inputs):
        args.append(f"--wrt {' '.join(wrt)}")
    args.append(cli_arguments(op))
    return " ".join(["symgrad", verb] + [a for a in args if a] + [tail]).rstrip()


def _words_or_formula(expr):
    """A step's item: words where the derivation names what a node becomes (a Symbol holding a
    sentence, as `symgrad derive --expr` prints it), else the formula."""
    if isinstance(expr, str) or (isinstance(expr, sp.Symbol) and " " in expr.name):
        return str(expr)
    return M(latex(expr))


def expression_page(op: Op) -> Page:
    """The page of a user's expression (`symgrad derive --expr ... --format markdown|latex`): the
    steps `symgrad derive --expr` prints, each formula displayed (a smooth expression has no
    non-smooth steps: no empty sections), the derivation's checks and the generated backward."""
    from .docs import Regenerate, settings_lines
    d = derive(op)
    sections = []
    for step in d.steps:
        if not step.items:
            continue
        s = Section(step.title[0].upper() + step.title[1:])
        s.blocks.append(Para([f"{step.note}:"]))
        s.blocks.append(Bullets([[C(label.strip()), ": ", _words_or_formula(expr)] for label, expr in step.items]))
        sections.append(s)
    checks = Section("Checks")
    checks.blocks.append(Bullets([[c] for c in d.checks]))
    sections.append(checks)
    mod, source, name = module_for(op)
    code = Section("The generated NumPy backward")
    code.blocks.append(Para(["From ", C(name), " (", C(_expr_command(op, "generate", f"--name {op.name} --out DIR")),
                             "), as emitted:"]))
    code.blocks.append(Code("python", backward_source(source)))
    sections.append(code)
    opening = [Bullets([[f"expression: {op.params['expr']}"],
                        [f"inputs: {', '.join(op.params['inputs'])}; gradients returned for: "
                         f"{', '.join(op.params['wrt'])}"]] + [[line] for line in settings_lines(op)]),
               Para(["Every formula below is printed from symgrad's derivation object, as ",
                     C(_expr_command(op, "derive", "")), " prints it. Regenerate: ",
                     Regenerate(_expr_command(op, "derive", "--format")), "."])]
    return Page(f"{op.params['expr']}: the backward under tie policy {op.ties}", opening, sections, None,
                name[:-3])
