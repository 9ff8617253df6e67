"""Documentation pages (generated/docs and `symgrad derive --format markdown|latex`).

* every formula of every committed page parses as LaTeX: a strict LaTeX parser (pylatexenc) on
  all of them, and a TeX engine (pdflatex) where one is installed;
* the worked example's numbers are what the committed module returns, and agree with the SymPy
  derivation evaluated at the example (elementwise) or with the page's W matrix (W^T g, windows);
* each picture is well-formed XML and marks as winners exactly the elements to which the module
  routes each window's gradient;
* the CLI prints the pages; text stays the default.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import sympy as sp

from symgrad import catalog, naming
from symgrad.derive import derive
from symgrad.indicators import MaxOf, MinOf, literal_values

from test_cli import assert_ok, assert_one_line_error, run_all

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "generated" / "docs"
ENTRIES = catalog.entries()
STEMS = [naming.module_name(op) for op in ENTRIES]
SVG_NS = "{http://www.w3.org/2000/svg}"


def page(stem: str) -> str:
    return (DOCS / f"{stem}.md").read_text(encoding="utf-8")


def formulas(md: str) -> list[str]:
    """Every $$...$$ block and $...$ span of a Markdown page (outside code blocks)."""
    md = re.sub(r"```.*?```", "", md, flags=re.S)
    md = re.sub(r"`[^`\n]*`", "", md)
    out = [m.group(1) for m in re.finditer(r"\$\$\n(.*?)\n\$\$", md, flags=re.S)]
    rest = re.sub(r"\$\$\n.*?\n\$\$", "", md, flags=re.S)
    out += re.findall(r"(?<![\\$])\$([^$\n]+)\$", rest)
    return out


def load_module(stem: str):
    path = ROOT / "generated" / "numpy" / f"{stem}.py"
    spec = importlib.util.spec_from_file_location(f"docs_test_{stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def example(md: str) -> dict:
    """The worked example's code block: {name: array}."""
    block = re.search(r"## \d+\. Worked example.*?```python\n(.*?)```", md, flags=re.S).group(1)
    out = {}
    for line in block.strip().splitlines():
        name, value = (s.strip() for s in line.split("=", 1))
        out[name] = np.array(ast.literal_eval(value), dtype=np.float64)
    return out


# ----------------------------------------------------------------------------- pages exist

def test_every_catalog_entry_has_a_page_and_the_index_links_them():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    special = {"unpool": ("W-form", "Derivative and backward", r"W^{\top} g", "Worked example",
                          "PyTorch", "JAX", "def backward("),
               "logsumexp": ("Derivative", r"\to \frac{1}{2}", "split policy's W", "Worked example",
                             "PyTorch", "JAX", "def backward("),
               "ranking": ("W-form", "Worked example", "PyTorch",
                           "JAX", "def backward(")}
    for op, stem in zip(ENTRIES, STEMS):
        md = page(stem)
        for needle in special.get(op.spec.kind, (
                "W-form", r"\delta\left(", "Delta elimination", r"\begin{cases}",
                "Worked example", "PyTorch", "JAX", "def backward(")):
            assert needle in md, (stem, needle)
        assert f"tie policy: {op.ties}" in md
        assert f"({stem}.md)" in index
        picture = (op.spec.kind != "elementwise" or op.name in ("maximum", "minimum", "fmax", "fmin")) \
            and op.spec.kind not in special
        assert (DOCS / f"{stem}.svg").exists() == picture, stem
        if picture:
            assert f"]({stem}.svg)" in md
            assert "W = " in md or "nonzero entries" in md  # W of the example, written out


# ----------------------------------------------------------------------------- LaTeX

ENVIRONMENTS = {"cases", "aligned", "array", "pmatrix"}


