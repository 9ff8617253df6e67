"""The committed catalog: the list in catalog.toml, generated into generated/ and checked."""

from __future__ import annotations

import tomllib
from pathlib import Path

from . import docs as _docs
from .backends import COMPLETE as BACKENDS  # every entry is generated for each
from .files import has_provenance
from .ops import Op, resolve
from .pipeline import render

CATALOG_FILE = Path(__file__).resolve().parent / "catalog.toml"


def entries() -> list[Op]:
    with open(CATALOG_FILE, "rb") as f:
        data = tomllib.load(f)
    ops = []
    for e in data.get("entry", []):
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in e.get("params", {}).items()}
        ops.append(resolve(e["op"], e.get("ties"), nan=e.get("nan"),
                           convention=e.get("convention"), **params))
    return ops


def render_all() -> dict[str, str]:
    """{relative path: source} of every catalog file."""
    files = {}
    for op in entries():
        for backend in BACKENDS:
            for name, source in render(op, backend).items():
                files[f"{backend}/{name}"] = source
    files.update(_docs.catalog_files(entries()))  # docs/: a page (+ picture) per entry, an index
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
