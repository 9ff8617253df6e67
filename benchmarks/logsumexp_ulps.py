"""logsumexp under the presets against PyTorch 2.13 CPU and JAX: the worst error in ulps over
random cases (the README's bound for the documented exception; tests/test_conventions_more.py
enforces 4 ulps forward and 4 (1 + |y|) ulps on the gradient).

    PYTHONPATH=. python benchmarks/logsumexp_ulps.py [cases per dtype and preset, default 200]

Errors as the test bounds them, over finite nonzero results (NaN, infinities and zeros are
compared bit for bit by the test): the forward in ulps of 1 + |y| (y = m + log(sum exp(x - m)):
the absolute error of y is about that of m and of the log, whatever the cancellation), a gradient
g * exp(x - y) in ulps of |g exp(x - y)| per 1 + |x| + |y| (the errors of y and of x - y, scaled
by the exponent)."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import torch

import symgrad

SHAPES = [((6,), 0), ((3, 5), 1), ((2, 3, 4), (0, 2))]


def _ulps(got, want, scale, eps, tiny) -> float:
    """The worst |got - want| / (eps * scale + tiny) over finite nonzero results."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want) & (want != 0) & np.isfinite(got) & (got != 0)
    scale = np.broadcast_to(scale, got.shape)[finite]
    return float((np.abs(got[finite] - want[finite]) / (eps * scale + tiny)).max(initial=0.0))


def main(cases: int) -> None:
    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    for framework in ("torch", "jax"):
        for dtype in (np.float16, np.float32, np.float64):
            eps, tiny = np.finfo(dtype).eps, np.finfo(dtype).smallest_subnormal
            worst_forward = worst_gradient = 0.0
            for _ in range(cases):
                shape, dim = SHAPES[rng.integers(len(SHAPES))]
                x = (rng.standard_normal(shape) * 4).astype(dtype)
                m = symgrad.load("logsumexp", convention=framework, dim=dim)
                y, saved = m.forward(x)
                g = rng.integers(-3, 4, size=y.shape).astype(dtype)
                (gx,) = m.backward(g, saved)
                if framework == "torch":
                    t = torch.tensor(x, requires_grad=True)
                    wy = torch.logsumexp(t, dim)
                    wy.backward(torch.tensor(g))
                    wy, wx = wy.detach().numpy(), t.grad.numpy()
                else:
                    wy, pullback = jax.vjp(lambda v: jax.nn.logsumexp(v, axis=dim), jnp.asarray(x))
                    wy, wx = np.asarray(wy), np.asarray(pullback(jnp.asarray(g))[0])
                one_plus_y = 1 + np.abs(np.asarray(wy, np.float64))
                worst_forward = max(worst_forward, _ulps(y, wy, one_plus_y, eps, tiny))
                per = np.expand_dims(one_plus_y, dim) + np.abs(x.astype(np.float64))
                worst_gradient = max(worst_gradient, _ulps(gx, wx, np.abs(wx.astype(np.float64)) * per, eps, tiny))
            print(f"{framework:5} {np.dtype(dtype).name:7} forward {worst_forward:5.2f} ulps of 1 + |y|, "
                  f"gradient {worst_gradient:5.2f} ulps of |g exp(x - y)| (1 + |x| + |y|) (worst of {cases} cases)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
