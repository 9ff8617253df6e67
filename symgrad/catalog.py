"""The committed catalog: the list in catalog.toml, generated into generated/ and checked."""

from __future__ import annotations

from pathlib import Path

from . import pages as _pages
from .backends import NAMES as BACKENDS  # every entry is generated for each
from .catalog_entries import CATALOG_FILE, entries  # noqa: F401 (the list, read by docs too)
from .files import has_provenance
from .pipeline import render


def render_all() -> dict[str, str]:
    """{relative path: source} of every catalog file."""
    files = {}
    for op in entries():
        for backend in BACKENDS:
            for name, source in render(op, backend).items():
                files[f"{backend}/{name}"] = source
    files.update(_pages.catalog_files(entries()))  # docs/: a page (+ picture) per entry, an index
    return files


def stale_files(out: Path, files: dict[str, str]) -> list[Path]:
    """Generated files under out that the catalog no longer lists."""
    found = []
    kinds = [(backend, ("*.py", "*.cu")) for backend in BACKENDS] + [("docs", ("*.md", "*.svg"))]
    for sub, patterns in kinds:
        if (out / sub).is_dir():
            found += [p for pattern in patterns for p in (out / sub).glob(pattern)
                      if f"{sub}/{p.name}" not in files and has_provenance(p)]
    return sorted(found)
