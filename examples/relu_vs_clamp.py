"""relu and clamp(min=0) have different gradients at 0: the classic question, in NumPy.

A two-layer net, loss = ((act(x @ w1) @ w2 - y) ** 2).sum(), differentiated with NumPy matmuls
and symgrad's generated backward for act.  Run: python examples/relu_vs_clamp.py
"""

import numpy as np

import symgrad

X = np.array([[3.0, 2, 1], [1, 0, 2], [4, 1, 2], [0, 0, 1]])
W1 = np.array([[1.0, 2], [0, 1], [4, 0]])
W2 = np.array([[-1.0, 1], [-2, 3]])
Y = np.ones((4, 2))


def w1_grad(act) -> np.ndarray:
    """d loss / d w1 with `act` a generated module (forward/backward)."""
    h = X @ W1  # h[3, 1] == 0: the kink
    a, saved = act.forward(h)
    out = a @ W2
    d_out = 2 * (out - Y)
    (d_h,) = act.backward(d_out @ W2.T, saved)[:1]
    return X.T @ d_h


class MaximumWithZero:
    """jnp.maximum(h, 0) as a one-input act: symgrad's maximum(a, b) with b = 0."""

    def __init__(self, convention):
        self.module = symgrad.load("maximum", convention=convention)

    def forward(self, h):
        return self.module.forward(h, np.zeros_like(h))

    def backward(self, g, saved):
        return self.module.backward(g, saved)[:1]


def main() -> None:
    torch_relu = w1_grad(symgrad.load("relu", convention="torch"))
    torch_clamp = w1_grad(symgrad.load("clamp", convention="torch", min=0))
    print("convention torch: w1.grad(relu) - w1.grad(clamp(min=0)) =")
    print(torch_relu - torch_clamp)
    jax_relu = w1_grad(symgrad.load("relu", convention="jax"))
    jax_maximum = w1_grad(MaximumWithZero("jax"))
    print("convention jax: w1.grad(jax.nn.relu) - w1.grad(jnp.maximum(h, 0)) =")
    print(jax_relu - jax_maximum)
    print("w1.grad with relu, torch convention:\n", torch_relu)


if __name__ == "__main__":
    main()
