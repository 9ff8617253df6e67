"""The torch backend's logsumexp (``lower.LogSumExpKernel``): the template context of
``logsumexp.py.jinja``, the kernel's expressions printed in torch operations, its inexact numbers
(1 / the temperature's divisor) named and rounded to each working dtype as NumPy rounds them."""

from __future__ import annotations

from .printer import float_literal, rounded, torch_code


def logsumexp_context(op, kernel) -> dict:
    """The strings logsumexp.py.jinja places: the kernel's expressions and named numbers."""
    numbers: list = []
    code = {name: torch_code(getattr(kernel, name), numbers) for name in ("shift", "term", "output", "weight")}
    t = op.params["temperature"]
    return {"params_list": [(k.upper(), repr(v)) for k, v in op.params.items()],
            "reduced_length": "math.prod([shape[i] for i in dims])", "empty_slices": True,
            "numbers": {dtype: [float_literal(rounded(v, dtype)) for v in numbers] for dtype in ("float32", "float64")},
            "unpack_lines": [f"({', '.join(f'_n{k}' for k in range(len(numbers)))},) = _NUMBERS[v.dtype]"]
            if numbers else [],
            "formula": f"{t!r} * log(sum(exp(x / {t!r})))" if t != 1 else "log(sum(exp(x)))",
            "weight_text": f"exp((x - y) / {t!r})" if t != 1 else "exp(x - y)", **code}