def _check_latex(tex: str, db) -> None:
    from pylatexenc.latexwalker import (LatexEnvironmentNode, LatexGroupNode, LatexMacroNode,
                                        LatexMathNode, LatexWalker)
    nodes, _, _ = LatexWalker(tex, tolerant_parsing=False).get_latex_nodes()
    fences = []

    def walk(ns):
        for n in ns or ():
            if isinstance(n, LatexMacroNode):
                if n.macroname in ("left", "right"):
                    fences.append(n.macroname)
                elif n.macroname not in (",", ";", "!", "\\", "{", "}", " ", "|"):
                    assert db.get_macro_spec(n.macroname) is not None, f"unknown macro \\{n.macroname} in {tex}"
                if n.nodeargd:
                    walk([a for a in n.nodeargd.argnlist if a is not None])
            elif isinstance(n, LatexEnvironmentNode):
                assert n.environmentname in ENVIRONMENTS, f"environment {n.environmentname} in {tex}"
                walk(n.nodelist)
            elif isinstance(n, (LatexGroupNode, LatexMathNode)):
                walk(n.nodelist)

    walk(nodes)
    depth = 0
    for f in fences:  # \left and \right pair up, in order
        depth += 1 if f == "left" else -1
        assert depth >= 0, f"\\right without \\left in {tex}"
    assert depth == 0, f"\\left without \\right in {tex}"


def test_every_formula_parses_as_latex():
    """A strict LaTeX parser reads every formula of every page: braces and environments balance,
    every macro is a known LaTeX one, \\left and \\right pair up."""
    pytest.importorskip("pylatexenc", reason="pylatexenc (the test extra) parses the formulas")
    from pylatexenc.latex2text import get_default_latex_context_db
    db = get_default_latex_context_db()
    count = 0
    for stem in STEMS:
        for tex in formulas(page(stem)):
            _check_latex(tex, db)
            count += 1
    assert count > 30 * len(STEMS)


@pytest.mark.parametrize("bad", [r"\frac{1}{", r"\begin{cases} 1 \end{aligned}", r"\left[x",
                                 r"\nosuchmacro{x}", r"\begin{tabular}{c} x \end{tabular}"])
def test_the_latex_check_can_fail(bad):
    pytest.importorskip("pylatexenc", reason="pylatexenc (the test extra) parses the formulas")
    from pylatexenc.latex2text import get_default_latex_context_db
    with pytest.raises(Exception):
        _check_latex(bad, get_default_latex_context_db())


def _pdflatex(tmp_path: Path, name: str, source: str) -> None:
    (tmp_path / f"{name}.tex").write_text(source, encoding="utf-8")
    r = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", f"{name}.tex"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    errors = [line for line in r.stdout.splitlines() if line.startswith("!")]
    assert r.returncode == 0 and (tmp_path / f"{name}.pdf").exists(), (name, errors, r.stdout[-2000:])


needs_tex = pytest.mark.skipif(shutil.which("pdflatex") is None,
                               reason="no TeX engine (pdflatex) installed; apt-get install texlive-latex-base")


@needs_tex
def test_markdown_formulas_compile_with_pdflatex(tmp_path):
    """Every formula of every page, typeset by TeX (amsmath), as display or inline math."""
    body = []
    for stem in STEMS:
        md = page(stem)
        for tex in formulas(md):
            body.append(r"\[" + tex + r"\]" if "\n" in tex or tex.startswith(r"\begin") else f"${tex}$\\par")
    doc = ("\\documentclass{article}\n\\usepackage{amsmath,amssymb}\n\\begin{document}\n"
           + "\n".join(body) + "\n\\end{document}\n")
    _pdflatex(tmp_path, "formulas", doc)


@needs_tex
def test_latex_output_compiles(tmp_path):
    """`symgrad derive OP --format latex` is a standalone document that pdflatex compiles."""
    argvs = {"max_pool2d": ["derive", "max_pool2d", "--kernel-size", "2", "--format", "latex"],
             "clamp": ["derive", "clamp", "--min", "-1", "--max", "1", "--ties", "split", "--format", "latex"],
             "maximum": ["derive", "maximum", "--convention", "torch", "--format", "latex"]}
    results = run_all(argvs, tmp_path / "cache")
    for name, r in results.items():
        assert_ok(r)
        assert r.stdout.startswith("% Generated by symgrad") and r"\documentclass" in r.stdout
        _pdflatex(tmp_path, name, r.stdout)


# ----------------------------------------------------------------------------- numbers

def _sympy_value(expr, env):
    expr = literal_values(expr)  # a constant held as the framework holds it (hardsigmoid's 1/6)
    expr = expr.replace(lambda e: isinstance(e, MaxOf), lambda e: sp.Max(*e.args))
    expr = expr.replace(lambda e: isinstance(e, MinOf), lambda e: sp.Min(*e.args))
    return expr.xreplace(env)


