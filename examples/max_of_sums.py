"""m = maximum(sum(t1), sum(t2)): the larger sum's vector gets all ones, the other all zeros.

Zeros, not None: symgrad always returns a gradient for every input.
Run: python examples/max_of_sums.py
"""

import numpy as np

import symgrad


def grads(t1: np.ndarray, t2: np.ndarray, convention: str = "torch"):
    maximum = symgrad.load("maximum", convention=convention)
    s1, s2 = np.array(t1.sum()), np.array(t2.sum())
    m, saved = maximum.forward(s1, s2)
    g1, g2 = maximum.backward(np.ones_like(m), saved)
    # the backward of sum() broadcasts the scalar gradient to every element
    return m, np.full_like(t1, g1), np.full_like(t2, g2)


def main() -> None:
    rng = np.random.default_rng(0)
    t1, t2 = rng.random(10), rng.random(10)
    m, g1, g2 = grads(t1, t2)
    print(f"sum t1: {t1.sum():.4f}  sum t2: {t2.sum():.4f}  max: {m:.4f}")
    print("t1 gradients:", g1)
    print("t2 gradients:", g2)


if __name__ == "__main__":
    main()
