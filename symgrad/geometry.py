"""Window geometry as integer expressions: where a window starts and ends along one axis, and which
windows hold an input coordinate, stated once (SymPy) and printed by each backend.

The symbols are integers: ``i`` an output position (a window) or an input coordinate, ``length``
the axis's input length, ``out`` its number of outputs.  Every expression is a sum of products,
floor(p / q) or ceiling(p / q) of nonnegative integers, which each backend prints in its integer
arithmetic (``backends/<name>/printer.py``: ``//`` in NumPy, ``/`` on 64-bit integers in CUDA).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

I, LENGTH, OUT = sp.symbols("i length out", integer=True, nonnegative=True)


@dataclass(frozen=True)
class AxisWindows:
    """Window ``i`` of ``out`` along an axis of ``length`` covers [start, end); input coordinate
    ``i`` is held by the windows [first_holder, end_holder)."""

    start: sp.Expr
    end: sp.Expr
    first_holder: sp.Expr
    end_holder: sp.Expr

    def windows(self, length: int, out: int) -> list[tuple[int, int]]:
        """[(start, end)] of every window, evaluated exactly (for documentation and checks)."""
        return [tuple(int(e.xreplace({I: i, LENGTH: length, OUT: out})) for e in (self.start, self.end))
                for i in range(out)]

    def doc(self) -> str:
        return (f"window i covers [{_text(self.start)}, {_text(self.end)}); input coordinate i is "
                f"held by the windows [{_text(self.first_holder)}, {_text(self.end_holder)})")


def _text(e: sp.Expr) -> str:
    return str(e).replace("ceiling", "ceil")


def _swapped(e: sp.Expr) -> sp.Expr:
    return e.xreplace({LENGTH: OUT, OUT: LENGTH})


_START = sp.floor(I * LENGTH / OUT)
_END = sp.ceiling((I + 1) * LENGTH / OUT)

# PyTorch's adaptive max pooling (AdaptiveMaxPooling.h: start_index, end_index): windows overlap
# and differ in size; the windows holding a coordinate follow from the same formulas with length
# and out swapped
ADAPTIVE = AxisWindows(_START, _END, _swapped(_START), _swapped(_END))
