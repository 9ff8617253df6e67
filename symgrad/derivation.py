"""What a derivation is: the steps it shows, the max/min nodes of the forward in the W-matrix view,
and the Derivation object that lowering, the docs and the checks read.  Every deriving module
(derive.py for max/min of pieces, derive_special.py for unpooling and logsumexp) builds these."""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

from .indicators import MaxOf, MinOf
from .ops import Op


@dataclass(frozen=True)
class Step:
    """One step of a derivation: a title, one sentence, and labelled SymPy objects."""

    title: str
    note: str
    items: tuple[tuple[str, sp.Basic], ...]


@dataclass
class Node:
    """One max/min of the forward, written in the W-matrix view."""

    symbol: sp.Symbol  # its value: y for the output, u0, u1, ... for inner nodes
    kind: str  # "max" | "min"
    pieces: tuple[sp.Expr, ...]
    weights: list[sp.Expr]  # w_i
    count: sp.Expr | None  # C for split (w_i = E_i / C), else None
    w_form: sp.Expr = None
    raw: dict = field(default_factory=dict)  # var -> derivative with DiracDelta terms
    delta_groups: dict = field(default_factory=dict)  # var -> [(delta, coeff, sifted)]
    partials: dict = field(default_factory=dict)  # var -> final partial (no delta)

    @property
    def forward(self) -> sp.Expr:
        return (MaxOf if self.kind == "max" else MinOf)(*self.pieces)


@dataclass
class Derivation:
    op: Op
    inputs: tuple[sp.Symbol, ...]
    forward: sp.Expr  # nested MaxOf/MinOf in the inputs
    nodes: list[Node]  # inner nodes first, the output node last
    partials: dict  # input symbol -> dy/dinput (may use inner node symbols)
    steps: list[Step]
    checks: list[str]
    # elementwise: the output as an affine map of the outermost node (scaled.Scaled; None: the node)
    output_map: sp.Basic | None = None

    @property
    def output(self) -> Node:
        return self.nodes[-1]

    @property
    def output_symbol(self) -> sp.Symbol:
        """The output's name: the last node's, or y where an output map follows it."""
        return self.output.symbol if self.output_map is None else sp.Symbol("y", real=True)
