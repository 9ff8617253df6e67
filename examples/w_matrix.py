"""The W-matrix view of max: max(x) = W x, and d max / dx = W, so the backward is W^T g.

Prints W's symbolic entries for x = [x0, x1, x2, x3] under each policy, W's numbers at a tie, and
for max_pool1d(kernel_size=2, stride=1) the 3x4 W whose transpose is the backward.
Run: python examples/w_matrix.py
"""

import numpy as np
import sympy as sp

import symgrad
from symgrad.derive import derive_window, window_symbols
from symgrad.printers import text

X = np.array([1.0, 3.0, 3.0, 2.0])  # a tie between x1 and x2


def w_row(ties: str, x=X) -> np.ndarray:
    """W (1 x 4) of max(x) at x, from the derivation evaluated exactly by SymPy."""
    node = derive_window(len(x), ties)
    env = dict(zip(window_symbols(len(x)), map(sp.nsimplify, x)))
    return np.array([[float(node.partials[s].xreplace(env)) for s in window_symbols(len(x))]])


def pool_w(ties: str, x=X) -> np.ndarray:
    """W (outputs x inputs) of max_pool1d(kernel_size=2, stride=1) at x: row i = backward(e_i)."""
    pool = symgrad.load("max_pool1d", ties=ties, kernel_size=2, stride=1)
    y, saved = pool.forward(x[None])
    rows = []
    for i in range(y.shape[1]):
        e = np.zeros_like(y)
        e[0, i] = 1.0
        rows.append(pool.backward(e, saved)[0][0])
    return np.array(rows)


def main() -> None:
    xs = window_symbols(4)
    for ties in symgrad.POLICIES:
        node = derive_window(4, ties)
        print(f"== {ties}: max(x0..x3) = sum_i w_i x_i with")
        for s in xs:
            print(f"   w for {s} = {text(node.partials[s])}")
        print(f"   at x = {X.tolist()}: W = {w_row(ties).tolist()}")
    for ties in ("first", "split"):
        W = pool_w(ties)
        g = np.array([[1.0, 10.0, 100.0]])
        pool = symgrad.load("max_pool1d", ties=ties, kernel_size=2, stride=1)
        y, saved = pool.forward(X[None])
        print(f"== max_pool1d(kernel_size=2, stride=1), {ties}, x = {X.tolist()}")
        print("W =\n", W)
        print("W @ x =", (W @ X).tolist(), " forward =", y[0].tolist())
        print("W^T g =", (W.T @ g[0]).tolist(), " backward =", pool.backward(g, saved)[0][0].tolist())


if __name__ == "__main__":
    main()
