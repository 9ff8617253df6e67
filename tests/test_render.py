"""Printers, templates and files: golden strings, the catalog, provenance, determinism."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import sympy as sp

from symgrad import catalog
from symgrad.indicators import Indicator, IsNan, MaxOf, MinOf
from symgrad.lower import Count, Quotient, Select
from symgrad.ops import resolve
from symgrad.backends.host.printer import numpy_code
from symgrad.printers import text
from symgrad.files import PROVENANCE
from symgrad import backends
from symgrad.pipeline import render


def render_numpy(op):
    ((name, source),) = render(op, backends.get("numpy")).items()
    return name, source

ROOT = Path(__file__).resolve().parent.parent
x, y = sp.symbols("x y", real=True)


@pytest.mark.parametrize("expr,want", [
    (sp.Ge(x, y), "x >= y"),
    (sp.Gt(x, 0), "x > 0"),
    (sp.Eq(x, y, evaluate=False), "x == y"),
    (sp.Or(sp.Gt(x, y), IsNan(x)), "np.isnan(x) | (x > y)"),
    (sp.And(sp.Gt(x, y), sp.Not(IsNan(y))), "~np.isnan(y) & (x > y)"),
    (Select(sp.Gt(x, 0), y, 0), "np.where(x > 0, y, 0)"),
    (Quotient(x, Count(sp.Gt(x, 0), sp.Ge(y, 0))), "(x) / (np.add((x > 0), (y >= 0), dtype=dtype))"),
    (MaxOf(x, y, 0), "np.maximum(np.maximum(x, y), 0)"),
    (MinOf(x, sp.Float(0.1, 17)), "np.minimum(x, 0.1)"),
])
def test_numpy_printer(expr, want):
    assert numpy_code(expr) == want


def test_numpy_printer_branch_free_select_for_templates_that_include_it():
    assert numpy_code(Select(sp.Gt(x, 0), y, 0), select=True) == "_select(x > 0, y)"
    assert numpy_code(Select(sp.Gt(x, 0), y, 1), select=True) == "np.where(x > 0, y, 1)"


def test_comparisons_are_never_printed_as_heaviside_or_subtraction():
    for path in (ROOT / "generated" / "numpy").glob("*.py"):
        src = path.read_text()
        assert "heaviside(" not in src.lower() and "DiracDelta(" not in src, path.name
        assert "import sympy" not in src, path.name


def test_text_printer():
    assert text(Indicator(sp.Gt(x, y))) == "[x > y]"
    assert text(sp.DiracDelta(x - y)) == "delta(x - y)"


def test_committed_catalog_is_fresh():
    """Regenerate every catalog entry in memory and compare with generated/ byte for byte."""
    files = catalog.render_all()
    stale = [rel for rel, src in files.items() if (ROOT / "generated" / rel).read_text() != src]
    assert not stale, f"generated/ is stale ({stale}); run `symgrad generate --catalog`"
    assert not catalog.stale_files(ROOT / "generated", files)


def test_generation_is_deterministic_and_has_provenance():
    op = resolve("max_pool2d", "split", kernel_size=3, stride=2, padding=1)
    name1, a = render_numpy(op)
    name2, b = render_numpy(resolve("max_pool2d", "split", kernel_size=(3, 3), stride=[2, 2], padding=1))
    assert (name1, a) == (name2, b)
    lines = a.splitlines()
    assert lines[0].startswith(PROVENANCE) and "DO NOT EDIT" in lines[0]
    header = "\n".join(lines[:12])
    for needle in ("op: max_pool2d", "tie policy: split", "NaN rule: dominate", "key: ",
                   "symgrad generate max_pool2d"):
        assert needle in header


def test_generated_module_imports_without_sympy(tmp_path):
    path = ROOT / "generated" / "numpy" / "max_pool2d_k3x3_s2x2_p1x1_first.py"
    code = (f"import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('m', {str(path)!r})\n"
            f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"import numpy as np\n"
            f"y, s = m.forward(np.ones((1, 4, 4)))\n"
            f"assert m.backward(np.ones_like(y), s)[0].shape == (1, 4, 4)\n"
            f"bad = [k for k in sys.modules if k.split('.')[0] in ('sympy', 'jinja2', 'symgrad')]\n"
            f"assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_docs_conventions_table_is_fresh():
    """The table in docs/conventions.md is what `symgrad conventions` measures from the modules today."""
    from symgrad import table
    text = (ROOT / "docs" / "conventions.md").read_text()
    assert table.update(text, table.markdown()) == text, "run `symgrad conventions --update docs/conventions.md`"


def test_docstrings_state_the_nan_guarded_conditions_the_code_computes():
    """Issue 15: a module's docstring said [x > 0] where the code computes isnan(x) | (x > 0).
    Every NaN test that an elementwise module's gradients make is in its docstring's 'As
    computed' lines, and every window module states its scan's or mask's condition."""
    import ast
    for path in sorted((ROOT / "generated" / "numpy").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(source))
        grads = "\n".join(line for line in source.splitlines() if re.match(r"\s+grad_\w+ = ", line))
        for name in set(re.findall(r"np\.isnan\((\w+)\)", grads)):
            assert f"isnan({name})" in doc, path.name
        if "take = " in source or "hit = " in source:
            assert "As computed" in doc, path.name


