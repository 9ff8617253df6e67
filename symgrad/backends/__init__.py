"""The backends, one package each, behind one registry (the contract and the recipe for adding one:
backends/README.md).

A backend package holds its printer (``printer.py``; the NumPy backend prints with the host
layer's), its configuration (``file_names(op)``, the importable module last, and
``render(artifacts) -> {file name: text}``, which picks templates by the lowered kernel's form)
and its own templates (``templates/``).  What several backends share lives one level down, never
in another backend: ``common.py`` (headers, docstrings, the template environment),
``printing.py`` (what every printer shares), ``host/`` (the Python side every backend emits) and
``cfamily/`` (what the C and CUDA backends share).

A name is resolved once, by ``get``, into a ``Backend`` that the pipeline carries down.  Adding a
backend touches its package and ``REGISTRY``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from . import cpu, cuda, jax, numpy, torch

if TYPE_CHECKING:
    from ..lower import Artifacts
    from ..ops import Op


@dataclass(frozen=True)
class Backend:
    """One backend: its name (the CLI's --backend, the cache's and catalog's folder), a line of
    help for the CLI, and its package."""

    name: str
    help: str
    package: ModuleType

    def file_names(self, op: "Op") -> tuple[str, ...]:
        """The files it writes for op, the importable module last."""
        return self.package.file_names(op)

    def render(self, art: "Artifacts") -> dict[str, str]:
        """{file name: file text} for the lowered op."""
        return self.package.render(art)

    def builds(self, op: "Op") -> bool:
        """Whether it builds op's kernel: its package's FORMS (lower.kernel_form names) where it
        lists them, else every form.  `symgrad generate --backend all` writes the backends that
        build the op; a backend asked alone for a form it lacks raises its one-line ValueError."""
        from ..lower import form_of
        forms = getattr(self.package, "FORMS", None)
        refuses = getattr(self.package, "refuses", None)  # a variant of a form it builds (jax)
        return (forms is None or form_of(op.spec.strategy) in forms) and not (refuses and refuses(op))

    @property
    def templates(self) -> Path:
        return Path(self.package.__file__).parent / "templates"

    def __repr__(self) -> str:
        return f"<symgrad backend {self.name!r}>"


REGISTRY = {b.name: b for b in (
    Backend("numpy", "a NumPy module (the default)", numpy),
    Backend("cuda", "a .cu file and its CuPy loader", cuda),
    Backend("cpu", "a .c file and its loader (compiled on first use)", cpu),
    Backend("torch", "a PyTorch module (torch operations: torch.compile, every device)", torch),
    Backend("jax", "a JAX module (jax.numpy and lax: jit, vmap, every device)", jax),
)}
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
