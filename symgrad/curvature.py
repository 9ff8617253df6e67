"""Second derivatives of the ops smooth between their kinks (hardswish, elu, celu): double backward
in symgrad.torch (its eager path and, through smooth_backward, the torch backend path: off the CPU
and the autograd.Function torch.compile traces) and symgrad.jax.

Their backward is g * f'(x), so the derivative of <backward(g), v> in x is v * g * f''(x),
written here per region and selected on values (never a gradient through an unselected branch,
which gives 0 * inf = NaN where exp overflows there; JAX transposes these forms in v, so v is
masked before it meets g where the framework's own double backward gives 0 for an infinite g).
Below h = v * g:

* convention "torch": PyTorch 2.13's formulas (FunctionsManual's elu_double_backward,
  derivatives.yaml's hardswish_backward): elu/celu ``elu_backward(h * s, x) * (x < 0)`` (the
  module's own backward of h * s, s the input scale: 1, or 1/alpha for celu; 0 at x = 0 and NaN,
  NaN there for an infinite h), hardswish ``where(-3 < x < 3, h / 3, 0)``;
* convention "jax": jax.grad(jax.grad(...)) of jax.nn.elu and jax.nn.hard_swish: elu/celu
  ``where(x > 0, 0, ((alpha * g') * v') * (expm1(x' / s) + 1) / s**2)``, g', v', x' 0 where
  x > 0 (the exp piece at 0, NaN at NaN; celu: the where() form of its first derivative), hardswish
  ``(where(m, v, 0) / 6) * g + where(m, (g * v) / 6, 0)``, m = 0 < x + 3 < 6 (relu6's jvp mask;
  NaN outside for an infinite g);
* a tie policy: sum_r w_r h f_r''(x), w_r the policy's weight of region r (the max/min node's
  W, from the backward of that node alone: ``maximum(0, x)`` for elu/celu, the expression
  ``Min(3, Max(-3, x))`` for hardswish (its arguments reversed under order="reversed"), under
  the same ties and NaN rule), f_r'' the
  region's second derivative (elu/celu: alpha / s**2 * exp(x / s) on the exp piece, 0 on x;
  hardswish: 1/3 on the middle, 0 on the bounds).
"""

from __future__ import annotations

SMOOTH = ("hardswish", "elu", "celu")  # the ops with a second derivative here


class _Torch:
    def __init__(self):
        import torch
        self.where, self.exp, self.expm1 = torch.where, torch.exp, torch.expm1
        self.zeros_like, self.ones_like = torch.zeros_like, torch.ones_like

    @staticmethod
    def cast(mask, like):
        return mask.to(like.dtype)


class _Jax:
    def __init__(self):
        import jax.numpy as jnp
        self.where, self.exp, self.expm1 = jnp.where, jnp.exp, jnp.expm1
        self.zeros_like, self.ones_like = jnp.zeros_like, jnp.ones_like

    @staticmethod
    def cast(mask, like):
        return mask.astype(like.dtype)