def _w_matrix(md: str) -> np.ndarray | None:
    m = re.search(r"W = \\left\[\\begin\{array\}\{c+\} (.*?) \\end\{array\}\\right\]", md)
    if m is None:
        return None
    frac = lambda c: Fraction(*map(int, re.fullmatch(r"\\frac\{(\d+)\}\{(\d+)\}", c).groups())) \
        if c.startswith(r"\frac") else Fraction(c)  # noqa: E731
    rows = [[float(frac(c.strip())) for c in row.split("&")] for row in m.group(1).split(r"\\")]
    return np.array(rows)


from symgrad.kinds.bag import LAYOUTS  # noqa: E402


def _given(ex, name, op=None):
    """An input of the example as forward takes it: integer indices (unpooling's, the segments',
    the bags' input and offsets) as int64."""
    bags = op is not None and op.spec.strategy.windows == "bags" and name in LAYOUTS[op.name]["integers"]
    return ex[name].astype(np.int64) if name in ("indices", "index", "segment_ids", "indptr") or bags else ex[name]


@pytest.mark.parametrize("op,stem", list(zip(ENTRIES, STEMS)), ids=STEMS)
def test_worked_example_is_what_the_module_returns(op, stem):
    md = page(stem)
    ex = example(md)
    mod = load_module(stem)
    names = list(op.spec.inputs)
    inputs = [_given(ex, n, op) for n in names]
    constant = ("indices",) + op.spec.constant_inputs  # unpooling's and fractional pooling's
    y, saved = mod.forward(*inputs)
    if isinstance(y, tuple):  # an order statistic: (values, indices)
        y, indices = y
        assert np.array_equal(indices, ex["indices"]), stem
    grads = mod.backward(ex["grad_output"], saved)
    assert np.array_equal(y, ex["output"]), stem
    for n, g in zip(names, grads):
        if n in constant:  # unpooling's indices, fractional pooling's samples: no gradient
            assert g is None and f"grad_{n}" not in ex, stem
            continue
        assert np.array_equal(g, ex[f"grad_{n}"]), (stem, n)
    names = [n for n in names if n not in constant]
    # and what the derivation says, independently of the module
    if op.spec.kind == "elementwise":
        d = derive(op)
        inner = {}
        for node in d.nodes[:-1]:
            inner[node.symbol] = node.forward
        for s, n in zip(d.inputs, names):
            for i in range(ex[names[0]].size):
                env = {t: sp.Float(float(ex[m].ravel()[i])) for t, m in zip(d.inputs, names)}
                env.update({u: _sympy_value(f, env) for u, f in inner.items()})
                want = float(_sympy_value(d.partials[s], env)) * ex["grad_output"].ravel()[i]
                if d.partials[s].has(sp.exp):  # (elu: NumPy's exp against the exact value, rounded)
                    assert ex[f"grad_{n}"].ravel()[i] == pytest.approx(want, rel=4 * 2.0 ** -52), (stem, n, i)
                    continue
                assert ex[f"grad_{n}"].ravel()[i] == want, (stem, n, i)
    W = _w_matrix(md)
    if W is not None:
        flat_in = np.concatenate([ex[n].ravel() for n in names])
        flat_grad = np.concatenate([ex[f"grad_{n}"].ravel() for n in names])
        assert np.array_equal(W.T @ ex["grad_output"].ravel(), flat_grad), stem
        if op.ties != "all":
            assert np.array_equal(W @ flat_in, ex["output"].ravel()), stem  # y = W x


# ----------------------------------------------------------------------------- pictures

@pytest.mark.parametrize("op,stem", [(o, s) for o, s in zip(ENTRIES, STEMS) if (DOCS / f"{s}.svg").exists()],
                         ids=[s for s in STEMS if (DOCS / f"{s}.svg").exists()])
