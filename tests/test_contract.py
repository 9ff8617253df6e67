"""The backend contract (symgrad/backends/README.md), read from the source: backends are siblings
that share one level down, choose their templates by the lowered kernel's form and never by an op
kind's name, and take every decision from the lowered kernel.  Each test reads files as text or
ASTs, so that a backend that breaks the contract fails here, whatever it generates."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from symgrad import backends, kinds, lower, pipeline
from symgrad.ops import resolve

BACKENDS = Path(backends.__file__).resolve().parent
PKG = BACKENDS.parent  # symgrad/
PACKAGES = {name: Path(b.package.__file__).resolve().parent for name, b in backends.REGISTRY.items()}
# the level below the backends, which every backend may use (backends/README.md)
SHARED = {"common", "printing", "host", "cfamily"}
# the modules of the spine a backend reads: the lowered kernel and the symbols it is written in,
# and the names of generated files; never the op's spec, its kind, the policies or the presets,
# which the lowering has already turned into the kernel
SPINE = {"lower", "geometry", "indicators", "naming", "derivation", "printers", "files"}
KIND_NAMES = set(kinds.KINDS)


def _python(package: Path) -> list[Path]:
    return sorted(package.rglob("*.py"))


def _typing_only(tree: ast.AST) -> set:
    """The import nodes under ``if TYPE_CHECKING:`` (for annotations; never run)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            out |= {n for stmt in node.body for n in ast.walk(stmt)}
    return out


