"""The pipeline: an op is derived and lowered once, and the finished artefacts go to the backends.

    op spec (ops.py, data)
      -> derivation (derive.py, derive_special.py: SymPy objects only; cached by derivations.py)
      -> lowered kernel (lower.py: backend-neutral, every decision made)
      -> a backend (backends/<name>.py: printer, configuration, templates placing finished strings)
      -> files (files.py: atomic writes, provenance, checks and diffs)

``build(op)`` is the one place that runs the first two steps; ``render(op, backend)`` hands its
artefacts to a backend of the registry (``symgrad.backends``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from . import backends
from .derivations import derive
from .derive import Derivation
from .lower import lower, piecewise_linear
from .ops import Op


@dataclass(frozen=True)
class Artifacts:
    """What every backend gets for one op: the derivation (for the docstring), the lowered kernel
    (for the code) and what the kernel is (piecewise linear: the jvp is also double backward)."""

    op: Op
    derivation: Derivation
    kernel: Any  # lower.ElementwiseKernel | WindowKernel | UnpoolKernel | LogSumExpKernel
    piecewise_linear: bool


@functools.lru_cache(maxsize=256)
def _build(key: str, op: Op) -> Artifacts:
    # code needs the partials, not the display of the raw derivative and its delta groups
    d = derive(op, display=False)
    kernel = lower(d)  # by the op kind's lowering (Kind.lowering)
    return Artifacts(op, d, kernel, piecewise_linear(kernel))


def build(op: Op) -> Artifacts:
    """Derive and lower an op (once per op, parameters and settings in a process).  Ops compare
    equal when their parameters do (max=0 and max=0.0), but their code need not be the same: the
    cache is keyed by the op's repr, which tells them apart."""
    return _build(repr(op), op)


def render(op: Op, backend: str) -> dict[str, str]:
    """{file name: file text} of one backend of an op."""
    return backends.get(backend).render(build(op))