def test_picture_is_xml_and_marks_the_modules_winners(op, stem):
    root = ET.parse(DOCS / f"{stem}.svg").getroot()
    assert root.tag == f"{SVG_NS}svg"
    marked = {(int(c.get("data-window")), c.get("data-cell")) for c in root.iter(f"{SVG_NS}circle")
              if c.get("class") == "winner"}
    ex = example(page(stem))
    names = list(op.spec.inputs)
    mod = load_module(stem)
    y, saved = mod.forward(*[_given(ex, n, op) for n in names])
    routed = set()
    for o in range(y.size):  # the module's argmax: where it sends a window's gradient
        g = np.zeros(y.size)
        g[o] = 1.0
        grads = mod.backward(g.reshape(y.shape), saved)
        for n, gr in zip(names, grads):
            if gr is not None:  # None: fractional pooling's samples get no gradient
                routed |= {(o, f"{n}:{i}") for i in np.flatnonzero(gr.ravel())}
    assert marked == routed, stem
    per_window = [sum(1 for w, _ in marked if w == o) for o in range(y.size)]
    if op.ties in ("first", "last"):
        assert per_window == [1] * y.size
    assert any(c > 1 for c in per_window) == (op.ties in ("split", "all"))  # the example's tie


# ----------------------------------------------------------------------------- CLI

def test_cli_prints_pages_and_keeps_text_the_default(tmp_path):
    argvs = {
        "md": ["derive", "max_pool2d", "--kernel-size", "2", "--format", "markdown"],
        "text": ["derive", "relu", "--ties", "split"],
        "text-explicit": ["derive", "relu", "--ties", "split", "--format", "text"],
        "bad": ["derive", "relu", "--format", "html"],
    }
    r = run_all(argvs, tmp_path / "cache")
    assert_ok(r["md"])
    md = r["md"].stdout
    assert md.startswith("<!-- Generated by symgrad")
    for needle in (r"\delta\left(", r"\begin{cases}", "W = ", "Worked example",
                   "](data:image/svg+xml;base64,", "def backward("):
        assert needle in md, needle
    assert_ok(r["text"])
    assert r["text"].stdout == r["text-explicit"].stdout
    assert r["text"].stdout.startswith("op: relu") and "== the rule ==" in r["text"].stdout
    assert "--format" in assert_one_line_error(r["bad"])


# ----------------------------------------------------------------------------- the backward shown