def _imports(path: Path, run_time: bool = False) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in path (relative ones resolved); run_time:
    leave out the ones under ``if TYPE_CHECKING:``."""
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    package = parts[:-1]
    tree = ast.parse(path.read_text())
    skip = _typing_only(tree) if run_time else set()
    out = []
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            base = list(package[:len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [module] if node.module else [f"{module}.{a.name}" for a in node.names]
            out += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
    return out


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_a_backend_imports_no_other_backend(name):
    others = set(PACKAGES) - {name}
    bad = [f"{p.relative_to(PKG)}:{line}: {mod}" for p in _python(PACKAGES[name])
           for line, mod in _imports(p)
           if mod.startswith("symgrad.backends.") and mod.split(".")[2] in others]
    assert not bad, f"backend {name} imports another backend: {bad}"


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_a_backend_reads_the_kernel_not_the_decisions(name):
    """A backend imports from symgrad's spine only the lowered kernel's side (SPINE) and the
    shared backend level: were it to import the op specs, kinds, policies or presets, it could
    decide something the lowering should have."""
    bad = []
    for p in _python(PACKAGES[name]):
        for line, mod in _imports(p, run_time=True):
            parts = mod.split(".")
            if parts[0] != "symgrad":
                continue
            if parts[1] == "backends":
                ok = len(parts) > 2 and (parts[2] == name or parts[2] in SHARED)
            else:
                ok = parts[1] in SPINE
            if not ok:
                bad.append(f"{p.relative_to(PKG)}:{line}: {mod}")
    assert not bad, f"backend {name} imports beyond the kernel and the shared level: {bad}"


def test_the_shared_level_imports_no_backend():
    """What the backends share imports none of them (the registry, backends/__init__.py, is
    the one module above them that names them)."""
    shared = [p for p in BACKENDS.glob("*.py") if p.name != "__init__.py"] + [
        p for d in ("host", "cfamily") if (BACKENDS / d).is_dir() for p in _python(BACKENDS / d)]
    bad = [f"{p.relative_to(PKG)}:{line}: {mod}" for p in shared for line, mod in _imports(p)
           if mod.startswith("symgrad.backends.") and mod.split(".")[2] in PACKAGES]
    assert not bad, f"the shared backend level imports a backend: {bad}"


INCLUDE = re.compile(r"""\{%-?\s*(?:include|import|from|extends)\s+["']([^"'/]+)/""")


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_a_backend_includes_its_own_and_the_shared_templates_only(name):
    allowed = {name} | SHARED
    bad = []
    for t in sorted((PACKAGES[name] / "templates").glob("*")):
        for m in INCLUDE.finditer(t.read_text()):
            if m.group(1) not in allowed:
                bad.append(f"{t.name}: {m.group(0)}")
    assert not bad, f"backend {name} includes other backends' templates: {bad}"


def test_shared_templates_include_no_backend():
    bad = []
    for d in ("host", "cfamily"):
        for t in sorted((BACKENDS / d / "templates").glob("*")):
            bad += [f"{d}/{t.name}: {m.group(0)}" for m in INCLUDE.finditer(t.read_text())
                    if m.group(1) not in SHARED]
    assert not bad, bad


def _backend_sources() -> list[Path]:
    return sorted(p for p in BACKENDS.rglob("*.py"))


def test_no_backend_names_an_op_kind():
    """Templates are chosen by the lowered kernel's form: no string in the backends (backend
    packages and the shared level) names an op kind, and none reads an op's kind."""
    bad = []
    for p in _backend_sources():
        tree = ast.parse(p.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in KIND_NAMES:
                bad.append(f"{p.relative_to(PKG)}:{node.lineno}: {node.value!r}")
            if isinstance(node, ast.Attribute) and node.attr == "kind" and \
                    isinstance(node.value, ast.Attribute) and node.value.attr == "spec":
                bad.append(f"{p.relative_to(PKG)}:{node.lineno}: spec.{node.attr}")
    assert not bad, f"the backends name op kinds: {bad}"


def test_window_forms_are_not_kind_names():
    """The lowered kernel names its windows' form, which the kinds share as they may, never the
    op kind that made it."""
    forms = {}
    for name, params in (("max_pool2d", {"kernel_size": 2}), ("maxout", {"pieces": 2}),
                         ("amax", {}), ("adaptive_max_pool2d", {"output_size": 2}),
                         ("fractional_max_pool2d", {"kernel_size": 2, "output_size": 2})):
        op = resolve(name, "split", **params)
        k = pipeline.build(op).kernel
        assert isinstance(k, lower.WindowKernel)
        forms[op.spec.kind] = k.windows
    assert not set(forms.values()) & KIND_NAMES, forms
    assert len(set(forms.values())) == len(forms), forms  # each form its own code


def test_registry_backends_keep_the_contract():
    for name, b in backends.REGISTRY.items():
        assert b.name == name and b.help and "\n" not in b.help
        assert callable(b.package.file_names) and callable(b.package.render)
        assert b.templates.is_dir() and any(b.templates.glob("*.jinja")), name
        assert backends.get(name) is b
    readme = (BACKENDS / "README.md").read_text()
    for name in backends.REGISTRY:
        assert f"backends/{name}/" in readme, f"backends/README.md does not describe {name}"


def test_the_pipeline_takes_a_resolved_backend():
    op = resolve("relu", "split")
    files = pipeline.render(op, backends.get("numpy"))
    assert list(files) == list(backends.get("numpy").file_names(op))
    with pytest.raises(TypeError, match="backends.get"):
        pipeline.render(op, "numpy")


def test_artifacts_are_made_by_the_lowering():
    """The lowering makes what the backends consume: Artifacts lives in lower.py, and the
    pipeline (which calls the backends) is not imported by any backend."""
    assert pipeline.Artifacts is lower.Artifacts
    for p in _backend_sources():
        assert not any(mod.startswith("symgrad.pipeline") for _, mod in _imports(p)), p


def test_framework_backends_name_the_forms_they_build_and_emit_no_numpy():
    """The torch backend (plain PyTorch code, traced by torch.compile on every device) names the
    kernel forms it builds by lower.kernel_form (kernel types and WINDOW_FORMS), has a geometry for
    each window form it names, refuses the others in one line, and its templates hold no NumPy."""
    package = backends.get("torch").package
    kernel_types = {t.__name__ for t in lower.KERNEL_TYPES.values()}
    assert set(package.FORMS) <= kernel_types | set(lower.WINDOW_FORMS), package.FORMS
    from symgrad.backends.torch import window
    assert set(window.GEOMETRY) == set(package.FORMS) & set(lower.WINDOW_FORMS)
    for t in sorted(backends.get("torch").templates.glob("*.jinja")):
        text = t.read_text()
        assert "import numpy" not in text and "np." not in text.replace("np.maximum", "").replace(
            "np.minimum", ""), t.name  # (docstrings say which NumPy call a helper matches)
    # every kernel form is built (since issues 32 and 33); a variant it refuses: segment_max
    # without num_segments
    for name, params in (("segment_max", {}),):
        op = resolve(name, "split", **params)
        assert lower.kernel_form(pipeline.build(op).kernel) not in package.FORMS or package.refuses(op)
        with pytest.raises(ValueError, match=r"torch backend builds .*backend='numpy'") as info:
            pipeline.render(op, backends.get("torch"))
        assert "\n" not in str(info.value)
