"""Measures of the backends' structure (issue 27), printed as a table, for a before/after:

    python tools/backend_metrics.py [--trace]

- lines of each backend package's Python and of each template folder;
- template pairs that share a run of 6 or more identical lines (blank lines and lone
  punctuation passed over), and how many of those pairs are Python (.py.jinja);
- functions of the package over 70 lines;
- comparisons of a kernel's geometry with a string and string literals that name an op kind,
  in the backend packages; imports and template includes that cross from one backend to another;
- --trace: the modules and templates that run when symgrad.load("max_pool2d", backend="cpu",
  ties="split", kernel_size=2) generates its files (a fresh cache: derivation included).
"""

from __future__ import annotations

import ast
import itertools
import re
import sys
from pathlib import Path

import symgrad  # noqa: E402

ROOT = Path(symgrad.__file__).resolve().parent  # the package measured: the one Python imports
BACKENDS = ROOT / "backends"
KIND_NAMES = {"pool", "maxout", "fractional", "reduction", "adaptive", "elementwise",
              "expression", "unpool", "logsumexp"}
RUN = 6


def lines(paths) -> int:
    return sum(len(p.read_text().splitlines()) for p in paths)


def backend_packages() -> list[Path]:
    """The registered backends' packages (not the shared level below them)."""
    from symgrad import backends
    out = []
    for b in backends.REGISTRY.values():
        module = getattr(b, "package", None) or sys.modules[b.render.__module__]
        out.append(Path(module.__file__).resolve().parent)
    return sorted(out)


def shared_packages() -> list[Path]:
    return sorted(p for p in BACKENDS.iterdir() if p.is_dir() and (p / "__init__.py").exists()
                  and p not in backend_packages())


def template_folders() -> list[Path]:
    return sorted(p for p in BACKENDS.rglob("templates") if p.is_dir())


def _significant(path: Path) -> list[str]:
    return [s for s in (line.strip() for line in path.read_text().splitlines())
            if s and not re.fullmatch(r"[\W_]*", s)]


def duplicated_pairs(paths: list[Path]) -> list[tuple[Path, Path]]:
    runs = {}
    for p in paths:
        sig = _significant(p)
        runs[p] = {tuple(sig[i:i + RUN]) for i in range(len(sig) - RUN + 1)}
    return [(a, b) for a, b in itertools.combinations(paths, 2) if runs[a] & runs[b]]


def long_functions(limit: int = 70) -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        if "_generated" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name} ({n})")
    return out


def kind_dispatch() -> tuple[int, int]:
    """(comparisons of an attribute ``geometry``/``windows`` with a string naming an op kind,
    string constants naming an op kind) in backends/."""
    comparisons = literals = 0
    for path in BACKENDS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in KIND_NAMES:
                literals += 1
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                named = any(isinstance(n, ast.Attribute) and n.attr in ("geometry", "windows")
                            for n in sides)
                kinds = any(isinstance(c, ast.Constant) and c.value in KIND_NAMES
                            for n in sides for c in ast.walk(n))
                comparisons += named and kinds
    return comparisons, literals


def crossings() -> list[str]:
    names = {p.name for p in backend_packages()}
    out = []
    for pkg in backend_packages():
        others = names - {pkg.name}
        for path in pkg.rglob("*.py"):
            for m in re.finditer(r"^\s*from\s+(\S+)\s+import", path.read_text(), re.M):
                if not m.group(1).startswith((".", "symgrad")):
                    continue  # a library (sympy.printing.numpy), not a backend
                parts = m.group(1).lstrip(".").split(".")
                if any(o in parts for o in others):
                    out.append(f"{path.relative_to(ROOT.parent)}: from {m.group(1)}")
        for path in (pkg / "templates").glob("*"):
            for m in re.finditer(r"""(include|import|extends|from)\s+["'](\w+)/""", path.read_text()):
                if m.group(2) in others:
                    out.append(f"{path.relative_to(ROOT.parent)}: {m.group(1)} {m.group(2)}/")
    return out


def trace() -> tuple[list[str], list[str]]:
    import os
    import tempfile

    os.environ["SYMGRAD_CACHE_DIR"] = tempfile.mkdtemp()
    import jinja2

    templates, modules = set(), set()
    get_source = jinja2.FileSystemLoader.get_source

    def recording(self, environment, template):
        source = get_source(self, environment, template)
        templates.add(str(Path(source[1]).relative_to(ROOT.parent)))
        return source

    jinja2.FileSystemLoader.get_source = recording

    def profile(frame, event, arg):
        f = frame.f_code.co_filename
        if event == "call" and f.startswith(str(ROOT)) and f.endswith(".py") and "_generated" not in f:
            modules.add(str(Path(f).relative_to(ROOT.parent)))

    sys.setprofile(profile)
    try:
        symgrad.api.generate("max_pool2d", tempfile.mkdtemp(), ties="split", backend="cpu",
                             kernel_size=2)
    finally:
        sys.setprofile(None)
    return sorted(modules), sorted(templates)


def main() -> int:
    print("| measure | value |\n|---|---|")
    for pkg in backend_packages():
        print(f"| lines of backends/{pkg.name}/*.py | {lines(pkg.glob('*.py'))} |")
    for pkg in shared_packages():
        print(f"| lines of backends/{pkg.name}/*.py (shared) | {lines(pkg.glob('*.py'))} |")
    shared = [p for p in BACKENDS.glob("*.py")]
    print(f"| lines of backends/*.py (shared modules) | {lines(shared)} |")
    folders = template_folders()
    for folder in folders:
        files = sorted(folder.glob("*.jinja"))
        print(f"| backends/{folder.relative_to(BACKENDS)}: templates, lines | {len(files)}, {lines(files)} |")
    pairs = duplicated_pairs(sorted(p for f in folders for p in f.glob("*.jinja")))
    python = sum(a.name.endswith(".py.jinja") and b.name.endswith(".py.jinja") for a, b in pairs)
    across = sum(a.parent != b.parent for a, b in pairs)
    print(f"| template pairs sharing >= {RUN} identical lines (Python pairs; across folders) | "
          f"{len(pairs)} ({python}; {across}) |")
    longs = long_functions()
    print(f"| functions over 70 lines | {len(longs)} |")
    comparisons, literals = kind_dispatch()
    print(f"| kernel geometry compared with an op kind's name, in backends/ | {comparisons} |")
    print(f"| string literals naming an op kind, in backends/ | {literals} |")
    cross = crossings()
    print(f"| imports/includes from one backend package into another | {len(cross)} |")
    if "--trace" in sys.argv:
        modules, templates = trace()
        print(f"| modules run by load(max_pool2d, cpu, split) -> .c | {len(modules)} |")
        print(f"| templates rendered for it | {len(templates)} |")
    print()
    for line in longs:
        print("long:", line)
    for line in cross:
        print("crossing:", line)
    if "--trace" in sys.argv:
        for m in modules:
            print("module:", m)
        for t in templates:
            print("template:", t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
