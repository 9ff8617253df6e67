"""An op's output as an affine map of its outermost max/min node (hardsigmoid: (u + 3) / 6).

``Scaled(u, shift, divisor, grad_scale, divide)`` stands for (u + shift) / divisor, where u is a
max/min of pieces (the W-matrix view of the op).  The derivation goes through u as for any
max/min op and multiplies each partial by ``grad_scale`` (dy/du as the framework multiplies it:
1/6 exactly, or a Literal holding 1/6 rounded as PyTorch's kernel holds it); the forward is
printed as one division ``(u + shift) / divisor`` (``divide``) or as the product with the rounded
reciprocal ``(1/divisor) * (u + shift)`` (as XLA computes a division by a constant).  The two
are kept apart because the frameworks compute them apart: PyTorch's hardsigmoid divides by 6 in
its forward and multiplies by the float 1/6 in its backward.
"""

from __future__ import annotations

import sympy as sp


class Scaled(sp.Function):
    """Scaled(u, shift, divisor, grad_scale, divide): (u + shift) / divisor (see the module)."""

    nargs = 5
    is_real = True

    @property
    def node(self) -> sp.Expr:
        return self.args[0]

    @property
    def grad_scale(self) -> sp.Expr:
        return self.args[3]

    def value(self, u: sp.Expr) -> sp.Expr:
        """The output's value for the node value u, as exact SymPy arithmetic."""
        return (u + self.args[1]) / self.args[2]

    def code(self, u: sp.Expr, quotient) -> sp.Expr:
        """The output as code for the node's code u (quotient: lower.Quotient, one division)."""
        _, shift, divisor, _, divide = self.args
        if divide:
            return quotient(u + shift, divisor)
        return (1 / divisor) * (u + shift)

    def _latex(self, printer):
        _, shift, divisor, _, _ = self.args
        return r"\frac{%s}{%s}" % (printer._print(self.node + shift), printer._print(divisor))

    def _sympystr(self, printer):
        _, shift, divisor, _, _ = self.args
        return f"({printer._print(self.node + shift)})/{printer._print(divisor)}"


class Picked(sp.Function):
    """Picked(u, q0, q1, ...): W times (q0, q1, ...), W the policy's weights of the max/min u's
    pieces: each piece stands for a value of its own (threshold: max(threshold, x) with the
    threshold piece standing for value).  The output jumps where the winner changes; its a.e.
    derivative is sum_i w_i dq_i/dx (a jump carries no gradient, as in the frameworks)."""

    is_real = True

    @property
    def node(self) -> sp.Expr:
        return self.args[0]

    @property
    def values(self) -> tuple:
        return self.args[1:]

    def _latex(self, printer):
        qs = r" \\ ".join(printer._print(q) for q in self.values)
        return r"W \begin{pmatrix} %s \end{pmatrix}" % qs

    def _sympystr(self, printer):
        return f"W({printer._print(self.node)})*({', '.join(printer._print(q) for q in self.values)})"