def second_derivative(name: str, params: dict, settings: dict, module, backend: str):
    """fn(x, v, g) -> v * g * f''(x) for op ``name`` (one of SMOOTH) made with ``settings`` (ties,
    convention, nan, order) and ``params``; ``module`` its module of ``backend`` ("torch" or
    "jax"), whose backward the presets' formulas use."""
    xp = _Torch() if backend == "torch" else _Jax()
    convention = settings.get("convention")
    if name == "hardswish":
        if convention == "torch":
            return lambda x, v, g: xp.where((-3 < x) & (x < 3), (v * g) / 3, 0)
        if convention == "jax":
            def jax_rule(x, v, g):  # JAX's two product-rule terms, in its order
                inside = (x + 3 > 0) & (x + 3 < 6)
                return (xp.where(inside, v, 0) / 6) * g + xp.where(inside, (g * v) / 6, 0)
            return jax_rule
        node = "Min(Max(x, -3), 3)" if settings.get("order") == "reversed" else "Min(3, Max(-3, x))"
        weight = _weights(xp, backend, settings, expr=node)
        return lambda x, v, g: _weighted(xp, weight(x)[0], v, lambda u: (u * g) / 3)

    # the exp piece is evaluated at x only where it counts, elsewhere at a finite point (1 on
    # the x piece, 0 off the policy's weight): exp(x) overflowing there would give NaN in
    # the transpose (0 * inf), as JAX's own where(x > 0, 0, x) inside expm1 avoids
    def back(x, h):
        return module.backward(h, module.forward(x)[1])[0]
    alpha = float(params["alpha"])
    if convention == "torch":  # input_scale: 1.0 / alpha.toFloat() (celu), held as a double
        import numpy as np
        scale = 1.0 / float(np.float32(alpha)) if name == "celu" else None

        def torch_rule(x, v, g):
            inside = xp.where((x > 0) | (x != x), 1, x)  # (NaN: the x piece, as 1 is)
            h = v * g
            return back(inside, h if scale is None else h * scale) * xp.cast(x < 0, h)
        return torch_rule
    if convention == "jax":
        def jax_rule(x, v, g):  # JAX's transpose of expm1's jvp g * (ans + 1), in its order
            off = x > 0
            arg = xp.where(off, 0, x) if name == "elu" else xp.where(off, 0, x) / alpha
            d = ((alpha * xp.where(off, 0, g)) * xp.where(off, 0, v)) * (xp.expm1(arg) + 1)
            return xp.where(off, 0, d if name == "elu" else (d / alpha) / alpha)
        return jax_rule
    s = alpha if name == "celu" else 1.0
    weight = _weights(xp, backend, settings, op="maximum")

    def policy_rule(x, v, g):
        w = weight(x)[0]
        return _weighted(xp, w, v, lambda u: ((u * g) * (alpha / (s * s))) * xp.exp(xp.where(w == 0, 0, x) / s))
    return policy_rule


def _weighted(xp, w, v, term):
    """w * term(v), 0 where w is 0 (v masked there first: no NaN from an infinite g or an exp
    overflowing off its region, in the value or its transpose)."""
    return xp.where(w == 0, 0, w * term(xp.where(w == 0, 0, v)))


def _weights(xp, backend: str, settings: dict, op: str | None = None, expr: str | None = None):
    """fn(x) -> the W weights of the op's max/min node at x: the node's backward of ones, from
    the op ``op`` of (0, x) (its weights of 0 and of x) or the expression ``expr`` in x."""
    from . import api
    chosen = {k: v for k, v in settings.items() if k in ("ties", "nan") and v is not None}
    if op is not None:
        node = api.load(op, backend=backend, order=settings.get("order"), **chosen)

        def weight(x):
            return node.backward(xp.ones_like(x), node.forward(xp.zeros_like(x), x)[1])
        return weight
    node = api.load_expr(expr, inputs=["x"], backend=backend, **chosen)

    def weight(x):
        return node.backward(xp.ones_like(x), node.forward(x)[1])
    return weight


def smooth_backward(name: str, second):
    """For op ``name`` in SMOOTH: make(module) -> fn(grad_output, saved) -> (grad_x,), the torch
    backend ``module``'s backward as an autograd.Function whose own derivative is (the module's
    jvp in grad_output, ``second()(x, v, g)`` in x: second_derivative's, made on first use), as
    symgrad.torch's eager path differentiates it; autograd differentiating the generated code
    instead gives NaN where exp overflows off its piece (0 * inf) and its own value at the kinks.
    None for the other ops."""
    if name not in SMOOTH:
        return None

    def make(module):
        import torch

        class SmoothBackward(torch.autograd.Function):
            @staticmethod
            def forward(g, x, rest):
                return module.backward(g, module.Saved(x, *rest))[0]

            @staticmethod
            def setup_context(ctx, inputs, output):
                g, x, ctx.rest = inputs
                ctx.save_for_backward(g, x)

            @staticmethod
            def backward(ctx, v):
                g, x = ctx.saved_tensors
                return module.jvp(v, module.Saved(x, *ctx.rest)), second()(x, v, g), None

        SmoothBackward.__name__ = SmoothBackward.__qualname__ = f"symgrad_{module.OP}_backward"
        return lambda g, saved: (SmoothBackward.apply(g, saved[0], tuple(saved[1:])),)
    return make
