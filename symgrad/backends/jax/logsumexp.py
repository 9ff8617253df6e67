"""The jax backend's logsumexp (``lower.LogSumExpKernel``): the template context of
``logsumexp.py.jinja``, the kernel's expressions printed in jax.numpy (a Python number is weakly
typed in JAX, rounded to the array's dtype as NumPy rounds it)."""

from __future__ import annotations

from .printer import jax_code


def logsumexp_context(op, kernel) -> dict:
    """The strings logsumexp.py.jinja places: the kernel's expressions."""
    t = op.params["temperature"]
    return {"params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
            "reduced_length": "math.prod([shape[i] for i in dims])", "empty_slices": True,
            "formula": f"{t!r} * log(sum(exp(x / {t!r})))" if t != 1 else "log(sum(exp(x)))",
            "weight_text": f"exp((x - y) / {t!r})" if t != 1 else "exp(x - y)",
            **{name: jax_code(getattr(kernel, name)) for name in ("shift", "term", "output", "weight")}}
