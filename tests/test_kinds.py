"""The op-kind registry (symgrad/kinds/): every op's kind is registered once, and the other
modules ask the registry instead of testing kind names; catalog.py and docs.py, docs.py and
docs_special.py import each other in one direction only (no import inside a function standing in
for a cycle)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from symgrad import kinds
from symgrad.expr import make_op
from symgrad.ops import MAX_WINDOW, OPS, resolve

PKG = Path(kinds.__file__).resolve().parent.parent  # symgrad/
KIND_NAMES = "|".join(kinds.KINDS)


def _sources():
    return sorted(p for p in PKG.rglob("*.py") if "kinds" not in p.relative_to(PKG).parts)


def test_every_op_kind_is_registered():
    assert {spec.kind for spec in OPS.values()} | {"expression"} == set(kinds.KINDS)
    for name, kind in kinds.KINDS.items():
        assert kind.name == name
    # one and only one way to derive: a max/min of pieces, a window's extremum, its own rule
    for kind in kinds.KINDS.values():
        assert kind.elementwise + kind.special + kind.expression <= 1, kind.name
        assert not kind.static or (kind.window_size and kind.window_param), kind.name
        if not (kind.elementwise or kind.special or kind.expression):  # a window's extremum:
            # its window, the docs page's words on it and the docs' worked example, its backward
            assert kind.window_size and kind.docs_windows and kind.example, kind.name
            assert kind.backward(resolve("amax")), kind.name


def test_no_kind_name_tested_outside_the_registry():
    """`spec.kind == "pool"`, `op.spec.kind in (...)`, `OPS[name].kind != "unpool"` and the old
    tuples of kind names (STATIC_WINDOW_KINDS, SPECIAL_KINDS) are what the registry replaces.
    lower.WindowKernel's form of windows is the kind's (Kind.windows), not read off spec.kind."""
    pattern = re.compile(r"(spec\.kind|\]\.kind)\s*(==|!=|in\b)|STATIC_WINDOW_KINDS|SPECIAL_KINDS"
                         rf"|\bkind\s*(==|!=)\s*\"({KIND_NAMES})\"")
    found = [f"{p.relative_to(PKG)}:{i}: {line.strip()}" for p in _sources()
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    found += [f"lower.py:{i}: {line.strip()}" for i, line in
              enumerate((PKG / "lower.py").read_text().splitlines(), 1) if "spec.kind" in line]
    assert found == [], "\n".join(found)


def test_backends_choose_by_the_kernels_form_not_by_a_kind_name():
    """The backends (symgrad/backends: numpy, cpu, cuda and what they share) choose templates and
    code by the lowered kernel's form and flags (lower.kernel_form, WindowKernel.windows, ...): no
    kind name as a string literal (template file names such as "pool.c.jinja" are file names), no
    spec.kind; and a backend package takes what it knows of an op from the kernel, importing
    neither symgrad.ops nor symgrad.policy at run time (annotations: under TYPE_CHECKING)."""
    from symgrad.lower import WINDOW_FORMS
    literal = re.compile(rf"""(["'])({KIND_NAMES})\1""")
    runtime_import = re.compile(r"^from \.\.\.(ops|policy)\b|^from \.\.\. import .*\b(ops|policy)\b")
    found = []
    for path in sorted((PKG / "backends").rglob("*.py")):
        name = path.relative_to(PKG)
        package = len(name.parts) > 2  # backends/<name>/...: a backend package, not the shared level
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if literal.search(line) or "spec.kind" in line or (package and runtime_import.search(line)):
                found.append(f"{name}:{i}: {line.strip()}")
    assert found == [], "\n".join(found)
    # the forms are named by what the windows are, not by the kinds that have them
    assert not set(WINDOW_FORMS) & set(kinds.KINDS)
    assert {k.windows for k in kinds.KINDS.values() if k.windows} == set(WINDOW_FORMS)


def test_lowering_and_geometry_are_asked_of_the_kind():
    """derive() and lower() make each kind's derivation and kernel by what the Kind names (no flag
    checks), and a window kind's WindowKernel carries the Kind's form of windows; only kinds whose windows
    never overlap (Kind.disjoint) may write a winner's gradient."""
    from symgrad.derivations import derive
    from symgrad.lower import LOWERINGS, LogSumExpKernel, UnpoolKernel, WindowKernel, lower
    from symgrad.lower import ElementwiseKernel, OrderKernel
    from symgrad.derive import DERIVATIONS
    assert {k.lowering for k in kinds.KINDS.values()} == set(LOWERINGS)
    assert {k.derivation for k in kinds.KINDS.values()} == set(DERIVATIONS)
    assert [k.name for k in kinds.KINDS.values() if k.derivation == "special"] == ["unpool", "logsumexp"]
    types = {"elementwise": ElementwiseKernel, "window": WindowKernel, "expression": ElementwiseKernel,
             "scatter": UnpoolKernel, "logsumexp": LogSumExpKernel, "segment": WindowKernel,
             "order": OrderKernel, "bag": WindowKernel}
    ops = [resolve("topk", k=2), resolve("scatter_max"), resolve("maximum"), resolve("amax"), resolve("max_pool1d", kernel_size=2),
           resolve("maxout", pieces=2), resolve("adaptive_max_pool1d", output_size=3),
           resolve("fractional_max_pool2d", kernel_size=2, output_size=3),
           resolve("max_unpool1d", kernel_size=2), resolve("logsumexp"),
           make_op("Max(x, 2*y)")[0], resolve("embedding_bag_max"),
           resolve("roi_max_pool", output_size=2)]
    assert {op.spec.kind for op in ops} == set(kinds.KINDS)
    for op in ops:
        kind = op.spec.strategy
        kernel = lower(derive(op, display=False))
        assert isinstance(kernel, types[kind.lowering]), op.name
        assert (kind.lowering in ("window", "segment", "bag")) == bool(kind.windows), op.name
        if kind.windows:
            assert kernel.windows == kind.windows, op.name
    # maxout's windows are groups of channels: disjoint; torch's maxout writes its winner's gradient
    assert [k.name for k in kinds.KINDS.values() if k.disjoint] == ["maxout", "segment"]
    assert lower(derive(resolve("maxout", pieces=2, convention="torch"), display=False)).grad_start == "written"
    # pooling does not name itself disjoint, so its gradient is added into +0 under any preset
    assert lower(derive(resolve("max_pool1d", kernel_size=2, convention="torch"), display=False)).grad_start == "+0"


@pytest.mark.parametrize("name, params, size", [
    ("max_pool2d", {"kernel_size": (2, 3)}, 6), ("fractional_max_pool3d",
                                                  {"kernel_size": 2, "output_size": 3}, 8),
    ("maxout", {"pieces": 5}, 5), ("amax", {}, 4), ("adaptive_max_pool1d", {"output_size": 3}, 4),
    ("max_unpool1d", {"kernel_size": 2}, 1), ("logsumexp", {}, 4)])
def test_window_sizes(name, params, size):
    assert resolve(name, **params).window_size() == size


def test_no_window():
    with pytest.raises(ValueError, match="relu has no window"):
        resolve("relu").window_size()
    with pytest.raises(ValueError, match="has no window"):
        make_op("max(x, 0)")[0].window_size()


@pytest.mark.parametrize("name, params, what", [
    ("maxout", {"pieces": MAX_WINDOW + 1}, "pieces"),
    ("max_pool1d", {"kernel_size": MAX_WINDOW + 1}, "kernel_size"),
    ("fractional_max_pool2d", {"kernel_size": 33, "output_size": 2}, "kernel_size")])
def test_static_window_bound_names_its_parameter(name, params, what):
    with pytest.raises(ValueError, match=f"{what} must give a window of at most {MAX_WINDOW}"):
        resolve(name, **params)


def test_settings_each_kind_refuses():
    with pytest.raises(ValueError, match="applies to elementwise ops"):
        resolve("max_pool1d", kernel_size=2, order="reversed")
    assert resolve("relu", order="reversed").order == "reversed"
    with pytest.raises(ValueError, match="a reduction follows NaN rule 'dominate'"):
        resolve("amax", "first", nan="last_nan")
    assert resolve("max_pool1d", "first", nan="last_nan", kernel_size=2).nan == "last_nan"
    with pytest.raises(ValueError, match="defined for a single max/min"):
        resolve("relu", "split", nan="each")
    assert resolve("maximum", "split", nan="each").nan == "each"
    assert resolve("max_pool1d", "split", nan="each", kernel_size=2).nan == "each"


def _imports(path: Path) -> tuple[set, set]:
    """(symgrad modules imported at the top, inside functions) of one module (relative imports)."""
    top, inner = set(), set()
    tree = ast.parse(path.read_text())
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nested = {id(n) for f in funcs for n in ast.walk(f)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            (inner if id(node) in nested else top).update(names)
    return top, inner


def test_catalog_and_docs_do_not_import_each_other_in_a_cycle():
    docs_top, docs_inner = _imports(PKG / "docs.py")
    catalog_top, _ = _imports(PKG / "catalog.py")
    assert "pages" in catalog_top  # the catalog's pages, written by pages.py from docs.py's
    assert not {"catalog", "pages"} & (docs_top | docs_inner)


def test_docs_and_docs_special_do_not_import_each_other_in_a_cycle():
    """docs.page imported docs_special inside the function (docs_special builds on docs)."""
    docs_top, docs_inner = _imports(PKG / "docs.py")
    special_top, special_inner = _imports(PKG / "docs_special.py")
    assert "docs" in special_top and "docs_special" not in docs_top | docs_inner
    assert {"docs", "docs_special"} <= _imports(PKG / "pages.py")[0]
