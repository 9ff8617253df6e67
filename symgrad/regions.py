"""An op's output and gradient written per region of a (nested) max/min (hardswish).

``Regions(u, output, tree, common)``: u is a max/min of pieces, possibly nested (hardswish's
min(3, max(-3, x))), whose W-form decides which region x is in: the winning piece of each node,
down to a leaf piece that is not a node.  ``output`` is the forward as an expression in the inputs
and ``NODE`` (the value of u): x * (u + 3) / 6, or a tree like ``tree`` of each region's value
(elu: alpha * (exp(x) - 1) where 0 wins max(0, x), x where x does).  ``tree`` mirrors u: for each piece of a node, the
gradient on the piece's region as the framework computes it (an expression in ``G``, the output's
gradient, the inputs and ``NODE``), or, for a piece that is itself a node, that node's tree.  The
gradient is ``common + sum_i w_i tree_i`` (w_i the node's policy weights, nested): the per-region
form of PyTorch's hardswish backward (x <= -3 ? 0 : x < 3 ? g * (x / 3 + 0.5) : g) with common 0,
or JAX's autodiff of x * hard_sigmoid(x), g * hs + [0 < x + 3 < 6] * (x * g) / 6, with the
product-rule term g * hs common to every region.

Division and product nodes of lower.py (Quotient, Product) keep the framework's arithmetic order
in the entries; the derivation checks each region's entry against SymPy's derivative of the
output on that region (``region_checks``), so the written forms are derived, not trusted.
"""

from __future__ import annotations

import sympy as sp

NODE = sp.Symbol("node", real=True)  # the value of the outermost max/min in output and tree
G = sp.Symbol("grad_output", real=True)  # lower.GRAD_OUTPUT (equal: same name and assumptions)


class Regions(sp.Function):
    """Regions(u, output, tree, common): see the module."""

    nargs = 4
    is_real = True

    @property
    def node(self) -> sp.Expr:
        return self.args[0]

    @property
    def output(self) -> sp.Expr:
        return self.args[1]

    @property
    def tree(self) -> sp.Tuple:
        return self.args[2]

    @property
    def common(self) -> sp.Expr:
        return self.args[3]

    def reversed_order(self, reverse) -> "Regions":
        """The same op with every max/min's arguments reversed (and the tree with them)."""
        return Regions(reverse(self.node), _reversed_tree(self.output), _reversed_tree(self.tree), self.common)

    def _latex(self, printer):
        if isinstance(self.output, sp.Tuple):
            return r"W \begin{pmatrix} %s \end{pmatrix}" % r" \\ ".join(
                printer._print(plain(v)) for v in _flat(self.output))
        return printer._print(plain(self.output).xreplace({NODE: self.node}))

    def _sympystr(self, printer):
        if isinstance(self.output, sp.Tuple):
            return f"W({printer._print(self.node)})*({', '.join(printer._print(plain(v)) for v in _flat(self.output))})"
        return printer._print(plain(self.output).xreplace({NODE: self.node}))


def _flat(tree) -> list:
    return [v for t in tree.args for v in (_flat(t) if isinstance(t, sp.Tuple) else [t])]


def _reversed_tree(tree):
    if not isinstance(tree, sp.Tuple):
        return tree
    return sp.Tuple(*[_reversed_tree(t) for t in reversed(tree.args)])


def plain(e: sp.Expr) -> sp.Expr:
    """e with the arithmetic-order nodes (lower.Quotient, lower.Product) as plain SymPy."""
    return e.replace(lambda a: type(a).__name__ == "Quotient", lambda a: a.args[0] / a.args[1]) \
            .replace(lambda a: type(a).__name__ == "Product", lambda a: a.args[0] * a.args[1])


def exact(e: sp.Expr) -> sp.Expr:
    """plain(e) with expm1(u) as exp(u) - 1 (what SymPy simplifies)."""
    return plain(e).replace(lambda a: type(a).__name__ == "expm1", lambda a: sp.exp(a.args[0]) - 1)


def weighted(tree, node_symbol, nodes: dict, leaf) -> sp.Expr:
    """sum_i w_i leaf(tree_i) over the node named node_symbol, nested where a piece is a node
    (its entry a tree): a sum of one term per region, the product of the weights on the way down
    times the leaf, over the product of the counts where the policy splits."""
    by_count: dict = {}  # the terms over one product of counts, as one fraction (lower_partial)
    for w, c, entry, piece in _paths(tree, node_symbol, nodes):
        by_count.setdefault(c, []).append(w * leaf(entry, piece))
    return sp.Add(*[sp.Add(*terms) / c for c, terms in by_count.items()])


def _paths(tree, node_symbol, nodes: dict):
    """(product of weights, product of counts, entry, leaf piece) of every region."""
    node = nodes[node_symbol]
    assert len(tree.args) == len(node.pieces), (tree, node.pieces)
    count = node.count if node.count is not None else sp.S.One
    for piece, w, entry in zip(node.pieces, node.weights, tree.args):
        if isinstance(entry, sp.Tuple):
            for w2, c2, e2, p2 in _paths(entry, piece, nodes):
                yield w * w2, count * c2, e2, p2
        else:
            yield w, count, entry, piece


def leaves(tree, node_symbol, nodes: dict):
    """(entry, leaf piece) of every region: the piece that wins down to a non-node piece."""
    for _, _, entry, piece in _paths(tree, node_symbol, nodes):
        yield entry, piece


def partial(r: Regions, root, nodes: dict, x: sp.Symbol) -> sp.Expr:
    """dy/dx in the W view: sum_i w_i d_i, d_i = (common + entry_i) / g on region i (the node's
    value there: the region's leaf piece)."""
    return weighted(r.tree, root, nodes, lambda e, leaf: region_derivative(r, e, leaf))


def region_derivative(r: Regions, entry, node_value) -> sp.Expr:
    return sp.simplify(exact((r.common + entry) / G).xreplace({NODE: node_value}))


def region_checks(r: Regions, root, nodes: dict, x: sp.Symbol) -> list[str]:
    """Each region's gradient as written equals g times SymPy's derivative of the output there."""
    out = []
    values = [v for v, _ in leaves(r.output, root, nodes)] if isinstance(r.output, sp.Tuple) else None
    for k, (entry, leaf) in enumerate(leaves(r.tree, root, nodes)):
        value = exact(values[k] if values else r.output).xreplace({NODE: leaf})
        d = region_derivative(r, entry, leaf)
        if sp.simplify(d - sp.diff(value, x)) != 0:
            raise AssertionError(f"the gradient written on the region where {leaf} wins, {entry}, "
                                 f"is not g * d/d{x} of {value}")
        out.append(f"where {leaf} wins: y = {value}, dy/d{x} = {sp.diff(value, x)} (as written: "
                   f"{exact(r.common + entry)})")
    return ["each region's gradient as written is g times SymPy's derivative of the output there: "
            + "; ".join(out)]
