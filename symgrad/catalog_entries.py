"""The committed catalog's list: the ops of catalog.toml, resolved.  Read by catalog.py (which
generates and checks them) and by docs.py (a catalog op's page names its committed module);
it imports neither."""

from __future__ import annotations

import tomllib
from pathlib import Path

from .ops import Op, resolve

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