def _template_decisions(directories, exclude=()) -> list[str]:
    """Tags of the templates under directories that decide on the selection, do arithmetic or
    build code text: a condition or a concatenation (`if`, `~`) naming the lowered form, the
    count, the NaN rule's winner, unpooling's writers, the tie kept, a geometry or kind name,
    whether a saved type is there (`index_ctype`, `count_ctype`), or printed code searched
    (`"..." in name`); arithmetic between names or numbers; a string formatted (`"..." % args`);
    a conditional choosing between two string literals of code (`"a" if c else "b"`: not two
    separators such as `", "` and `","`, nor words of a comment or docstring on the tag's line).
    exclude: file name patterns (fnmatch) left out."""
    from fnmatch import fnmatch
    from symgrad.kinds import KINDS
    tag = re.compile(r"\{[{%].*?[}%]\}", re.S)
    named = re.compile(r"\b(form|counts|each_writer|winner_is_output|keep|geometry|index_ctype|count_ctype|"
                       + "|".join(KINDS) + r")\b|\"\s+in\s+\w")
    arithmetic = re.compile(r"[\w)\]]\s+[-+/%]\s+[\w(]")
    literal = re.compile(r'"[^"]*"|\'[^\']*\'')
    formats = re.compile(r"#\d+#\s*%(?!\})")  # a literal's % (not the %} closing a tag)
    chooses = re.compile(r"#(\d+)#\s*\)?\s*if\b.*?\belse\s*\(?\s*#(\d+)#", re.S)  # also of tuples
    separator = re.compile(r"[\s,;]*")
    found = []
    for directory in directories:
        for path in sorted(directory.glob("*.jinja")):
            if any(fnmatch(path.name, pattern) for pattern in exclude):
                continue
            text = path.read_text()
            comment = re.compile(r"//" if path.name.endswith((".c.jinja", ".cu.jinja")) else r"#|\"\"\"")
            for match in tag.finditer(text):
                t = match.group()
                if t.startswith("{#"):
                    continue
                bare = re.sub(r'"[^"]*"', '""', t)  # string literals are text, not decisions
                decides = re.search(r"\bif\b|~", bare) and named.search(t)
                texts = literal.findall(t)
                count = iter(range(len(texts)))
                numbered = literal.sub(lambda m: f"#{next(count)}#", t)  # literal i: #i#
                line = text[text.rfind("\n", 0, match.start()) + 1:match.start()]
                picks = [(texts[int(i)][1:-1], texts[int(j)][1:-1]) for i, j in chooses.findall(numbered)]
                picks_code = not comment.search(line) and any(
                    not (separator.fullmatch(a) and separator.fullmatch(b)) for a, b in picks)
                if decides or arithmetic.search(bare) or formats.search(numbered) or picks_code:
                    found.append(f"{path.name}: {t}")
    return found


def test_templates_place_finished_strings():
    """The NumPy, CUDA and CPU templates (and the shared pieces) decide nothing: the backend
    chooses the partials (scan or mask, counting or not, each writer or one) from the lowered
    kernel and places finished strings; no tag branches on a policy, NaN rule or kind, computes,
    or searches printed code."""
    backends = ROOT / "symgrad" / "backends"
    found = _template_decisions([backends / "numpy" / "templates", backends / "cuda" / "templates",
                                 backends / "cpu" / "templates", backends / "cfamily" / "templates",
                                 backends / "host" / "templates"])
    assert found == [], "\n".join(found)


def test_the_reduction_scan_comment_names_the_tie_order_the_code_computes():
    """The NumPy reduction's comment on its scan says which tied element wins, as the code does
    (it was read off the printed call and said 'first' under ties=last)."""
    import numpy as np
    from symgrad.api import load
    x = np.array([[1.0, 3.0, 0.0, 3.0, 2.0]])
    for ties, winner in (("first", 1), ("last", 3)):
        op = resolve("amax", ties=ties, dim=1)
        _, source = render_numpy(op)
        mod = load("amax", ties=ties, dim=1)
        _, saved = mod.forward(x)
        (grad,) = mod.backward(np.ones(1), saved)
        assert np.flatnonzero(grad).tolist() == [winner]  # oracle: the tied 3.0 at that position
        assert f"ties go to the {ties} element" in source
