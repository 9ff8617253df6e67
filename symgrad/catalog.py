"""The committed catalog: the list in catalog.toml, generated into generated/ and checked."""

from __future__ import annotations

import tomllib
from pathlib import Path

from .ops import Op, resolve
from .render import has_provenance, render

CATALOG_FILE = Path(__file__).resolve().parent / "catalog.toml"


def entries() -> list[Op]:
    with open(CATALOG_FILE, "rb") as f:
        data = tomllib.load(f)
    ops = []
    for e in data.get("entry", []):
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in e.get("params", {}).items()}
        ops.append(resolve(e["op"], e.get("ties"), **params))
    return ops


BACKENDS = ("numpy", "cuda")  # every entry is generated for each


def render_all() -> dict[str, str]:
    """{relative path: source} of every catalog file."""
    files = {}
    for op in entries():
        for backend in BACKENDS:
            for name, source in render(op, backend).items():
                files[f"{backend}/{name}"] = source
    return files


def stale_files(out: Path, files: dict[str, str]) -> list[Path]:
    """Generated files under out that the catalog no longer lists."""
    stale = []
    for backend in BACKENDS:
        d = out / backend
        if d.is_dir():
            stale += [p for pattern in ("*.py", "*.cu") for p in d.glob(pattern)
                      if f"{backend}/{p.name}" not in files and has_provenance(p)]
    return sorted(stale)
