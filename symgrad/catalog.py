"""The committed catalog: the list in catalog.toml, generated into generated/ and checked."""

from __future__ import annotations

from pathlib import Path

from . import pages as _pages
from .backends import COMPLETE as BACKENDS  # every entry is generated for each complete backend
from .backends import get as backend_named
from .catalog_entries import CATALOG_FILE, entries  # noqa: F401 (the list, read by docs too)
from .backends.common import CATALOG_GENERATOR, GENERATOR_LINE, generator_hash
from .files import has_provenance
from .pipeline import render


def render_all() -> dict[str, str]:
    """{relative path: source} of every catalog file."""
    files = {}
    for op in entries():
        for backend in [b for b in BACKENDS if backend_named(b).builds(op)]:  # (cuda: no order statistics yet)
            for name, source in render(op, backend_named(backend)).items():
                files[f"{backend}/{name}"] = _catalog_header(source)
    files.update(_pages.catalog_files(entries()))  # docs/: a page (+ picture) per entry, an index
    return files


def _catalog_header(source: str) -> str:
    """A catalog file's header names no generator hash (backends.common.CATALOG_GENERATOR)."""
    for prefix in (GENERATOR_LINE, "//" + GENERATOR_LINE[1:]):
        line = prefix + generator_hash()
        if line + "\n" in source:
            return source.replace(line + "\n", prefix + CATALOG_GENERATOR + "\n", 1)
    return source


def stale_files(out: Path, files: dict[str, str]) -> list[Path]:
    """Generated files under out that the catalog no longer lists."""
    found = []
    kinds = [(backend, ("*.py", "*.cu")) for backend in BACKENDS] + [("docs", ("*.md", "*.svg"))]
    for sub, patterns in kinds:
        if (out / sub).is_dir():
            found += [p for pattern in patterns for p in (out / sub).glob(pattern)
                      if f"{sub}/{p.name}" not in files and has_provenance(p)]
    return sorted(found)
