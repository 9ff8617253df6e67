"""The backends, one module each (printer configuration, template contexts, file names), behind
one registry.  A backend is ``file_names(op)`` (the importable module last) and
``render(artifacts) -> {file name: text}``; adding one touches its module and this registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import cpu, cuda, numpy


@dataclass(frozen=True)
class Backend:
    name: str
    help: str  # one line for the CLI
    file_names: Callable  # (op) -> tuple of file names, the importable module last
    render: Callable  # (pipeline.Artifacts) -> {file name: file text}


REGISTRY = {
    "numpy": Backend("numpy", "a NumPy module (the default)", numpy.file_names, numpy.render),
    "cuda": Backend("cuda", "a .cu file and its CuPy loader", cuda.file_names, cuda.render),
    "cpu": Backend("cpu", "a .c file and its loader (compiled on first use)",
                   cpu.file_names, cpu.render),
}
NAMES = tuple(REGISTRY)
# the backends that build every kind: the committed catalog holds these (`--backend all` writes
# every backend, NAMES).  The cpu backend builds every kind too, but stays out of the catalog: a catalog module is loaded from generated/
# (or the installed package's copy), and its loader keeps the compiled library beside it, so the
# catalog's ops would write .so files into the source tree, or, where that folder is not the
# user's (a system-wide install), compile into a temporary directory in every process (1.8-3 s
# per op); and render_all (run by several catalog tests) measured 3.1 -> 3.9 s CPU with it, 100
# more files (load average 15)
COMPLETE = ("numpy", "cuda")


def get(name: object) -> Backend:
    """The backend called name, or a TypeError/ValueError naming the backends there are."""
    if not isinstance(name, str):
        raise TypeError(f"backend must be one of {', '.join(NAMES)} (a string), got {name!r}")
    if name not in REGISTRY:
        raise ValueError(f"unknown backend {name!r}; expected one of: {', '.join(NAMES)}")
    return REGISTRY[name]
