"""The pipeline: an op is derived and lowered once, and the finished artefacts go to a backend.

    op spec (ops.py, data)
      -> derivation (derive.py, derive_special.py: SymPy objects only; cached by derivations.py)
      -> lowered kernel (lower.py: backend-neutral, every decision made; lower.Artifacts)
      -> a backend (backends/<name>/: printer, configuration, templates placing finished strings;
         backends/README.md)
      -> files (files.py: atomic writes, provenance, checks and diffs)

``build(op)`` is the one place that runs the first two steps; ``render(op, backend)`` hands its
artefacts to a backend, a ``backends.Backend`` that the caller resolved once from its name
(``backends.get``).
"""

from __future__ import annotations

import functools

from .backends import Backend
from .derivations import derive
from .lower import Artifacts, artifacts
from .ops import Op


@functools.lru_cache(maxsize=256)
def _build(key: str, op: Op) -> Artifacts:
    # code needs the partials, not the display of the raw derivative and its delta groups
    return artifacts(derive(op, display=False))


def build(op: Op) -> Artifacts:
    """Derive and lower an op (once per op, parameters and settings in a process).  Ops compare
    equal when their parameters do (max=0 and max=0.0), but their code need not be the same: the
    cache is keyed by the op's repr, which tells them apart."""
    return _build(repr(op), op)


def render(op: Op, backend: Backend) -> dict[str, str]:
    """{file name: file text} of one backend of an op."""
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a symgrad.backends.Backend (backends.get(name) gives one), "
                        f"got {backend!r}")
    return backend.render(build(op))
