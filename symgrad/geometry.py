"""Window geometry as data: per axis, as SymPy expressions, how many windows there are, where window
``i`` starts, the coordinate of its element ``j``, whether a coordinate is inside the input, and
which windows hold an input coordinate.  Stated once here, printed by each backend
(``backends/<name>/printer.py``), placed by the templates.

The integer symbols: ``i`` a window (an output position), ``j`` an element of a window (its
position along the axis, 0..k-1), ``x`` an input coordinate, ``length`` the axis's input length,
``out`` its number of windows, and the pooling parameters ``k`` (kernel size, or maxout's pieces),
``s`` (stride), ``p`` (padding), ``d`` (dilation).  Fractional pooling's starts are computed in
floating point from the plane's sample ``u`` and the step ``alpha`` (real symbols).

Integer expressions are sums and products, floor(a / b), ceiling(a / b) and Mod(a, b) of integers,
Min and Max; conditions are comparisons joined by And/Or.  Each backend prints them in its integer
arithmetic (``//`` in Python, ``/`` on 64-bit integers in CUDA, where every quotient it prints has a
nonnegative numerator).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import sympy as sp

I, J, LENGTH, OUT = sp.symbols("i j length out", integer=True, nonnegative=True)
X = sp.Symbol("x", integer=True)  # may be a coordinate of the padding, below 0
Q = sp.Symbol("q", integer=True)  # pooling: an input coordinate's offset from window 0's element j
K, S, D = sp.symbols("k s d", integer=True, positive=True)
P = sp.Symbol("p", integer=True, nonnegative=True)
U, ALPHA, RATIO = sp.symbols("u alpha ratio", real=True, nonnegative=True)  # fractional pooling: floating point
PARAMETERS = (K, S, P, D)


@dataclass(frozen=True)
class AxisGeometry:
    """The windows along one axis.  A field is None where the geometry has no closed form of it
    (the backend's skeleton then walks or searches, as its template says)."""

    name: str
    output_size: sp.Expr | None  # windows along the axis, in length and the parameters (None: given)
    start: sp.Expr  # where window i starts (its element 0, maybe padding)
    coordinate: sp.Expr  # the input coordinate of element j of window i
    inside: sp.Basic  # input coordinate x is inside the input (not padding)
    end: sp.Expr | None = None  # one past window i's last element
    offset: sp.Expr | None = None  # q, what holder and holds read: from x and j
    holder: sp.Expr | None = None  # the window that holds coordinate x as its element j ...
    holds: sp.Basic | None = None  # ... where this holds
    element: sp.Expr | None = None  # the element j of coordinate x in its one window (no overlap)
    first_inside: sp.Expr | None = None  # element j is inside the input for the windows ...
    end_inside: sp.Expr | None = None  # ... [first_inside, end_inside)
    first_holder: sp.Expr | None = None  # coordinate x is held by the windows ...
    end_holder: sp.Expr | None = None  # ... [first_holder, end_holder)
    alpha: sp.Expr | None = None  # fractional: the step between starts, in floating point
    last_start: sp.Expr | None = None  # fractional: the last window's start

    def windows(self, length: int, out: int, **params) -> list[tuple[int, ...]]:
        """Evaluated exactly (for documentation and checks): [(start, end)] of every window where
        the geometry has an end, else the input coordinates of every window's elements inside the
        input (elements j < params["k"])."""
        values = {LENGTH: length, OUT: out, **{sp.Symbol(n, **_ASSUME[n]): v for n, v in params.items()}}
        if self.end is not None:
            return [tuple(int(e.xreplace(values | {I: i})) for e in (self.start, self.end))
                    for i in range(out)]
        windows = []
        for i in range(out):
            coords = (int(self.coordinate.xreplace(values | {I: i, J: j})) for j in range(params["k"]))
            windows.append(tuple(c for c in coords if self.inside.xreplace(values | {X: c}) is sp.true))
        return windows

    def doc(self) -> str:
        if self.end is not None:
            return (f"window i covers [{_text(self.start)}, {_text(self.end)}); input coordinate i "
                    f"is held by the windows [{_text(self.first_holder)}, {_text(self.end_holder)})")
        return f"element j of window i is input coordinate {_text(self.coordinate)}"

    def expressions(self) -> dict:
        """{field: expression} of the fields this geometry has (the printers' input)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "name" and getattr(self, f.name) is not None}


_ASSUME = {"k": {"integer": True, "positive": True}, "s": {"integer": True, "positive": True},
           "d": {"integer": True, "positive": True}, "p": {"integer": True, "nonnegative": True}}


def _text(e: sp.Expr) -> str:
    return str(e).replace("ceiling", "ceil")


def _swapped(e: sp.Expr) -> sp.Expr:
    return e.xreplace({LENGTH: OUT, OUT: LENGTH})


_INSIDE = sp.And(X >= 0, X < LENGTH)

# ----------------------------------------------------------------------------- pooling

# PyTorch's pooling_output_shape: floor((length + 2p - d(k - 1) - 1) / s) + 1; under ceil_mode the
# ceiling, less one where the last window would start at or past the input's end plus the left
# padding ((out - 1) s >= length + p), which is out <= ceiling((length + p) / s) (one step at most,
# since p <= k / 2)
_REACH = LENGTH + 2 * P - D * (K - 1) - 1
_POOL_Q = X + P - J * D  # coordinate x as element j: window (x + p - j d) / s where s divides it


_FIRST_INSIDE = sp.Min(OUT, sp.Max(0, sp.ceiling((P - J * D) / S)))


def _pool(ceil_mode: bool) -> AxisGeometry:
    size = (sp.Min(sp.ceiling(_REACH / S) + 1, sp.ceiling((LENGTH + P) / S)) if ceil_mode
            else sp.floor(_REACH / S) + 1)
    return AxisGeometry(
        "pool", size, I * S - P, I * S - P + J * D, _INSIDE,
        offset=_POOL_Q, holder=sp.floor(Q / S),
        holds=sp.And(Q >= 0, sp.Eq(sp.Mod(Q, S), 0), sp.StrictLessThan(sp.floor(Q / S), OUT, evaluate=False)),
        # element j is inside the input from the first window whose element j reaches coordinate 0
        # to the last whose element j is before length
        first_inside=_FIRST_INSIDE,
        end_inside=sp.Max(_FIRST_INSIDE, sp.Min(OUT, sp.ceiling((LENGTH + P - J * D) / S)), evaluate=False))


POOL = _pool(False)
POOL_CEIL = _pool(True)


def pool(ceil_mode: bool) -> AxisGeometry:
    """max_pool*d's axis geometry (kernel k, stride s, padding p, dilation d), as PyTorch's."""
    return POOL_CEIL if ceil_mode else POOL


# ----------------------------------------------------------------------------- maxout

# the channel axis cut into windows of k consecutive channels: no padding, no overlap
MAXOUT = AxisGeometry("maxout", sp.floor(LENGTH / K), I * K, I * K + J, _INSIDE,
                      holder=sp.floor(X / K), holds=sp.true, element=sp.Mod(X, K))

# ----------------------------------------------------------------------------- adaptive

_START = sp.floor(I * LENGTH / OUT)
_END = sp.ceiling((I + 1) * LENGTH / OUT)

# PyTorch's adaptive max pooling (AdaptiveMaxPooling.h: start_index, end_index): windows overlap
# and differ in size; the windows holding a coordinate follow from the same formulas with length
# and out swapped
ADAPTIVE = AxisGeometry("adaptive", None, _START, _START + J, _INSIDE, end=_END,
                        first_holder=_swapped(_START), end_holder=_swapped(_END))

# ----------------------------------------------------------------------------- fractional

# PyTorch's fractional max pooling (FractionalMaxPool2d.cpp, generate_intervals): window i of out
# starts at int((i + u) alpha) - int(u alpha), alpha = (length - k) / (out - 1) in the input's
# floating-point type, the last at length - k; windows of k elements, which may overlap.  floor
# is int()'s truncation: every operand is nonnegative.  The windows holding a coordinate have no
# closed form (the starts are rounded floats): the backends search them, starts never decreasing.
_FRACTIONAL_START = sp.floor((I + U) * ALPHA) - sp.floor(U * ALPHA)
FRACTIONAL = AxisGeometry("fractional", sp.floor(LENGTH * RATIO), _FRACTIONAL_START,
                          _FRACTIONAL_START + J, _INSIDE,
                          alpha=(LENGTH - K) / (OUT - 1), last_start=LENGTH - K)