def _shown_functions(md: str) -> set:
    """The functions the page's 'generated NumPy backward' section prints."""
    section = md.split("The generated NumPy backward", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    return set(re.findall(r"^def (\w+)", code, flags=re.M))


def _functions_run(mod, calls) -> set:
    """The module's functions that run inside backward for each (args of forward, grad_output
    maker), not counting the argument checks and layout plumbing (and what they call)."""
    from symgrad.docs import PLUMBING
    ran, stack = set(), []

    def profile(frame, event, arg):
        if frame.f_globals is not mod.__dict__ or frame.f_code.co_name.startswith("<"):
            return
        if event == "call":
            stack.append(frame.f_code.co_name)
            if "backward" in stack:
                inside = stack[stack.index("backward"):]
                if not PLUMBING & set(inside):
                    ran.add(frame.f_code.co_name)
        elif event == "return" and stack:
            stack.pop()
    for args in calls:
        y, saved = mod.forward(*args)
        y = y[0] if isinstance(y, tuple) else y  # (an order statistic's values, indices)
        sys.setprofile(profile)
        try:
            mod.backward(np.ones_like(y), saved)
        finally:
            sys.setprofile(None)
    return ran


SINGLE_INPUT = [(o, s) for o, s in zip(ENTRIES, STEMS) if tuple(o.spec.inputs) == ("x",)]


@pytest.mark.parametrize("op,stem", SINGLE_INPUT, ids=[s for _, s in SINGLE_INPUT])
def test_the_backward_shown_is_the_backward_that_runs(op, stem):
    """Every function of the module that backward runs through to compute the gradient is on the
    page (relu's _gradients too), and no function that it never runs for these parameters (a
    path of other window sizes): on the worked example and a copy large enough for the
    size-picked paths (over 1 MiB of gradient)."""
    x = example(page(stem))["x"]
    big = np.concatenate([x] * (2 + (1 << 18) // x.size), axis=0)
    calls = [(x,), (big,)]
    mod = load_module(stem)
    assert _functions_run(mod, calls) == _shown_functions(page(stem)), stem


def test_pages_say_one_variable_not_1_variables():
    """No '1 variables' and no 'f|_{x = 0} = 0 = 0' on any page."""
    for stem in STEMS:
        md = page(stem)
        assert not re.search(r"\b1 variables\b", md), stem
        assert not re.search(r"= (\S+) = \1\s*$", md, flags=re.M), stem


@pytest.mark.parametrize("fmt,other", [("latex", "markdown"), ("markdown", "latex")])
def test_a_page_says_how_to_regenerate_it_in_its_own_format(fmt, other):
    """`symgrad derive clamp --min 0 --max 6 --format latex` writes a .tex whose Regenerate line
    says --format latex (it said markdown)."""
    from symgrad import pages
    from symgrad.ops import resolve
    text = pages.render(resolve("clamp", min=0, max=6), fmt)
    line = next(ln for ln in text.splitlines() if "Regenerate" in ln)
    assert "--format " + fmt in line and "--format " + other not in line, line


def test_an_expression_has_its_page_in_each_format(tmp_path):
    """`symgrad derive --expr ... --format markdown|latex` writes the expression's page (it was
    refused, "available for catalog ops"): the derivation's steps as formulas, its checks, the
    generated backward, and a Regenerate line that rebuilds it; a smooth expression's page has no
    empty non-smooth sections."""
    argvs = {"md": ["derive", "--expr", "Max(x*y, x + y, 0)", "--format", "markdown"],
             "tex": ["derive", "--expr", "Max(x, y)", "--ties", "split", "--format", "latex"],
             "smooth": ["derive", "--expr", "x*y + x", "--format", "markdown"]}
    r = run_all(argvs, tmp_path / "cache")
    for key in argvs:
        assert_ok(r[key])
    md = r["md"].stdout
    assert md.startswith("<!-- Generated by symgrad")
    for needle in ("# Max(x\\*y, x + y, 0): the backward under tie policy first", "## 3. W-form",
                   r"\delta\left(", "## 7. Checks", "def backward(",
                   # the command that made it (the default policy left out: the page says "(default)")
                   "Regenerate: `symgrad derive --expr 'Max(x*y, x + y, 0)' --inputs x y --format markdown`"):
        assert needle in md, needle
    tex = r["tex"].stdout
    assert r"\section" in tex and "--ties split --format latex" in tex and "--format markdown" not in tex
    smooth = r["smooth"].stdout
    assert "Non-smooth" not in smooth and "W-form" not in smooth and "## 2. Final partials" in smooth


# ----------------------------------------------------------------------------- commands the pages print

def _page_commands(md: str) -> list[str]:
    """Every `symgrad ...` code span of a Markdown page."""
    return re.findall(r"`(symgrad [^`]*)`", md)


def _run_command(command: str, tmp_path: Path, capsys) -> None:
    """Run a printed command through symgrad.cli.main in tmp_path (DIR: a fresh folder there;
    `generate --catalog` writes tmp_path/generated); it exits 0."""
    import shlex

    from symgrad import cli
    argv = [str(tmp_path / "out") if a == "DIR" else a for a in shlex.split(command)[1:]]
    status = cli.main(argv)
    assert status == 0, f"{command}: exit {status}: {capsys.readouterr().err.strip()}"


PAGE_COMMANDS = sorted({c for p in DOCS.glob("*.md") for c in _page_commands(p.read_text(encoding="utf-8"))})


@pytest.mark.parametrize("command", PAGE_COMMANDS, ids=PAGE_COMMANDS)
def test_every_command_the_catalog_pages_print_runs(command, tmp_path, monkeypatch, capsys):
    """Every command that the committed pages (index and catalog) print runs and exits 0."""
    monkeypatch.chdir(tmp_path)
    _run_command(command, tmp_path, capsys)


def test_every_command_an_expression_page_prints_runs(tmp_path, monkeypatch, capsys):
    """The expression page's commands run: it printed `--inputs x,y`, which the CLI refused
    ('must be a plain identifier'). The pages print `--inputs x y` (the CLI's form, as every
    other flag of several values), and the CLI takes `x,y` too: both forms give the page."""
    from symgrad import cli
    monkeypatch.chdir(tmp_path)
    pages = {}
    for sep in (" ", ","):
        argv = ["derive", "--expr", "Max(x*y, x + y, 0)", "--inputs", *sep.join("xy").split(" "),
                "--wrt", "y", "--ties", "split", "--format", "markdown"]
        assert cli.main(argv) == 0
        pages[sep] = capsys.readouterr().out
    assert pages[" "] == pages[","]
    commands = _page_commands(pages[" "])
    assert {c.split()[1] for c in commands} == {"derive", "generate"} and len(commands) >= 3, commands
    for command in commands:
        assert "--inputs x y --wrt y" in command, command
        _run_command(command, tmp_path, capsys)
